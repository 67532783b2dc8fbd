"""Tool-call parsers by vLLM's names (``--tool-call-parser``): each finds the calls a model family writes
in its answer, whole or as it streams. A new format is a file here and an entry below."""
from __future__ import annotations

from actorserve.runtime.text.tool_parsers.base import Scan, ToolCall, ToolParser
from actorserve.runtime.text.tool_parsers.deepseek_v3 import DeepSeekV3Parser
from actorserve.runtime.text.tool_parsers.hermes import HermesParser
from actorserve.runtime.text.tool_parsers.llama3_json import Llama3JsonParser
from actorserve.runtime.text.tool_parsers.mistral import MistralParser
from actorserve.runtime.text.tool_parsers.pythonic import PythonicParser
from actorserve.runtime.text.tool_parsers.qwen3_xml import Qwen3CoderParser, Qwen3XmlParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (
    HermesParser, Llama3JsonParser, MistralParser, PythonicParser, Qwen3XmlParser, Qwen3CoderParser,
    DeepSeekV3Parser)}

__all__ = ["TOOL_PARSERS", "Scan", "ToolCall", "ToolParser"]
