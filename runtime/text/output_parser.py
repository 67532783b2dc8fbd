"""One sample's answer read as a reasoning model's thinking, its content and its tool calls.

Used by the client edge for every API that answers in those parts (chat, Responses, Anthropic Messages):
``parse`` reads a finished answer; ``feed`` reads a growing one and returns what is new since the last
call, so a stream's parts, joined, are exactly ``parse``'s. The reasoning parser splits the thinking off
first; the tool parser reads the rest. Content beside tool calls is trimmed of surrounding whitespace
(a stream holds a whitespace tail back until text follows it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from actorserve.runtime.text.reasoning_parsers import ReasoningParser
from actorserve.runtime.text.tool_parsers import ToolCall, ToolParser


@dataclass(frozen=True)
class ParsedOutput:
    reasoning: Optional[str]  # None: no reasoning parser, or no thinking
    content: Optional[str]  # None: nothing beside the thinking or the calls
    calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class CallDelta:
    """News of call ``index``: its name on its first delta (None after), then its arguments as they grow."""

    index: int
    name: Optional[str]
    arguments: str


@dataclass
class OutputDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class OutputParser:
    def __init__(self, reasoning: Optional[ReasoningParser] = None, tools: Optional[ToolParser] = None) -> None:
        self.reasoning, self.tools = reasoning, tools
        self._sent_reasoning = self._sent_content = 0
        self._sent_args: list[int] = []  # per call: the arguments' characters sent
        self.calls: tuple[ToolCall, ...] = ()  # the calls seen so far

    @property
    def active(self) -> bool:
        return self.reasoning is not None or self.tools is not None

    def parse(self, text: str) -> ParsedOutput:
        reasoning, content, calls = self._view(text, True)
        if not self.active:
            return ParsedOutput(None, content)
        return ParsedOutput(reasoning or None, content or None, calls)

    def feed(self, text: str, final: bool) -> OutputDelta:
        reasoning, content, calls = self._view(text, final)
        delta = OutputDelta(reasoning[self._sent_reasoning:], content[self._sent_content:])
        self._sent_reasoning, self._sent_content = len(reasoning), len(content)
        for index, call in enumerate(calls):
            if index == len(self._sent_args):
                self._sent_args.append(0)
                delta.calls.append(CallDelta(index, call.name, call.arguments))
            elif len(call.arguments) > self._sent_args[index]:
                delta.calls.append(CallDelta(index, None, call.arguments[self._sent_args[index]:]))
            self._sent_args[index] = len(call.arguments)
        self.calls = calls
        return delta

    def _view(self, text: str, final: bool) -> tuple[str, str, tuple[ToolCall, ...]]:
        reasoning, content = "", text
        if self.reasoning is not None:
            split = self.reasoning.split(text, final)
            reasoning, content = split.reasoning, split.content
        if self.tools is None:
            return reasoning, content, ()
        scan = self.tools.scan(content, final)
        return reasoning, scan.content.strip(), scan.calls
