/* Decode attention over the paged KV cache, read in place (no gather), written against the vector layer
 * (../simd.h) and built once per ISA and element type (bf16 or fp32 q and out: ``elem``), and per cache
 * element (``kv_elem``: the element type, or bf16 under fp32).
 *
 * One query token per sequence. q and out are [B, H, D]; the caches are [KVH, num_blocks, block_size, D]
 * (the torch backend's layout); block_tables is [B, table_stride] int64, seq_lens [B] int64. Each work
 * item is one (sequence, KV head): its G = H / KVH query heads read every key and value row once. Scores,
 * softmax and the weighted sum of values are fp32; the output is rounded to the element type once. D % 32 == 0.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "../prefetch.h"
#include "../simd.h"

#define MAX_G 16
#define MAX_D 256

/* The next block of a sequence lies anywhere in the pool, where the hardware prefetcher does not look, so
 * the one after next is fetched while this block is read (faster on contiguous blocks too). */
#ifndef AHEAD
#define AHEAD 2 /* blocks fetched ahead of the one being read */
#endif
static inline __attribute__((always_inline)) void prefetch_block(const kv_elem *p, int64_t elems) {
    prefetch_lines(p, elems * (int64_t)sizeof(kv_elem));
}

/* One (sequence, KV head). Inlined into clones with G and D constant (``one_fixed``), so that the loops
 * over heads and columns unroll and the accumulators live in registers: with them in memory (runtime G
 * and D) every multiply-add of pass 2 went through the stack, and the kernel ran at about half the
 * machine's memory bandwidth. Pass 1 keeps VL partial sums of one head at a time; pass 2 tiles the heads
 * by 4 and the columns by 4 vectors, at most 16 accumulators, re-reading a tile's value rows from cache. */
