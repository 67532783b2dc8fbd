/* Fused row operations of a decoder layer, each one pass over its rows instead of four to six torch
 * operators (and as many dispatches, which dominate at decode batch sizes). Rows are of the element type
 * (bf16, or fp32: ../simd.h's ``elem``); arithmetic is fp32, and every intermediate is rounded to the
 * element type where torch's sequence in that dtype rounds it (e() below; nothing in fp32), so results
 * match that sequence up to the last bit of exp and of the order of a row's sum of squares:
 *   rms_norm:     y = e(w * e(x * rsqrt(mean(x^2) + eps)))       (x, mean, rsqrt in fp32)
 *   add_rms_norm: h = e(x + d); y = rms_norm(h)                   (h is written back too)
 *   silu_mul:     y = e(e(silu(g)) * u) for gate_up rows [g | u]
 *   argmax:       torch.argmax of each row (the greedy sampler's, without widening the logits to fp32)
 * Written against the vector layer (../simd.h), built once per ISA and element type; the caller checks
 * the CPU. Each function's exported name carries the element type (rms_norm_bf16, rms_norm_f32, ...).
 */
#include <math.h>
#include <omp.h>

#include "../simd.h"

#define PAR_MIN_ELEMS 65536 /* below this one thread does the rows: a parallel region costs more */

/* x, y [rows, n]; d and h (both or neither) [rows, n]: h = x + d, normalised into y. */
void ELEM(rms_norm)(const elem *x, const elem *d, elem *h, const elem *w, elem *y, int64_t rows, int64_t n, float eps, int threads) {
    if (rows * n < PAR_MIN_ELEMS || threads < 2) {
        for (int64_t r = 0; r < rows; r++)
            norm_row(x + r * n, d ? d + r * n : 0, d ? h + r * n : 0, w, y + r * n, n, eps);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        norm_row(x + r * n, d ? d + r * n : 0, d ? h + r * n : 0, w, y + r * n, n, eps);
}

static void silu_mul_row(const elem *gu, elem *y, int64_t n) {
    for (int64_t i = 0; i < n; i += VL) {
        const vcount m = vtail(n, i);
        vstore_e_n(y + i, vmul(vsilu_e(vload_e_n(gu + i, m)), vload_e_n(gu + n + i, m)), m);
    }
}

/* gu [rows, 2n] (gate then up), y [rows, n]. */
void ELEM(silu_mul)(const elem *gu, elem *y, int64_t rows, int64_t n, int threads) {
    if (rows * n < PAR_MIN_ELEMS || threads < 2) {
        for (int64_t r = 0; r < rows; r++) silu_mul_row(gu + r * 2 * n, y + r * n, n);
        return;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) silu_mul_row(gu + r * 2 * n, y + r * n, n);
}

/* Rotate-half rotary embedding of rows [T, heads, D] read with a row stride (the q and k columns of a
 * fused qkv output), into out [T, heads, D] contiguous; cos and sin_signed are [T, D] (sin's first half
 * negated): out = e(e(x * cos) + e(roll(x, D/2) * sin_signed)), torch's rounding sequence. */
void ELEM(rotary)(const elem *x, int64_t row_stride, const elem *cos, const elem *sin, elem *out,
                 int64_t T, int64_t heads, int64_t D, int threads) {
    const int64_t half = D / 2;
#pragma omp parallel for num_threads(T * heads * D >= PAR_MIN_ELEMS && threads > 1 ? threads : 1) schedule(static)
    for (int64_t t = 0; t < T; t++) {
        const elem *c = cos + t * D, *s = sin + t * D;
        for (int64_t h = 0; h < heads; h++) {
            const elem *xr = x + t * row_stride + h * D;
            elem *o = out + (t * heads + h) * D;
            for (int64_t i = 0; i < D; i += VL) {
                const vcount m = vtail(D, i);
                /* roll(x, D/2)[i] = x[(i + D/2) mod D]: the other half, read in two pieces where a vector
                 * straddles the middle (only when half is not a multiple of VL) */
                vf rolled;
                if (i + VL <= half || i >= half) {
                    rolled = vload_e_n(xr + (i < half ? i + half : i - half), m);
                } else {
                    float tmp[VL];
                    for (int e = 0; e < VL && i + e < D; e++) tmp[e] = from_e(xr[(i + e + half) % D]);
                    rolled = vload_n(tmp, m);
                }
                const vf a = vround_e(vmul(vload_e_n(xr + i, m), vload_e_n(c + i, m)));
                const vf b = vround_e(vmul(rolled, vload_e_n(s + i, m)));
                vstore_e_n(o + i, vadd(a, b), m);
            }
        }
    }
}

/* First index of a row's largest value, as torch.argmax: a NaN counts as the largest (its first one wins),
 * and among equal values (0.0 and -0.0 too) the first index wins. Widening bf16 is exact and keeps order. */
static int64_t argmax_scalar(const elem *x, int64_t n) {
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v = from_e(x[i]);
        if (v != v) return i;
        if (v > from_e(x[at])) at = i;
    }
    return at;
}

/* Two passes over the row, which stays in cache between them: its largest value, kept in four maxima so
 * that no load waits on the one before it (one running value and index, blended lane by lane, made each
 * step wait on the last: slow where a blend is not a single instruction), then the first index holding
 * that value. A row with a NaN is scanned one value at a time. */
static int64_t argmax_row(const elem *x, int64_t n) {
    const int64_t full = n / (4 * VL) * (4 * VL);
    vf m[4] = {vset1(-INFINITY), vset1(-INFINITY), vset1(-INFINITY), vset1(-INFINITY)};
    vbool nan = vnone();
    for (int64_t i = 0; i < full; i += 4 * VL)
        for (int k = 0; k < 4; k++) {
            const vf v = vload_e(x + i + k * VL);
            nan = vor(nan, visnan(v));
            m[k] = vmax(m[k], v);
        }
    if (vany(nan)) return argmax_scalar(x, n);
    float top = vmaxall(vmax(vmax(m[0], m[1]), vmax(m[2], m[3])));
    for (int64_t i = full; i < n; i++) {
        const float v = from_e(x[i]);
        if (v != v) return argmax_scalar(x, n);
        if (v > top) top = v;
    }
    const vf t = vset1(top);
    for (int64_t i = 0; i < full; i += VL)
        if (vany(veq(vload_e(x + i), t)))
            for (int64_t j = i;; j++)
                if (from_e(x[j]) == top) return j;
    for (int64_t i = full; i < n; i++)
        if (from_e(x[i]) == top) return i;
    return 0;
}

/* x [rows, n] -> out [rows] int64. */
void ELEM(argmax)(const elem *x, int64_t *out, int64_t rows, int64_t n, int threads) {
#pragma omp parallel for num_threads(rows * n >= PAR_MIN_ELEMS && threads > 1 ? threads : 1) schedule(static)
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * n, n);
}
