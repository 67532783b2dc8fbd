"""Architectures on shared layers: the config every family fills in, the decoder, attention variants (MLA,
sliding window, linear attention), MoE, and the model registry of families."""