static inline __attribute__((always_inline)) void one_impl(
        const elem *q, const kv_elem *k_cache, const kv_elem *v_cache, const int64_t *table, int64_t len,
        elem *out, const int64_t G, int64_t NB, int64_t BS, const int64_t D, int64_t kvh, float scale,
        int64_t first, float softcap, float *scores /* [G, len - lo rounded up to 16] */,
        float *part /* NULL, or [G, D + 2]: out in fp32 with each head's score max and exp sum after it */,
        int stream /* the keys come from memory: ask for them ahead (not where an earlier row read them) */) {
    /* keys [first, len) are seen (a sliding window starts past 0); the blocks before first's are not read,
     * so a window's freed blocks may hold anything. Scores are kept from lo, first's block's start. */
    const int64_t lo = first / BS * BS, span = len - lo;
    const int64_t stride = (span + 15) / 16 * 16;
    const int64_t head_base = kvh * NB * BS * D;
    /* pass 1: scores[g, t - lo] = scale * q_g . k_t, VL keys at a time (one horizontal reduction per VL) */
    const vf vscale = vset1(scale);
    for (int64_t t0 = lo; t0 < len; t0 += BS) {
        const kv_elem *kb = k_cache + head_base + table[t0 / BS] * BS * D;
        const int64_t n = len - t0 < BS ? len - t0 : BS;
        /* the value rows are fetched beside the keys, so that pass 2 reads them from cache */
        if (stream && t0 == lo) {
            prefetch_block(v_cache + head_base + table[lo / BS] * BS * D, n * D);
            for (int64_t k = 1; k < AHEAD && lo + k * BS < len; k++) {
                prefetch_block(k_cache + head_base + table[lo / BS + k] * BS * D, BS * D);
                prefetch_block(v_cache + head_base + table[lo / BS + k] * BS * D, BS * D);
            }
        }
        /* the block AHEAD on is asked for VL rows at a time, as these are read: asked for whole, its lines
         * queued ahead of this block's own loads and left the arithmetic waiting on them */
        const int64_t ahead = stream && t0 + AHEAD * BS < len ? head_base + table[t0 / BS + AHEAD] * BS * D : -1;
        for (int64_t i0 = 0; i0 < n; i0 += VL) {
            const vcount m = vtail(n, i0);
            if (ahead >= 0) {
                prefetch_block(k_cache + ahead + i0 * D, VL * D);
                prefetch_block(v_cache + ahead + i0 * D, VL * D);
            }
            for (int64_t g = 0; g < G; g++) {
                const elem *qg = q + g * D;
                vf part[VL];
                if (m == VL) { /* a whole vector of keys: unrolled, so that the partial sums stay in registers */
#pragma GCC unroll 16
                    for (int64_t j = 0; j < VL; j++) {
                        vf acc = vzero();
                        const kv_elem *kr = kb + (i0 + j) * D;
                        for (int64_t d = 0; d < D; d += VDOT_QK) acc = vdot_qk(acc, qg + d, kr + d);
                        part[j] = acc;
                    }
                } else {
                    for (int64_t j = 0; j < VL; j++) {
                        vf acc = vzero();
                        if (j < m) {
                            const kv_elem *kr = kb + (i0 + j) * D;
                            for (int64_t d = 0; d < D; d += VDOT_QK) acc = vdot_qk(acc, qg + d, kr + d);
                        }
                        part[j] = acc;
                    }
                }
                vstore_n(scores + g * stride + t0 - lo + i0, vmul(vsum_each(part), vscale), m);
            }
        }
    }
    /* softmax per head, fp32; the padded tail of each row is zero, as are the keys before the window's */
    for (int64_t g = 0; g < G; g++) {
        float *s = scores + g * stride;
        if (softcap > 0.0f) /* Gemma's cap: softcap * tanh(score / softcap), after the scale */
            for (int64_t t = first - lo; t < span; t++) s[t] = softcap * tanhf(s[t] / softcap);
        for (int64_t t = 0; t < first - lo; t++) s[t] = -INFINITY;
        for (int64_t t = span; t < stride; t++) s[t] = -INFINITY;
        vf m = vset1(-INFINITY);
        for (int64_t t = 0; t < stride; t += VL) m = vmax(m, vload(s + t));
        const vf mx = vset1(vmaxall(m));
        vf sum = vzero();
        for (int64_t t = 0; t < stride; t += VL) {
            const vf e = vkeep(vexp(vsub(vload(s + t), mx)), t < span ? vtail(span, t) : 0);
            sum = vadd(sum, e);
            vstore(s + t, e);
        }
        const float total = vsum(sum);
        if (part) part[g * (D + 2) + D] = vmaxall(m), part[g * (D + 2) + D + 1] = total;
        const vf inv = vset1(1.0f / total);
        for (int64_t t = 0; t < stride; t += VL) vstore(s + t, vmul(vload(s + t), inv));
    }
    /* pass 2: out_g = sum_t p[g, t] v_t, fp32 accumulators, per tile of up to 4 heads x 64 columns */
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
        const int64_t gt = G - g0 < 4 ? G - g0 : 4;
        for (int64_t c0 = 0; c0 < D; c0 += 4 * VL) {
            const int64_t ct = (D - c0 < 4 * VL ? D - c0 : 4 * VL) / VL;
            vf acc[4][4];
            for (int64_t g = 0; g < 4; g++)
                for (int64_t j = 0; j < 4; j++) acc[g][j] = vzero();
            for (int64_t t0 = lo; t0 < len; t0 += BS) {
                const kv_elem *vb = v_cache + head_base + table[t0 / BS] * BS * D + c0;
                const int64_t n = len - t0 < BS ? len - t0 : BS;
                const float *p = scores + g0 * stride + t0 - lo;
                for (int64_t i = 0; i < n; i++) {
                    const kv_elem *vr = vb + i * D;
                    for (int64_t j = 0; j < 4; j++) {
                        if (j >= ct) break;
                        const vf v = vload_kv(vr + j * VL);
                        for (int64_t g = 0; g < 4; g++) {
                            if (g >= gt) break;
                            acc[g][j] = vfmadd(vset1(p[g * stride + i]), v, acc[g][j]);
                        }
                    }
                }
            }
            for (int64_t g = 0; g < gt; g++)
                for (int64_t j = 0; j < ct; j++) {
                    if (part) {
                        vstore(part + (g0 + g) * (D + 2) + c0 + j * VL, acc[g][j]);
                        continue;
                    }
                    float tmp[VL];
                    vstore(tmp, acc[g][j]);
                    for (int e = 0; e < VL; e++) out[(g0 + g) * D + c0 + j * VL + e] = to_e(tmp[e]);
                }
        }
    }
}

