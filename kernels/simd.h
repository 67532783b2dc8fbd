/* The vector layer of the C kernels: one API over fp32 lanes, bf16 held as uint16_t, and the conversions
 * and e^x they need, built for the ISA the compiler targets. Every kernel source is written once against
 * it; native.py builds each source once per ISA (its flags pick the branch below):
 *   AVX-512 BF16 (-mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mf16c): 16 lanes, masked tails, vcvtneps2bf16
 *       and vdpbf16ps;
 *   AVX2 + FMA + F16C (-mavx2 -mfma -mf16c): 8 lanes, tails through a small buffer, bf16 widened by a
 *       shift and rounded to nearest even in integer arithmetic (as torch rounds).
 * A tail is a lane count (``vcount``): the lanes i .. i + n - 1 of a row of n, at most VL of them. Loads
 * read zeros past it and stores leave memory past it alone.
 */
#ifndef ACTORSERVE_SIMD_H
#define ACTORSERVE_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int vcount;

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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
/* ------------------------------------------------------------------------------------------------ AVX-512 */
#define VL 16
#define SIMD_ISA "avx512_bf16"
typedef __m512 vf;
typedef __mmask16 vbool; /* one bit per lane */

static inline __mmask16 lanes(vcount n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf viota(void) { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
/* The fp16 values at p and p + 2, each widened into every lane: a 32-bit broadcast load, one convert and
 * two in-lane duplicates, where widening and broadcasting each value alone takes twice the shuffles */
static inline void vset1_halves(const uint8_t *p, vf *a, vf *b) {
    int32_t v;
    memcpy(&v, p, 4);
    const vf both = _mm512_cvtph_ps(_mm256_set1_epi32(v));
    *a = _mm512_moveldup_ps(both);
    *b = _mm512_movehdup_ps(both);
}
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); } /* b where either is NaN, as maxps */
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vfmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vabs(vf a) { return _mm512_abs_ps(a); }
static inline float vsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline float vmaxall(vf a) { return _mm512_reduce_max_ps(a); }

static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vload_n(const float *p, vcount n) { return _mm512_maskz_loadu_ps(lanes(n), p); }
static inline void vstore_n(float *p, vf v, vcount n) { _mm512_mask_storeu_ps(p, lanes(n), v); }
static inline vf vload_i32_n(const int32_t *p, vcount n) {
    return _mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(lanes(n), p));
}
/* v where the lane is below n, else 0 */
static inline vf vkeep(vf v, vcount n) { return _mm512_maskz_mov_ps(lanes(n), v); }

