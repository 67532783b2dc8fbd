/* Products of GGUF weights with activations quantized to int8 per block of 32, as llama.cpp's q8 dot
 * products compute them: integer dot products of the weight's quants with the activation's, scaled per
 * block. Approximate (the activations lose precision); the fp32-activation kernel (gguf_blocks.c) is the
 * exact one.
 *
 * The weights are repacked once at load (``gguf_q8_pack``), 16 rows at a time, into as many bytes as the
 * file holds them: for each block of 32 values, the 16 rows' fp16 scales d[16] (Q4_1: then their minima
 * m[16]), then their quants with the 4 bytes of a row side by side in 32-bit lanes:
 *   Q4_0 / Q4_1: 4 chunks of 64 bytes; lane r of chunk c is bytes 4c .. 4c + 3 of row r's 16 bytes of
 *       nibbles, so chunk c's low nibbles are values 4c .. 4c + 3 of the 16 rows, and its high ones values
 *       16 + 4c .. 16 + 4c + 3;
 *   Q8_0: 8 chunks of 64 bytes; lane r of chunk g is values 4g .. 4g + 3 of row r, each + 128 as a uint8.
 * One multiply-accumulate of 4 uint8 x int8 pairs per lane (vpdpbusd) then gives 16 rows' partial dot
 * products with the same 4 activation values, broadcast: 16 output rows a vector, no horizontal sums.
 * The weights' offsets come out in the block's integer sum: sum((q - 8) x) = sum(q x) - 8 sum(x) for
 * Q4_0, the same with 128 for the shifted Q8_0, and Q4_1's minimum m adds m * d_x * sum(x).
 *
 * Built for AVX-512 VNNI (16 lanes) or for AVX2 (two halves of 8 lanes, vpmaddubsw then vpmaddwd: Q4
 * products summed in 16 bits over a block, which cannot overflow, 15 * 127 * 2 * 8 < 2^15; Q8_0's signs
 * moved onto the activations so that the 16-bit pair sums stay in range). The caller checks the CPU.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "../prefetch.h"
#include "q8_activations.h"

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8 }; /* ggml's type numbers */
#define R 16    /* weight rows packed together */
#define MT 8    /* activation rows a pass over a group of weight rows */

static inline int block_bytes(int type) { return type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q8_0 ? 34 : 0; }
static inline int scale_bytes(int type) { return type == Q4_1 ? 4 * R : 2 * R; }
static inline int64_t record_bytes(int type) { return (int64_t)block_bytes(type) * R; }

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* ---------------------------------------------------------------------------------------- AVX-512 VNNI */
#define HALVES 1
typedef __m512i vi;
typedef __m512 vq;
static inline vi chunk(const uint8_t *p, int h) { (void)h; return _mm512_loadu_si512(p); }
static inline vi lo_nibbles(vi v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
static inline vi hi_nibbles(vi v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
static inline vi ibcast(int32_t v) { return _mm512_set1_epi32(v); }
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
static inline vq fset1(float v) { return _mm512_set1_ps(v); }
static inline vq fzero(void) { return _mm512_setzero_ps(); }
static inline vq fma_i(vi i, vq s, vq acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), s, acc); }
static inline vq fmul(vq a, vq b) { return _mm512_mul_ps(a, b); }
static inline vq ffma(vq a, vq b, vq c) { return _mm512_fmadd_ps(a, b, c); }
static inline void fstore(float *p, vq v, int n) { _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), v); }
#define FL 16
#define Q8_OFFSET 128 /* the shifted Q8_0 quants' offset, taken out of the integer sum */