#define ONE_FIXED(g, d)                                                                                       \
    static void one_g##g##_d##d(const elem *q, const kv_elem *kc, const kv_elem *vc, const int64_t *tb,        \
                                int64_t len, elem *out, int64_t NB, int64_t BS, int64_t kvh, float scale,  \
                                int64_t first, float softcap, float *scores, float *part, int stream) {       \
        one_impl(q, kc, vc, tb, len, out, g, NB, BS, d, kvh, scale, first, softcap, scores, part, stream);     \
    }
ONE_FIXED(1, 64) ONE_FIXED(2, 64) ONE_FIXED(3, 64) ONE_FIXED(4, 64) ONE_FIXED(5, 64) ONE_FIXED(6, 64)
ONE_FIXED(7, 64) ONE_FIXED(8, 64)
ONE_FIXED(1, 128) ONE_FIXED(2, 128) ONE_FIXED(3, 128) ONE_FIXED(4, 128) ONE_FIXED(5, 128) ONE_FIXED(6, 128)
ONE_FIXED(7, 128) ONE_FIXED(8, 128)

typedef void (*one_fn)(const elem *, const kv_elem *, const kv_elem *, const int64_t *, int64_t, elem *,
                       int64_t, int64_t, int64_t, float, int64_t, float, float *, float *, int);

/* The clone for (G, D), or 0: those shapes take the generic body. */
static one_fn one_fixed(int64_t G, int64_t D) {
    static const one_fn d64[8] = {one_g1_d64, one_g2_d64, one_g3_d64, one_g4_d64,
                                  one_g5_d64, one_g6_d64, one_g7_d64, one_g8_d64};
    static const one_fn d128[8] = {one_g1_d128, one_g2_d128, one_g3_d128, one_g4_d128,
                                   one_g5_d128, one_g6_d128, one_g7_d128, one_g8_d128};
    if (G < 1 || G > 8) return 0;
    return D == 64 ? d64[G - 1] : D == 128 ? d128[G - 1] : 0;
}

static void one(const elem *q, const kv_elem *k_cache, const kv_elem *v_cache, const int64_t *table,
                int64_t len, elem *out, int64_t G, int64_t NB, int64_t BS, int64_t D, int64_t kvh,
                float scale, int64_t first, float softcap, float *scores, float *part, int stream) {
    one_impl(q, k_cache, v_cache, table, len, out, G, NB, BS, D, kvh, scale, first, softcap, scores, part, stream);
}

/* How many parts each (sequence, KV head) item's keys are cut into, so that a step of fewer items than
 * threads keeps them all busy (a lone sequence's 3 KV heads on 2 threads left one thread idle a third of
 * the time): enough parts for two units a thread, as many units on each thread, parts of 4 blocks or more
 * (shorter ones cost more to merge than they save). */
static int64_t parts_of(int64_t items, int64_t max_len, int64_t BS, int threads) {
    if (threads < 2 || items >= 2 * threads) return 1;
    int64_t S = (2 * threads + items - 1) / items;
    while ((items * S) % threads) S++;
    while (S > 1 && max_len < 4 * S * BS) S--;
    return S > 8 ? 8 : S;
}

