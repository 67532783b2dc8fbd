/* The repacked layout of the q8 products (gguf_q8.c): 16 weight rows side by side, 32 values (a block, or a
 * sub-block of a 256-value block) a record, the quants as the file stores them.
 *
 * A record, for 16 rows and 32 values, holds in order:
 *   scales: the rows' fp16 d[16] as stored (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), or fp32 s[16] (MXFP4's
 *       power of two; Q4_K's, Q5_K's and IQ4_XS's d times the sub-block's scale, exact in fp32), or for
 *       Q6_K fp32 s[16] of each half of 16 values (d times its int8 scale, exact);
 *   minima: fp16 m[16] as stored (Q4_1, Q5_1), or fp32 (Q4_K, Q5_K: -dmin times the sub-block's
 *       minimum, exact), or none;
 *   planes of high bits (Q5_0, Q5_1, Q5_K: bit 4 of each quant; Q6_K: bits 4 and 5): for each chunk c and
 *       nibble half k (below), a 64-bit mask whose bit 4 r + i is the high bit of the quant in byte i of
 *       lane r;
 *   quants: 4 chunks of 64 bytes of nibbles, lane r of chunk c holding 4 bytes of row r, whose low nibbles
 *       are its values 4c .. 4c + 3 and high ones 16 + 4c .. 16 + 4c + 3 (their low 4 bits); or for Q8_0 8
 *       chunks of 64 bytes, lane r of chunk g its values 4g .. 4g + 3, each + 128 as a uint8.
 * A weight is s (v - offset) + m of its unsigned quant v (offset: 8 for Q4_0, 16 for Q5_0, 32 for Q6_K),
 * or for IQ4_NL, IQ4_XS and MXFP4 s table[v]. The legacy types' records are exactly as many bytes as the
 * file's blocks; the others' scales take 1 (MXFP4, IQ4_XS) to 2 (Q4_K, Q5_K, Q6_K) bits a weight where
 * the file's take 0.2 to 0.5. Q2_K and Q3_K are not repacked (gguf_q8_blocks.c multiplies them as stored).
 */
#ifndef ACTORSERVE_GGUF_Q8_LAYOUT_H
#define ACTORSERVE_GGUF_Q8_LAYOUT_H

#include "gguf_decode.h"

#define R 16 /* weight rows packed together */

static inline int q8_packs(int type) { return block_bytes(type) && type != Q2_K && type != Q3_K; }
static inline int scale_f32(int type) { return type == MXFP4 || type == Q4_K || type == Q5_K || type == IQ4_XS; }
static inline int scale_halves(int type) { return type == Q6_K; }
static inline int min_f16(int type) { return type == Q4_1 || type == Q5_1; }
static inline int min_f32(int type) { return type == Q4_K || type == Q5_K; }
static inline int planes(int type) { return type == Q6_K ? 2 : type == Q5_0 || type == Q5_1 || type == Q5_K; }
static inline int tabled(int type) { return type == IQ4_NL || type == IQ4_XS || type == MXFP4; }
static inline int q_offset(int type) { return type == Q4_0 ? 8 : type == Q5_0 ? 16 : type == Q6_K ? 32 : 0; }
static inline const int8_t *table_of(int type) { return type == MXFP4 ? KVALUES_MXFP4 : KVALUES_IQ4NL; }

static inline int64_t scale_bytes(int type) { return scale_halves(type) ? 8 * R : scale_f32(type) ? 4 * R : 2 * R; }
static inline int64_t min_bytes(int type) { return min_f32(type) ? 4 * R : min_f16(type) ? 2 * R : 0; }
static inline int64_t plane_bytes(int type) { return planes(type) * 64; }
static inline int64_t quant_bytes(int type) { return type == Q8_0 ? 8 * 64 : 4 * 64; }
static inline int64_t record_bytes(int type) {
    return scale_bytes(type) + min_bytes(type) + plane_bytes(type) + quant_bytes(type);
}

/* A sub-block of one row: its 32 unsigned quants (the table's index for a table type), its scale(s) and
 * minimum in the record's form. */
typedef struct {
    uint8_t v[32];
    uint16_t d16, m16;
    float s[2], mn;
} sub_values;

