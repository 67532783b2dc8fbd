"""Top-k / top-p sampling of a batch of rows in one launch, without sorting the vocabulary.

Each program takes one row. Top-k keeps the values at or above the k-th largest, and top-p the largest
values whose mass (among those top-k keeps, renormalised) reaches p, the most likely always kept: both
thresholds are found by bisection over the row's values, each step one pass of masked counts or sums.
The token is then the exponential race over the survivors, argmax of exp(x - max) / E with E ~ Exp(1)
drawn by the caller (``noise``), so a seeded request's noise is still its own generator's. Reference:
``runtime.model.sampling.sampler.top_k_top_p_mask`` (the CPU sampler's own filter, by sorting) and the race.
Values tied at a threshold are all kept, where sorting would keep some of them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BISECTIONS = 48


@triton.jit
def _bisect(base, V, lo, hi, target, keep_from, top, COUNT: tl.constexpr, BISECTIONS: tl.constexpr,
            BLOCK: tl.constexpr):
    """The threshold between lo and hi where the row's measure above it falls below ``target``: the count
    of values >= t (COUNT), or the mass exp(x - top) of the kept values > t. Returns (lo, hi)."""
    offs = tl.arange(0, BLOCK)
    for _ in range(BISECTIONS):
        mid = lo + (hi - lo) * 0.5
        measure = 0.0
        for start in range(0, V, BLOCK):
            x = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
            if COUNT:
                measure += tl.sum((x >= mid).to(tl.float32), axis=0)
            else:
                measure += tl.sum(tl.where((x > mid) & (x >= keep_from), tl.exp(x - top), 0.0), axis=0)
        if measure >= target:
            lo = mid
        else:
            hi = mid
    return lo, hi


@triton.jit
def _sample_kernel(logits_ptr, noise_ptr, k_ptr, p_ptr, out_ptr, V, stride, noise_stride,
                   BISECTIONS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    top = float("-inf")
    low = float("inf")
    for start in range(0, V, BLOCK):
        x = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
        top = tl.maximum(top, tl.max(x, axis=0))
        low = tl.minimum(low, tl.min(tl.where(x == float("-inf"), float("inf"), x), axis=0))
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    # top-k: the largest threshold t with count(x >= t) >= k (all values where k is 0 or >= V)
    keep_from = low
    if k > 0 and k < V:
        keep_from, _ = _bisect(base, V, low, top, k.to(tl.float32), low, top, True, BISECTIONS, BLOCK)
    # top-p over what top-k keeps: keep x where the mass strictly above x is below p
    if p < 1.0:
        total = 0.0
        for start in range(0, V, BLOCK):
            x = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
            total += tl.sum(tl.where(x >= keep_from, tl.exp(x - top), 0.0), axis=0)
        _, hi = _bisect(base, V, keep_from, top, p * total, keep_from, top, False, BISECTIONS, BLOCK)
        keep_from = tl.maximum(keep_from, tl.minimum(hi, top))
    best = float("-inf")
    best_at = 0
    for start in range(0, V, BLOCK):
        at = start + offs
        x = tl.load(base + at, mask=at < V, other=float("-inf")).to(tl.float32)
        e = tl.load(noise_ptr + row.to(tl.int64) * noise_stride + at, mask=at < V, other=1.0)
        score = tl.where(x >= keep_from, tl.exp(x - top) / e, float("-inf"))
        chunk_best = tl.max(score, axis=0)
        chunk_at = tl.min(tl.where(score == chunk_best, at, V), axis=0)
        if chunk_best > best:
            best = chunk_best
            best_at = chunk_at
    tl.store(out_ptr + row, best_at)


def top_k_top_p_sample(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                       noise: torch.Tensor) -> torch.Tensor:
    """logits [B, V] after temperature; top_k [B] (0: off), top_p [B] (1: off); noise [B, V] ~ Exp(1).
    Returns the sampled token of each row [B] int64."""
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.int32, device=logits.device)
    if b == 0:
        return out.long()
    logits, noise = logits.contiguous(), noise.float().contiguous()
    _sample_kernel[(b,)](logits, noise, top_k.to(device=logits.device, dtype=torch.int32).contiguous(),
                         top_p.to(device=logits.device, dtype=torch.float32).contiguous(), out, v,
                         logits.stride(0), noise.stride(0), BISECTIONS=_BISECTIONS,
                         BLOCK=min(1024, triton.next_power_of_2(v)))
    return out.long()
