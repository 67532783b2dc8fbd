/* q8 products over the GGUF blocks as the file stores them, for the block types that gguf_q8.c does not
 * repack (Q2_K and Q3_K, kept at their size; the kernel takes every type but Q4_0, Q4_1 and Q8_0):
 * activations quantized to int8 per block of 32 (q8_activations.h), integer dot products with the weight's
 * quants, as llama.cpp's q8 dot products compute them; approximate as theirs (gguf_blocks.c is the exact
 * product).
 *
 * A weight row at a time, its 32-value sub-blocks read as the file holds them: each decoded once into 32
 * int8 quants in a 256-bit register (gguf_decode.h's layouts) with w = s q + mn, s and mn its scale and
 * minimum (per 16 values for Q2_K, Q3_K and Q6_K), then multiplied with up to MT activation rows: an integer
 * dot product of 8 lanes of 4 pairs each (vpdpbusd on AVX-512 VNNI; vpmaddubsw and vpmaddwd on AVX2,
 * whose 16-bit pair sums cannot overflow: |q| <= 127 and 2 * 127 * 127 < 2^15), converted and scaled by
 * s d_x into a float accumulator, the minimum by mn d_x sum(q_x). Signed quants are multiplied through
 * their magnitude, the sign moved onto the activation. A row's 8 lanes are summed once at its end.
 */
#include <omp.h>

#include "../prefetch.h"
#include "gguf_decode.h"
#include "q8_activations.h"

#define MT 8 /* activation rows a pass over a weight row */

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
static inline __m256i dot_u8(__m256i u, __m256i x) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, x); }
#else
static inline __m256i dot_u8(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}
#endif

/* A sub-block's 32 quants (unsigned, or signed where ``signed_q``), its scales (lanes 0-3: the first 16
 * values', 4-7: the second's) and minima (mn[0], mn[1] likewise; 0 where the type has none). */
typedef struct {
    __m256i q;
    __m256 s;
    float mn[2];
} sub_block;

static inline int signed_q(int type) {
    return type == Q5_0 || type == IQ4_NL || type == MXFP4 || type == Q3_K || type == Q6_K || type == IQ4_XS;
}

static inline int min_per_16(int type) { return type == Q2_K; }

static inline int has_min(int type) { return type == Q5_1 || type == Q4_K || type == Q5_K || type == Q2_K; }

/* The 32 bytes at p, each shifted right by `by` bits, masked */
static inline __m256i bits_at(const uint8_t *p, int by, int mask) {
    return _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)p), _mm_cvtsi32_si128(by)),
                            _mm256_set1_epi8((char)mask));
}

/* The 16 bytes at p's low nibbles then their high ones: a 32-value block's nibbles in value order */
static inline __m256i nibbles32(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p), m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* Byte i of the result: bit i of bits, as 0 or 0xFF */
static inline __m256i bytes_of_bits(uint32_t bits) {
    const __m256i shuffle = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuffle);
    const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, mask), mask);
}

static inline __m256i table_lookup(const int8_t *kvalues, __m256i nib) {
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues)), nib);
}

static inline __m256 halves(float a, float b) { return _mm256_setr_m128(_mm_set1_ps(a), _mm_set1_ps(b)); }

/* Sub-block j of the block at blk, for the types of one scale (and minimum) a 32-value block */
static inline __attribute__((always_inline)) sub_block decode_32(int type, const uint8_t *blk, int j) {
    sub_block r;
    r.mn[0] = r.mn[1] = 0.0f;
    float s;
    if (type == Q5_0 || type == Q5_1) { /* Q5_0: q - 16 as nib | ~fifth & 0xF0 (two's complement) */
        const __m256i nib = nibbles32(blk + (type == Q5_1 ? 8 : 6));
        const __m256i fifth = bytes_of_bits(u32_at(blk + (type == Q5_1 ? 4 : 2)));
        r.q = type == Q5_1 ? _mm256_or_si256(nib, _mm256_and_si256(fifth, _mm256_set1_epi8(0x10)))
                           : _mm256_or_si256(nib, _mm256_andnot_si256(fifth, _mm256_set1_epi8((char)0xF0)));
        s = half(blk);
        r.mn[0] = r.mn[1] = type == Q5_1 ? half(blk + 2) : 0.0f;
    } else if (type == IQ4_NL || type == MXFP4) {
        r.q = table_lookup(type == IQ4_NL ? KVALUES_IQ4NL : KVALUES_MXFP4, nibbles32(blk + (type == IQ4_NL ? 2 : 1)));
        s = type == IQ4_NL ? half(blk) : e8m0_half(blk[0]);
    } else if (type == IQ4_XS) {
        r.q = table_lookup(KVALUES_IQ4NL, nibbles32(blk + 8 + 16 * j));
        s = half(blk) * (float)iq4xs_scale(blk, j);
    } else { /* Q4_K, Q5_K: sub-block j's nibbles are the low (even j) or high ones of 32 bytes */
        int sc, mn;
        scale_min(blk + 4, j, &sc, &mn);
        r.q = bits_at(blk + (type == Q4_K ? 16 : 48) + 32 * (j / 2), 4 * (j & 1), 0x0F);
        if (type == Q5_K) r.q = _mm256_or_si256(r.q, _mm256_slli_epi16(bits_at(blk + 16, j, 1), 4));
        s = half(blk) * (float)sc;
        r.mn[0] = r.mn[1] = -(half(blk + 2) * (float)mn);
    }
    r.s = _mm256_set1_ps(s);
    return r;
}