static inline vf vload_bf16_n(const uint16_t *p, vcount n) {
    __m256i h = _mm256_maskz_loadu_epi16(lanes(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline vf vload_bf16(const uint16_t *p) { return vload_bf16_n(p, 16); }
static inline void vstore_bf16_n(uint16_t *p, vf v, vcount n) {
    _mm256_mask_storeu_epi16(p, lanes(n), (__m256i)_mm512_cvtneps_pbh(v));
}
/* To bf16 and back: the value torch would hold after rounding. */
static inline vf vround_bf16(vf v) {
    __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* acc + the products of 2 * VL bf16 pairs, summed pairwise into VL lanes (which pair goes to which lane
 * is the ISA's business: the caller only ever sums the lanes) */
#define VDOT 32
static inline vf vdot_bf16(vf acc, const uint16_t *a, const uint16_t *b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
}
/* the same over the first n < VDOT pairs */
static inline vf vdot_bf16_n(vf acc, const uint16_t *a, const uint16_t *b, int n) {
    const __mmask32 m = (__mmask32)((1ull << n) - 1);
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(m, a), (__m512bh)_mm512_maskz_loadu_epi16(m, b));
}

/* q[0 .. n) = saturate_int8(round_half_even(v)) under the default MXCSR, as torch.round then clamp */
static inline void vstore_i8_n(int8_t *q, vf v, vcount n) {
    _mm_mask_storeu_epi8(q, lanes(n), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}

/* 16 bytes to floats, VL at a time: out[0 .. 16 / VL) */
static inline void vexpand_u8(__m128i b, vf *out) { out[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }
/* table[q] for the 16 nibbles q of the bytes p[0 .. 16), their low ones (their high ones where high): one
 * permute a lane, where widening, converting and scaling take three (only this ISA has a 16-entry
 * permute of its own; VLUT16 says so). The permute reads an index's low 4 bits, so no mask is needed. */
#define VLUT16 1
static inline vf vlut16_nibbles(const uint8_t *p, int high, vf table) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm512_permutexvar_ps(high ? _mm512_srli_epi32(b, 4) : b, table);
}
/* vlut16_nibbles with its lanes in another order, for a caller that only multiplies them by values it has
 * put in the same order (``VLUT16_SPREAD``) and sums: lane i holds the nibble of byte 4 (i % 4) + i / 4.
 * The 16 bytes are broadcast as they are loaded and each lane shifts its own byte down, where widening
 * them in order takes a shuffle, and this ISA's shuffles and permutes share the one port that the
 * table's permute keeps busy already. */
#define VLUT16_SPREAD(i) (4 * ((i) % 4) + (i) / 4)
static inline vf vlut16_spread(const uint8_t *p, int high, vf table) {
    const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
    const __m512i shift = _mm512_add_epi32(_mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0),
                                           _mm512_set1_epi32(high ? 4 : 0));
    return _mm512_permutexvar_ps(_mm512_srlv_epi32(b, shift), table);
}
static inline __m512i vspread_order(void) {
    return _mm512_setr_epi32(VLUT16_SPREAD(0), VLUT16_SPREAD(1), VLUT16_SPREAD(2), VLUT16_SPREAD(3), VLUT16_SPREAD(4),
                             VLUT16_SPREAD(5), VLUT16_SPREAD(6), VLUT16_SPREAD(7), VLUT16_SPREAD(8), VLUT16_SPREAD(9),
                             VLUT16_SPREAD(10), VLUT16_SPREAD(11), VLUT16_SPREAD(12), VLUT16_SPREAD(13),
                             VLUT16_SPREAD(14), VLUT16_SPREAD(15));
}
/* v's lanes in the order vlut16_spread gives a block's values */
static inline vf vspread(vf v) { return _mm512_permutexvar_ps(vspread_order(), v); }
/* table[q] for 5-bit values q: their low 4 bits the nibbles at p as vlut16_nibbles (vlut16_spread where
 * spread) reads them, their fifth bit i + 16 high of bits for the nibble of byte i; lo holds table[0 .. 16)
 * and hi table[16 .. 32). One two-table permute a lane, as vlut16's one. */
static inline vf vlut32_nibbles(const uint8_t *p, int high, uint32_t bits, vf lo, vf hi, int spread) {
    __m512i q, at;
    if (spread) {
        const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
        q = _mm512_srlv_epi32(b, _mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0));
        at = vspread_order();
    } else {
        q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
        at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
    q = _mm512_and_si512(high ? _mm512_srli_epi32(q, 4) : q, _mm512_set1_epi32(15));
    const __m512i fifth = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)bits),
                                                             _mm512_add_epi32(at, _mm512_set1_epi32(16 * high))),
                                           _mm512_set1_epi32(1));
    return _mm512_permutex2var_ps(lo, _mm512_or_si512(q, _mm512_slli_epi32(fifth, 4)), hi);
}
static inline void vexpand_i8(__m128i b, vf *out) { out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
/* The 16 bytes at p as floats of their low nibbles (lo[0 .. 16 / VL)) and of their high ones (hi[...]):
 * the bytes widened to 32-bit lanes first, where a mask and a shift give both */
static inline void vnibbles(const uint8_t *p, vf *lo, vf *hi) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    lo[0] = _mm512_cvtepi32_ps(_mm512_and_si512(e, _mm512_set1_epi32(15)));
    hi[0] = _mm512_cvtepi32_ps(_mm512_srli_epi32(e, 4));
}

static inline vbool vgt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
static inline vbool veq(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
static inline vbool visnan(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
static inline vbool vfirst(vcount n) { return lanes(n); }
static inline vbool vand(vbool a, vbool b) { return a & b; }
static inline vbool vor(vbool a, vbool b) { return a | b; }
static inline vbool vnone(void) { return 0; }
static inline int vany(vbool a) { return a != 0; }
static inline vf vblend(vbool take, vf if_not, vf if_taken) { return _mm512_mask_mov_ps(if_not, take, if_taken); }

static inline vf vround_int(vf x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vscale2(vf p, vf k) { return _mm512_scalef_ps(p, k); } /* p * 2^k, k integral */

/* Lane j of the result is the sum of v[j]'s 16 lanes: a transpose-and-add tree, 15 adds for 16 sums
 * where 16 separate reductions take 64 shuffles and adds. */
static inline vf vsum_each(const vf v[16]) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] of v[2i], v[2i+1] */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: that lane's sums of v[4i .. 4i+3] */
        __m512d c = _mm512_castps_pd(t[2 * i]), d = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)), _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
    }
    /* across the four 128-bit lanes */
    __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
    __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
}

