"""Mixture of experts on a GPU: the routed experts' gated MLPs fused in one triton kernel (``fused_moe_triton``),
against the torch layer's own path (``runtime.model.architectures.moe``, its reference)."""
