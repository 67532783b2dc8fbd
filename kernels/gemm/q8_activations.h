/* The activations of the q8 products (gguf_q8.c, gguf_q8_blocks.c), quantized to int8 per block of 32 as
 * llama.cpp's q8 products quantize theirs, into one scratch layout that both kernels read: the first
 * segment of a fused weight quantizes the rows, and the others, of either kernel, read them there.
 */
#ifndef ACTORSERVE_Q8_ACTIVATIONS_H
#define ACTORSERVE_Q8_ACTIVATIONS_H

#include <immintrin.h>
#include <stdint.h>

#define QK 32 /* values an activation block */

/* M rows of K values in scratch: q[M K] int8 (from offset 0), then per block of 32 of each row its scale
 * d, the sum of its quants and s = d * sum, s16[2] = d times the sums of its two halves of 16 (for weights
 * with a minimum per 16 values) and sum16[2] those sums (for weights with an offset and a scale per 16).
 * The scratch holds M K + 64 + 28 M K / 32 bytes. */
typedef struct {
    int8_t *q;
    float *d;
    int32_t *sum;
    float *s;
    float *s16;
    int32_t *sum16;
} q8_rows;

static inline q8_rows q8_layout(uint8_t *scratch, int64_t M, int64_t K) {
    const int64_t nb = M * (K / QK);
    q8_rows a;
    a.q = (int8_t *)scratch;
    a.d = (float *)(scratch + ((M * K + 63) / 64) * 64);
    a.sum = (int32_t *)(a.d + nb);
    a.s = (float *)(a.sum + nb);
    a.s16 = a.s + nb;
    a.sum16 = (int32_t *)(a.s16 + 2 * nb);
    return a;
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1));
    return _mm_cvtsi128_si32(u);
}

/* Quantize M rows of K (a multiple of QK) fp32 values, per block of 32: d = max|x| / 127, q = round(x / d)
 * (to nearest even, clamped to [-127, 127] so that a NaN or infinite value gives a bound), sum = sum(q),
 * s = d * sum. Eight lanes at a time in either build (both have AVX2). */
static void q8_quantize(const float *x, int64_t M, int64_t K, q8_rows a) {
    const int64_t nb = K / QK;
    const __m256 sign = _mm256_set1_ps(-0.0f), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t m = 0; m < M; m++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + m * K + b * QK;
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
            }
            __m128 t = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            t = _mm_max_ps(t, _mm_movehl_ps(t, t));
            t = _mm_max_ss(t, _mm_movehdup_ps(t));
            const float db = _mm_cvtss_f32(t) / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
            const __m256 idv = _mm256_set1_ps(id);
            __m256i qi[4];
            for (int i = 0; i < 4; i++) /* max first: a NaN lane takes the bound (maxps returns its second operand) */
                qi[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[i], idv), lo), hi));
            /* 32 int32 to 32 int8 in order: the packs interleave 4-value groups, the permute restores them */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
            _mm256_storeu_si256((__m256i *)(a.q + m * K + b * QK), _mm256_permutevar8x32_epi32(p, order));
            const int32_t first = hsum_i32(_mm256_add_epi32(qi[0], qi[1]));
            const int32_t second = hsum_i32(_mm256_add_epi32(qi[2], qi[3]));
            const int64_t i = m * nb + b;
            a.d[i] = db;
            a.sum[i] = first + second;
            a.s[i] = db * (float)(first + second);
            a.s16[2 * i] = db * (float)first;
            a.s16[2 * i + 1] = db * (float)second;
            a.sum16[2 * i] = first;
            a.sum16[2 * i + 1] = second;
        }
}

#endif
