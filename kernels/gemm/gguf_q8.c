/* Products of GGUF weights with activations quantized to int8 per block of 32, as llama.cpp's q8 dot
 * products compute them: integer dot products of the weight's quants with the activation's, scaled per
 * block. Approximate (the activations lose precision); the fp32-activation kernel (gguf_blocks.c) is the
 * exact one.
 *
 * The weights are repacked once at load (``gguf_q8_pack``), 16 rows at a time, their quants as the file
 * stores them (gguf_q8_layout.h). One multiply-accumulate of 4 uint8 x int8 pairs per lane (vpdpbusd)
 * then gives 16 rows' partial dot products with the same 4 activation values, broadcast: 16 output rows a
 * vector, no horizontal sums. A quant's fifth and sixth bits come from the record's masks (one masked
 * byte move each), a table type's value from a byte shuffle of its table. The weights' offsets come out
 * in the block's integer sum: sum((q - 8) x) = sum(q x) - 8 sum(x) for Q4_0, the same with 16 for Q5_0,
 * 32 for Q6_K (per half of 16, whose scales are its own) and 128 for the shifted Q8_0 and the tables'
 * values; a minimum m adds m * d_x * sum(x).
 *
 * Built for AVX-512 VNNI (16 lanes) or for AVX2 (two halves of 8 lanes, vpmaddubsw then vpmaddwd: 4-bit
 * products summed in 16 bits over a block, which cannot overflow, 15 * 127 * 2 * 8 < 2^15, 5- and 6-bit
 * ones over one chunk, 63 * 127 * 2 < 2^15; Q8_0's and the tables' signs moved onto the activations so
 * that the 16-bit pair sums stay in range). The caller checks the CPU.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "../prefetch.h"
#include "q8_activations.h"
#include "gguf_q8_layout.h"

#define MT 8 /* activation rows a pass over a group of weight rows */

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* ---------------------------------------------------------------------------------------- AVX-512 VNNI */
#define HALVES 1
typedef __m512i vi;
typedef __m512 vq;
static inline vi chunk(const uint8_t *p, int h) { (void)h; return _mm512_loadu_si512(p); }
static inline vi lo_nibbles(vi v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
static inline vi hi_nibbles(vi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
static inline vi ibcast(int32_t v) { return _mm512_set1_epi32(v); }
static inline vi ior(vi a, vi b) { return _mm512_or_si512(a, b); }
/* bit `bit` set in each byte of the chunk whose bit in the mask at p is set */
static inline vi high_bits(const uint8_t *p, int h, int bit) {
    (void)h;
    uint64_t mask;
    memcpy(&mask, p, 8);
    return _mm512_maskz_mov_epi8((__mmask64)mask, _mm512_set1_epi8((char)(1 << bit)));
}
/* a table type's values as uint8 (value + 128), looked up by nibble in each 128-bit lane */
static inline vi table_u8(const int8_t *kvalues) {
    return _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kvalues)),
                            _mm512_set1_epi8((char)0x80));
}
static inline vi lookup(vi table, vi nib) { return _mm512_shuffle_epi8(table, nib); }
/* acc + per lane the sum of 4 products: w's uint8 by the 4 int8 at x, broadcast to every lane as the
 * instruction's memory operand (compilers emit a separate broadcast for the intrinsic, one more uop) */
static inline vi dot4x(vi acc, vi w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)x));
    return acc;
}
static inline vq scales(const uint8_t *p, int h) {
    (void)h;
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline vq scales32(const uint8_t *p, int h) {
    (void)h;
    return _mm512_loadu_ps(p);
}
static inline vq fset1(float v) { return _mm512_set1_ps(v); }
static inline vq fzero(void) { return _mm512_setzero_ps(); }
static inline vq fma_i(vi i, vq s, vq acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc); }
static inline vq fmul(vq a, vq b) { return _mm512_mul_ps(a, b); }
static inline vq ffma(vq a, vq b, vq c) { return _mm512_fmadd_ps(a, b, c); }
static inline vq fadd(vq a, vq b) { return _mm512_add_ps(a, b); }
static inline vq floadu(const float *p) { return _mm512_loadu_ps(p); }
static inline void fstore(float *p, vq v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }
#define FL 16
#define SHIFTED 128 /* the offset of Q8_0's shifted quants and of the tables' values */

