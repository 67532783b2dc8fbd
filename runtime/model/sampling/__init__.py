"""Sampling: the sampler of every request row, and the rejection sampler of speculative decoding."""
