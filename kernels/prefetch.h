/* Asking for memory before it is read: the helpers of the kernels that stream a weight or a cache.
 *
 * Always inlined: GCC (12, at -O1 and above) takes a small function whose only effect is a prefetch for
 * one without effects and deletes the calls to it where it is not inlined early, so a plain ``static
 * inline`` helper silently prefetched nothing.
 */
#ifndef ACTORSERVE_PREFETCH_H
#define ACTORSERVE_PREFETCH_H

#include <immintrin.h>
#include <stdint.h>

/* The cache lines of [p, p + bytes): a hint, so an address past the end of an array is harmless. */
static inline __attribute__((always_inline)) void prefetch_lines(const void *p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

/* How far ahead of its reads a product that streams a weight asks for it. A decode step reads each weight
 * once, from memory, with too little work per byte for the loads to hide their own latency, and the
 * hardware prefetcher of some CPUs does not run far enough ahead of such a stream. */
#ifndef STREAM_AHEAD
#define STREAM_AHEAD 4096
#endif

/* Before reading [p, p + bytes) of a stream that ends at end: the bytes STREAM_AHEAD past them, up to end.
 * A reader that calls this for each piece it reads asks for every line of the stream once. */
static inline __attribute__((always_inline)) void prefetch_stream(const void *p, int64_t bytes, const void *end) {
    const char *a = (const char *)p + STREAM_AHEAD;
    if (a < (const char *)end) prefetch_lines(a, a + bytes < (const char *)end ? bytes : (const char *)end - a);
}

#endif