#elif defined(__AVX2__) && defined(__FMA__)
/* --------------------------------------------------------------------------------------------------- AVX2 */
#define VL 8
#define SIMD_ISA "avx2"
typedef __m256 vf;
typedef __m256 vbool; /* all ones in a lane that is set */

static inline __m256i lanes(vcount n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf viota(void) { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
static inline void vset1_halves(const uint8_t *p, vf *a, vf *b) { /* as above */
    int32_t v;
    memcpy(&v, p, 4);
    const vf both = _mm256_cvtph_ps(_mm_set1_epi32(v));
    *a = _mm256_moveldup_ps(both);
    *b = _mm256_movehdup_ps(both);
}
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); } /* b where either is NaN, as maxps */
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vfmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vabs(vf a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
static inline float vsum(vf a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float vmaxall(vf a) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vload_n(const float *p, vcount n) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n));
}
static inline void vstore_n(float *p, vf v, vcount n) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, lanes(n), v);
}
static inline vf vload_i32_n(const int32_t *p, vcount n) {
    __m256i i = n >= 8 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskload_epi32((const int *)p, lanes(n));
    return _mm256_cvtepi32_ps(i);
}
static inline vf vkeep(vf v, vcount n) { return n >= 8 ? v : _mm256_and_ps(v, _mm256_castsi256_ps(lanes(n))); }

static inline vf widen8(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
static inline vf vload_bf16(const uint16_t *p) { return widen8(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vload_bf16_n(const uint16_t *p, vcount n) {
    if (n >= 8) return vload_bf16(p);
    uint16_t tmp[8] = {0};
    memcpy(tmp, p, (size_t)(n > 0 ? n : 0) * 2);
    return vload_bf16(tmp);
}
/* the bf16 bit patterns (in the low halves of 32-bit lanes) that round v to nearest even, NaN quiet */
static inline __m256i bf16_bits(vf v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(rounded, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
static inline void vstore_bf16_n(uint16_t *p, vf v, vcount n) {
    const __m256i b = bf16_bits(v);
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    if (n >= 8) {
        _mm_storeu_si128((__m128i *)p, h);
    } else {
        uint16_t tmp[8];
        _mm_storeu_si128((__m128i *)tmp, h);
        memcpy(p, tmp, (size_t)(n > 0 ? n : 0) * 2);
    }
}
static inline vf vround_bf16(vf v) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16)); }

/* acc + the products of 2 * VL bf16 pairs, summed into VL lanes (each bf16 pair widened exactly, then one
 * fused multiply-add per half; the two operands are interleaved alike, so lanes pair up right) */
#define VDOT 16
static inline vf vdot_bf16(vf acc, const uint16_t *a, const uint16_t *b) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)a), y = _mm256_loadu_si256((const __m256i *)b);
    const __m256i z = _mm256_setzero_si256();
    acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x)),
                          _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, y)), acc);
    return _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x)),
                           _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, y)), acc);
}
static inline vf vdot_bf16_n(vf acc, const uint16_t *a, const uint16_t *b, int n) {
    uint16_t ta[16] = {0}, tb[16] = {0};
    memcpy(ta, a, (size_t)n * 2);
    memcpy(tb, b, (size_t)n * 2);
    return vdot_bf16(acc, ta, tb);
}

/* q[0 .. n) = saturate_int8(round_half_even(v)): clamped first (a NaN lane goes to -128, as the
 * AVX-512 conversion's saturation sends it), then converted under the default MXCSR */
static inline void vstore_i8_n(int8_t *q, vf v, vcount n) {
    const __m256i i = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-128.0f)),
                                                       _mm256_set1_ps(127.0f)));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    const __m128i b = _mm_packs_epi16(w, w);
    if (n >= 8) {
        _mm_storel_epi64((__m128i *)q, b);
    } else {
        int8_t tmp[16];
        _mm_storeu_si128((__m128i *)tmp, b);
        memcpy(q, tmp, (size_t)(n > 0 ? n : 0));
    }
}

