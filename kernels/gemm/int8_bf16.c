/* The two row passes around an int8 product (kernels/gemm/int8.py), each one threaded pass where torch
 * takes four to six operators:
 *   quantize_rows_bf16: s = amax(|x|) / 127; q = sat8(rne(x * (127 / amax)))   (q = 0 where amax is 0)
 *   dequant_rows_bf16:  y = bf16(acc * sx[row] * sw[col] (+ bias[col]))         (left to right, in fp32)
 *   silu_mul_quantize_rows: dequant_rows of a gate_up product [g | u], then silu_mul (the elementwise
 *       kernel's bf16 sequence), then quantize_rows: the MLP's middle in one pass, with no bf16 rows
 *       written between the two int8 products
 * Each is the torch reference sequence of int8.py operation for operation, so results match to the bit.
 * Written against the vector layer (../simd.h), built once per ISA; the caller checks the CPU.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "../prefetch.h"
#include "../simd.h"

#define PAR_MIN_ELEMS 65536 /* below this one thread does the rows: a parallel region costs more */

/* The row's scale (amax / 127) into *scale; the multiplier that maps the row onto [-127, 127]. */
static inline vf row_scale(float amax, float *scale) {
    *scale = amax / 127.0f;
    return vset1(amax > 0.0f ? 127.0f / amax : 0.0f);
}

