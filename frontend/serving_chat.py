"""/v1/chat/completions: the chat template, n samples, whole or streamed as SSE."""
from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import ChatCompletionRequest, ChatMessage
from actorserve.frontend.serving import (SSE_DONE, Prompt, ServingContext, clamp_logprob, now, prompt_logprobs_json,
                                         sse, usage)
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob
from actorserve.runtime.model.chat_template import render

log = logging.getLogger("actorserve.frontend")


async def render_chat(ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool,
                      continue_final_message: bool, chat_template: Optional[str] = None,
                      tools: Optional[list] = None, documents: Optional[list] = None,
                      template_kwargs: Optional[dict] = None, add_special_tokens: bool = False) -> Prompt:
    """The template and the tokenizer run on the pool's thread, after the cheap length check; the
    server's ``--chat-template`` stands in for a request that names none."""
    ctx.check_length("".join(m.text() for m in messages), "messages")
    conversation = [m.model_dump(exclude_none=True) for m in messages]
    try:
        text, ids = await ctx.off_loop(lambda: render(
            ctx.tokenizer, conversation, add_generation_prompt, continue_final_message,
            chat_template or ctx.chat_template, tools, documents, template_kwargs, add_special_tokens))
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
        if request.tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice other than \"none\" needs tool calling, which this server does not "
                                "support", "tool_choice")
        if request.tools and request.tool_choice is None:  # OpenAI's default with tools is "auto"
            raise APIError(400, "tools without tool_choice means \"auto\" tool choice, which needs tool calling: "
                                "this server does not support it (give tool_choice \"none\" to show the tools "
                                "to the model without calls)", "tool_choice")
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
        return prompt, self.ctx.build_params(request, prompt, requested, logprobs, request.prompt_logprobs)

    async def create(self, request: ChatCompletionRequest, request_id: str) -> dict:
        prompt, params = await self.prepare(request, request_id)
        out = await self.ctx.final(prompt, params, request_id)
        prefix = echo_prefix(request, prompt.text)
        choices = [{
            "index": s.index, "message": {"role": "assistant", "content": prefix + s.text},
            "logprobs": chat_logprobs(s, request.top_logprobs or 0) if request.logprobs else None,
            "finish_reason": s.finish_reason, "stop_reason": s.stop_reason,
        } for s in out.outputs]
        body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": now(),
                "model": self.ctx.response_name(request.model), "choices": choices,
                "usage": usage([prompt], [out])}
        if request.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        return body

    async def stream(self, request: ChatCompletionRequest, request_id: str) -> AsyncIterator[str]:
        """Errors before the stream starts (the engine's refusal included) are plain 4xx."""
        prompt, params = await self.prepare(request, request_id)
        outputs = await self.ctx.started(prompt, params, request_id)
        return self._events(request, request_id, prompt, outputs)

    async def _events(self, request, request_id, prompt: Prompt, outputs) -> AsyncIterator[str]:
        head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": now(),
                "model": self.ctx.response_name(request.model)}
        prefix = echo_prefix(request, prompt.text)
        sent = {i: (0, 0) for i in range(request.n)}
        done: set[int] = set()  # samples whose finish_reason went out: nothing more for them
        last = None
        try:
            for i in range(request.n):
                delta = {"role": "assistant", "content": prefix}
                yield sse({**head, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]})
            async for out in outputs:
                last = out
                for s in out.outputs:
                    chunk = _delta(s, sent, done, request)
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
