/* The two row passes around an int8 product (kernels/gemm/int8.py), each one threaded pass where torch
 * takes four to six operators:
 *   quantize_rows_bf16: s = amax(|x|) / 127; q = sat8(rne(x * (127 / amax)))   (q = 0 where amax is 0)
 *   dequant_rows_bf16:  y = bf16(acc * sx[row] * sw[col] (+ bias[col]))         (left to right, in fp32)
 * Both are the torch reference sequences of int8.py operation for operation, so results match to the bit.
 * Needs AVX-512 BF16 (vcvtneps2bf16); the caller checks the CPU.
 */
#include <math.h>
#include <omp.h>

#include "../bf16_avx512.h"

#define PAR_MIN_ELEMS 65536 /* below this one thread does the rows: a parallel region costs more */

static void quantize_row(const uint16_t *x, int64_t k, int8_t *q, float *scale) {
    __m512 amax = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 16)
        amax = _mm512_max_ps(amax, _mm512_abs_ps(load_bf16(x + i, tail_mask(k, i))));
    const float a = _mm512_reduce_max_ps(amax);
    *scale = a / 127.0f;
    const __m512 inv = _mm512_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
    for (int64_t i = 0; i < k; i += 16) {
        __mmask16 m = tail_mask(k, i);
        /* cvtps_epi32 rounds to nearest even under the default MXCSR, as torch.round does */
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(load_bf16(x + i, m), inv));
        _mm_mask_storeu_epi8(q + i, m, _mm512_cvtsepi32_epi8(v));
    }
}

/* x [rows, k] bf16 -> q [rows, k] int8 and scale [rows] fp32. */
void quantize_rows_bf16(const uint16_t *x, int8_t *q, float *scale, int64_t rows, int64_t k, int threads) {
    if (rows * k < PAR_MIN_ELEMS || threads < 2) {
        for (int64_t r = 0; r < rows; r++) quantize_row(x + r * k, k, q + r * k, scale + r);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) quantize_row(x + r * k, k, q + r * k, scale + r);
}

static void dequant_row(const int32_t *acc, int64_t n, float sx, const float *sw, const uint16_t *bias,
                        uint16_t *y) {
    const __m512 s = _mm512_set1_ps(sx);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail_mask(n, i);
        __m512 v = _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, acc + i));
        v = _mm512_mul_ps(_mm512_mul_ps(v, s), _mm512_maskz_loadu_ps(m, sw + i));
        if (bias) v = _mm512_add_ps(v, load_bf16(bias + i, m));
        store_bf16(y + i, v, m);
    }
}

/* acc [rows, n] int32, sx [rows], sw [n], bias [n] bf16 or NULL -> y [rows, n] bf16. */
void dequant_rows_bf16(const int32_t *acc, const float *sx, const float *sw, const uint16_t *bias, uint16_t *y,
                       int64_t rows, int64_t n, int threads) {
    if (rows * n < PAR_MIN_ELEMS || threads < 2) {
        for (int64_t r = 0; r < rows; r++) dequant_row(acc + r * n, n, sx[r], sw, bias, y + r * n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) dequant_row(acc + r * n, n, sx[r], sw, bias, y + r * n);
}
