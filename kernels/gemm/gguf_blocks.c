/* Products with weights held as the GGUF file stores them: rows of blocks, each with its fp16 scale(s),
 * dequantized in registers as they are read.
 *
 *   Q4_0 (32 values, 18 bytes): d, 16 bytes of nibbles       w = d * (q - 8)
 *   Q4_1 (32 values, 20 bytes): d, m, 16 bytes of nibbles    w = d * q + m      (one product, then one sum)
 *   Q8_0 (32 values, 34 bytes): d, 32 int8                   w = q * d
 *   Q4_K (256 values, 144 bytes): d, dmin, 12 bytes of 6-bit scales and minima for 8 sub-blocks of 32,
 *       128 bytes of nibbles                                 w = (d * sc) * q - (dmin * m)
 *   Q5_K (256 values, 176 bytes): as Q4_K, with a fifth bit per value from 32 bytes of high bits
 *   Q6_K (256 values, 210 bytes): 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (one per
 *       16 values), d                                         w = (d * scale) * (q - 32)
 * In a Q4_0 / Q4_1 block the low nibbles are values 0 .. 15, the high ones 16 .. 31. Each weight is
 * the fp32 value the reference decoder gives (runtime/model/gguf_dequant.py, gguf-py's for the K types:
 * fp16 widened to fp32, each operation rounded), so only the order of a dot product's sum differs from
 * a dense fp32 product. Where the reference multiplies, then adds (Q4_1, Q4_K, Q5_K), one fused
 * multiply-add gives its value: the product of an fp16 scale (11 significant bits, times a 6-bit
 * sub-block scale for the K types: 17) and a quant of at most 5 bits is exact in fp32's 24, so the
 * reference's first rounding does nothing and its second is the fused one's. (Not so for Q6_K's 8-bit
 * scales and 6-bit quants: it multiplies twice, as the reference does.) Activations and
 * outputs are fp32. Written against the vector layer (../simd.h), built once per ISA; the caller checks
 * the CPU.
 */
#include <omp.h>
#include <stdlib.h>

#include "../prefetch.h"
#include "../simd.h"

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 }; /* ggml's type numbers */
#define SUB 32     /* values decoded at a time: a block, or a sub-block of a K block */
#define MAX_ROWS 8 /* rows of x per pass over the weight: the accumulators live in registers */

static inline int block_values(int type) { return type == Q4_K || type == Q5_K || type == Q6_K ? 256 : 32; }

static inline int block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 0;
    }
}

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline __m128i nibbles(const uint8_t *p, int high) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm_and_si128(high ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0F));
}

/* The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K block (gguf-py's get_scale_min). */
static inline void scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 0x3F;
        *m = s[j + 4] & 0x3F;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

/* Values [32 j, 32 j + 32) of the block at blk into w[0 .. 32 / VL); where spread is set, a 4-bit type's
 * in the lane order of ``vlut16_spread`` (``spreads``: the product's activations are put in that order).
 * sd, sm: where not NULL, a Q4_0 / Q4_1 / Q8_0 block's d (and Q4_1's m) widened already (``row_scales``). */
