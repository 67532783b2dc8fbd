"""Paged attention backends behind one interface.

A backend writes the new tokens' K/V into the paged cache and attends each query over its sequence's
cached keys. The torch reference is the ground truth that faster backends (triton, flashinfer) are
tested against.
"""
from actorserve.kernels.attention.interface import AttentionBackend, AttentionMetadata, SequenceGroup
from actorserve.kernels.attention.torch_ref import TorchPagedMetadata, TorchRefBackend, paged_attention, write_kv_ref
from actorserve.kernels.attention import cpu_decode  # after torch_ref: it builds on it

__all__ = ["AttentionBackend", "AttentionMetadata", "SequenceGroup", "TorchPagedMetadata", "TorchRefBackend",
           "cpu_decode", "paged_attention", "write_kv_ref"]
