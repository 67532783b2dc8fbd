/* bf16 conversions and e^x for the AVX-512 BF16 C kernels, shared by every source that includes this.
 * bf16 is held as uint16_t; widening is exact, narrowing rounds to nearest even as torch does. */
#ifndef ACTORSERVE_BF16_AVX512_H
#define ACTORSERVE_BF16_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays a quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 16 lanes, the first n - i of them where fewer than 16 remain. */
static inline __mmask16 tail_mask(int64_t n, int64_t i) {
    return n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
}

static inline __m512 load_bf16(const uint16_t *p, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline void store_bf16(uint16_t *p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

/* To bf16 and back: the value torch would hold after rounding. */
static inline __m512 round_bf16(__m512 v) {
    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* e^x in fp32 (Cephes' polynomial, about 1 ulp); overflows to inf as expf does (so silu(-100) is -0),
 * and flushes below e^-87.3 to that smallest normal value. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(127.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, k);
}

/* One row of RMSNorm, or of residual add + RMSNorm where d is given: h = bf16(x + d) (h may be x itself),
 * y = bf16(w * bf16(h * rsqrt(mean(h^2) + eps))). Shared so that fused passes elsewhere (the int8
 * layer seam) compute the elementwise kernel's bits. */
static inline void norm_row(const uint16_t *x, const uint16_t *d, uint16_t *h, const uint16_t *w, uint16_t *y,
                     int64_t n, float eps) {
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n, i);
        __m512 v = load_bf16(x + i, m);
        if (d) {
            v = round_bf16(_mm512_add_ps(v, load_bf16(d + i, m)));
            store_bf16(h + i, v, m);
        }
        ss = _mm512_fmadd_ps(v, v, ss);
    }
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(ss) / (float)n + eps));
    const uint16_t *src = d ? h : x;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n, i);
        __m512 v = round_bf16(_mm512_mul_ps(load_bf16(src + i, m), r));
        store_bf16(y + i, _mm512_mul_ps(v, load_bf16(w + i, m)), m);
    }
}

/* silu(g) = g / (1 + e^-g) in fp32, rounded to bf16 as torch's bf16 F.silu rounds it. */
static inline __m512 silu_bf16(__m512 g) {
    return round_bf16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), exp512(_mm512_sub_ps(_mm512_setzero_ps(), g)))));
}

#endif
