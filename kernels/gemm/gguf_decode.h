/* GGUF blocks decoded in registers: every block type that llama.cpp's quantization presets write, 32 values
 * at a time into fp32 lanes, each the value gguf-py's ``dequantize`` gives (fp16 widened to fp32, then its
 * operations in its order, each rounded), so that a product over them differs from the dense fp32 product
 * only in the order of its sums.
 *
 *   Q4_0   (32 values, 18 bytes): d, 16 bytes of nibbles                   w = d * (q - 8)
 *   Q4_1   (32, 20): d, m, 16 bytes of nibbles                              w = d * q + m
 *   Q5_0   (32, 22): d, 32 fifth bits, 16 bytes of nibbles                  w = d * (q - 16)
 *   Q5_1   (32, 24): d, m, 32 fifth bits, 16 bytes of nibbles               w = d * q + m
 *   Q8_0   (32, 34): d, 32 int8                                             w = q * d
 *   IQ4_NL (32, 18): d, 16 bytes of nibbles, each an index into a table     w = d * table[q]
 *   MXFP4  (32, 17): e (a power of two, e8m0), 16 bytes of e2m1 nibbles    w = 2^(e - 128) * table[q]
 *   Q2_K   (256, 84): 16 bytes of 4-bit scales and minima (one each per 16 values), 64 bytes of 2-bit
 *       quants, d, dmin                                                     w = (d * sc) * q - (dmin * m)
 *   Q3_K   (256, 110): 32 bytes of third bits, 64 of 2-bit quants, 12 of 6-bit scales (one per 16), d
 *                                                                           w = (d * (sc - 32)) * (q - 4)
 *   Q4_K   (256, 144): d, dmin, 12 bytes of 6-bit scales and minima for 8 sub-blocks of 32, 128 bytes
 *       of nibbles                                                          w = (d * sc) * q - (dmin * m)
 *   Q5_K   (256, 176): as Q4_K, with a fifth bit per value from 32 bytes of high bits
 *   Q6_K   (256, 210): 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (one per 16), d
 *                                                                           w = (d * scale) * (q - 32)
 *   IQ4_XS (256, 136): d, 8 6-bit sub-block scales, 128 bytes of table nibbles
 *                                                                           w = (d * (sc - 32)) * table[q]
 * In a 32-value block (or sub-block) of nibbles the low ones are values 0 .. 15, the high ones 16 .. 31.
 * Where the reference multiplies, then adds (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), one fused multiply-add gives its
 * value: the product of an fp16 scale (11 significant bits, times a sub-block scale of at most 6: 17) and
 * a quant of at most 5 bits is exact in fp32's 24, so the reference's first rounding does nothing and its
 * second is the fused one's. Every product of Q3_K, IQ4_NL, IQ4_XS and MXFP4 is exact (at most 24
 * significant bits), so any order gives it; Q6_K's is not (8-bit scales, 6-bit quants): it multiplies
 * twice, as the reference does. Written against the vector layer (../simd.h).
 */
#ifndef ACTORSERVE_GGUF_DECODE_H
#define ACTORSERVE_GGUF_DECODE_H

#include "../simd.h"

enum { /* ggml's type numbers */
    Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
    IQ4_NL = 20, IQ4_XS = 23, MXFP4 = 39
};
#define SUB 32 /* values decoded at a time: a block, or a sub-block of a 256-value block */

static const int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t KVALUES_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}; /* e2m1, x 2 */

static inline int block_values(int type) {
    return type == Q2_K || type == Q3_K || type == Q4_K || type == Q5_K || type == Q6_K || type == IQ4_XS ? 256 : 32;
}

static inline int block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case IQ4_NL: return 18;
    case MXFP4: return 17;
    case Q2_K: return 84;
    case Q3_K: return 110;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    case IQ4_XS: return 136;
    default: return 0;
    }
}

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline uint32_t u32_at(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* MXFP4's scale: 2^(e - 128), subnormal for e < 2 (ggml's e8m0_to_fp32_half) */
static inline float e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline __m128i nibbles(const uint8_t *p, int high) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm_and_si128(high ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(0x0F));
}

