/* y[M, N] = x[M, K] . w[N, K]^T (+ bias[N]) for bf16 x, w, bias and y, accumulated in fp32.
 *
 * For the few-row products of decode steps (M up to about 8) the cost is reading w once from memory, and
 * oneDNN's bf16 path reads it well below the machine's bandwidth there (bench/gemm_paths.py).
 * Each thread takes a contiguous range of output rows; blocks of BLOCK rows of w are read once and
 * reused, from L1, for every row of x. Written against the vector layer (../simd.h), built once per ISA;
 * the caller checks the CPU.
 * Threads come from the OpenMP runtime torch has already loaded (same soname), so they are torch's.
 */
#include <omp.h>

#include "../simd.h"

#define BLOCK 8

static void rows(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                 int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
    const int64_t full = K / VDOT * VDOT;
    const int tail = (int)(K - full);
    for (int64_t n = n0; n < n1; n += BLOCK) {
        const int64_t nr = n1 - n < BLOCK ? n1 - n : BLOCK;
        const uint16_t *wn = w + n * K;
        for (int64_t m = 0; m < M; m++) {
            const uint16_t *xm = x + m * K;
            vf acc[BLOCK];
            for (int r = 0; r < BLOCK; r++) acc[r] = vzero();
            if (nr == BLOCK) {
                for (int64_t k = 0; k < full; k += VDOT) {
#pragma GCC unroll 8
                    for (int r = 0; r < BLOCK; r++) {
                        _mm_prefetch((const char *)(wn + (r + 2 * BLOCK) * K + k), _MM_HINT_T0);
                        acc[r] = vdot_bf16(acc[r], xm + k, wn + r * K + k);
                    }
                }
            } else {
                for (int64_t k = 0; k < full; k += VDOT)
                    for (int64_t r = 0; r < nr; r++) acc[r] = vdot_bf16(acc[r], xm + k, wn + r * K + k);
            }
            if (tail)
                for (int64_t r = 0; r < nr; r++) acc[r] = vdot_bf16_n(acc[r], xm + full, wn + r * K + full, tail);
            for (int64_t r = 0; r < nr; r++) {
                float s = vsum(acc[r]);
                if (bias) s += from_bf16(bias[n + r]);
                y[m * N + n + r] = to_bf16(s);
            }
        }
    }
}

void skinny_linear_bf16(const uint16_t *x, const uint16_t *w, const uint16_t *bias, uint16_t *y,
                        int64_t M, int64_t N, int64_t K, int threads) {
    if (threads < 1) threads = 1;
    int64_t per = ((N + threads - 1) / threads + BLOCK - 1) / BLOCK * BLOCK;
    if (threads == 1 || N <= BLOCK) {
        rows(x, w, bias, y, M, N, K, 0, N);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int64_t t = omp_get_thread_num();
        int64_t a = t * per, b = a + per < N ? a + per : N;
        if (a < b) rows(x, w, bias, y, M, N, K, a, b);
    }
}
