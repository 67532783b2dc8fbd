"""The model registry: which architectures load, by the names checkpoints give them (an HF config's
``architectures`` and ``model_type``, a GGUF file's ``general.architecture``), each mapped to its family.

A family is the switches of ``ArchConfig`` it sets (and the one decoder, ``runtime.model.decoder``, reads
them). What a checkpoint names and no family claims is a ``ModelLoadError`` that lists what is supported.
Importing this module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actorserve.runtime.errors import ModelLoadError


@dataclass(frozen=True)
class Family:
    name: str  # ArchConfig.arch
    hf_architectures: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    gguf_architectures: tuple[str, ...]
    models: str  # what it covers, for the README and the errors


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("LlamaForCausalLM",), ("llama",), ("llama",),
           "Llama 2 / 3 / 3.1 / 3.2 (llama3 and linear rope scaling), SmolLM / SmolLM2, TinyLlama"),
    Family("mistral", ("MistralForCausalLM",), ("mistral",), (), "Mistral 7B (its sliding window too)"),
    Family("gemma2", ("Gemma2ForCausalLM",), ("gemma2",), (),
           "Gemma 2 (alternating sliding and global layers, attention and logit soft-capping)"),
    Family("gemma3", ("Gemma3ForCausalLM",), ("gemma3_text",), (),
           "Gemma 3 text models (sliding layers with their own rotary base, q and k norms)"),
    Family("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), ("qwen2",), "Qwen2 / Qwen2.5 (q, k, v biases)"),
    Family("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), ("qwen3",), "Qwen3 dense (q and k norms)"),
    Family("phi3", ("Phi3ForCausalLM",), ("phi3",), (),
           "Phi-3 / Phi-3.5 mini (fused qkv and gate-up weights, sliding window; without LongRoPE scaling)"),
    Family("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), (),
           "Qwen3-MoE (top-k routing, renormalised where norm_topk_prob)"),
    Family("qwen2_moe", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), (),
           "Qwen1.5-MoE / Qwen2-MoE (top-k routing and a gated shared expert)"),
    Family("mixtral", ("MixtralForCausalLM",), ("mixtral",), (),
           "Mixtral 8x7B / 8x22B (top-2 routing, renormalised)"),
    Family("qwen3_next", ("Qwen3NextForCausalLM",), ("qwen3_next",), (),
           "Qwen3-Next (gated delta net linear attention interleaved with gated full attention, MoE)"),
    Family("deepseek_v2", ("DeepseekV2ForCausalLM",), ("deepseek_v2",), (),
           "DeepSeek-V2 / V2-Lite (multi-head latent attention over a compressed KV cache, shared and routed "
           "experts; without YaRN rope scaling)"),
    Family("olmoe", ("OlmoeForCausalLM",), ("olmoe",), (),
           "OLMoE (q and k norms over the whole projection, top-k routing without renormalisation)"),
)
NAMES = tuple(f.name for f in FAMILIES)


def supported() -> str:
    return "; ".join(f"{', '.join(f.hf_architectures)} ({f.models})" for f in FAMILIES)


def markdown() -> str:
    """The README's list of supported architectures (``python -m actorserve.runtime.model.registry``
    prints it; a test checks the README against it)."""
    return "\n".join(f"- `{arch}`: {f.models}" + (f" (GGUF `{'`, `'.join(f.gguf_architectures)}`)"
                                                   if f.gguf_architectures else "")
                     for f in FAMILIES for arch in f.hf_architectures)


def family_of_hf(config: dict[str, Any]) -> Family:
    """The family of an HF config.json: by its ``architectures``, else its ``model_type``."""
    named = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    for family in FAMILIES:
        if any(a in family.hf_architectures for a in named):
            return family
    model_type = config.get("model_type")
    if not named:
        for family in FAMILIES:
            if model_type in family.hf_model_types:
                return family
    what = ", ".join(named) or repr(model_type)
    raise ModelLoadError(f"unsupported architecture {what}; supported: {supported()}")


def family_of_gguf(arch: str) -> Family:
    for family in FAMILIES:
        if arch in family.gguf_architectures:
            return family
    gguf = sorted(a for f in FAMILIES for a in f.gguf_architectures)
    raise ModelLoadError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(gguf)}")


if __name__ == "__main__":
    print(markdown())
