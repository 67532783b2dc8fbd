"""The reasoning formats by vLLM's names: the same tags, read by each family's rules."""
from __future__ import annotations

from actorserve.runtime.text.reasoning_parsers.base import ReasoningParser, TaggedReasoningParser


class DeepSeekR1Parser(ReasoningParser):
    """DeepSeek-R1 and its distills, QwQ: the template opens ``<think>`` in the prompt (R1-0528 writes it
    again), so the answer thinks until ``</think>``; an answer that never closes it was all thinking."""

    name = "deepseek_r1"
    start_in_prompt = True


class Qwen3Parser(TaggedReasoningParser):
    """Qwen3: thinks between ``<think>`` and ``</think>`` unless the request's ``enable_thinking`` is false
    (the template then writes an empty thinking block itself, and the answer is all content)."""

    name = "qwen3"


class Glm45Parser(TaggedReasoningParser):
    name = "glm45"


class SeedOssParser(TaggedReasoningParser):
    """Seed-OSS: ``<seed:think>`` ... ``</seed:think>``."""

    name = "seed_oss"
    start = "<seed:think>"
    end = "</seed:think>"
