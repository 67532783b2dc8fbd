"""An answer as the ordered blocks the Responses and Messages APIs return: thinking, text, and one block
per tool call.

Runs in the frontend process. ``blocks_of`` reads a finished answer; ``BlockStream`` turns a growing
answer's deltas (``OutputParser.feed``) into opens, deltas and closes of blocks, one block open at a
time: news of another kind closes the open block and opens the next. Each API names these events its
own way; the order and the text are the same for both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from actorserve.runtime.text.output_parser import OutputDelta, ParsedOutput

Kind = Literal["reasoning", "text", "call"]


@dataclass
class Block:
    kind: Kind
    text: str = ""  # the thinking, the text, or the call's arguments (JSON text)
    name: Optional[str] = None  # a call's function


@dataclass(frozen=True)
class BlockEvent:
    what: Literal["open", "delta", "close"]
    index: int
    block: Block
    delta: str = ""


def blocks_of(parsed: ParsedOutput) -> list[Block]:
    blocks = []
    if parsed.reasoning:
        blocks.append(Block("reasoning", parsed.reasoning))
    if parsed.content:
        blocks.append(Block("text", parsed.content))
    blocks.extend(Block("call", c.arguments, c.name) for c in parsed.calls)
    return blocks


class BlockStream:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._open: Optional[int] = None
        self._calls: dict[int, int] = {}  # a call's index among the calls -> its block's

    def feed(self, news: OutputDelta) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        if news.reasoning:
            self._append(events, "reasoning", news.reasoning)
        if news.content:
            self._append(events, "text", news.content)
        for call in news.calls:
            if call.name is not None:
                self._close(events)
                self._start(events, Block("call", name=call.name))
                self._calls[call.index] = self._open
            self._delta(events, self._calls[call.index], call.arguments)
        return events

    def finish(self) -> list[BlockEvent]:
        events: list[BlockEvent] = []
        self._close(events)
        return events

    def _append(self, events: list[BlockEvent], kind: Kind, text: str) -> None:
        if self._open is None or self.blocks[self._open].kind != kind:
            self._close(events)
            self._start(events, Block(kind))
        self._delta(events, self._open, text)

    def _start(self, events: list[BlockEvent], block: Block) -> None:
        self.blocks.append(block)
        self._open = len(self.blocks) - 1
        events.append(BlockEvent("open", self._open, block))

    def _delta(self, events: list[BlockEvent], index: int, text: str) -> None:
        if text:
            self.blocks[index].text += text
            events.append(BlockEvent("delta", index, self.blocks[index], text))

    def _close(self, events: list[BlockEvent]) -> None:
        if self._open is not None:
            events.append(BlockEvent("close", self._open, self.blocks[self._open]))
            self._open = None
