"""Llama 2 / 3 / 3.1 / 3.2, SmolLM / SmolLM2, TinyLlama: the plain decoder every other family departs from."""
from actorserve.runtime.model.family import Family

FAMILY = Family("llama", ("LlamaForCausalLM",), ("llama",), ("llama",),
                "Llama 2 / 3 / 3.1 / 3.2 (llama3 and linear rope scaling), SmolLM / SmolLM2, TinyLlama")
