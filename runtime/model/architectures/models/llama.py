"""Llama 2 / 3 / 3.1 / 3.2, SmolLM / SmolLM2, TinyLlama: the plain decoder every other family departs from."""
from actorserve.runtime.model.architectures.family import Family, gguf_experts

# llama.cpp writes Mixtral (and other Llama-shaped MoE models) as "llama" with experts, renormalised
FAMILY = Family("llama", ("LlamaForCausalLM",), ("llama",), ("llama",),
                "Llama 2 / 3 / 3.1 / 3.2 (llama3, linear and YaRN rope scaling), SmolLM / SmolLM2, TinyLlama",
                gguf_switches=lambda a, names: gguf_experts(a, names, renormalize=True) if a("expert_count") else {})