#elif defined(__AVX2__) && defined(__FMA__)
/* ----------------------------------------------------------------------------------------------- AVX2 */
#define HALVES 2
typedef __m256i vi;
typedef __m256 vq;
static inline vi chunk(const uint8_t *p, int h) { return _mm256_loadu_si256((const __m256i *)(p + 32 * h)); }
static inline vi lo_nibbles(vi v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
static inline vi hi_nibbles(vi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
static inline vi ibcast(int32_t v) { return _mm256_set1_epi32(v); }
static inline vi ior(vi a, vi b) { return _mm256_or_si256(a, b); }
static inline vi x4(const int8_t *x) { int32_t v; memcpy(&v, x, 4); return _mm256_set1_epi32(v); }
/* bit `bit` set in each byte of half h of the chunk whose bit in the mask at p is set */
static inline vi high_bits(const uint8_t *p, int h, int bit) {
    uint32_t bits;
    memcpy(&bits, p + 4 * h, 4);
    const __m256i shuffle = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuffle);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
    return _mm256_and_si256(set, _mm256_set1_epi8((char)(1 << bit)));
}
/* a table type's values as int8 (the signs go onto the activations), looked up by nibble */
static inline vi table_i8(const int8_t *kvalues) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues));
}
static inline vi lookup(vi table, vi nib) { return _mm256_shuffle_epi8(table, nib); }
static inline vq scales(const uint8_t *p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
}
static inline vq scales32(const uint8_t *p, int h) { return _mm256_loadu_ps((const float *)(p + 32 * h)); }
static inline vq fset1(float v) { return _mm256_set1_ps(v); }
static inline vq fzero(void) { return _mm256_setzero_ps(); }
static inline vq fma_i(vi i, vq s, vq acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, acc); }
static inline vq fmul(vq a, vq b) { return _mm256_mul_ps(a, b); }
static inline vq ffma(vq a, vq b, vq c) { return _mm256_fmadd_ps(a, b, c); }
static inline vq fadd(vq a, vq b) { return _mm256_add_ps(a, b); }
static inline vq floadu(const float *p) { return _mm256_loadu_ps(p); }
static inline void fstore(float *p, vq v, int n) {
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
    } else {
        float t[8];
        _mm256_storeu_ps(t, v);
        memcpy(p, t, (size_t)n * 4);
    }
}
#define FL 8
#define SHIFTED 0 /* the signs go onto the activations instead (vpsignb), so no offset */

#else
#error "gguf_q8.c needs AVX-512 VNNI or AVX2 with FMA: native.py passes the flags of one"
#endif

/* The quants of chunk c of the record at rec (half h of its lanes): the low nibbles (values 4c .. 4c + 3 of
 * each row) in *lo, the high ones (16 + 4c ..) in *hi, their high bits from the planes OR-ed in, through
 * the table where the type has one. */
static inline __attribute__((always_inline)) void chunk_quants(int type, const uint8_t *rec, int c, int h, vi table,
                                                               vi *lo, vi *hi) {
    const uint8_t *planes_at = rec + scale_bytes(type) + min_bytes(type);
    const vi v = chunk(planes_at + plane_bytes(type) + 64 * c, h);
    *lo = lo_nibbles(v);
    *hi = hi_nibbles(v);
    for (int plane = 0; plane < planes(type); plane++) {
        *lo = ior(*lo, high_bits(planes_at + 8 * ((plane * 4 + c) * 2), h, 4 + plane));
        *hi = ior(*hi, high_bits(planes_at + 8 * ((plane * 4 + c) * 2 + 1), h, 4 + plane));
    }
    if (tabled(type)) {
        *lo = lookup(table, *lo);
        *hi = lookup(table, *hi);
    }
}

