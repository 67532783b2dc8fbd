"""Sampling on a GPU: top-k / top-p sampling of a batch's rows in one triton kernel (``top_k_top_p_triton``),
on the noise the torch sampler draws (``runtime.model.sampling.sampler``, its reference)."""
