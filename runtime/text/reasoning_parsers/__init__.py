"""Reasoning parsers by vLLM's names (``--reasoning-parser``): each splits a reasoning model's thinking from
its answer, whole or as it streams. A new format is a class in ``models`` and an entry below."""
from __future__ import annotations

from actorserve.runtime.text.reasoning_parsers.base import ReasoningParser, Split, TaggedReasoningParser
from actorserve.runtime.text.reasoning_parsers.models import DeepSeekR1Parser, Glm45Parser, Qwen3Parser, SeedOssParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {p.name: p for p in (
    DeepSeekR1Parser, Qwen3Parser, Glm45Parser, SeedOssParser)}

__all__ = ["REASONING_PARSERS", "ReasoningParser", "Split", "TaggedReasoningParser"]