/* The integer dot products of one record with MM activation rows (activation block i of row 0 at index
 * i0, a row's blocks nb apart), for half h of the group's lanes: acc[m] (lanes = rows of the group) = the
 * sum over the block of the weights' quants times q_x, less their offset; for a type with a scale per 16
 * values, acc[m] the first 16's and acc2[m] the second's. */
static inline __attribute__((always_inline)) void block_dots(int type, const uint8_t *rec, int h,
                                                             const int8_t *const *xb, q8_rows a, int64_t i0,
                                                             int64_t nb, int MM, vi *acc, vi *acc2) {
    const int32_t offset = type == Q8_0 || tabled(type) ? SHIFTED : q_offset(type);
    for (int m = 0; m < MM; m++) {
        const int64_t i = i0 + m * nb;
        if (scale_halves(type)) {
            acc[m] = ibcast(-offset * a.sum16[2 * i]);
            acc2[m] = ibcast(-offset * a.sum16[2 * i + 1]);
        } else {
            acc[m] = ibcast(-offset * a.sum[i]);
        }
    }
    const uint8_t *qs = rec + scale_bytes(type) + min_bytes(type) + plane_bytes(type);
#if HALVES == 1
    if (type == Q8_0) {
        for (int g = 0; g < 8; g++) {
            const vi w = chunk(qs + 64 * g, h);
            for (int m = 0; m < MM; m++) acc[m] = dot4x(acc[m], w, xb[m] + 4 * g);
        }
        return;
    }
    const vi table = tabled(type) ? table_u8(table_of(type)) : ibcast(0);
    for (int c = 0; c < 4; c++) {
        vi lo, hi;
        chunk_quants(type, rec, c, h, table, &lo, &hi);
        for (int m = 0; m < MM; m++) {
            acc[m] = dot4x(acc[m], lo, xb[m] + 4 * c);
            if (scale_halves(type))
                acc2[m] = dot4x(acc2[m], hi, xb[m] + 16 + 4 * c);
            else
                acc[m] = dot4x(acc[m], hi, xb[m] + 16 + 4 * c);
        }
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == Q8_0 || tabled(type)) { /* |w| by x with w's sign: pair sums of at most 2 * 128 * 127 */
        const vi table = tabled(type) ? table_i8(table_of(type)) : ibcast(0);
        for (int g = 0; g < 8; g += 2) {
            vi w[2]; /* Q8_0: chunks g, g + 1; a table's: chunk g / 2's low nibbles, then its high ones */
            int at[2];
            if (type == Q8_0) {
                for (int k = 0; k < 2; k++) {
                    w[k] = _mm256_xor_si256(chunk(qs + 64 * (g + k), h), _mm256_set1_epi8((char)0x80));
                    at[k] = 4 * (g + k);
                }
            } else {
                chunk_quants(type, rec, g / 2, h, table, &w[0], &w[1]);
                at[0] = 4 * (g / 2), at[1] = 16 + 4 * (g / 2);
            }
            for (int k = 0; k < 2; k++) {
                const vi aw = _mm256_abs_epi8(w[k]);
                for (int m = 0; m < MM; m++) {
                    const vi p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x4(xb[m] + at[k]), w[k]));
                    acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(p, ones));
                }
            }
        }
        return;
    }
    if (planes(type)) { /* 5- and 6-bit quants: each chunk's 16-bit sums widened at once */
        for (int c = 0; c < 4; c++) {
            vi lo, hi;
            chunk_quants(type, rec, c, h, ibcast(0), &lo, &hi);
            for (int m = 0; m < MM; m++) {
                const vi pl = _mm256_maddubs_epi16(lo, x4(xb[m] + 4 * c));
                const vi ph = _mm256_maddubs_epi16(hi, x4(xb[m] + 16 + 4 * c));
                if (scale_halves(type)) {
                    acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(pl, ones));
                    acc2[m] = _mm256_add_epi32(acc2[m], _mm256_madd_epi16(ph, ones));
                } else {
                    acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones));
                }
            }
        }
        return;
    }
    vi s16[MT];
    for (int m = 0; m < MM; m++) s16[m] = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        const vi v = chunk(qs + 64 * c, h), lo = lo_nibbles(v), hi = hi_nibbles(v);
        for (int m = 0; m < MM; m++) {
            s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(lo, x4(xb[m] + 4 * c)));
            s16[m] = _mm256_add_epi16(s16[m], _mm256_maddubs_epi16(hi, x4(xb[m] + 16 + 4 * c)));
            /* each row's sum taken here: left free, GCC computes all the block's products first, then adds
             * them up, and spills most of them (AVX2 has 16 vector registers) */
            __asm__("" : "+x"(s16[m]));
        }
    }
    for (int m = 0; m < MM; m++) acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(s16[m], ones));
