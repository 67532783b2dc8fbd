"""/v1/chat/completions: the chat template, n samples, whole or streamed as SSE."""
from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

from actorserve.frontend import tool_calls
from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import ChatCompletionRequest, ChatMessage
from actorserve.frontend.serving import (SSE_DONE, Prompt, ServingContext, clamp_logprob, now, prompt_logprobs_json,
                                         sse, usage)
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob
from actorserve.runtime.engine.sampling_params import prompt_text_bound
from actorserve.runtime.text.chat_template import render

log = logging.getLogger("actorserve.frontend")


async def render_chat(ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool,
                      continue_final_message: bool, chat_template: Optional[str] = None,
                      tools: Optional[list] = None, documents: Optional[list] = None,
                      template_kwargs: Optional[dict] = None, add_special_tokens: bool = False) -> Prompt:
    """The template and the tokenizer run on the pool's thread, after the cheap length check; the
    server's ``--chat-template`` stands in for a request that names none, and a request's own is rendered
    only under ``--trust-request-chat-template``. A server renders in its ``TemplateRenderer``'s process,
    within its budget and the prompt's length bound, before anything is tokenized."""
    if chat_template is not None and not ctx.trust_request_chat_template:
        raise APIError(400, "chat_template: a request's own chat template is refused unless the server runs "
                            "with --trust-request-chat-template", "chat_template")
    ctx.check_length("".join(m.text() for m in messages), "messages")
    conversation = [m.model_dump(exclude_none=True) for m in messages]
    bound = prompt_text_bound(ctx.max_model_len, ctx.max_token_chars)
    try:
        text, ids = await ctx.off_loop(lambda: render(
            ctx.tokenizer, conversation, add_generation_prompt, continue_final_message,
            chat_template or ctx.chat_template, tools, documents, template_kwargs, add_special_tokens,
            ctx.renderer, bound))
    except ValueError as exc:
        raise APIError(400, str(exc), "messages") from None
    return Prompt(text, ids)


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def prepare(self, request: ChatCompletionRequest, request_id: str):
        self.ctx.check_model(request.model)
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError(400, "top_logprobs needs logprobs to be true", "top_logprobs")
        try:
            mode = tool_calls.mode_of(request, self.ctx.tool_parser)
        except ValueError as exc:
            raise APIError(400, str(exc), "tool_choice") from None
        request._tools_constraint = tool_calls.constraint(request, mode)
        self.ctx.check_fields(request, request_id)
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        template_kwargs = dict(request.chat_template_kwargs or {})
        if request.reasoning_effort is not None:
            template_kwargs.setdefault("reasoning_effort", request.reasoning_effort)
        prompt = await render_chat(self.ctx, request.messages, request.add_generation_prompt,
                                   request.continue_final_message, request.chat_template, tools,
                                   request.documents, template_kwargs, request.add_special_tokens)
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        names = {"logprobs": "top_logprobs"}
        if request.max_completion_tokens is not None:
            names["max_tokens"] = "max_completion_tokens"
        params = self.ctx.build_params(request, prompt, requested, logprobs, request.prompt_logprobs, names)
        return prompt, params, mode

    async def create(self, request: ChatCompletionRequest, request_id: str) -> dict:
        prompt, params, mode = await self.prepare(request, request_id)
        out = await self.ctx.final(prompt, params, request_id)
        prefix = echo_prefix(request, prompt.text)
        choices = []
        for s in out.outputs:
            message, reason = {"role": "assistant", "content": prefix + s.text}, s.finish_reason
            if mode is not None:
                content, calls = tool_calls.calls_of(s.text, mode)
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reason = tool_calls.finish_reason(mode, s.finish_reason, calls)
            choices.append({"index": s.index, "message": message,
                            "logprobs": chat_logprobs(s, request.top_logprobs or 0) if request.logprobs else None,
                            "finish_reason": reason, "stop_reason": s.stop_reason})
        body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": now(),
                "model": self.ctx.response_name(request.model), "choices": choices,
                "usage": usage([prompt], [out])}
        if request.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        return body

    async def stream(self, request: ChatCompletionRequest, request_id: str) -> AsyncIterator[str]:
        """Errors before the stream starts (the engine's refusal included) are plain 4xx."""
        prompt, params, mode = await self.prepare(request, request_id)
        outputs = await self.ctx.started(prompt, params, request_id)
        return self._events(request, request_id, prompt, outputs, mode)

    async def _events(self, request, request_id, prompt: Prompt, outputs,
                      mode: Optional[tool_calls.ToolMode] = None) -> AsyncIterator[str]:
        head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": now(),
                "model": self.ctx.response_name(request.model)}
        prefix = echo_prefix(request, prompt.text)
        sent = {i: (0, 0) for i in range(request.n)}
        done: set[int] = set()  # samples whose finish_reason went out: nothing more for them
        calls = _StreamedCalls(mode) if mode is not None else None
        last = None
        try:
            for i in range(request.n):
                delta = {"role": "assistant", "content": prefix}
                yield sse({**head, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]})
            async for out in outputs:
                last = out
                for s in out.outputs:
                    chunk = _delta(s, sent, done, request)
                    if chunk is not None and calls is not None:
                        chunk = calls.delta(s, chunk)
                    if chunk is not None:
                        yield sse({**head, "choices": [chunk]})
            if request.stream_options and request.stream_options.include_usage and last is not None:
                yield sse({**head, "choices": [],
                           "usage": usage([prompt], [last])})
        except APIError as exc:
            yield sse_error(exc)
        except Exception as exc:  # after the 200: the error travels in the stream, and is logged
            log.exception("request %s failed while streaming", request_id)
            yield sse_error(APIError(500, f"internal error: {type(exc).__name__}"))
        finally:
            await outputs.aclose()
        yield SSE_DONE