/* 16 bytes to floats, VL at a time: out[0 .. 16 / VL) */
static inline void vexpand_u8(__m128i b, vf *out) {
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
}
static inline void vexpand_i8(__m128i b, vf *out) {
    out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
}
/* The 16 bytes at p as floats of their low nibbles (lo[0 .. 16 / VL)) and of their high ones (hi[...]):
 * 8 bytes at a time widened to 32-bit lanes as they are loaded, where a mask and a shift give both */
static inline void vnibbles(const uint8_t *p, vf *lo, vf *hi) {
    for (int k = 0; k < 2; k++) {
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8 * k)));
        lo[k] = _mm256_cvtepi32_ps(_mm256_and_si256(e, _mm256_set1_epi32(15)));
        hi[k] = _mm256_cvtepi32_ps(_mm256_srli_epi32(e, 4));
    }
}

static inline vbool vgt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
static inline vbool veq(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
static inline vbool visnan(vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
static inline vbool vfirst(vcount n) { return _mm256_castsi256_ps(lanes(n)); }
static inline vbool vand(vbool a, vbool b) { return _mm256_and_ps(a, b); }
static inline vbool vor(vbool a, vbool b) { return _mm256_or_ps(a, b); }
static inline vbool vnone(void) { return _mm256_setzero_ps(); }
static inline int vany(vbool a) { return _mm256_movemask_ps(a) != 0; }
static inline vf vblend(vbool take, vf if_not, vf if_taken) { return _mm256_blendv_ps(if_not, if_taken, take); }

static inline vf vround_int(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^k for integral k in [-126, 254]: two exact power-of-two factors, so that a k past 127 overflows to
 * inf as scalef does instead of wrapping the exponent field */
static inline vf vscale2(vf p, vf k) {
    const vf k1 = _mm256_min_ps(k, _mm256_set1_ps(127.0f)), k2 = _mm256_sub_ps(k, k1);
    const __m256i e1 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k1), _mm256_set1_epi32(127)), 23);
    const __m256i e2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k2), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e1)), _mm256_castsi256_ps(e2));
}