#endif
}

/* Rows [g0 * R, g1 * R) of y (at most N) for MM activation rows starting at row m0. Where ahead is set, the
 * first half's pass asks for the records at ahead (the next group's) block by block, one group ahead of its
 * reads: the weight streams from memory, and the hardware prefetcher alone leaves the loads waiting. */
static inline __attribute__((always_inline)) void groups_mm(int type, q8_rows a, int MM, int64_t m0,
                                                            const uint8_t *w, const float *bias, float *y,
                                                            int64_t ldy, int64_t N, int64_t K, int64_t g0,
                                                            int64_t g1, const uint8_t *ahead) {
    const int64_t nb = K / QK, rec = record_bytes(type), sb = scale_bytes(type);
    const int8_t *xrow[MT];
    for (int64_t g = g0; g < g1; g++)
        for (int h = 0; h < HALVES; h++) {
            vq accf[MT];
            for (int m = 0; m < MM; m++) accf[m] = fzero();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *r = w + (g * nb + b) * rec;
                if (ahead && h == 0) prefetch_lines(ahead + b * rec, rec);
                for (int m = 0; m < MM; m++) xrow[m] = a.q + (m0 + m) * K + b * QK;
                vi acc[MT], acc2[MT];
                block_dots(type, r, h, xrow, a, m0 * nb + b, nb, MM, acc, acc2);
                if (scale_halves(type)) {
                    const vq s0 = scales32(r, h), s1 = scales32(r + 4 * R, h);
                    for (int m = 0; m < MM; m++) {
                        const vq dx = fset1(a.d[(m0 + m) * nb + b]);
                        accf[m] = fma_i(acc2[m], fmul(s1, dx), fma_i(acc[m], fmul(s0, dx), accf[m]));
                    }
                } else {
                    const vq dw = scale_f32(type) ? scales32(r, h) : scales(r, h);
                    for (int m = 0; m < MM; m++)
                        accf[m] = fma_i(acc[m], fmul(dw, fset1(a.d[(m0 + m) * nb + b])), accf[m]);
                }
                if (min_f16(type) || min_f32(type)) {
                    const vq mw = min_f32(type) ? scales32(r + sb, h) : scales(r + sb, h);
                    for (int m = 0; m < MM; m++) accf[m] = ffma(mw, fset1(a.s[(m0 + m) * nb + b]), accf[m]);
                }
            }
            const int64_t n0 = g * R + h * FL;
            if (n0 >= N) continue;
            const int n = N - n0 < FL ? (int)(N - n0) : FL;
            for (int m = 0; m < MM; m++) {
                vq v = accf[m];
                if (bias) {
                    float t[FL] = {0};
                    memcpy(t, bias + n0, (size_t)n * 4);
                    v = fadd(v, floadu(t));
                }
                fstore(y + (m0 + m) * ldy + n0, v, n);
            }
        }
}

/* The clones, one per type and activation-row count, so that the loops over rows unroll. */
typedef void (*groups_fn)(q8_rows, int64_t, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t,
                          int64_t, int64_t, const uint8_t *);
#define GROUPS_TM(t, mm)                                                                                     \
    static void groups_##t##_##mm(q8_rows a, int64_t m0, const uint8_t *w, const float *bias, float *y,       \
                                  int64_t ldy, int64_t N, int64_t K, int64_t g0, int64_t g1,                  \
                                  const uint8_t *ahead) {                                                    \
        groups_mm(t, a, mm, m0, w, bias, y, ldy, N, K, g0, g1, ahead);                                       \
    }