#elif defined(__AVX2__) && defined(__FMA__)
/* ----------------------------------------------------------------------------------------------- AVX2 */
#define HALVES 2
typedef __m256i vi;
typedef __m256 vq;
static inline vi chunk(const uint8_t *p, int h) { return _mm256_loadu_si256((const __m256i *)(p + 32 * h)); }
static inline vi lo_nibbles(vi v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
static inline vi hi_nibbles(vi v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
static inline vi ibcast(int32_t v) { return _mm256_set1_epi32(v); }
static inline vi x4(const int8_t *x) { int32_t v; memcpy(&v, x, 4); return _mm256_set1_epi32(v); }
/* acc + per lane the sum of 4 products: w's uint8 by the 4 int8 at x, broadcast */
static inline vq scales(const uint8_t *p, int h) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
}
static inline vq fset1(float v) { return _mm256_set1_ps(v); }
static inline vq fzero(void) { return _mm256_setzero_ps(); }
static inline vq fma_i(vi i, vq s, vq acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), s, acc); }
static inline vq fmul(vq a, vq b) { return _mm256_mul_ps(a, b); }
static inline vq ffma(vq a, vq b, vq c) { return _mm256_fmadd_ps(a, b, c); }
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
#define Q8_OFFSET 0 /* the signs go onto the activations instead (vpsignb), so no offset */

#else
#error "gguf_q8.c needs AVX-512 VNNI or AVX2 with FMA: native.py passes the flags of one"
#endif

/* The integer dot products of one block of a group with MM activation rows, for half h of the group's
 * lanes: acc[m] (lanes = rows of the group) = sum over the block of w * q_x, less the weights' offset. */
static inline __attribute__((always_inline)) void block_dots(
        int type, const uint8_t *qs, int h, const int8_t *const *xb, const int32_t *xsum, int64_t nb, int64_t b,
        int MM, vi *acc) {
#if HALVES == 1
    const int32_t offset = type == Q4_0 ? 8 : type == Q8_0 ? Q8_OFFSET : 0;
    for (int m = 0; m < MM; m++) acc[m] = ibcast(-offset * xsum[m * nb + b]);
    if (type == Q8_0) {
        for (int g = 0; g < 8; g++) {
            const vi w = chunk(qs + 64 * g, h);
            for (int m = 0; m < MM; m++) acc[m] = dot4x(acc[m], w, xb[m] + 4 * g);
        }
        return;
    }
    for (int c = 0; c < 4; c++) {
        const vi v = chunk(qs + 64 * c, h), lo = lo_nibbles(v), hi = hi_nibbles(v);
        for (int m = 0; m < MM; m++) {
            acc[m] = dot4x(acc[m], lo, xb[m] + 4 * c);
            acc[m] = dot4x(acc[m], hi, xb[m] + 16 + 4 * c);
        }
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (type == Q8_0) { /* |w| by x with w's sign: pair sums of at most 2 * 128 * 127, each widened at once */
        for (int m = 0; m < MM; m++) acc[m] = _mm256_setzero_si256();
        for (int g = 0; g < 8; g++) {
            const vi w = _mm256_xor_si256(chunk(qs + 64 * g, h), _mm256_set1_epi8((char)0x80));
            const vi aw = _mm256_abs_epi8(w);
            for (int m = 0; m < MM; m++) {
                const vi p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x4(xb[m] + 4 * g), w));
                acc[m] = _mm256_add_epi32(acc[m], _mm256_madd_epi16(p, ones));
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
    const int32_t offset = type == Q4_0 ? 8 : 0;
    for (int m = 0; m < MM; m++)
        acc[m] = _mm256_add_epi32(_mm256_madd_epi16(s16[m], ones), ibcast(-offset * xsum[m * nb + b]));
#endif
}

/* Rows [g0 * R, g1 * R) of y (at most N) for MM activation rows starting at row m0. Where ahead is set, the
 * first half's pass asks for the records at ahead (the next group's) block by block, one group ahead of its
 * reads: the weight streams from memory, and the hardware prefetcher alone leaves the loads waiting. */
static inline __attribute__((always_inline)) void groups_mm(
        int type, const int8_t *xq, const float *xd, const int32_t *xsum, const float *xs, int MM, int64_t m0,
        const uint8_t *w, const float *bias, float *y, int64_t ldy, int64_t N, int64_t K, int64_t g0, int64_t g1,
        const uint8_t *ahead) {
    const int64_t nb = K / QK, rec = record_bytes(type), sb = scale_bytes(type);
    const int8_t *xrow[MT];
    for (int64_t g = g0; g < g1; g++)
        for (int h = 0; h < HALVES; h++) {
            vq accf[MT];
            for (int m = 0; m < MM; m++) accf[m] = fzero();
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *r = w + (g * nb + b) * rec;
                if (ahead && h == 0) prefetch_lines(ahead + b * rec, rec);
                for (int m = 0; m < MM; m++) xrow[m] = xq + (m0 + m) * K + b * QK;
                vi acc[MT];
                block_dots(type, r + sb, h, xrow, xsum + m0 * nb, nb, b, MM, acc);
                const vq dw = scales(r, h);
                for (int m = 0; m < MM; m++) accf[m] = fma_i(acc[m], fmul(dw, fset1(xd[(m0 + m) * nb + b])), accf[m]);
                if (type == Q4_1) {
                    const vq mw = scales(r + 2 * R, h);
                    for (int m = 0; m < MM; m++) accf[m] = ffma(mw, fset1(xs[(m0 + m) * nb + b]), accf[m]);
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
#if HALVES == 1
                    v = _mm512_add_ps(v, _mm512_loadu_ps(t));
#else
                    v = _mm256_add_ps(v, _mm256_loadu_ps(t));
#endif
                }
                fstore(y + (m0 + m) * ldy + n0, v, n);
            }
        }
}

/* The clones, one per type and activation-row count, so that the loops over rows unroll. */
typedef void (*groups_fn)(const int8_t *, const float *, const int32_t *, const float *, int64_t, const uint8_t *,
                          const float *, float *, int64_t, int64_t, int64_t, int64_t, int64_t, const uint8_t *);
#define GROUPS_TM(t, mm)                                                                                     \
    static void groups_##t##_##mm(const int8_t *xq, const float *xd, const int32_t *xsum, const float *xs,   \
                                  int64_t m0, const uint8_t *w, const float *bias, float *y, int64_t ldy,    \
                                  int64_t N, int64_t K, int64_t g0, int64_t g1, const uint8_t *ahead) {      \
        groups_mm(t, xq, xd, xsum, xs, mm, m0, w, bias, y, ldy, N, K, g0, g1, ahead);                        \
    }