/* Byte i of the result: bit 16 high + i of bits, as 0 or 1. */
static inline __m128i bits16(uint32_t bits, int high) {
    const __m128i v = _mm_set1_epi16((short)(bits >> (16 * high)));
    const __m128i s = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
    const __m128i mask = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(s, mask), mask), _mm_set1_epi8(1));
}

/* Bit b of each of the 16 bytes at p, as 0 or 1 */
static inline __m128i bit_of_bytes(const uint8_t *p, int b) {
    return _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128(b)), _mm_set1_epi8(1));
}

/* Two bits (2 s, 2 s + 1) of each of the 16 bytes at p, as 0 .. 3 */
static inline __m128i crumbs(const uint8_t *p, int s) {
    return _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128(2 * s)),
                         _mm_set1_epi8(3));
}

/* The 6-bit scale and minimum of sub-block j of a Q4_K / Q5_K block (gguf-py's get_scale_min). */
static inline void scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 0x3F;
        *m = s[j + 4] & 0x3F;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30);
        *m = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

/* The signed 6-bit scale of 16-value group g of a Q3_K block (its 12 scale bytes at s), less 32 */
static inline int q3k_scale(const uint8_t *s, int g) {
    const int low = g < 8 ? s[g] & 0x0F : s[g - 8] >> 4;
    return (low | ((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
}

/* The signed 6-bit scale of sub-block j of an IQ4_XS block, less 32 */
static inline int iq4xs_scale(const uint8_t *blk, int j) {
    const int low = (blk[4 + j / 2] >> (4 * (j % 2))) & 0x0F, high = (blk[2 + j / 4] >> (2 * (j % 4))) & 3;
    return (low | high << 4) - 32;
}

/* The 32 table nibbles of sub-block j of a 4-bit type whose values are table[q]: the 16-entry fp32 table
 * that stands for them (each entry computed as the reference computes that weight) and the 16 bytes of
 * nibbles. The types of one scale (and minimum) a 32-value block: Q4_0, Q4_1, IQ4_NL, MXFP4, Q4_K, IQ4_XS. */
static inline int is_table4(int type) {
    return type == Q4_0 || type == Q4_1 || type == IQ4_NL || type == MXFP4 || type == Q4_K || type == IQ4_XS;
}

static inline vf vkvalues(const int8_t *kvalues) {
    vf out[16 / VL];
    vexpand_i8(_mm_loadu_si128((const __m128i *)kvalues), out);
    return out[0]; /* (the table's first VL entries: enough where VL is 16, the only build with tables) */
}

/* d, m: a Q4_0 / Q4_1 block's d and m, or Q4_K's and IQ4_XS's sub-block scale and Q4_K's minimum (negated),
 * in every lane. */
static inline __attribute__((always_inline)) const uint8_t *table4(int type, const uint8_t *blk, int j, vf d, vf m,
                                                                    vf *table) {
    if (type == Q4_0) {
        *table = vmul(d, vsub(viota(), vset1(8.0f))); /* q - 8 is exact in fp32 */
        return blk + 2;
    }
    if (type == Q4_1) {
        *table = vfmadd(d, viota(), m);
        return blk + 4;
    }
    if (type == IQ4_NL || type == MXFP4) {
        const float d = type == IQ4_NL ? half(blk) : e8m0_half(blk[0]);
        *table = vmul(vset1(d), vkvalues(type == IQ4_NL ? KVALUES_IQ4NL : KVALUES_MXFP4));
        return blk + (type == IQ4_NL ? 2 : 1);
    }
    if (type == IQ4_XS) {
        *table = vmul(d, vkvalues(KVALUES_IQ4NL));
        return blk + 8 + 16 * j;
    }
    *table = vfmadd(d, viota(), m); /* Q4_K: sub-block j's nibbles are the low (even j) or high ones of 32
                                     * bytes, two runs of 16 */
    return blk + 16 + 32 * (j / 2);
}

/* The values of a 4-bit table type through arithmetic, for a build without a 16-entry permute: w[0 .. 32 /
 * VL), in order. */
static inline __attribute__((always_inline)) void table4_arith(int type, const uint8_t *blk, int j, vf d, vf m,
                                                               vf *w) {
    if (type == Q4_0 || type == Q4_1) {
        vnibbles(blk + (type == Q4_1 ? 4 : 2), w, w + 16 / VL);
        if (type == Q4_1) {
            for (int i = 0; i < SUB / VL; i++) w[i] = vfmadd(d, w[i], m);
        } else {
            for (int i = 0; i < SUB / VL; i++) w[i] = vmul(d, vsub(w[i], vset1(8.0f))); /* q - 8 is exact */
        }
        return;
    }
    if (type == Q4_K) {
        const uint8_t *qs = blk + 16 + 32 * (j / 2);
        vexpand_u8(nibbles(qs, j & 1), w);
        vexpand_u8(nibbles(qs + 16, j & 1), w + 16 / VL);
        for (int i = 0; i < SUB / VL; i++) w[i] = vfmadd(d, w[i], m);
        return;
    }
    /* IQ4_NL, MXFP4, IQ4_XS: the table's int8 entries picked by a byte shuffle, then one exact product */
    const int8_t *kvalues = type == MXFP4 ? KVALUES_MXFP4 : KVALUES_IQ4NL;
    const __m128i table = _mm_loadu_si128((const __m128i *)kvalues);
    const uint8_t *qs = type == IQ4_NL ? blk + 2 : type == MXFP4 ? blk + 1 : blk + 8 + 16 * j;
    const vf scale = type == IQ4_XS ? d : vset1(type == IQ4_NL ? half(blk) : e8m0_half(blk[0]));
    vexpand_i8(_mm_shuffle_epi8(table, nibbles(qs, 0)), w);
    vexpand_i8(_mm_shuffle_epi8(table, nibbles(qs, 1)), w + 16 / VL);
    for (int i = 0; i < SUB / VL; i++) w[i] = vmul(scale, w[i]);
}

/* Q5_0 / Q5_1: w[0 .. 32 / VL), through a 32-entry table where the build has the permute for it */
static inline __attribute__((always_inline)) void decode_q5(int type, const uint8_t *blk, vf *w, int spread) {
    const float d = half(blk), m = type == Q5_1 ? half(blk + 2) : 0.0f;
    const uint32_t bits = u32_at(blk + (type == Q5_1 ? 4 : 2));
    const uint8_t *qs = blk + (type == Q5_1 ? 8 : 6);
#ifdef VLUT16
    const vf q = viota(), sixteen = vset1(16.0f);
    const vf lo = type == Q5_1 ? vfmadd(vset1(d), q, vset1(m)) : vmul(vset1(d), vsub(q, sixteen));
    const vf hi = type == Q5_1 ? vfmadd(vset1(d), vadd(q, sixteen), vset1(m)) : vmul(vset1(d), q);
    w[0] = vlut32_nibbles(qs, 0, bits, lo, hi, spread);
    w[1] = vlut32_nibbles(qs, 1, bits, lo, hi, spread);
#else
    (void)spread;
    for (int h = 0; h < 2; h++)
        vexpand_u8(_mm_or_si128(nibbles(qs, h), _mm_slli_epi16(bits16(bits, h), 4)), w + h * 16 / VL);
    for (int i = 0; i < SUB / VL; i++) /* q - 16 is exact in fp32 */
        w[i] = type == Q5_1 ? vfmadd(vset1(d), w[i], vset1(m)) : vmul(vset1(d), vsub(w[i], vset1(16.0f)));
#endif
}

/* Q2_K, Q3_K, Q5_K, Q6_K sub-block j: the quants as bytes (two runs of 16), then each 16's scale (Q5_K's
 * sub-block's one) and minimum from ks, km (``block_scales``) */
static inline __attribute__((always_inline)) void decode_k(int type, const uint8_t *blk, int j, vf *w,
                                                           const float *ks, const float *km) {
    const int h = j / 4, s = j % 4;
    __m128i q[2];
    if (type == Q2_K || type == Q3_K) { /* 2-bit quants s of the 32 bytes at 32 h; Q3_K's third bit j */
        const uint8_t *qs = blk + (type == Q2_K ? 16 : 32) + 32 * h;
        for (int r = 0; r < 2; r++) {
            q[r] = crumbs(qs + 16 * r, s);
            if (type == Q3_K) q[r] = _mm_or_si128(q[r], _mm_slli_epi16(bit_of_bytes(blk + 16 * r, j), 2));
        }
    } else if (type == Q5_K) { /* nibbles as Q4_K's, bit j of the 32 high-bit bytes as the fifth */
        const uint8_t *qs = blk + 48 + 32 * (j / 2);
        for (int r = 0; r < 2; r++)
            q[r] = _mm_or_si128(nibbles(qs + 16 * r, j & 1), _mm_slli_epi16(bit_of_bytes(blk + 16 + 16 * r, j), 4));
    } else { /* Q6_K: values 128 h + 32 s + i take ql byte 64 h + 32 (s % 2) + i (its high nibble for s >= 2)
              * and bits 2 s, 2 s + 1 of qh byte 32 h + i */
        const uint8_t *ql = blk + 64 * h + 32 * (s % 2), *qh = blk + 128 + 32 * h;
        for (int r = 0; r < 2; r++)
            q[r] = _mm_or_si128(nibbles(ql + 16 * r, s >= 2), _mm_slli_epi16(crumbs(qh + 16 * r, s), 4));
    }
    vexpand_u8(q[0], w);
    vexpand_u8(q[1], w + 16 / VL);
    if (type == Q5_K) {
        float sc = ks ? ks[j] : 0.0f, mn = ks ? km[j] : 0.0f;
        if (!ks) {
            int isc, imn;
            scale_min(blk + 4, j, &isc, &imn);
            sc = half(blk) * (float)isc, mn = -(half(blk + 2) * (float)imn);
        }
        for (int i = 0; i < SUB / VL; i++) w[i] = vfmadd(vset1(sc), w[i], vset1(mn));
        return;
    }
    for (int i = 0; i < SUB / VL; i++) {
        const int g = 2 * j + (i * VL) / 16; /* the 16-value group of these lanes */
        if (type == Q2_K) {
            const float dl = ks ? ks[g] : half(blk + 80) * (float)(blk[g] & 0x0F);
            const float ml = ks ? km[g] : -(half(blk + 82) * (float)(blk[g] >> 4));
            w[i] = vfmadd(vset1(dl), w[i], vset1(ml));
        } else if (type == Q3_K) { /* q - 4 is exact, and so is the product */
            const float dl = ks ? ks[g] : half(blk + 108) * (float)q3k_scale(blk + 96, g);
            w[i] = vmul(vset1(dl), vsub(w[i], vset1(4.0f)));
        } else { /* Q6_K: q - 32 is exact in fp32 */
            const float dl = ks ? ks[g] : half(blk + 208) * (float)((const int8_t *)(blk + 192))[g];
            w[i] = vmul(vset1(dl), vsub(w[i], vset1(32.0f)));
        }
    }
}

/* The types whose blocks carry sub-block scales: ``block_scales`` gives them. */
static inline int scaled_blocks(int type) {
    return type == Q2_K || type == Q3_K || type == Q4_K || type == Q5_K || type == Q6_K || type == IQ4_XS;
}

/* A 256-value block's sub-block scales widened into s[] (8 for Q4_K, Q5_K and IQ4_XS, one a 32 values; 16 for
 * Q2_K, Q3_K and Q6_K, one a 16) and its minima, negated, into m[] (Q4_K, Q5_K, Q2_K): each the product the
 * reference takes (d times the sub-block's scale, exact in fp32), computed once a block. */
static inline __attribute__((always_inline)) void block_scales(int type, const uint8_t *blk, float *s, float *m) {
    if (type == Q4_K || type == Q5_K) { /* the 12 bytes of 6-bit scales and minima unpacked 8 at a time */
        uint32_t u[4];
        memcpy(u, blk + 4, 12);
        u[3] = ((u[2] >> 4) & 0x0F0F0F0Fu) | (((u[1] >> 6) & 0x03030303u) << 4);
        const uint32_t mins_low = u[1] & 0x3F3F3F3Fu;
        u[1] = (u[2] & 0x0F0F0F0Fu) | (((u[0] >> 6) & 0x03030303u) << 4);
        u[2] = mins_low;
        u[0] &= 0x3F3F3F3Fu;
        const __m256 d = _mm256_set1_ps(half(blk)), dmin = _mm256_set1_ps(-half(blk + 2));
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)u)));
        const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + 2))));
        _mm256_storeu_ps(s, _mm256_mul_ps(d, sc));
        _mm256_storeu_ps(m, _mm256_mul_ps(dmin, mn)); /* -(dmin * mn): the sign of a product is exact */
    } else if (type == Q6_K) {
        const __m128i sc = _mm_loadu_si128((const __m128i *)(blk + 192));
        const __m256 d = _mm256_set1_ps(half(blk + 208));
        _mm256_storeu_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(s + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    } else if (type == Q3_K) {
        const float d = half(blk + 108);
        for (int g = 0; g < 16; g++) s[g] = d * (float)q3k_scale(blk + 96, g);
    } else if (type == Q2_K) {
        const float d = half(blk + 80), dmin = half(blk + 82);
        for (int g = 0; g < 16; g++) s[g] = d * (float)(blk[g] & 0x0F), m[g] = -(dmin * (float)(blk[g] >> 4));
    } else { /* IQ4_XS */
        const float d = half(blk);
        for (int j = 0; j < 8; j++) s[j] = d * (float)iq4xs_scale(blk, j);
    }
}

