"""One module per model family, each a ``FAMILY`` (``runtime.model.architectures.family.Family``): its
checkpoint names and the ArchConfig switches it sets, with which the shared decoder
(``runtime.model.architectures.decoder``: attention, latent attention, gated delta nets, gated MLPs,
experts, norms and rotary from ``layers``, ``mla``,
``linear_attention`` and ``moe``) builds it. ``MODULES`` is the registry's order; adding a family is its
module and its name here."""
MODULES = ("llama", "mistral", "gemma2", "gemma3", "qwen2", "qwen3", "phi3", "qwen3_moe", "qwen2_moe", "mixtral",
           "qwen3_next", "deepseek_v2", "olmoe")