#define GROUPS_T(t)                                                                                          \
    GROUPS_TM(t, 1) GROUPS_TM(t, 2) GROUPS_TM(t, 3) GROUPS_TM(t, 4) GROUPS_TM(t, 5) GROUPS_TM(t, 6)           \
    GROUPS_TM(t, 7) GROUPS_TM(t, 8) static const groups_fn groups_##t[MT] = {                                \
        groups_##t##_1, groups_##t##_2, groups_##t##_3, groups_##t##_4,                                      \
        groups_##t##_5, groups_##t##_6, groups_##t##_7, groups_##t##_8};
GROUPS_T(Q4_0) GROUPS_T(Q4_1) GROUPS_T(Q5_0) GROUPS_T(Q5_1) GROUPS_T(Q8_0) GROUPS_T(IQ4_NL) GROUPS_T(MXFP4)
GROUPS_T(Q4_K) GROUPS_T(Q5_K) GROUPS_T(Q6_K) GROUPS_T(IQ4_XS)

static const groups_fn *groups_of(int type) {
    switch (type) {
    case Q4_0: return groups_Q4_0;
    case Q4_1: return groups_Q4_1;
    case Q5_0: return groups_Q5_0;
    case Q5_1: return groups_Q5_1;
    case Q8_0: return groups_Q8_0;
    case IQ4_NL: return groups_IQ4_NL;
    case MXFP4: return groups_MXFP4;
    case Q4_K: return groups_Q4_K;
    case Q5_K: return groups_Q5_K;
    case Q6_K: return groups_Q6_K;
    case IQ4_XS: return groups_IQ4_XS;
    default: return NULL;
    }
}

/* Groups [g0, g1) for all M rows: the m-tiles inside, so that a group's weights are read from memory
 * once and from cache by the tiles after the first; the first tile asks for the next group's. */
static void groups(int type, const groups_fn *by_m, q8_rows a, int64_t M, const uint8_t *w, const float *bias,
                   float *y, int64_t ldy, int64_t N, int64_t K, int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g++)
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int64_t mm = M - m0 < MT ? M - m0 : MT;
            const uint8_t *ahead = m0 == 0 && g + 1 < g1 ? w + (g + 1) * (K / QK) * record_bytes(type) : NULL;
            by_m[mm - 1](a, m0, w, bias, y, ldy, N, K, g, g + 1, ahead);
        }
}

/* y[M, N] (row stride ldy) = x[M, K] . W^T (+ bias), W the N rows packed at w by ``gguf_q8_pack``. The
 * rows of x are quantized into scratch (``q8_layout``) where ``quantize_x`` is set; else scratch holds them
 * from an earlier call with the same x (of this kernel or of gguf_q8_blocks.c's). Returns 0, or -1 where
 * the type or shape is not one this kernel takes. */
int gguf_q8_linear(int type, const float *x, int64_t M, const uint8_t *w, const float *bias, float *y, int64_t ldy,
                   int64_t N, int64_t K, int threads, uint8_t *scratch, int quantize_x) {
    const groups_fn *by_m = groups_of(type);
    if (!by_m || K % block_values(type) || M < 1 || N < 1) return -1;
    const q8_rows a = q8_layout(scratch, M, K);
    if (quantize_x) q8_quantize(x, M, K, a);
    const int64_t G = (N + R - 1) / R;
    if (threads < 1) threads = 1;
    if (threads == 1 || G < 4) {
        groups(type, by_m, a, M, w, bias, y, ldy, N, K, 0, G);
        return 0;
    }
    const int64_t per = (G + threads - 1) / threads;
#pragma omp parallel num_threads(threads)
    {
        const int64_t g0 = omp_get_thread_num() * per, g1 = g0 + per < G ? g0 + per : G;
        if (g0 < g1) groups(type, by_m, a, M, w, bias, y, ldy, N, K, g0, g1);
    }
    return 0;
}
