"""/v1/completions: one or many prompts, n samples each, whole or streamed as SSE."""
from __future__ import annotations

from typing import AsyncIterator, Optional

from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import CompletionRequest
from actorserve.frontend.serving import SSE_DONE, Prompt, ServingContext, merge, now, sse, usage
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob


class CompletionServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    def _prompts(self, request: CompletionRequest) -> list[Prompt]:
        p = request.prompt
        if isinstance(p, str):
            p = [p]
        if not p:
            raise APIError(400, "prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [Prompt(None, list(p))]
        prompts = []
        for item in p:
            if isinstance(item, str):
                prompts.append(Prompt(item, self.ctx.tokenizer.encode(item)))
            else:
                prompts.append(Prompt(None, list(item)))
        if any(not x.token_ids for x in prompts):
            raise APIError(400, "prompt must not be empty", "prompt")
        return prompts

    def prepare(self, request: CompletionRequest):
        self.ctx.check_model(request.model)
        if request.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        prompts = self._prompts(request)
        max_tokens = [self.ctx.check_prompt(p, request.max_tokens) for p in prompts]
        params = [self.ctx.build_params(request, m, request.logprobs) for m in max_tokens]
        for p in prompts:
            if p.text is None and request.echo:
                p.text = self.ctx.tokenizer.decode(p.token_ids)
        return prompts, params

    async def create(self, request: CompletionRequest, request_id: str) -> dict:
        prompts, params = self.prepare(request)
        finals = [None] * len(prompts)
        async for i, out in merge([self.ctx.stream(p, sp, f"{request_id}-{i}")
                                   for i, (p, sp) in enumerate(zip(prompts, params))]):
            finals[i] = out
        choices = []
        for i, (prompt, out) in enumerate(zip(prompts, finals)):
            prefix = echo_prefix(request, prompt.text)
            for sample in out.outputs:
                choices.append(self._choice(i * request.n + sample.index, prefix, sample, request.logprobs))
        return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": now(),
                "model": self.ctx.model_name, "choices": choices, "usage": usage(prompts, finals)}

    def _choice(self, index: int, prefix: str, sample: CompletionOutput, logprobs: Optional[int]) -> dict:
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(sample.token_ids, sample.logprobs or [], len(prefix))
        return {"index": index, "text": prefix + sample.text, "logprobs": lp,
                "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}

    async def stream(self, request: CompletionRequest, request_id: str) -> AsyncIterator[str]:
        prompts, params = self.prepare(request)  # errors before the stream starts are plain 4xx
        return self._events(request, request_id, prompts, params)

    async def _events(self, request, request_id, prompts, params) -> AsyncIterator[str]:
        head = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": now(),
                "model": self.ctx.model_name}
        sent: dict[int, tuple[int, int]] = {}  # choice index -> (chars, tokens) already streamed
        finals = {}
        try:
            prefixes = [echo_prefix(request, p.text) for p in prompts]
            async for i, out in merge([self.ctx.stream(p, sp, f"{request_id}-{i}")
                                       for i, (p, sp) in enumerate(zip(prompts, params))]):
                finals[i] = out
                for sample in out.outputs:
                    index = i * request.n + sample.index
                    chunk = self._delta(index, sample, sent, prefixes[i], request.logprobs)
                    if chunk is not None:
                        yield sse({**head, "choices": [chunk]})
            if request.stream_options and request.stream_options.include_usage:
                yield sse({**head, "choices": [], "usage": usage(prompts, list(finals.values()))})
        except APIError as exc:
            yield sse_error(exc)
        yield SSE_DONE

    def _delta(self, index, sample: CompletionOutput, sent, prefix: str, logprobs) -> Optional[dict]:
        chars, tokens = sent.get(index, (0, 0))
        first = index not in sent
        text = sample.text[chars:]
        new_tokens = sample.token_ids[tokens:]
        if not text and not new_tokens and not sample.finish_reason and not (first and prefix):
            return None
        sent[index] = (len(sample.text), len(sample.token_ids))
        lp = None
        if logprobs is not None:
            lp = completion_logprobs(new_tokens, (sample.logprobs or [])[tokens:], 0)
        return {"index": index, "text": (prefix if first else "") + text, "logprobs": lp,
                "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}


def completion_logprobs(token_ids: list[int], entries: list[dict[int, Logprob]], offset: int) -> dict:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token, entry in zip(token_ids, entries):
        chosen = entry[token]
        text = chosen.decoded_token or ""
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        token_logprobs.append(chosen.logprob)
        top.append({(lp.decoded_token or ""): lp.logprob for lp in entry.values()})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
