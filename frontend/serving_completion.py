"""/v1/completions: one or many prompts, n samples each, whole or streamed as SSE."""
from __future__ import annotations

import logging
from typing import AsyncIterator, Optional

from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import CompletionRequest
from actorserve.frontend.serving import SSE_DONE, Prompt, ServingContext, merge, now, sse, usage
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob
from actorserve.runtime.model.tokenizer import encode

log = logging.getLogger("actorserve.frontend")


class CompletionServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def _prompts(self, request: CompletionRequest) -> list[Prompt]:
        p = request.prompt
        if isinstance(p, str):
            p = [p]
        if not p:
            raise APIError(400, "prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [Prompt(None, list(p))]
        for item in p:  # every text checked before any is tokenized
            if isinstance(item, str):
                self.ctx.check_length(item)
        prompts = []
        for item in p:
            if isinstance(item, str):
                prompts.append(Prompt(item, await self.ctx.off_loop(encode, self.ctx.tokenizer, item)))
            else:
                prompts.append(Prompt(None, list(item)))
        if any(not x.token_ids for x in prompts):
            raise APIError(400, "prompt must not be empty", "prompt")
        return prompts

    async def prepare(self, request: CompletionRequest):
        self.ctx.check_model(request.model)
        if request.suffix:
            raise APIError(400, "suffix is not supported", "suffix")
        prompts = await self._prompts(request)
        params = [self.ctx.build_params(request, p, request.max_tokens, request.logprobs) for p in prompts]
        for p in prompts:
            if p.text is None and request.echo:
                p.text = await self.ctx.off_loop(self.ctx.tokenizer.decode, p.token_ids)
        return prompts, params

    async def create(self, request: CompletionRequest, request_id: str) -> dict:
        prompts, params = await self.prepare(request)
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
        """Errors before the stream starts (the engine's refusal included) are plain 4xx."""
        prompts, params = await self.prepare(request)
        streams = await self.ctx.started_all([(p, sp, f"{request_id}-{i}")
                                              for i, (p, sp) in enumerate(zip(prompts, params))])
        return self._events(request, request_id, prompts, streams)

    async def _events(self, request, request_id, prompts, streams) -> AsyncIterator[str]:
        head = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": now(),
                "model": self.ctx.model_name}
        sent: dict[int, tuple[int, int]] = {}  # choice index -> (chars, tokens) already streamed
        done: set[int] = set()  # choices whose finish_reason went out: nothing more for them
        finals = {}
        try:
            prefixes = [echo_prefix(request, p.text) for p in prompts]
            async for i, out in merge(streams):
                finals[i] = out
                for sample in out.outputs:
                    index = i * request.n + sample.index
                    chunk = self._delta(index, sample, sent, done, prefixes[i], request.logprobs)
                    if chunk is not None:
                        yield sse({**head, "choices": [chunk]})
            if request.stream_options and request.stream_options.include_usage:
                yield sse({**head, "choices": [], "usage": usage(prompts, list(finals.values()))})
        except APIError as exc:
            yield sse_error(exc)
        except Exception as exc:  # after the 200: the error travels in the stream, and is logged
            log.exception("request %s failed while streaming", request_id)
            yield sse_error(APIError(500, f"internal error: {type(exc).__name__}"))
        finally:
            for s in streams:
                await s.aclose()
        yield SSE_DONE

    def _delta(self, index, sample: CompletionOutput, sent, done: set, prefix: str, logprobs) -> Optional[dict]:
        if index in done:
            return None
        chars, tokens = sent.get(index, (0, 0))
        first = index not in sent
        text = sample.text[chars:]
        new_tokens = sample.token_ids[tokens:]
        if not text and not new_tokens and not sample.finish_reason and not (first and prefix):
            return None
        sent[index] = (len(sample.text), len(sample.token_ids))
        if sample.finish_reason:
            done.add(index)
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
