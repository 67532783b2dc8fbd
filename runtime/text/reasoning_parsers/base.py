"""What every reasoning parser shares: the thinking between a start and an end tag, split from the answer.

``split`` reads the answer so far; unfinished (``final`` False), it holds back a tail that may be the start
of the end tag, so that a stream's reasoning and content only grow and end as the whole answer's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from actorserve.runtime.text.tool_parsers.base import held_back


@dataclass(frozen=True)
class Split:
    reasoning: str
    content: str


class ReasoningParser:
    """Thinking written between ``start`` and ``end``. ``start_in_prompt``: the template may have written
    the start tag already (an answer without it that has the end tag was thinking from its first word).
    ``thinking_off``: the request's template kwargs turned thinking off (``enable_thinking`` false), so the
    whole answer is content."""

    name: ClassVar[str]
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    start_in_prompt: ClassVar[bool] = False

    def __init__(self, template_kwargs: Optional[dict] = None) -> None:
        kwargs = template_kwargs or {}
        self.thinking_off = kwargs.get("enable_thinking") is False or kwargs.get("thinking") is False

    def split(self, text: str, final: bool) -> Split:
        if self.thinking_off:
            return Split("", text)
        head = text.lstrip()
        if not final and self.start.startswith(head):
            return Split("", "")  # it may be the start tag
        opened = head.startswith(self.start)
        if not opened and not self.start_in_prompt:
            return Split("", text)
        body = head[len(self.start):] if opened else text
        i = body.find(self.end)
        if i < 0:  # still thinking (or cut short while thinking)
            return Split(body if final else held_back(body, (self.end,)), "")
        return Split(body[:i], body[i + len(self.end):])


class TaggedReasoningParser(ReasoningParser):
    """The generic form: thinking opens with its start tag in the answer (``<think>`` ... ``</think>``)."""