/* Values [32 j, 32 j + 32) of the block at blk into w[0 .. 32 / VL); where spread is set, the lanes of a
 * table type (``spreads``) in the order of ``vlut16_spread`` (the product puts its activations in that
 * order). sd, sm, where not NULL: a Q4_0 / Q4_1 / Q8_0 block's d (and Q4_1's m) widened already, or for the
 * types of ``scaled_blocks`` the block's ``block_scales`` (where NULL, this sub-block's are computed here). */
static inline __attribute__((always_inline)) void decode(int type, const uint8_t *blk, int j, vf *w, int spread,
                                                         const float *sd, const float *sm) {
    vf d = vzero(), m = vzero(); /* a Q4_0 / Q4_1 / Q8_0 block's scale, and Q4_1's minimum (the others' two
                                  * bytes after d are quants, and m goes unused), or a sub-block's */
    if (type == Q8_0 || type == Q4_0 || type == Q4_1) {
        if (sd) {
            d = vset1(*sd);
            m = vset1(type == Q4_1 ? *sm : 0.0f);
        } else {
            vset1_halves(blk, &d, &m);
        }
    } else if ((type == Q4_K || type == IQ4_XS) && sd) {
        d = vset1(sd[j]);
        m = vset1(type == Q4_K ? sm[j] : 0.0f);
    } else if (type == Q4_K) {
        int sc, mn;
        scale_min(blk + 4, j, &sc, &mn);
        d = vset1(half(blk) * (float)sc);
        m = vset1(-(half(blk + 2) * (float)mn));
    } else if (type == IQ4_XS) {
        d = vset1(half(blk) * (float)iq4xs_scale(blk, j));
    }
    if (type == Q8_0) {
        vexpand_i8(_mm_loadu_si128((const __m128i *)(blk + 2)), w);
        vexpand_i8(_mm_loadu_si128((const __m128i *)(blk + 18)), w + 16 / VL);
        for (int i = 0; i < SUB / VL; i++) w[i] = vmul(w[i], d);
        return;
    }
    if (type == Q5_0 || type == Q5_1) {
        decode_q5(type, blk, w, spread);
        return;
    }
    if (is_table4(type)) {
#ifdef VLUT16
        vf table;
        const uint8_t *qs = table4(type, blk, j, d, m, &table);
        const int high = type == Q4_K ? j & 1 : 0, second = type == Q4_K ? 16 : 0;
        w[0] = spread ? vlut16_spread(qs, high, table) : vlut16_nibbles(qs, high, table);
        w[1] = spread ? vlut16_spread(qs + second, type == Q4_K ? high : 1, table)
                      : vlut16_nibbles(qs + second, type == Q4_K ? high : 1, table);
#else
        (void)spread;
        table4_arith(type, blk, j, d, m, w);
#endif
        return;
    }
    decode_k(type, blk, j, w, sd, sm);
}

#endif
