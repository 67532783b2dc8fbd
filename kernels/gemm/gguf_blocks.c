/* Products with weights held as the GGUF file stores them: rows of blocks of any type that gguf_decode.h
 * decodes, each block decoded in registers as it is read into the fp32 values the reference decoder gives
 * (gguf-py's ``dequantize``), so only the order of a dot product's sum differs from a dense fp32 product.
 * Activations and outputs are fp32. Written against the vector layer (../simd.h), built once per ISA; the
 * caller checks the CPU.
 */
#include <omp.h>
#include <stdlib.h>

#include "../prefetch.h"
#include "../simd.h"
#include "gguf_decode.h"

#define MAX_ROWS 8 /* rows of x per pass over the weight: the accumulators live in registers */

/* Whether the product widens its rows' block scales up front (``row_scales``): on AVX-512, one block's fp16
 * scale widened and broadcast as it is decoded takes shuffles, on the port that the table's permutes keep
 * busy. (AVX2's gathers cost more than they save, and so do Q8_0's, which has no table: its lm_head of a
 * decode step measured 7-12% faster without them.) */
static inline int widens_scales(int type) {
#if VL == 16
    return type == Q4_0 || type == Q4_1;
#else
    (void)type;
    return 0;
#endif
}

/* The fp16 d (and Q4_1's m) of the nb consecutive blocks at r, widened into d[] (and m[]), which hold nb
 * rounded up to 16: a gather of 16 blocks' first 4 bytes at a time (d, then m or two quants). */
static inline __attribute__((always_inline)) void row_scales(int type, const uint8_t *r, int64_t nb, float *d,
                                                             float *m) {
#if VL == 16
    const int bytes = block_bytes(type);
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(bytes));
    for (int64_t b = 0; b < nb; b += 16) {
        const __mmask16 k = nb - b >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nb - b)) - 1);
        const __m512i g = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), k, at, r + b * bytes, 1);
        _mm512_storeu_ps(d + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g)));
        if (type == Q4_1) _mm512_storeu_ps(m + b, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16))));
    }
#else
    (void)type, (void)r, (void)nb, (void)d, (void)m;
#endif
}

/* Whether the product computes a block's sub-block scales once a block (``block_scales``), where each
 * sub-block took them from the block's bytes again: the types with one a 16 values or a minimum apart from
 * the table (their decode at one row measured 20-35% faster so, Q4_K's, IQ4_XS's and Q3_K's slower). */
static inline int scales_once(int type) { return type == Q2_K || type == Q5_K || type == Q6_K; }

/* Rows [n0, n1) of y[m, n] = x[m, :] . w[n, :] (+ bias[n]) for M (at most MAX_ROWS) rows of x. Inlined
 * into clones with M constant (``ROWS_TM``), so that the accumulators live in registers.
 *   M < 6: each row keeps two sets of SUB / VL accumulators, for even and odd sub-blocks: with one chain,
 *       each multiply-add waited on the latency of the one before it.
 *   M >= 6: the rows' chains are enough, one accumulator a row; with 32 registers (VL 16) two weight rows
 *       are decoded at a time, so that each load of x feeds two multiply-adds (one load a multiply-add
 *       bounded the pass; at 4 rows the pairs are slower for Q8_0). A last odd row takes the M < 6
 *       loop. */
