"""Mistral: Llama's decoder with a sliding window on every layer."""
from actorserve.runtime.model.architectures.family import Family, windows

FAMILY = Family("mistral", ("MistralForCausalLM",), ("mistral",), (), "Mistral 7B (its sliding window too)",
                switches=windows)