static inline __attribute__((always_inline)) void decode(int type, const uint8_t *blk, int j, vf *w, int spread,
                                                         const float *sd, const float *sm) {
    vf d, m; /* a Q4_0 / Q4_1 / Q8_0 block's scale, and Q4_1's minimum (the others' two bytes after d are
              * quants, and m goes unused) */
    if (type == Q8_0 || type == Q4_0 || type == Q4_1) {
        if (sd) {
            d = vset1(*sd);
            m = vset1(type == Q4_1 ? *sm : 0.0f);
        } else {
            vset1_halves(blk, &d, &m);
        }
    }
#ifdef VLUT16
    /* 4-bit values through a table of the 16 weights a nibble can stand for, each computed as below */
    if (type == Q4_0 || type == Q4_1) {
        const vf q = viota();
        const vf table = type == Q4_1 ? vfmadd(d, q, m) : vmul(d, vsub(q, vset1(8.0f)));
        const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
        w[0] = spread ? vlut16_spread(qs, 0, table) : vlut16_nibbles(qs, 0, table);
        w[1] = spread ? vlut16_spread(qs, 1, table) : vlut16_nibbles(qs, 1, table);
        return;
    }
    if (type == Q4_K) {
        int sc, mn;
        scale_min(blk + 4, j, &sc, &mn);
        const vf table = vfmadd(vset1(half(blk) * (float)sc), viota(), vset1(-(half(blk + 2) * (float)mn)));
        const uint8_t *qs = blk + 16 + 32 * (j / 2);
        w[0] = spread ? vlut16_spread(qs, j & 1, table) : vlut16_nibbles(qs, j & 1, table);
        w[1] = spread ? vlut16_spread(qs + 16, j & 1, table) : vlut16_nibbles(qs + 16, j & 1, table);
        return;
    }
#else
    (void)spread;
#endif
    if (type == Q8_0 || type == Q4_0 || type == Q4_1) {
        if (type == Q8_0) {
            vexpand_i8(_mm_loadu_si128((const __m128i *)(blk + 2)), w);
            vexpand_i8(_mm_loadu_si128((const __m128i *)(blk + 18)), w + 16 / VL);
            for (int i = 0; i < SUB / VL; i++) w[i] = vmul(w[i], d);
            return;
        }
        vnibbles(blk + (type == Q4_1 ? 4 : 2), w, w + 16 / VL);
        if (type == Q4_1) {
            for (int i = 0; i < SUB / VL; i++) w[i] = vfmadd(d, w[i], m);
        } else {
            const vf eight = vset1(8.0f);
            for (int i = 0; i < SUB / VL; i++) w[i] = vmul(d, vsub(w[i], eight)); /* q - 8 is exact in fp32 */
        }
        return;
    }
    if (type == Q4_K || type == Q5_K) {
        int sc, mn;
        scale_min(blk + 4, j, &sc, &mn);
        const vf d = vset1(half(blk) * (float)sc), neg_dm = vset1(-(half(blk + 2) * (float)mn));
        const uint8_t *qs = blk + (type == Q4_K ? 16 : 48) + 32 * (j / 2);
        __m128i lo = nibbles(qs, j & 1), hi = nibbles(qs + 16, j & 1);
        if (type == Q5_K) { /* bit j of each of the 32 high-bit bytes, as bit 4 */
            const __m128i one = _mm_set1_epi8(1), count = _mm_cvtsi32_si128(j);
            const __m128i h0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(blk + 16)), count), one);
            const __m128i h1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(blk + 32)), count), one);
            lo = _mm_or_si128(lo, _mm_slli_epi16(h0, 4));
            hi = _mm_or_si128(hi, _mm_slli_epi16(h1, 4));
        }
        vexpand_u8(lo, w);
        vexpand_u8(hi, w + 16 / VL);
        for (int i = 0; i < SUB / VL; i++) w[i] = vfmadd(d, w[i], neg_dm);
        return;
    }
    /* Q6_K: values 128 h + 32 r + i take ql byte 64 h + 32 (r % 2) + i (its high nibble for r >= 2) and
     * bits 2r, 2r + 1 of qh byte 32 h + i */
    const int h = j / 4, r = j % 4;
    const uint8_t *ql = blk + 64 * h + 32 * (r % 2), *qh = blk + 128 + 32 * h;
    const __m128i three = _mm_set1_epi8(3), count = _mm_cvtsi32_si128(2 * r);
    const __m128i h0 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)qh), count), three);
    const __m128i h1 = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)(qh + 16)), count), three);
    vexpand_u8(_mm_or_si128(nibbles(ql, r >= 2), _mm_slli_epi16(h0, 4)), w);
    vexpand_u8(_mm_or_si128(nibbles(ql + 16, r >= 2), _mm_slli_epi16(h1, 4)), w + 16 / VL);
    const int8_t *scales = (const int8_t *)(blk + 192);
    const float d6 = half(blk + 208);
    const vf thirty_two = vset1(32.0f);
    for (int i = 0; i < SUB / VL; i++) /* q - 32 is exact in fp32; one scale per 16 values */
        w[i] = vmul(vset1(d6 * (float)scales[2 * j + (i * VL) / 16]), vsub(w[i], thirty_two));
}

