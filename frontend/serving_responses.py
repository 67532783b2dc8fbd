"""/v1/responses: OpenAI's Responses API, served as the chat request it amounts to.

Runs in the frontend process. ``responses_protocol`` writes the chat request; ``ChatServing.prepare``
renders and checks it; the answer is read by the chat turn's parsers into output items (reasoning, a
message, function calls: ``answer_blocks``) and, streamed, into the API's typed events. Responses with
``store`` (OpenAI's default) are kept in the bounded ``ResponseStore`` for ``previous_response_id``, GET,
DELETE and, while a ``background`` one runs, cancel.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator, Optional

from actorserve.frontend.answer_blocks import Block, BlockEvent, BlockStream, blocks_of
from actorserve.frontend.errors import APIError
from actorserve.frontend.responses_protocol import ResponsesRequest
from actorserve.frontend.serving import ServingContext
from actorserve.frontend.serving_chat import ChatServing, ChatTurn
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.text.tokenizer import encode

log = logging.getLogger("actorserve.frontend")
_PREFIX = {"reasoning": "rs", "text": "msg", "call": "fc"}


class ResponsesServing:
    def __init__(self, ctx: ServingContext, chat: ChatServing) -> None:
        self.ctx, self.chat = ctx, chat
        self._running: dict[str, tuple[str, asyncio.Task]] = {}  # background responses: id -> (request id, task)

    async def create(self, request: ResponsesRequest, request_id: str) -> dict:
        history, turn = await self._prepare(request, request_id)
        response = self._response(request, "in_progress", [])
        if request.background:
            response["status"] = "queued"
            self.ctx.responses.put(response, [])
            task = asyncio.ensure_future(self._finish(request, request_id, turn, history, response))
            self._running[response["id"]] = (request_id, task)
            task.add_done_callback(lambda _: self._running.pop(response["id"], None))
            return dict(response)
        return await self._finish(request, request_id, turn, history, response)

    async def _finish(self, request, request_id, turn: ChatTurn, history, response: dict) -> dict:
        response["status"] = "in_progress"
        try:
            out = await self.ctx.final(turn.prompt, turn.params, request_id)
        except Exception as exc:  # a background response fails in its status; a foreground one, in its answer
            if not request.background:
                raise
            message = exc.message if isinstance(exc, APIError) else f"internal error: {type(exc).__name__}"
            response.update(status="failed", error={"code": "server_error", "message": message})
            return response
        sample = out.outputs[0]
        parsed = turn.output_parser(self.ctx.reasoning_parser).parse(sample.text)
        items = [_item(b, "completed") for b in blocks_of(parsed)]
        self._complete(response, request, turn, history, out, items)
        return response

    async def stream(self, request: ResponsesRequest, request_id: str) -> AsyncIterator[str]:
        if request.background:
            raise APIError(400, "background responses are not streamed here: create it, then GET it", "stream")
        history, turn = await self._prepare(request, request_id)
        outputs = await self.ctx.started(turn.prompt, turn.params, request_id)
        return self._events(request, request_id, turn, history, outputs)

    async def _events(self, request, request_id, turn: ChatTurn, history, outputs) -> AsyncIterator[str]:
        response = self._response(request, "in_progress", [])
        events = _Events()
        yield events("response.created", response=dict(response))
        yield events("response.in_progress", response=dict(response))
        parser, blocks, items, last = turn.output_parser(self.ctx.reasoning_parser), BlockStream(), [], None
        try:
            async for out in outputs:
                last, s = out, out.outputs[0]
                for e in blocks.feed(parser.feed(s.text, final=s.finish_reason is not None)):
                    for event in _item_events(e, items):
                        yield events(**event)
            for e in blocks.finish():
                for event in _item_events(e, items):
                    yield events(**event)
            self._complete(response, request, turn, history, last, items)
            # (a response cut short ends with it too, its status "incomplete", as vLLM's do: the SDKs' stream
            # helpers read the final response from this event alone)
            yield events("response.completed", response=response)
        except APIError as exc:
            response.update(status="failed", error={"code": "server_error", "message": exc.message})
            yield events("response.failed", response=response)
        except Exception as exc:  # after the 200: the error travels in the stream, and is logged
            log.exception("request %s failed while streaming", request_id)
            response.update(status="failed", error={"code": "server_error", "message": type(exc).__name__})
            yield events("response.failed", response=response)
        finally:
            await outputs.aclose()

    def get(self, response_id: str) -> dict:
        return self._stored(response_id).body

    def delete(self, response_id: str) -> dict:
        self._stored(response_id)
        running = self._running.get(response_id)
        if running is not None:
            running[1].cancel()
        self.ctx.responses.delete(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def cancel(self, response_id: str) -> dict:
        body = self._stored(response_id).body
        if not body.get("background"):
            raise APIError(400, f"response {response_id!r} is not a background response: only those can be "
                                "cancelled", "response_id")
        running = self._running.get(response_id)
        if running is not None:
            await self.ctx.engine.abort(running[0])
            running[1].cancel()
            await asyncio.gather(running[1], return_exceptions=True)
            body.update(status="cancelled", output=[])
        return body

    def _stored(self, response_id: str):
        stored = self.ctx.responses.get(response_id)
        if stored is None:
            raise APIError(404, f"response {response_id!r} is not in the store: it was never stored, was deleted, "
                                "or was evicted (--responses-store-entries, --responses-store-bytes)", "response_id")
        return stored

    async def _prepare(self, request: ResponsesRequest, request_id: str) -> tuple[list[dict], ChatTurn]:
        unknown = request.check_fields()
        history: list[dict] = []
        if request.previous_response_id is not None:
            stored = self.ctx.responses.get(request.previous_response_id)
            if stored is None:
                raise APIError(404, f"previous_response_id {request.previous_response_id!r} is not in the store: it "
                                    "was never stored, was deleted, or was evicted", "previous_response_id")
            if stored.body["status"] in ("queued", "in_progress"):
                raise APIError(400, f"previous_response_id {request.previous_response_id!r} has not finished",
                               "previous_response_id")
            history = stored.conversation
        turn = await self.chat.prepare_from(request.chat_body(history), unknown, request_id, "input",
                                            {"max_tokens": "max_output_tokens"})
        return history, turn

    def _response(self, request: ResponsesRequest, status: str, output: list) -> dict:
        return {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
                "status": status, "background": request.background, "error": None, "incomplete_details": None,
                "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
                "metadata": request.metadata or {}, "model": self.ctx.response_name(request.model),
                "output": output, "parallel_tool_calls": request.parallel_tool_calls is not False,
                "previous_response_id": request.previous_response_id,
                "reasoning": {"effort": (request.reasoning or {}).get("effort"), "summary": None},
                "store": request.store, "temperature": request.temperature, "top_p": request.top_p,
                "text": request.text or {"format": {"type": "text"}},
                "tool_choice": request.tool_choice or "auto", "tools": request.tools or [],
                "truncation": "disabled", "usage": None, "user": None}

    def _complete(self, response: dict, request: ResponsesRequest, turn: ChatTurn, history: list[dict],
                  out: Optional[RequestOutput], items: list[dict]) -> None:
        """The finished response (its status, output and usage), stored if asked."""
        sample = out.outputs[0] if out is not None else None
        calls = [i for i in items if i["type"] == "function_call"]
        cut = sample is not None and sample.finish_reason == "length" and not calls
        generated = len(sample.token_ids) if sample is not None else 0
        thinking = "".join(c["text"] for i in items if i["type"] == "reasoning" for c in i["content"])
        reasoning_tokens = len(encode(self.ctx.tokenizer, thinking, add_special_tokens=False)) if thinking else 0
        response.update(status="incomplete" if cut else "completed", output=items,
                        incomplete_details={"reason": "max_output_tokens"} if cut else None,
                        usage={"input_tokens": len(turn.prompt.token_ids), "input_tokens_details": {"cached_tokens": 0},
                               "output_tokens": generated,
                               "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                               "total_tokens": len(turn.prompt.token_ids) + generated})
        if request.store:
            answer = {"role": "assistant", "content": "".join(c["text"] for i in items if i["type"] == "message"
                                                              for c in i["content"]) or None}
            if calls:
                answer["tool_calls"] = [{"id": c["call_id"], "type": "function",
                                         "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
            self.ctx.responses.put(response, history + request.messages() + [answer])


def _item(block: Block, status: str, item_id: Optional[str] = None) -> dict:
    item_id = item_id or f"{_PREFIX[block.kind]}_{uuid.uuid4().hex}"
    if block.kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": block.text}]}
    if block.kind == "text":
        return {"type": "message", "id": item_id, "role": "assistant", "status": status,
                "content": [{"type": "output_text", "text": block.text, "annotations": [], "logprobs": []}]}
    return {"type": "function_call", "id": item_id, "call_id": f"call_{uuid.uuid4().hex}", "name": block.name,
            "arguments": block.text, "status": status}


def _item_events(e: BlockEvent, items: list[dict]) -> list[dict]:
    """The API's events for one block event; ``items`` gathers the finished items."""
    if e.what == "open":
        item = _item(e.block, "in_progress")
        if e.block.kind != "call":
            item["content"] = []  # (filled by the deltas)
        items.append(item)
        added = [{"type": "response.output_item.added", "output_index": e.index, "item": dict(item)}]
        if e.block.kind == "text":
            added.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": e.index,
                          "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
        return added
    item = items[e.index]
    where = {"item_id": item["id"], "output_index": e.index}
    if e.what == "delta":
        if e.block.kind == "call":
            return [{"type": "response.function_call_arguments.delta", **where, "delta": e.delta}]
        kind = "response.output_text.delta" if e.block.kind == "text" else "response.reasoning_text.delta"
        return [{"type": kind, **where, "content_index": 0, "delta": e.delta,
                 **({"logprobs": []} if e.block.kind == "text" else {})}]
    done = _item(e.block, "completed", item["id"])
    if e.block.kind == "call":
        done["call_id"] = item["call_id"]
    items[e.index] = done
    if e.block.kind == "call":
        closing = [{"type": "response.function_call_arguments.done", **where, "name": e.block.name,
                    "arguments": e.block.text}]
    elif e.block.kind == "text":
        part = done["content"][0]
        closing = [{"type": "response.output_text.done", **where, "content_index": 0, "text": e.block.text,
                    "logprobs": []},
                   {"type": "response.content_part.done", **where, "content_index": 0, "part": part}]
    else:
        closing = [{"type": "response.reasoning_text.done", **where, "content_index": 0, "text": e.block.text}]
    return closing + [{"type": "response.output_item.done", "output_index": e.index, "item": done}]


class _Events:
    """SSE of the Responses API: each event named, numbered in order."""

    def __init__(self) -> None:
        self.number = 0

    def __call__(self, type: str, **fields) -> str:
        payload = {"type": type, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {type}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"