/* Sub-block j of a Q2_K, Q3_K or Q6_K block: a scale (and Q2_K's minimum) per 16 values */
static inline __attribute__((always_inline)) sub_block decode_16(int type, const uint8_t *blk, int j) {
    sub_block r;
    const int h = j / 4, s = j % 4, g = 2 * j;
    if (type == Q2_K) {
        r.q = bits_at(blk + 16 + 32 * h, 2 * s, 3);
        const float d = half(blk + 80), dmin = half(blk + 82);
        r.s = halves(d * (float)(blk[g] & 0x0F), d * (float)(blk[g + 1] & 0x0F));
        r.mn[0] = -(dmin * (float)(blk[g] >> 4));
        r.mn[1] = -(dmin * (float)(blk[g + 1] >> 4));
        return r;
    }
    r.mn[0] = r.mn[1] = 0.0f;
    if (type == Q3_K) { /* q - 4 */
        const __m256i u = _mm256_or_si256(bits_at(blk + 32 + 32 * h, 2 * s, 3),
                                          _mm256_slli_epi16(bits_at(blk, j, 1), 2));
        r.q = _mm256_sub_epi8(u, _mm256_set1_epi8(4));
        const float d = half(blk + 108);
        r.s = halves(d * (float)q3k_scale(blk + 96, g), d * (float)q3k_scale(blk + 96, g + 1));
        return r;
    }
    /* Q6_K: q - 32 */
    const __m256i u = _mm256_or_si256(bits_at(blk + 64 * h + 32 * (s % 2), 4 * (s >= 2), 0x0F),
                                      _mm256_slli_epi16(bits_at(blk + 128 + 32 * h, 2 * s, 3), 4));
    r.q = _mm256_sub_epi8(u, _mm256_set1_epi8(32));
    const int8_t *sc = (const int8_t *)(blk + 192);
    const float d = half(blk + 208);
    r.s = halves(d * (float)sc[g], d * (float)sc[g + 1]);
    return r;
}

static inline __attribute__((always_inline)) sub_block decode_sub(int type, const uint8_t *blk, int j) {
    return type == Q2_K || type == Q3_K || type == Q6_K ? decode_16(type, blk, j) : decode_32(type, blk, j);
}

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Weight rows [n0, n1) by activation rows [m0, m0 + MM) into y. Inlined into clones with MM constant, so
 * that the accumulators live in registers. */
static inline __attribute__((always_inline)) void rows_mm(int type, q8_rows a, int MM, int64_t m0, const uint8_t *w,
                                                          const float *bias, float *y, int64_t ldy, int64_t K,
                                                          int64_t n0, int64_t n1) {
    const int64_t qk = block_values(type), per = qk / QK, nb = K / QK, bytes = block_bytes(type);
    const int64_t row_bytes = K / qk * bytes;
    const uint8_t *const end = w + n1 * row_bytes;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = w + n * row_bytes;
        prefetch_stream(wr, row_bytes, end);
        __m256 acc[MT];
        float mins[MT];
        for (int m = 0; m < MM; m++) acc[m] = _mm256_setzero_ps(), mins[m] = 0.0f;
        for (int64_t sb = 0; sb < nb; sb++) {
            const sub_block r = decode_sub(type, wr + sb / per * bytes, (int)(sb % per));
            const __m256i mag = signed_q(type) ? _mm256_sign_epi8(r.q, r.q) : r.q;
            for (int m = 0; m < MM; m++) {
                const int64_t i = (m0 + m) * nb + sb;
                const __m256i x = _mm256_loadu_si256((const __m256i *)(a.q + (m0 + m) * K + sb * QK));
                const __m256i dot = dot_u8(mag, signed_q(type) ? _mm256_sign_epi8(x, r.q) : x);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(r.s, _mm256_set1_ps(a.d[i])), acc[m]);
                if (min_per_16(type))
                    mins[m] += r.mn[0] * a.s16[2 * i] + r.mn[1] * a.s16[2 * i + 1];
                else if (has_min(type))
                    mins[m] += r.mn[0] * a.s[i];
            }
        }
        for (int m = 0; m < MM; m++) y[(m0 + m) * ldy + n] = hsum_ps(acc[m]) + mins[m] + (bias ? bias[n] : 0.0f);
    }
}

