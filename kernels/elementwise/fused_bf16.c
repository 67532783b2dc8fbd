/* Fused bf16 row operations of a decoder layer, each one pass over its rows instead of four to six torch
 * operators (and as many dispatches, which dominate at decode batch sizes). Every intermediate is rounded
 * to bf16 where torch's bf16 sequence rounds it, so results match that sequence up to the last bit of exp
 * and of the order of a row's sum of squares:
 *   rms_norm:     y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))       (x, mean, rsqrt in fp32)
 *   add_rms_norm: h = bf16(x + d); y = rms_norm(h)                      (h is written back too)
 *   silu_mul:     y = bf16(bf16(silu(g)) * u) for gate_up rows [g | u]
 *   argmax:       torch.argmax of each row (the greedy sampler's, without widening the logits to fp32)
 * Needs AVX-512 BF16 (vcvtneps2bf16); the caller checks the CPU.
 */
#include <math.h>
#include <omp.h>

#include "../bf16_avx512.h"

#define PAR_MIN_ELEMS 65536 /* below this one thread does the rows: a parallel region costs more */

/* x, y [rows, n]; d and h (both or neither) [rows, n]: h = x + d, normalised into y. */
void rms_norm_bf16(const uint16_t *x, const uint16_t *d, uint16_t *h, const uint16_t *w, uint16_t *y,
                   int64_t rows, int64_t n, float eps, int threads) {
    if (rows * n < PAR_MIN_ELEMS || threads < 2) {
        for (int64_t r = 0; r < rows; r++)
            norm_row(x + r * n, d ? d + r * n : 0, d ? h + r * n : 0, w, y + r * n, n, eps);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * n, d ? d + r * n : 0, d ? h + r * n : 0, w, y + r * n, n, eps);
}

static void silu_mul_row(const uint16_t *gu, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n, i);
        store_bf16(y + i, _mm512_mul_ps(silu_bf16(load_bf16(gu + i, m)), load_bf16(gu + n + i, m)), m);
    }
}

/* gu [rows, 2n] (gate then up), y [rows, n]. */
void silu_mul_bf16(const uint16_t *gu, uint16_t *y, int64_t rows, int64_t n, int threads) {
    if (rows * n < PAR_MIN_ELEMS || threads < 2) {
        for (int64_t r = 0; r < rows; r++) silu_mul_row(gu + r * 2 * n, y + r * n, n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) silu_mul_row(gu + r * 2 * n, y + r * n, n);
}

/* Rotate-half rotary embedding of rows [T, heads, D] read with a row stride (the q and k columns of a
 * fused qkv output), into out [T, heads, D] contiguous; cos and sin_signed are [T, D] (sin's first half
 * negated): out = bf16(bf16(x * cos) + bf16(roll(x, D/2) * sin_signed)), torch's rounding sequence. */
void rotary_bf16(const uint16_t *x, int64_t row_stride, const uint16_t *cos, const uint16_t *sin, uint16_t *out,
                 int64_t T, int64_t heads, int64_t D, int threads) {
    const int64_t half = D / 2;
#pragma omp parallel for num_threads(T * heads * D >= PAR_MIN_ELEMS && threads > 1 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *c = cos + t * D, *s = sin + t * D;
        for (int64_t h = 0; h < heads; h++) {
            const uint16_t *xr = x + t * row_stride + h * D;
            uint16_t *o = out + (t * heads + h) * D;
            for (int64_t i = 0; i < D; i += 16) {
                __mmask16 m = tail_mask(D, i);
                /* roll(x, D/2)[i] = x[(i + D/2) mod D]: the other half, read in two pieces where a vector
                 * straddles the middle (only when half is not a multiple of 16) */
                __m512 rolled;
                if (i + 16 <= half || i >= half) {
                    rolled = load_bf16(xr + (i < half ? i + half : i - half), m);
                } else {
                    float tmp[16];
                    for (int e = 0; e < 16 && i + e < D; e++) {
                        int64_t j = (i + e + half) % D;
                        uint32_t u = (uint32_t)xr[j] << 16;
                        memcpy(&tmp[e], &u, 4);
                    }
                    rolled = _mm512_maskz_loadu_ps(m, tmp);
                }
                __m512 a = round_bf16(_mm512_mul_ps(load_bf16(xr + i, m), load_bf16(c + i, m)));
                __m512 b = round_bf16(_mm512_mul_ps(rolled, load_bf16(s + i, m)));
                store_bf16(o + i, _mm512_add_ps(a, b), m);
            }
        }
    }
}

/* First index of a row's largest value, as torch.argmax: a NaN counts as the largest (its first one wins),
 * and among equal values (0.0 and -0.0 too) the first index wins. Widening bf16 is exact and keeps order. */
static int64_t argmax_row(const uint16_t *x, int64_t n) {
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i best_i = _mm512_set1_epi32(-1);
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 nan = 0;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n, i);
        __m512 v = load_bf16(x + i, m);
        nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
        /* strictly greater, or the first -inf of a lane (best_i still -1): each lane keeps its first max */
        __mmask16 take = _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ)
                       | _mm512_mask_cmpeq_epi32_mask(m, best_i, _mm512_set1_epi32(-1));
        best = _mm512_mask_mov_ps(best, take, v);
        best_i = _mm512_mask_mov_epi32(best_i, take, idx);
        idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16));
    }
    if (nan) {
        for (int64_t i = 0; i < n; i++)
            if (from_bf16(x[i]) != from_bf16(x[i])) return i;
    }
    const float top = _mm512_reduce_max_ps(best);
    __mmask16 at_top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(top), _CMP_EQ_OQ) &
                       _mm512_cmpneq_epi32_mask(best_i, _mm512_set1_epi32(-1));
    /* lanes hold disjoint indices: the smallest index among the lanes at the top */
    return (int64_t)_mm512_mask_reduce_min_epi32(at_top, best_i);
}

/* x [rows, n] -> out [rows] int64. */
void argmax_bf16(const uint16_t *x, int64_t *out, int64_t rows, int64_t n, int threads) {
#pragma omp parallel for num_threads(rows * n >= PAR_MIN_ELEMS && threads > 1 ? threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
}