/* Lane j of the result is the sum of v[j]'s 8 lanes: two rounds of horizontal adds, then the two halves. */
static inline vf vsum_each(const vf v[8]) {
    const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#else
#error "the C kernels need AVX-512 BF16 or AVX2 with FMA: native.py passes the flags of one"
#endif

/* --------------------------------------------------------------------------------------- either ISA */
static inline vf vload_i32(const int32_t *p) { return vload_i32_n(p, VL); }
static inline void vstore_bf16(uint16_t *p, vf v) { vstore_bf16_n(p, v, VL); }
static inline vcount vtail(int64_t n, int64_t i) { return n - i >= VL ? VL : (vcount)(n - i); }

/* e^x in fp32 (Cephes' polynomial, about 1 ulp); overflows to inf as expf does (so silu(-100) is -0),
 * and flushes below e^-87.3 to that smallest normal value. */
static inline vf vexp(vf x) {
    x = vmin(vmax(x, vset1(-87.3f)), vset1(127.0f));
    const vf k = vround_int(vmul(x, vset1(1.44269504088896341f)));
    vf r = vfmadd(k, vset1(-0.693359375f), x);
    r = vfmadd(k, vset1(2.12194440e-4f), r);
    vf p = vset1(1.9875691500e-4f);
    p = vfmadd(p, r, vset1(1.3981999507e-3f));
    p = vfmadd(p, r, vset1(8.3334519073e-3f));
    p = vfmadd(p, r, vset1(4.1665795894e-2f));
    p = vfmadd(p, r, vset1(1.6666665459e-1f));
    p = vfmadd(p, r, vset1(5.0000001201e-1f));
    p = vfmadd(vmul(p, r), r, vadd(r, vset1(1.0f)));
    return vscale2(p, k);
}

/* ---------------------------------------------------------------------------------- the element type
 * What the row and attention kernels store: bf16 (the default) or fp32 (built with -DACTORSERVE_ELEM_F32,
 * native.py's ``element`` parameter). Arithmetic is fp32 either way; ``vround_e`` rounds where a bf16
 * torch sequence rounds an intermediate, and is nothing in fp32. ``ELEM(name)`` is a kernel's exported
 * name for this element type (name_bf16, name_f32). */
#ifdef ACTORSERVE_ELEM_F32
typedef float elem;
#define ELEM(name) name##_f32
static inline vf vload_e_n(const elem *p, vcount n) { return vload_n(p, n); }
static inline vf vload_e(const elem *p) { return vload(p); }
static inline void vstore_e_n(elem *p, vf v, vcount n) { vstore_n(p, v, n); }
static inline vf vround_e(vf v) { return v; }
static inline float from_e(elem x) { return x; }
static inline elem to_e(float f) { return f; }
/* acc + the products of VDOT_E pairs, summed into VL lanes */
#define VDOT_E VL
static inline vf vdot_e(vf acc, const elem *a, const elem *b) { return vfmadd(vload(a), vload(b), acc); }
#else
typedef uint16_t elem;
#define ELEM(name) name##_bf16
static inline vf vload_e_n(const elem *p, vcount n) { return vload_bf16_n(p, n); }
static inline vf vload_e(const elem *p) { return vload_bf16(p); }
static inline void vstore_e_n(elem *p, vf v, vcount n) { vstore_bf16_n(p, v, n); }
static inline vf vround_e(vf v) { return vround_bf16(v); }
static inline float from_e(elem x) { return from_bf16(x); }
static inline elem to_e(float f) { return to_bf16(f); }
#define VDOT_E VDOT
static inline vf vdot_e(vf acc, const elem *a, const elem *b) { return vdot_bf16(acc, a, b); }
#endif

/* ------------------------------------------------------------------------------- the KV cache's element
 * What the attention kernel keeps K and V in: the element type, or bf16 under fp32 elements (built with
 * -DACTORSERVE_KV_BF16 too: an fp32 model over a cache of half the bytes, which a long batch's decode reads
 * whole every step). Keys and values are widened exactly; the rounding is the one of the cache's write. */
#if defined(ACTORSERVE_KV_BF16) && defined(ACTORSERVE_ELEM_F32)
typedef uint16_t kv_elem;
static inline vf vload_kv(const kv_elem *p) { return vload_bf16(p); }
/* acc + the products of VDOT_QK pairs of a query's elements and a key's, summed into VL lanes */
#define VDOT_QK VL
static inline vf vdot_qk(vf acc, const elem *q, const kv_elem *k) { return vfmadd(vload(q), vload_bf16(k), acc); }
/* n elements as the cache holds them (rounded to nearest even, as torch's .to(torch.bfloat16)) */
static inline void store_kv(kv_elem *dst, const elem *src, int64_t n) {
    for (int64_t i = 0; i < n; i += VL) vstore_bf16_n(dst + i, vload_n(src + i, vtail(n, i)), vtail(n, i));
}
#elif defined(ACTORSERVE_KV_BF16)
#error "a bf16 KV cache is built under fp32 elements (a bf16 model's cache is bf16 already)"
#else
typedef elem kv_elem;
static inline vf vload_kv(const kv_elem *p) { return vload_e(p); }
#define VDOT_QK VDOT_E
static inline vf vdot_qk(vf acc, const elem *q, const kv_elem *k) { return vdot_e(acc, q, k); }
static inline void store_kv(kv_elem *dst, const elem *src, int64_t n) { memcpy(dst, src, (size_t)n * sizeof(elem)); }
#endif

/* silu(g) = g / (1 + e^-g) in fp32, rounded to the element type as torch's F.silu rounds it. */
static inline vf vsilu_e(vf g) { return vround_e(vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g))))); }

/* One row of RMSNorm, or of residual add + RMSNorm where d is given: h = e(x + d) (h may be x itself),
 * y = e(w * e(h * rsqrt(mean(h^2) + eps))), e() the element type's rounding. Shared so that fused passes
 * elsewhere (the int8 layer seam) compute the elementwise kernel's bits. */
static inline void norm_row(const elem *x, const elem *d, elem *h, const elem *w, elem *y, int64_t n, float eps) {
    vf ss = vzero();
    for (int64_t i = 0; i < n; i += VL) {
        const vcount m = vtail(n, i);
        vf v = vload_e_n(x + i, m);
        if (d) {
            v = vround_e(vadd(v, vload_e_n(d + i, m)));
            vstore_e_n(h + i, v, m);
        }
        ss = vfmadd(v, v, ss);
    }
    const vf r = vset1(1.0f / sqrtf(vsum(ss) / (float)n + eps));
    const elem *src = d ? h : x;
    for (int64_t i = 0; i < n; i += VL) {
        const vcount m = vtail(n, i);
        const vf v = vround_e(vmul(vload_e_n(src + i, m), r));
        vstore_e_n(y + i, vmul(v, vload_e_n(w + i, m)), m);
    }
}

#endif