typedef void (*rows_fn)(q8_rows, int64_t, const uint8_t *, const float *, float *, int64_t, int64_t, int64_t,
                        int64_t);
#define ROWS_TM(t, mm)                                                                                       \
    static void rows_##t##_##mm(q8_rows a, int64_t m0, const uint8_t *w, const float *bias, float *y,         \
                                int64_t ldy, int64_t K, int64_t n0, int64_t n1) {                             \
        rows_mm(t, a, mm, m0, w, bias, y, ldy, K, n0, n1);                                                   \
    }
#define ROWS_T(t)                                                                                            \
    ROWS_TM(t, 1) ROWS_TM(t, 2) ROWS_TM(t, 3) ROWS_TM(t, 4) ROWS_TM(t, 5) ROWS_TM(t, 6) ROWS_TM(t, 7)         \
    ROWS_TM(t, 8) static const rows_fn rows_##t[MT] = {rows_##t##_1, rows_##t##_2, rows_##t##_3,             \
                                                       rows_##t##_4, rows_##t##_5, rows_##t##_6,             \
                                                       rows_##t##_7, rows_##t##_8};
ROWS_T(Q5_0) ROWS_T(Q5_1) ROWS_T(IQ4_NL) ROWS_T(MXFP4) ROWS_T(Q2_K) ROWS_T(Q3_K) ROWS_T(Q4_K) ROWS_T(Q5_K)
ROWS_T(Q6_K) ROWS_T(IQ4_XS)

static const rows_fn *rows_of(int type) {
    switch (type) {
    case Q5_0: return rows_Q5_0;
    case Q5_1: return rows_Q5_1;
    case IQ4_NL: return rows_IQ4_NL;
    case MXFP4: return rows_MXFP4;
    case Q2_K: return rows_Q2_K;
    case Q3_K: return rows_Q3_K;
    case Q4_K: return rows_Q4_K;
    case Q5_K: return rows_Q5_K;
    case Q6_K: return rows_Q6_K;
    case IQ4_XS: return rows_IQ4_XS;
    default: return NULL;
    }
}

/* Weight rows [n0, n1) for all M activation rows: a few weight rows at a time, every pass of MT activation
 * rows over them, so that the rows are read from memory once and from cache by the passes after the first. */
static void rows(const rows_fn *by_m, q8_rows a, int64_t M, const uint8_t *w, int64_t row_bytes, const float *bias,
                 float *y, int64_t ldy, int64_t K, int64_t n0, int64_t n1) {
    const int64_t tile = M <= MT ? n1 - n0 : 4;
    for (int64_t t0 = n0; t0 < n1; t0 += tile) {
        const int64_t t1 = t0 + tile < n1 ? t0 + tile : n1;
        for (int64_t m0 = 0; m0 < M; m0 += MT) {
            const int64_t mm = M - m0 < MT ? M - m0 : MT;
            by_m[mm - 1](a, m0, w, bias, y, ldy, K, t0, t1);
        }
    }
    (void)row_bytes;
}

/* y[M, N] (row stride ldy) = x[M, K] . W^T (+ bias), W the N rows of the file's blocks at w. The rows of x
 * are quantized into scratch (``q8_layout``) where ``quantize_x`` is set; else scratch holds them from an
 * earlier call with the same x (of this kernel or of gguf_q8.c's). Returns 0, or -1 where the type or shape
 * is not one this kernel takes. */
int gguf_q8_blocks_linear(int type, const float *x, int64_t M, const uint8_t *w, const float *bias, float *y,
                          int64_t ldy, int64_t N, int64_t K, int threads, uint8_t *scratch, int quantize_x) {
    const rows_fn *by_m = rows_of(type);
    if (!by_m || K % block_values(type) || M < 1 || N < 1) return -1;
    const q8_rows a = q8_layout(scratch, M, K);
    if (quantize_x) q8_quantize(x, M, K, a);
    const int64_t row_bytes = K / block_values(type) * block_bytes(type);
    if (threads < 1) threads = 1;
    if (threads == 1 || N < 64) {
        rows(by_m, a, M, w, row_bytes, bias, y, ldy, K, 0, N);
        return 0;
    }
    const int64_t per = (N + threads - 1) / threads;
#pragma omp parallel num_threads(threads)
    {
        const int64_t n0 = omp_get_thread_num() * per, n1 = n0 + per < N ? n0 + per : N;
        if (n0 < n1) rows(by_m, a, M, w, row_bytes, bias, y, ldy, K, n0, n1);
    }
    return 0;
}