/* out_g of one item from its S parts' fp32 outputs, each softmax-normalized over its own keys: weighted by
 * the part's share of the whole exp sum (exp of its max against the largest). A part with no keys has sum 0. */
static void combine(const float *parts, int64_t S, int64_t G, int64_t D, elem *out) {
    for (int64_t g = 0; g < G; g++) {
        float top = -INFINITY, total = 0.0f, w[8];
        for (int64_t s = 0; s < S; s++) {
            const float *st = parts + (s * G + g) * (D + 2) + D;
            if (st[1] > 0.0f && st[0] > top) top = st[0];
        }
        for (int64_t s = 0; s < S; s++) {
            const float *st = parts + (s * G + g) * (D + 2) + D;
            w[s] = st[1] > 0.0f ? st[1] * expf(st[0] - top) : 0.0f;
            total += w[s];
        }
        for (int64_t d0 = 0; d0 < D; d0 += VL) {
            vf acc = vzero();
            for (int64_t s = 0; s < S; s++)
                if (w[s] > 0.0f) acc = vfmadd(vset1(w[s] / total), vload(parts + (s * G + g) * (D + 2) + d0), acc);
            float tmp[VL];
            vstore(tmp, acc);
            for (int e = 0; e < VL; e++) out[g * D + d0 + e] = to_e(tmp[e]);
        }
    }
}

/* q [B, H, D] with contiguous heads and rows q_row_stride elements apart (the q columns of a fused q|k
 * output need no copy); out [B, H, D] contiguous. Query row b attends over the first seq_lens[b] cached
 * tokens of the sequence whose block table is row row_seq[b] of block_tables (row b where row_seq is
 * NULL): several query rows may share a sequence, each with its own length, which makes a prefill chunk's
 * causal attention (its K/V written to the cache first). A row sees its last ``window`` tokens only where
 * window > 0 (a sliding window: keys k with len - k <= window), and its scores are capped by
 * softcap * tanh(s / softcap) where softcap > 0. Returns 0, or -1 where the shapes are outside what this
 * kernel takes (the caller checks first). */