static inline void nibbles_of(const uint8_t *qs, uint8_t *v) {
    for (int i = 0; i < 16; i++) v[i] = qs[i] & 0x0F, v[16 + i] = qs[i] >> 4;
}

/* Sub-block j (of 32 values) of the block at blk, for every type q8_packs takes */
static void sub_block_values(int type, const uint8_t *blk, int j, sub_values *o) {
    memcpy(&o->d16, blk, 2);
    memcpy(&o->m16, blk + 2, 2);
    o->s[0] = o->s[1] = o->mn = 0.0f;
    if (type == Q8_0) {
        for (int i = 0; i < 32; i++) o->v[i] = blk[2 + i] ^ 0x80;
    } else if (type == Q4_0 || type == Q4_1 || type == IQ4_NL || type == MXFP4) {
        nibbles_of(blk + (type == Q4_1 ? 4 : type == MXFP4 ? 1 : 2), o->v);
        if (type == MXFP4) o->s[0] = e8m0_half(blk[0]);
    } else if (type == Q5_0 || type == Q5_1) {
        const uint32_t bits = u32_at(blk + (type == Q5_1 ? 4 : 2));
        nibbles_of(blk + (type == Q5_1 ? 8 : 6), o->v);
        for (int i = 0; i < 32; i++) o->v[i] |= ((bits >> i) & 1) << 4;
    } else if (type == IQ4_XS) {
        nibbles_of(blk + 8 + 16 * j, o->v);
        o->s[0] = half(blk) * (float)iq4xs_scale(blk, j);
    } else if (type == Q4_K || type == Q5_K) {
        int sc, mn;
        scale_min(blk + 4, j, &sc, &mn);
        const uint8_t *qs = blk + (type == Q4_K ? 16 : 48) + 32 * (j / 2);
        for (int i = 0; i < 32; i++)
            o->v[i] = ((qs[i] >> (4 * (j & 1))) & 0x0F) | (type == Q5_K ? ((blk[16 + i] >> j) & 1) << 4 : 0);
        o->s[0] = half(blk) * (float)sc;
        o->mn = -(half(blk + 2) * (float)mn);
    } else { /* Q6_K */
        const int h = j / 4, s = j % 4;
        const uint8_t *ql = blk + 64 * h + 32 * (s % 2), *qh = blk + 128 + 32 * h;
        for (int i = 0; i < 32; i++) o->v[i] = ((ql[i] >> (4 * (s >= 2))) & 0x0F) | ((qh[i] >> (2 * s)) & 3) << 4;
        for (int k = 0; k < 2; k++) o->s[k] = half(blk + 208) * (float)((const int8_t *)(blk + 192))[2 * j + k];
    }
}

/* Lane r of the record at rec: row r's sub-block as sub_block_values gives it */
static void put_lane(int type, uint8_t *rec, int r, const sub_values *o) {
    uint8_t *p = rec;
    if (scale_halves(type)) {
        memcpy(p + 4 * r, &o->s[0], 4);
        memcpy(p + 4 * R + 4 * r, &o->s[1], 4);
    } else if (scale_f32(type)) {
        memcpy(p + 4 * r, &o->s[0], 4);
    } else {
        memcpy(p + 2 * r, &o->d16, 2);
    }
    p += scale_bytes(type);
    if (min_f16(type)) memcpy(p + 2 * r, &o->m16, 2);
    if (min_f32(type)) memcpy(p + 4 * r, &o->mn, 4);
    p += min_bytes(type);
    for (int plane = 0; plane < planes(type); plane++)
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 2; k++) {
                uint64_t mask;
                memcpy(&mask, p + 8 * ((plane * 4 + c) * 2 + k), 8);
                for (int i = 0; i < 4; i++)
                    mask |= (uint64_t)((o->v[16 * k + 4 * c + i] >> (4 + plane)) & 1) << (4 * r + i);
                memcpy(p + 8 * ((plane * 4 + c) * 2 + k), &mask, 8);
            }
    p += plane_bytes(type);
    if (type == Q8_0) {
        for (int g = 0; g < 8; g++) memcpy(p + 64 * g + 4 * r, o->v + 4 * g, 4);
        return;
    }
    for (int c = 0; c < 4; c++)
        for (int i = 0; i < 4; i++)
            p[64 * c + 4 * r + i] = (o->v[4 * c + i] & 0x0F) | (o->v[16 + 4 * c + i] & 0x0F) << 4;
}