static inline __attribute__((always_inline)) void rows_impl(
        int type, const float *x, const int64_t M, const uint8_t *w, const float *bias, float *y, int64_t ldy,
        int64_t K, int64_t n0, int64_t n1) {
    const int64_t qk = block_values(type), per = qk / SUB, subs = K / SUB, bytes = block_bytes(type);
    const int64_t row_bytes = K / qk * bytes, NB = VL == 16 && M >= 6 ? 2 : 1;
    const uint8_t *const end = w + n1 * row_bytes; /* of this call's rows */
    /* where the scales are widened up front (then a block is a sub-block: per == 1), the rows' being read,
     * as each pass starts: widened further ahead, the gathers waited on lines not yet fetched */
    const int widen = widens_scales(type);
    const int64_t ns = widen ? (NB * subs + 15) / 16 * 16 : 1;
    float sd[ns], sm[ns];
    float ks[2][16], km[2][16]; /* the rows' current block's sub-block scales (``block_scales``), once a block */
    int64_t n = n0;
    for (; M >= 6 && n + NB <= n1; n += NB) {
        prefetch_stream(w + n * row_bytes, NB * row_bytes, end);
        if (widen) row_scales(type, w + n * row_bytes, NB * subs, sd, sm); /* the rows' blocks are consecutive */
        vf acc[MAX_ROWS][2];
        for (int64_t m = 0; m < M; m++) acc[m][0] = acc[m][1] = vzero();
        for (int64_t sb = 0; sb < subs; sb++) {
            vf wv[2][SUB / VL];
            for (int64_t j = 0; j < NB; j++) {
                const uint8_t *blk = w + (n + j) * row_bytes + sb / per * bytes;
                const int scaled = scales_once(type);
                if (scaled && sb % per == 0) block_scales(type, blk, ks[j], km[j]);
                decode(type, blk, (int)(sb % per), wv[j], 1, widen ? sd + j * subs + sb : scaled ? ks[j] : NULL,
                       widen ? sm + j * subs + sb : scaled ? km[j] : NULL);
            }
            for (int64_t m = 0; m < M; m++)
                for (int i = 0; i < SUB / VL; i++) {
                    const vf xv = vload(x + m * K + sb * SUB + i * VL);
                    for (int64_t j = 0; j < NB; j++) acc[m][j] = vfmadd(xv, wv[j][i], acc[m][j]);
                }
        }
        for (int64_t m = 0; m < M; m++)
            for (int64_t j = 0; j < NB; j++) y[m * ldy + n + j] = vsum(acc[m][j]) + (bias ? bias[n + j] : 0.0f);
    }
    for (; n < n1; n++) {
        const uint8_t *wr = w + n * row_bytes;
        prefetch_stream(wr, row_bytes, end);
        if (widen) row_scales(type, wr, subs, sd, sm);
        vf acc[MAX_ROWS][2][SUB / VL];
        for (int64_t m = 0; m < M; m++)
            for (int p = 0; p < 2; p++)
                for (int i = 0; i < SUB / VL; i++) acc[m][p][i] = vzero();
        for (int64_t sb = 0; sb < subs; sb += 2) /* even sub-blocks into acc[.][0], odd into acc[.][1] */
            for (int p = 0; p < 2 && sb + p < subs; p++) {
                vf wv[SUB / VL];
                const uint8_t *blk = wr + (sb + p) / per * bytes;
                const int scaled = scales_once(type);
                if (scaled && (sb + p) % per == 0) block_scales(type, blk, ks[0], km[0]);
                decode(type, blk, (int)((sb + p) % per), wv, 1, widen ? sd + sb + p : scaled ? ks[0] : NULL,
                       widen ? sm + sb + p : scaled ? km[0] : NULL);
                for (int64_t m = 0; m < M; m++) {
                    const float *xm = x + m * K + (sb + p) * SUB;
                    for (int i = 0; i < SUB / VL; i++)
                        acc[m][p][i] = vfmadd(vload(xm + i * VL), wv[i], acc[m][p][i]);
                }
            }
        for (int64_t m = 0; m < M; m++) {
            vf t = vadd(acc[m][0][0], acc[m][1][0]);
            for (int i = 1; i < SUB / VL; i++) t = vadd(t, vadd(acc[m][0][i], acc[m][1][i]));
            y[m * ldy + n] = vsum(t) + (bias ? bias[n] : 0.0f);
        }
    }
}

/* The clones: one per block type and row count, so that neither the type's branches nor the row loops are
 * decided inside the loop over the blocks. */
typedef void (*rows_fn)(const float *, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t, int64_t);
#define ROWS_TM(t, m)                                                                                        \
    static void rows_##t##_##m(const float *x, const uint8_t *w, const float *bias, float *y, int64_t ldy,   \
                               int64_t K, int64_t n0, int64_t n1) {                                          \
        rows_impl(t, x, m, w, bias, y, ldy, K, n0, n1);                                                      \
    }
#define ROWS_T(t)                                                                                            \
    ROWS_TM(t, 1) ROWS_TM(t, 2) ROWS_TM(t, 3) ROWS_TM(t, 4) ROWS_TM(t, 5) ROWS_TM(t, 6) ROWS_TM(t, 7)         \
    ROWS_TM(t, 8) static const rows_fn rows_##t[MAX_ROWS] = {rows_##t##_1, rows_##t##_2, rows_##t##_3,       \
                                                             rows_##t##_4, rows_##t##_5, rows_##t##_6,       \
                                                             rows_##t##_7, rows_##t##_8};
ROWS_T(Q4_0) ROWS_T(Q4_1) ROWS_T(Q5_0) ROWS_T(Q5_1) ROWS_T(Q8_0) ROWS_T(IQ4_NL) ROWS_T(MXFP4) ROWS_T(Q2_K)
ROWS_T(Q3_K) ROWS_T(Q4_K) ROWS_T(Q5_K) ROWS_T(Q6_K) ROWS_T(IQ4_XS)