int ELEM(paged_decode)(const elem *q, int64_t q_row_stride, const kv_elem *k_cache, const kv_elem *v_cache,
                       const int64_t *block_tables, int64_t table_stride, const int64_t *row_seq,
                       const int64_t *seq_lens, elem *out,
                      int64_t B, int64_t H, int64_t KVH, int64_t NB, int64_t BS, int64_t D, float scale,
                      int64_t window, float softcap, int threads) {
    const int64_t G = H / KVH;
    if (G > MAX_G || D > MAX_D || D % 32 || H % KVH) return -1;
    int64_t max_len = 0;
    for (int64_t b = 0; b < B; b++) max_len = seq_lens[b] > max_len ? seq_lens[b] : max_len;
    const int64_t per_item = G * ((max_len + 15) / 16 * 16);
    if (threads < 1) threads = 1;
    const one_fn fixed = one_fixed(G, D);
    /* units: (item, part) with items (sequence, KV head); an item's keys are cut into S parts where the
     * items alone are too few for the threads */
    const int64_t items = B * KVH, S = parts_of(items, max_len, BS, threads), units = items * S;
    float *parts = S > 1 ? (float *)malloc(sizeof(float) * (size_t)(units * G * (D + 2))) : NULL;
    if (S > 1 && !parts) return -2;
    /* chunks of at most 16 units and at most a quarter of a thread's share, dealt in turn, so that each
     * thread gets about as much work where units differ in length (a prefill chunk's rows grow) and where
     * they are few (chunks of 16 would deal 16 sequences x 3 KV heads as 32 items to one thread, 16 to
     * the other) */
    const int64_t quarter = units / (4 * threads);
    const int64_t chunk = quarter > 16 ? 16 : quarter > 1 ? quarter : 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = (float *)malloc(sizeof(float) * (per_item > 0 ? per_item : 1));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static, chunk)
        for (int64_t unit = 0; unit < units; unit++) {
            if (!scores) continue;
            const int64_t item = unit / S, s = unit % S, b = item / KVH, h = item % KVH;
            const int64_t len = seq_lens[b];
            const int64_t *table = block_tables + (row_seq ? row_seq[b] : b) * table_stride;
            float *part = parts ? parts + (item * S + s) * G * (D + 2) : NULL;
            if (part)
                for (int64_t g = 0; g < G; g++) part[g * (D + 2) + D + 1] = 0.0f; /* no keys yet */
            if (len <= 0) continue;
            int64_t first = window > 0 && len > window ? len - window : 0, end = len;
            if (S > 1) { /* this part's blocks of the item's */
                const int64_t lo = first / BS * BS, blocks = (len - lo + BS - 1) / BS;
                const int64_t a = lo + blocks * s / S * BS, z = lo + blocks * (s + 1) / S * BS;
                first = a > first ? a : first, end = z < len ? z : len;
                if (first >= end) continue;
            }
            /* a row whose sequence the row before read (a prefill chunk's) finds its keys in cache */
            const int stream = !row_seq || b == 0 || row_seq[b] != row_seq[b - 1];
            const int64_t nb = (item + 1) / KVH;
            if (unit + 1 < units && (unit + 1) % S == 0 && (!row_seq || nb == 0 || row_seq[nb] != row_seq[nb - 1])) {
                /* the next item's first keys, while this one is attended */
                const int64_t nh = (item + 1) % KVH, nlen = seq_lens[nb];
                const int64_t *nt = block_tables + (row_seq ? row_seq[nb] : nb) * table_stride;
                const int64_t nlo = (window > 0 && nlen > window ? nlen - window : 0) / BS * BS;
                for (int64_t k = 0; k < 2 && nlo + k * BS < nlen; k++)
                    prefetch_block(k_cache + nh * NB * BS * D + nt[nlo / BS + k] * BS * D,
                                   (nlen - nlo - k * BS < BS ? nlen - nlo - k * BS : BS) * D);
            }
            if (fixed)
                fixed(q + b * q_row_stride + h * G * D, k_cache, v_cache, table, end,
                      out + (b * H + h * G) * D, NB, BS, h, scale, first, softcap, scores, part, stream);
            else
                one(q + b * q_row_stride + h * G * D, k_cache, v_cache, table, end,
                    out + (b * H + h * G) * D, G, NB, BS, D, h, scale, first, softcap, scores, part, stream);
        }
        free(scores);
        if (parts) { /* after the loop's barrier: every part is in */
#pragma omp for schedule(static)
            for (int64_t item = 0; item < items; item++)
                if (seq_lens[item / KVH] > 0)
                    combine(parts + item * S * G * (D + 2), S, G, D, out + ((item / KVH) * H + (item % KVH) * G) * D);
        }
    }
    free(parts);
    return failed ? -2 : 0;
}

/* Store the step's new K and V rows [T, KVH, D] (rows strided, heads contiguous: columns of a fused qkv
 * output) at their slots of the caches [KVH, slots_per_head, D], as the cache's elements (``store_kv``).
 * Every slot is checked before anything is written; returns -1 (nothing written) where one is out of range. */
int ELEM(write_kv)(const elem *k, int64_t k_row_stride, const elem *v, int64_t v_row_stride,
                   const int64_t *slots, int64_t T, int64_t KVH, int64_t D, kv_elem *k_cache, kv_elem *v_cache,
                  int64_t slots_per_head) {
    for (int64_t t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= slots_per_head) return -1;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < KVH; h++) {
            const int64_t at = (h * slots_per_head + slots[t]) * D;
            store_kv(k_cache + at, k + t * k_row_stride + h * D, D);
            store_kv(v_cache + at, v + t * v_row_stride + h * D, D);
        }
    return 0;
}
