"""/v1/chat/completions: the chat template, n samples, whole or streamed as SSE."""
from __future__ import annotations

from typing import AsyncIterator, Optional

from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import ChatCompletionRequest, ChatMessage
from actorserve.frontend.serving import SSE_DONE, Prompt, ServingContext, now, sse, usage
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob


def render_chat(tokenizer, messages: list[ChatMessage], add_generation_prompt: bool,
                continue_final_message: bool, chat_template: Optional[str] = None) -> Prompt:
    if add_generation_prompt and continue_final_message:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true",
                       "continue_final_message")
    if continue_final_message and messages[-1].role != "assistant":
        raise APIError(400, "continue_final_message needs a final assistant message", "messages")
    conversation = [{"role": m.role, "content": m.text()} for m in messages]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, chat_template=chat_template,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message)
    except Exception as exc:  # jinja errors of a template: the request's fault
        raise APIError(400, f"the chat template could not be applied: {exc}", "messages") from None
    return Prompt(text, tokenizer.encode(text, add_special_tokens=False))


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    def prepare(self, request: ChatCompletionRequest):
        self.ctx.check_model(request.model)
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError(400, "top_logprobs needs logprobs to be true", "top_logprobs")
        prompt = render_chat(self.ctx.tokenizer, request.messages, request.add_generation_prompt,
                             request.continue_final_message, request.chat_template)
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        max_tokens = self.ctx.check_prompt(prompt, requested)
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        return prompt, self.ctx.build_params(request, max_tokens, logprobs)

    async def create(self, request: ChatCompletionRequest, request_id: str) -> dict:
        prompt, params = self.prepare(request)
        out = await self.ctx.final(prompt, params, request_id)
        prefix = echo_prefix(request, prompt.text)
        choices = [{
            "index": s.index, "message": {"role": "assistant", "content": prefix + s.text},
            "logprobs": chat_logprobs(s, request.top_logprobs or 0) if request.logprobs else None,
            "finish_reason": s.finish_reason, "stop_reason": s.stop_reason,
        } for s in out.outputs]
        return {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": now(),
                "model": self.ctx.model_name, "choices": choices,
                "usage": usage([prompt], [out])}

    async def stream(self, request: ChatCompletionRequest, request_id: str) -> AsyncIterator[str]:
        prompt, params = self.prepare(request)
        return self._events(request, request_id, prompt, params)

    async def _events(self, request, request_id, prompt: Prompt, params) -> AsyncIterator[str]:
        head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": now(),
                "model": self.ctx.model_name}
        prefix = echo_prefix(request, prompt.text)
        for i in range(request.n):
            delta = {"role": "assistant", "content": prefix}
            yield sse({**head, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]})
        sent = {i: (0, 0) for i in range(request.n)}
        last = None
        try:
            async for out in self.ctx.stream(prompt, params, request_id):
                last = out
                for s in out.outputs:
                    chunk = _delta(s, sent, request)
                    if chunk is not None:
                        yield sse({**head, "choices": [chunk]})
            if request.stream_options and request.stream_options.include_usage and last is not None:
                yield sse({**head, "choices": [],
                           "usage": usage([prompt], [last])})
        except APIError as exc:
            yield sse_error(exc)
        yield SSE_DONE


def _delta(s: CompletionOutput, sent: dict, request: ChatCompletionRequest) -> Optional[dict]:
    chars, tokens = sent[s.index]
    text, new_tokens = s.text[chars:], s.token_ids[tokens:]
    if not text and not new_tokens and not s.finish_reason:
        return None
    sent[s.index] = (len(s.text), len(s.token_ids))
    lp = None
    if request.logprobs:
        window = CompletionOutput(s.index, token_ids=new_tokens, logprobs=(s.logprobs or [])[tokens:])
        lp = chat_logprobs(window, request.top_logprobs or 0)
    return {"index": s.index, "delta": {"content": text} if text else {}, "logprobs": lp,
            "finish_reason": s.finish_reason, "stop_reason": s.stop_reason}


def _entry(lp: Logprob) -> dict:
    token = lp.decoded_token or ""
    return {"token": token, "logprob": lp.logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(sample: CompletionOutput, top_n: int) -> dict:
    content = []
    for token, entry in zip(sample.token_ids, sample.logprobs or []):
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)[:top_n]
        content.append({**_entry(entry[token]), "top_logprobs": [_entry(lp) for lp in ranked]})
    return {"content": content}