/* The weight of quant i (0 .. 31) of lane r of the record at rec: the reference decoder's value */
static float lane_weight(int type, const uint8_t *rec, int r, int i) {
    const uint8_t *p = rec + scale_bytes(type) + min_bytes(type);
    int v;
    if (type == Q8_0) {
        v = rec[scale_bytes(type) + 64 * (i / 4) + 4 * r + i % 4] ^ 0x80;
        return (float)(int8_t)v * half(rec + 2 * r);
    }
    const int j = i % 16, k = i / 16;
    const uint8_t byte = p[plane_bytes(type) + 64 * (j / 4) + 4 * r + j % 4];
    v = k ? byte >> 4 : byte & 0x0F;
    for (int plane = 0; plane < planes(type); plane++) {
        uint64_t mask;
        memcpy(&mask, p + 8 * ((plane * 4 + j / 4) * 2 + k), 8);
        v |= (int)((mask >> (4 * r + j % 4)) & 1) << (4 + plane);
    }
    float s, mn = 0.0f;
    if (scale_halves(type)) {
        memcpy(&s, rec + 4 * R * k + 4 * r, 4);
    } else if (scale_f32(type)) {
        memcpy(&s, rec + 4 * r, 4);
    } else {
        s = half(rec + 2 * r);
    }
    if (min_f16(type)) mn = half(rec + scale_bytes(type) + 2 * r);
    if (min_f32(type)) memcpy(&mn, rec + scale_bytes(type) + 4 * r, 4);
    if (tabled(type)) return s * (float)table_of(type)[v];
    if (min_f16(type) || min_f32(type)) return fmaf(s, (float)v, mn);
    return s * (float)(v - q_offset(type));
}

/* Bytes of N rows of K values packed: whole groups of 16 rows */
int64_t gguf_q8_packed_bytes(int type, int64_t N, int64_t K) {
    return (N + R - 1) / R * (K / QK) * record_bytes(type);
}

/* The N rows of file blocks at src (K values each) into the packed layout at dst (``gguf_q8_packed_bytes``);
 * rows past N in the last group are zeros. */
int gguf_q8_pack(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    if (!q8_packs(type) || K % block_values(type)) return -1;
    const int64_t subs = K / QK, per = block_values(type) / QK, row_bytes = K / block_values(type) * block_bytes(type);
    const int64_t rec = record_bytes(type), G = (N + R - 1) / R;
    memset(dst, 0, (size_t)gguf_q8_packed_bytes(type, N, K));
    sub_values zero;
    memset(&zero, 0, sizeof zero);
    for (int i = 0; i < 32; i++) zero.v[i] = type == Q8_0 ? 0x80 : (uint8_t)q_offset(type); /* a zero row */
    for (int64_t g = 0; g < G; g++)
        for (int64_t b = 0; b < subs; b++)
            for (int r = 0; r < R; r++) {
                const int64_t n = g * R + r;
                sub_values o = zero;
                if (n < N)
                    sub_block_values(type, src + n * row_bytes + b / per * block_bytes(type), (int)(b % per), &o);
                put_lane(type, dst + (g * subs + b) * rec, r, &o);
            }
    return 0;
}

/* out[i, K] fp32 = row ids[i] of the packed weight (of N rows): the reference decoder's values. */
int gguf_q8_rows(int type, const uint8_t *w, const int64_t *ids, int64_t n_ids, int64_t N, int64_t K, float *out) {
    if (!q8_packs(type) || K % block_values(type)) return -1;
    const int64_t subs = K / QK, rec = record_bytes(type);
    for (int64_t i = 0; i < n_ids; i++) {
        const int64_t n = ids[i];
        if (n < 0 || n >= N) return -1;
        for (int64_t b = 0; b < subs; b++)
            for (int k = 0; k < QK; k++)
                out[i * K + b * QK + k] = lane_weight(type, w + (n / R * subs + b) * rec, (int)(n % R), k);
    }
    return 0;
}

#endif