#define GROUPS_T(t)                                                                                          \
    GROUPS_TM(t, 1) GROUPS_TM(t, 2) GROUPS_TM(t, 3) GROUPS_TM(t, 4) GROUPS_TM(t, 5) GROUPS_TM(t, 6)           \
    GROUPS_TM(t, 7) GROUPS_TM(t, 8) static const groups_fn groups_##t[MT] = {                                \
        groups_##t##_1, groups_##t##_2, groups_##t##_3, groups_##t##_4,                                      \
        groups_##t##_5, groups_##t##_6, groups_##t##_7, groups_##t##_8};
GROUPS_T(Q4_0) GROUPS_T(Q4_1) GROUPS_T(Q8_0)

/* Groups [g0, g1) for all M rows: the m-tiles inside, so that a group's weights are read from memory
 * once and from cache by the tiles after the first; the first tile asks for the next group's. */
static void groups(int type, const int8_t *xq, const float *xd, const int32_t *xsum, const float *xs, int64_t M,
                   const uint8_t *w, const float *bias, float *y, int64_t ldy, int64_t N, int64_t K, int64_t g0,
                   int64_t g1) {
    const groups_fn *by_m = type == Q4_0 ? groups_Q4_0 : type == Q4_1 ? groups_Q4_1 : groups_Q8_0;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int64_t mm = M - m0 < MT ? M - m0 : MT;
            const uint8_t *ahead = m0 == 0 && g + 1 < g1 ? w + (g + 1) * (K / QK) * record_bytes(type) : NULL;
            by_m[mm - 1](xq, xd, xsum, xs, m0, w, bias, y, ldy, N, K, g, g + 1, ahead);
        }
}

/* y[M, N] (row stride ldy) = x[M, K] . W^T (+ bias), W the N rows packed at w by ``gguf_q8_pack``. The
 * rows of x are quantized into scratch (``q8_layout``) where ``quantize_x`` is set; else scratch holds them
 * from an earlier call with the same x (of this kernel or of gguf_q8_blocks.c's). Returns 0, or -1 where the type or shape is not one
 * this kernel takes. */