static void quantize_row(const uint16_t *x, int64_t k, int8_t *q, float *scale) {
    vf amax = vzero();
    for (int64_t i = 0; i < k; i += VL) amax = vmax(amax, vabs(vload_bf16_n(x + i, vtail(k, i))));
    const vf inv = row_scale(vmaxall(amax), scale);
    for (int64_t i = 0; i < k; i += VL) {
        const vcount m = vtail(k, i);
        vstore_i8_n(q + i, vmul(vload_bf16_n(x + i, m), inv), m);
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
    const vf s = vset1(sx);
    for (int64_t i = 0; i < n; i += VL) {
        const vcount m = vtail(n, i);
        vf v = vmul(vmul(vload_i32_n(acc + i, m), s), vload_n(sw + i, m));
        if (bias) v = vadd(v, vload_bf16_n(bias + i, m));
        vstore_bf16_n(y + i, v, m);
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

static void silu_mul_quantize_row(const int32_t *acc, int64_t n, float sx, const float *sw, float *h, int8_t *q,
                                  float *scale) {
    const vf s = vset1(sx);
    vf amax = vzero();
    for (int64_t i = 0; i < n; i += VL) {
        const vcount m = vtail(n, i);
        const vf g = vround_bf16(vmul(vmul(vload_i32_n(acc + i, m), s), vload_n(sw + i, m)));
        const vf u = vround_bf16(vmul(vmul(vload_i32_n(acc + n + i, m), s), vload_n(sw + n + i, m)));
        const vf v = vround_bf16(vmul(vsilu_e(g), u));
        vstore_n(h + i, v, m);
        amax = vmax(amax, vkeep(vabs(v), m));
    }
    const vf inv = row_scale(vmaxall(amax), scale);
    for (int64_t i = 0; i < n; i += VL) {
        const vcount m = vtail(n, i);
        vstore_i8_n(q + i, vmul(vload_n(h + i, m), inv), m);
    }
}

/* acc [rows, 2n] int32 (gate then up), sx [rows], sw [2n] -> q [rows, n] int8 and scale [rows].
 * Returns 0, or -1 where the row buffer could not be allocated. */
int silu_mul_quantize_rows(const int32_t *acc, const float *sx, const float *sw, int8_t *q, float *scale,
                           int64_t rows, int64_t n, int threads) {
    int failed = 0;
#pragma omp parallel num_threads(rows * n >= PAR_MIN_ELEMS && threads > 1 ? threads : 1)
    {
        float *h = (float *)malloc(sizeof(float) * (n > 0 ? n : 1));
        if (!h) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            if (h) silu_mul_quantize_row(acc + r * 2 * n, n, sx[r], sw, h, q + r * n, scale + r);
        free(h);
    }
    return failed ? -1 : 0;
}

/* The seam between two int8 products of a decoder layer, in one pass: the first product dequantized
 * (dequant_rows), added into the residual stream and normalised (the elementwise kernel's add_rms_norm),
 * and quantized for the next product (quantize_rows); only the residual is written in bf16.
 * acc [rows, n] int32, sx [rows], sw [n], bias [n] bf16 or NULL; res_in, res_out [rows, n] bf16 (may be
 * one buffer); w [n] -> q [rows, n] int8, scale [rows]. Returns 0, or -1 where the row buffers could not
 * be allocated. */
int dequant_add_norm_quantize_rows(const int32_t *acc, const float *sx, const float *sw, const uint16_t *bias,
                                   const uint16_t *res_in, uint16_t *res_out, const uint16_t *w, float eps,
                                   int8_t *q, float *scale, int64_t rows, int64_t n, int threads) {
    int failed = 0;
#pragma omp parallel num_threads(rows * n >= PAR_MIN_ELEMS && threads > 1 ? threads : 1)
    {
        uint16_t *y = (uint16_t *)malloc(sizeof(uint16_t) * 2 * (n > 0 ? n : 1));
        if (!y) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!y) continue;
            dequant_row(acc + r * n, n, sx[r], sw, bias, y);
            norm_row(res_in + r * n, y, res_out + r * n, w, y + n, n, eps);
            quantize_row(y + n, n, q + r * n, scale + r);
        }
        free(y);
    }
    return failed ? -1 : 0;
}

/* acc[M, N] = q[M, K] . w[N, K]^T in int32, exactly, for the CPUs whose int8 product (oneDNN's) would
 * saturate: without a 4-way integer dot, byte products are summed in pairs in 16 bits (vpmaddubsw), and
 * oneDNN's shift of q to unsigned bytes lets a pair reach 2 x 255 x 127. Here the sign of w goes onto q
 * instead (vpsignb), so each pair is |w| x (+-q) with both in [0, 127] and [-127, 127]: at most
 * 2 x 127 x 127, which fits. Both q and w must lie in [-127, 127] (the quantizers clamp there). Blocks of
 * BLOCK rows of w are read once and reused, from L1, for every row of q. AVX2 instructions, in either
 * build. */
#define I8_BLOCK 4

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

static inline __m256i dot32(__m256i acc, __m256i w, __m256i x, __m256i ones) {
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
}

static void int8_rows(const int8_t *q, const int8_t *w, int32_t *acc, int64_t ld, int64_t M, int64_t K,
                      int64_t n0, int64_t n1) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int64_t full = K / 32 * 32;
    for (int64_t n = n0; n < n1; n += I8_BLOCK) {
        const int64_t nr = n1 - n < I8_BLOCK ? n1 - n : I8_BLOCK;
        const int8_t *wn = w + n * K;
        prefetch_stream(wn, nr * K, w + n1 * K);
        for (int64_t m = 0; m < M; m++) {
            const int8_t *qm = q + m * K;
            __m256i a[I8_BLOCK];
            for (int r = 0; r < I8_BLOCK; r++) a[r] = _mm256_setzero_si256();
            if (nr == I8_BLOCK) {
                for (int64_t k = 0; k < full; k += 32) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(qm + k));
#pragma GCC unroll 4
                    for (int r = 0; r < I8_BLOCK; r++)
                        a[r] = dot32(a[r], _mm256_loadu_si256((const __m256i *)(wn + r * K + k)), x, ones);
                }
            } else {
                for (int64_t k = 0; k < full; k += 32) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(qm + k));
                    for (int64_t r = 0; r < nr; r++)
                        a[r] = dot32(a[r], _mm256_loadu_si256((const __m256i *)(wn + r * K + k)), x, ones);
                }
            }
            for (int64_t r = 0; r < nr; r++) {
                int32_t s = hsum_epi32(a[r]);
                for (int64_t k = full; k < K; k++) s += (int32_t)qm[k] * (int32_t)wn[r * K + k];
                acc[m * ld + n + r] = s;
            }
        }
    }
}

void int8_product(const int8_t *q, const int8_t *w, int32_t *acc, int64_t M, int64_t N, int64_t K, int threads) {
    if (threads < 2 || M * N * K < PAR_MIN_ELEMS * 16) {
        int8_rows(q, w, acc, N, M, K, 0, N);
        return;
    }
    const int64_t per = ((N + threads - 1) / threads + I8_BLOCK - 1) / I8_BLOCK * I8_BLOCK;
#pragma omp parallel num_threads(threads)
    {
        const int64_t a = omp_get_thread_num() * per, b = a + per < N ? a + per : N;
        if (a < b) int8_rows(q, w, acc, N, M, K, a, b);
    }
}
