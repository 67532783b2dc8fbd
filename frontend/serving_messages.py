"""/v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, served as the chat request it
amounts to.

Runs in the frontend process. ``messages_protocol`` writes the chat request; ``ChatServing.prepare``
renders and checks it; the answer is read by the chat turn's parsers into content blocks (thinking,
text, tool_use: ``answer_blocks``) and, streamed, into Anthropic's events. Errors take Anthropic's shape
(``errors.anthropic_error_body``), in a stream as its ``error`` event.
"""
from __future__ import annotations

import json
import logging
import uuid
from typing import AsyncIterator, Optional

from actorserve.frontend.answer_blocks import Block, BlockEvent, BlockStream, blocks_of
from actorserve.frontend.errors import APIError, anthropic_error_body
from actorserve.frontend.messages_protocol import CountTokensRequest, MessagesRequest
from actorserve.frontend.serving import ServingContext
from actorserve.frontend.serving_chat import ChatServing, ChatTurn
from actorserve.runtime.engine.outputs import CompletionOutput

log = logging.getLogger("actorserve.frontend")


class MessagesServing:
    def __init__(self, ctx: ServingContext, chat: ChatServing) -> None:
        self.ctx, self.chat = ctx, chat

    async def create(self, request: MessagesRequest, request_id: str) -> dict:
        turn = await self._prepare(request, request_id)
        out = await self.ctx.final(turn.prompt, turn.params, request_id)
        sample = out.outputs[0]
        parsed = turn.output_parser(self.ctx.reasoning_parser).parse(sample.text)
        message = self._message(request, turn, [_block(b) for b in blocks_of(parsed)])
        message.update(_stop(sample, bool(parsed.calls)))
        message["usage"]["output_tokens"] = len(sample.token_ids)
        return message

    async def stream(self, request: MessagesRequest, request_id: str) -> AsyncIterator[str]:
        turn = await self._prepare(request, request_id)
        outputs = await self.ctx.started(turn.prompt, turn.params, request_id)
        return self._events(request, request_id, turn, outputs)

    async def count_tokens(self, request: CountTokensRequest, request_id: str) -> dict:
        request.max_tokens = 1  # (the prompt is all that is counted)
        turn = await self._prepare(request, request_id)
        return {"input_tokens": len(turn.prompt.token_ids)}

    async def _events(self, request, request_id, turn: ChatTurn, outputs) -> AsyncIterator[str]:
        message = self._message(request, turn, [])
        yield _event("message_start", message=message)
        yield _event("ping")
        parser, blocks, sample = turn.output_parser(self.ctx.reasoning_parser), BlockStream(), None
        try:
            async for out in outputs:
                sample = out.outputs[0]
                for e in blocks.feed(parser.feed(sample.text, final=sample.finish_reason is not None)):
                    yield _block_event(e)
            for e in blocks.finish():
                yield _block_event(e)
            yield _event("message_delta", delta=_stop(sample, bool(parser.calls)),
                         usage={"output_tokens": len(sample.token_ids) if sample is not None else 0})
            yield _event("message_stop")
        except APIError as exc:
            yield _event("error", error=anthropic_error_body(exc.status, exc.message)["error"])
        except Exception as exc:  # after the 200: the error travels in the stream, and is logged
            log.exception("request %s failed while streaming", request_id)
            yield _event("error", error=anthropic_error_body(500, f"internal error: {type(exc).__name__}")["error"])
        finally:
            await outputs.aclose()

    async def _prepare(self, request: MessagesRequest, request_id: str) -> ChatTurn:
        return await self.chat.prepare_from(request.chat_body(), request.check_fields(), request_id, "messages",
                                            {"stop": "stop_sequences"})

    def _message(self, request: MessagesRequest, turn: ChatTurn, content: list[dict]) -> dict:
        return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
                "model": self.ctx.response_name(request.model), "content": content, "stop_reason": None,
                "stop_sequence": None, "usage": {"input_tokens": len(turn.prompt.token_ids), "output_tokens": 0,
                                                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


def _stop(sample: Optional[CompletionOutput], called: bool) -> dict:
    """Anthropic's stop_reason: tool_use after a call, max_tokens, stop_sequence (naming it), or end_turn."""
    if sample is None or sample.finish_reason == "abort":
        return {"stop_reason": None, "stop_sequence": None}
    if called:
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if sample.finish_reason == "length":
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if isinstance(sample.stop_reason, str):
        return {"stop_reason": "stop_sequence", "stop_sequence": sample.stop_reason}
    return {"stop_reason": "end_turn", "stop_sequence": None}


def _block(block: Block) -> dict:
    if block.kind == "reasoning":
        return {"type": "thinking", "thinking": block.text, "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    try:
        arguments = json.loads(block.text) if block.text else {}
    except json.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex}", "name": block.name,
            "input": arguments if isinstance(arguments, dict) else {}}


_DELTAS = {"reasoning": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
           "call": ("input_json_delta", "partial_json")}


def _block_event(e: BlockEvent) -> str:
    if e.what == "open":
        start = _block(Block(e.block.kind, "", e.block.name))  # empty: a call's input is {}
        return _event("content_block_start", index=e.index, content_block=start)
    if e.what == "delta":
        kind, key = _DELTAS[e.block.kind]
        return _event("content_block_delta", index=e.index, delta={"type": kind, key: e.delta})
    return _event("content_block_stop", index=e.index)


def _event(kind: str, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"