/* Whether the product widens its rows' block scales up front (``row_scales``): on AVX-512, one block's fp16
 * scale widened and broadcast as it is decoded takes shuffles, on the port that the table's permutes keep
 * busy. (AVX2's gathers cost more than they save.) */
static inline int widens_scales(int type) {
#if VL == 16
    return type == Q4_0 || type == Q4_1 || type == Q8_0;
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

/* Rows [n0, n1) of y[m, n] = x[m, :] . w[n, :] (+ bias[n]) for M (at most MAX_ROWS) rows of x. Inlined
 * into clones with M constant (``ROWS_TM``), so that the accumulators live in registers.
 *   M < 6: each row keeps two sets of SUB / VL accumulators, for even and odd sub-blocks: with one chain,
 *       each multiply-add waited on the latency of the one before it.
 *   M >= 6: the rows' chains are enough, one accumulator a row; with 32 registers (VL 16) two weight rows
 *       are decoded at a time, so that each load of x feeds two multiply-adds (one load a multiply-add
 *       bounded the pass; at 4 rows the pairs measured slower for Q8_0). A last odd row takes the M < 6
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
    int64_t n = n0;
    for (; M >= 6 && n + NB <= n1; n += NB) {
        prefetch_stream(w + n * row_bytes, NB * row_bytes, end);
        if (widen) row_scales(type, w + n * row_bytes, NB * subs, sd, sm); /* the rows' blocks are consecutive */
        vf acc[MAX_ROWS][2];
        for (int64_t m = 0; m < M; m++) acc[m][0] = acc[m][1] = vzero();
        for (int64_t sb = 0; sb < subs; sb++) {
            vf wv[2][SUB / VL];
            for (int64_t j = 0; j < NB; j++)
                decode(type, w + (n + j) * row_bytes + sb / per * bytes, (int)(sb % per), wv[j], 1,
                       widen ? sd + j * subs + sb : NULL, widen ? sm + j * subs + sb : NULL);
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
                decode(type, wr + (sb + p) / per * bytes, (int)((sb + p) % per), wv, 1,
                       widen ? sd + sb + p : NULL, widen ? sm + sb + p : NULL);
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
ROWS_T(Q4_0) ROWS_T(Q4_1) ROWS_T(Q8_0) ROWS_T(Q4_K) ROWS_T(Q5_K) ROWS_T(Q6_K)

static void rows(int type, const float *x, int64_t M, const uint8_t *w, const float *bias, float *y, int64_t ldy,
                 int64_t K, int64_t n0, int64_t n1) {
    const rows_fn *by_m = type == Q4_0 ? rows_Q4_0 : type == Q4_1 ? rows_Q4_1 : type == Q8_0 ? rows_Q8_0
                          : type == Q4_K ? rows_Q4_K : type == Q5_K ? rows_Q5_K : rows_Q6_K;
    by_m[M - 1](x, w, bias, y, ldy, K, n0, n1);
}

/* Whether this build's product decodes the type's blocks with their lanes spread (``decode``). */
static inline int spreads(int type) {
#ifdef VLUT16
    return type == Q4_0 || type == Q4_1 || type == Q4_K;
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
        for (int64_t b = 0; b < nb; b++)
            for (int j = 0; j < qk / SUB; j++) {
                vf wv[SUB / VL];
                decode(type, w + (n * nb + b) * bytes, j, wv, 0, NULL, NULL);
                for (int i = 0; i < SUB / VL; i++) vstore(out + n * K + b * qk + j * SUB + i * VL, wv[i]);
            }
    return 0;
}