static void rows(int type, const float *x, int64_t M, const uint8_t *w, const float *bias, float *y, int64_t ldy,
                 int64_t K, int64_t n0, int64_t n1) {
    const rows_fn *by_m;
    switch (type) {
    case Q4_0: by_m = rows_Q4_0; break;
    case Q4_1: by_m = rows_Q4_1; break;
    case Q5_0: by_m = rows_Q5_0; break;
    case Q5_1: by_m = rows_Q5_1; break;
    case Q8_0: by_m = rows_Q8_0; break;
    case IQ4_NL: by_m = rows_IQ4_NL; break;
    case MXFP4: by_m = rows_MXFP4; break;
    case Q2_K: by_m = rows_Q2_K; break;
    case Q3_K: by_m = rows_Q3_K; break;
    case Q4_K: by_m = rows_Q4_K; break;
    case Q5_K: by_m = rows_Q5_K; break;
    case Q6_K: by_m = rows_Q6_K; break;
    default: by_m = rows_IQ4_XS; break;
    }
    by_m[M - 1](x, w, bias, y, ldy, K, n0, n1);
}

/* Whether this build's product decodes the type's blocks with their lanes spread (``decode``): the types
 * decoded through a table. */
static inline int spreads(int type) {
#ifdef VLUT16
    return is_table4(type) || type == Q5_0 || type == Q5_1;
#else
    (void)type;
    return 0;
#endif
}

/* The M rows of x with each 16 values in the order the spread weights have theirs, in this thread's buffer
 * (grown as needed, kept for the next product); NULL where it cannot be had. */
static const float *spread_rows(const float *x, int64_t M, int64_t K) {
    static __thread float *buffer;
    static __thread int64_t capacity;
    if (M * K > capacity) {
        free(buffer);
        buffer = (float *)malloc((size_t)(M * K) * sizeof(float));
        capacity = buffer ? M * K : 0;
        if (!buffer) return NULL;
    }
#ifdef VLUT16
    for (int64_t i = 0; i < M * K; i += 16) vstore(buffer + i, vspread(vload(x + i)));
#endif
    return buffer;
}

/* y[M, N] (row stride ldy) = x[M, K] . W^T (+ bias), W the N rows of blocks at w; K a multiple of the
 * type's block and M at most MAX_ROWS. Returns 0, -1 where the type or the shape is not one this kernel
 * takes, or -2 where its buffer could not be allocated. */
int gguf_linear_f32(int type, const float *x, int64_t M, const uint8_t *w, const float *bias, float *y, int64_t ldy,
                    int64_t N, int64_t K, int threads) {
    if (!block_bytes(type) || K % block_values(type) || M < 1 || M > MAX_ROWS) return -1;
    if (spreads(type) && !(x = spread_rows(x, M, K))) return -2;
    if (threads < 1) threads = 1;
    if (threads == 1 || N < 64) {
        rows(type, x, M, w, bias, y, ldy, K, 0, N);
        return 0;
    }
    const int64_t per = (N + threads - 1) / threads;
#pragma omp parallel num_threads(threads)
    {
        const int64_t a = omp_get_thread_num() * per, b = a + per < N ? a + per : N;
        if (a < b) rows(type, x, M, w, bias, y, ldy, K, a, b);
    }
    return 0;
}

/* out[N, K] fp32 = the weights of the N rows of blocks at w: the reference decoder's values. */
int gguf_dequantize_f32(int type, const uint8_t *w, float *out, int64_t N, int64_t K, int threads) {
    if (!block_bytes(type) || K % block_values(type)) return -1;
    const int64_t qk = block_values(type), nb = K / qk, bytes = block_bytes(type);
#pragma omp parallel for num_threads(N * K >= (1 << 16) && threads > 1 ? threads : 1) schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < nb; b++) {
            float ks[16], km[16];
            const uint8_t *blk = w + (n * nb + b) * bytes;
            if (scaled_blocks(type)) block_scales(type, blk, ks, km);
            for (int j = 0; j < qk / SUB; j++) {
                vf wv[SUB / VL];
                decode(type, blk, j, wv, 0, scaled_blocks(type) ? ks : NULL, scaled_blocks(type) ? km : NULL);
                for (int i = 0; i < SUB / VL; i++) vstore(out + n * K + b * qk + j * SUB + i * VL, wv[i]);
            }
        }
    return 0;
}