int gguf_q8_linear(int type, const float *x, int64_t M, const uint8_t *w, const float *bias, float *y, int64_t ldy,
                   int64_t N, int64_t K, int threads, uint8_t *scratch, int quantize_x) {
    if (!block_bytes(type) || K % QK || M < 1 || N < 1) return -1;
    const q8_rows a = q8_layout(scratch, M, K);
    if (quantize_x) q8_quantize(x, M, K, a);
    const int8_t *xq = a.q;
    const float *xd = a.d, *xs = a.s;
    const int32_t *xsum = a.sum;
    const int64_t G = (N + R - 1) / R;
    if (threads < 1) threads = 1;
    if (threads == 1 || G < 4) {
        groups(type, xq, xd, xsum, xs, M, w, bias, y, ldy, N, K, 0, G);
        return 0;
    }
    const int64_t per = (G + threads - 1) / threads;
#pragma omp parallel num_threads(threads)
    {
        const int64_t a = omp_get_thread_num() * per, b = a + per < G ? a + per : G;
        if (a < b) groups(type, xq, xd, xsum, xs, M, w, bias, y, ldy, N, K, a, b);
    }
    return 0;
}

/* The N rows of file blocks at src (each K / 32 blocks of the type) into the packed layout at dst
 * (``gguf_q8_packed_bytes``); rows past N in the last group are zeros. */
int64_t gguf_q8_packed_bytes(int type, int64_t N, int64_t K) { return (N + R - 1) / R * (K / QK) * record_bytes(type); }

int gguf_q8_pack(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    if (!block_bytes(type) || K % QK) return -1;
    const int64_t nb = K / QK, bytes = block_bytes(type), rec = record_bytes(type), sb = scale_bytes(type);
    const int64_t G = (N + R - 1) / R;
    memset(dst, 0, (size_t)gguf_q8_packed_bytes(type, N, K));
    for (int64_t g = 0; g < G; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *r = dst + (g * nb + b) * rec;
            for (int lane = 0; lane < R; lane++) {
                const int64_t n = g * R + lane;
                if (n >= N) {
                    if (type == Q8_0) /* a zero row: quants 0, stored + 128 */
                        for (int c = 0; c < 8; c++) memset(r + sb + 64 * c + 4 * lane, 0x80, 4);
                    continue;
                }
                const uint8_t *blk = src + (n * nb + b) * bytes;
                memcpy(r + 2 * lane, blk, 2);                       /* d */
                if (type == Q4_1) memcpy(r + 2 * R + 2 * lane, blk + 2, 2); /* m */
                const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
                const int chunks = type == Q8_0 ? 8 : 4;
                for (int c = 0; c < chunks; c++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t v = qs[4 * c + i];
                        r[sb + 64 * c + 4 * lane + i] = type == Q8_0 ? (uint8_t)(v ^ 0x80) : v;
                    }
            }
        }
    return 0;
}

/* out[i, K] fp32 = row ids[i] of the packed weight (of N rows): the reference decoder's values. */
int gguf_q8_rows(int type, const uint8_t *w, const int64_t *ids, int64_t n_ids, int64_t N, int64_t K, float *out) {
    if (!block_bytes(type) || K % QK) return -1;
    const int64_t nb = K / QK, rec = record_bytes(type), sb = scale_bytes(type);
    for (int64_t i = 0; i < n_ids; i++) {
        const int64_t n = ids[i];
        if (n < 0 || n >= N) return -1;
        const int64_t g = n / R, lane = n % R;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *r = w + (g * nb + b) * rec;
            const float d = half(r + 2 * lane), mn = type == Q4_1 ? half(r + 2 * R + 2 * lane) : 0.0f;
            float *o = out + i * K + b * QK;
            for (int k = 0; k < QK; k++) {
                float v;
                if (type == Q8_0) {
                    v = (float)(int8_t)(r[sb + 64 * (k / 4) + 4 * lane + k % 4] ^ 0x80) * d;
                } else {
                    const int j = k % 16;
                    const uint8_t byte = r[sb + 64 * (j / 4) + 4 * lane + j % 4];
                    const int q = k < 16 ? byte & 0x0F : byte >> 4;
                    v = type == Q4_1 ? fmaf(d, (float)q, mn) : d * (float)(q - 8);
                }
                o[k] = v;
            }
        }
    }
    return 0;
}