class _StreamedCalls:
    """Tool calls as stream deltas: a named function's arguments as they come (the first delta with the
    call's id and name); "required" and "auto" calls once the sample is finished, when they parse."""

    def __init__(self, mode: tool_calls.ToolMode) -> None:
        self.mode = mode
        self.started: set[int] = set()

    def delta(self, s: CompletionOutput, chunk: dict) -> Optional[dict]:
        text = chunk["delta"].pop("content", "")
        if self.mode.kind == "named":
            if text:
                call: dict = {"index": 0, "function": {"arguments": text}}
                if s.index not in self.started:
                    self.started.add(s.index)
                    call = {"index": 0, "id": tool_calls.call_id(), "type": "function",
                            "function": {"name": self.mode.name, "arguments": text}}
                chunk["delta"]["tool_calls"] = [call]
        elif chunk["finish_reason"]:  # required / auto: the whole answer is needed to parse it
            content, calls = tool_calls.calls_of(s.text, self.mode)
            if content:
                chunk["delta"]["content"] = content
            if calls:
                chunk["delta"]["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
            chunk["finish_reason"] = tool_calls.finish_reason(self.mode, chunk["finish_reason"], calls)
        if not chunk["delta"] and not chunk["finish_reason"] and chunk["logprobs"] is None:
            return None
        return chunk


def _delta(s: CompletionOutput, sent: dict, done: set, request: ChatCompletionRequest) -> Optional[dict]:
    if s.index in done:
        return None
    chars, tokens = sent[s.index]
    text, new_tokens = s.text[chars:], s.token_ids[tokens:]
    if not text and not new_tokens and not s.finish_reason:
        return None
    sent[s.index] = (len(s.text), len(s.token_ids))
    if s.finish_reason:
        done.add(s.index)
    lp = None
    if request.logprobs:
        window = CompletionOutput(s.index, token_ids=new_tokens, logprobs=(s.logprobs or [])[tokens:])
        lp = chat_logprobs(window, request.top_logprobs or 0)
    return {"index": s.index, "delta": {"content": text} if text else {}, "logprobs": lp,
            "finish_reason": s.finish_reason, "stop_reason": s.stop_reason}


def _entry(lp: Logprob) -> dict:
    token = lp.decoded_token or ""
    return {"token": token, "logprob": clamp_logprob(lp.logprob), "bytes": list(token.encode("utf-8"))}


def chat_logprobs(sample: CompletionOutput, top_n: int) -> dict:
    content = []
    for token, entry in zip(sample.token_ids, sample.logprobs or []):
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)[:top_n]
        content.append({**_entry(entry[token]), "top_logprobs": [_entry(lp) for lp in ranked]})
    return {"content": content}
