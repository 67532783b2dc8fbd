"""Linear-attention kernels: the gated delta rule (``gated_delta``) and the causal depthwise convolution
(``causal_conv``) of Qwen3-Next's GDN layers, each over a state per sequence kept beside the paged KV
cache."""
