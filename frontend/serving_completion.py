"""/v1/completions: one or many prompts, n samples each, whole or streamed as SSE."""
from __future__ import annotations

import logging
from typing import AsyncIterator, Callable, Optional

from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import CompletionRequest
from actorserve.frontend.serving import (SSE_DONE, Prompt, ServingContext, clamp_logprob, merge, now,
                                         prompt_logprobs_json, sse, usage)
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob, RequestOutput
from actorserve.runtime.text.tokenizer import encode

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
        if 1 <= request.n <= self.ctx.max_n:  # (an n out of range is its own 400, named so)
            self.ctx.check_sequences(len(p) * request.n)
        for item in p:  # every text checked before any is tokenized
            if isinstance(item, str):
                self.ctx.check_length(item)
        prompts = []
        for item in p:
            if isinstance(item, str):
                ids = await self.ctx.off_loop(lambda: encode(self.ctx.tokenizer, item,
                                                             add_special_tokens=request.add_special_tokens))
                prompts.append(Prompt(item, ids))
            else:
                prompts.append(Prompt(None, list(item)))
        if any(not x.token_ids for x in prompts):
            raise APIError(400, "prompt must not be empty", "prompt")
        return prompts

    async def prepare(self, request: CompletionRequest, request_id: str):
        """The prompts and their params. With ``echo``, ``logprobs`` covers the prompt's tokens too (so
        the prompt's logprobs are computed), and ``max_tokens`` 0 returns the prompt alone, for scoring
        (one token is generated and dropped, as vLLM does)."""
        self.ctx.check_model(request.model)
        self.ctx.check_fields(request, request_id)
        if request.max_tokens == 0 and not request.echo:
            raise APIError(400, "max_tokens must be at least 1, or 0 with echo (to score the prompt alone)",
                           "max_tokens")
        prompts = await self._prompts(request)
        max_tokens = 1 if request.max_tokens == 0 else request.max_tokens
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo and request.logprobs is not None:
            prompt_logprobs = request.logprobs
        params = [self.ctx.build_params(request, p, max_tokens, request.logprobs, prompt_logprobs) for p in prompts]
        for p in prompts:
            if p.text is None and request.echo:
                p.text = await self.ctx.off_loop(self.ctx.tokenizer.decode, p.token_ids)
        return prompts, params

    async def create(self, request: CompletionRequest, request_id: str) -> dict:
        prompts, params = await self.prepare(request, request_id)
        finals = [None] * len(prompts)
        async for i, out in merge([self.ctx.stream(p, sp, f"{request_id}-{i}")
                                   for i, (p, sp) in enumerate(zip(prompts, params))]):
            finals[i] = out
        choices = []
        for i, (prompt, out) in enumerate(zip(prompts, finals)):
            prefix = echo_prefix(request, prompt.text)
            for sample in out.outputs:
                choice = self._choice(i * request.n + sample.index, prefix, out, sample, request)
                if request.prompt_logprobs is not None:
                    choice["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
                choices.append(choice)
        return {"id": f"cmpl-{request_id}", "object": "text_completion", "created": now(),
                "model": self.ctx.response_name(request.model), "choices": choices,
                "usage": usage(prompts, finals, generated=request.max_tokens != 0)}

    def _choice(self, index: int, prefix: str, out: RequestOutput, sample: CompletionOutput,
                request: CompletionRequest) -> dict:
        generated = request.max_tokens != 0
        lp = None
        if request.logprobs is not None:
            ids, entries = self._echoed(out, request)
            if generated:
                ids, entries = ids + sample.token_ids, entries + (sample.logprobs or [])
            lp = completion_logprobs(ids, entries, 0, self._decode)
        return {"index": index, "text": prefix + (sample.text if generated else ""), "logprobs": lp,
                "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}

    @staticmethod
    def _echoed(out: RequestOutput, request: CompletionRequest) -> tuple[list[int], list]:
        """The prompt's tokens and logprob entries, when echo puts them in front of the output."""
        if not request.echo:
            return [], []
        return list(out.prompt_token_ids), list(out.prompt_logprobs or [None] * len(out.prompt_token_ids))

    def _decode(self, token: int) -> str:
        return self.ctx.tokenizer.decode([token])

    async def stream(self, request: CompletionRequest, request_id: str) -> AsyncIterator[str]:
        """Errors before the stream starts (the engine's refusal included) are plain 4xx."""
        prompts, params = await self.prepare(request, request_id)
        streams = await self.ctx.started_all([(p, sp, f"{request_id}-{i}")
                                              for i, (p, sp) in enumerate(zip(prompts, params))])
        return self._events(request, request_id, prompts, streams)

    async def _events(self, request, request_id, prompts, streams) -> AsyncIterator[str]:
        head = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": now(),
                "model": self.ctx.response_name(request.model)}
        sent: dict[int, tuple[int, int]] = {}  # choice index -> (chars, tokens) already streamed
        done: set[int] = set()  # choices whose finish_reason went out: nothing more for them
        finals = {}
        try:
            prefixes = [echo_prefix(request, p.text) for p in prompts]
            async for i, out in merge(streams):
                finals[i] = out
                for sample in out.outputs:
                    index = i * request.n + sample.index
                    chunk = self._delta(index, out, sample, sent, done, prefixes[i], request)
                    if chunk is not None:
                        yield sse({**head, "choices": [chunk]})
            if request.stream_options and request.stream_options.include_usage:
                yield sse({**head, "choices": [],
                           "usage": usage(prompts, list(finals.values()), generated=request.max_tokens != 0)})
        except APIError as exc:
            yield sse_error(exc)
        except Exception as exc:  # after the 200: the error travels in the stream, and is logged
            log.exception("request %s failed while streaming", request_id)
            yield sse_error(APIError(500, f"internal error: {type(exc).__name__}"))
        finally:
            for s in streams:
                await s.aclose()
        yield SSE_DONE

    def _delta(self, index, out: RequestOutput, sample: CompletionOutput, sent, done: set, prefix: str,
               request: CompletionRequest) -> Optional[dict]:
        """The choice's news since the last chunk; the first carries the echo (and its logprobs)."""
        if index in done:
            return None
        generated = request.max_tokens != 0
        chars, tokens = sent.get(index, (0, 0))
        first = index not in sent
        text = sample.text[chars:] if generated else ""
        new_tokens = sample.token_ids[tokens:] if generated else []
        if not text and not new_tokens and not sample.finish_reason and not (first and prefix):
            return None
        sent[index] = (len(sample.text), len(sample.token_ids))
        if sample.finish_reason:
            done.add(index)
        lp = None
        if request.logprobs is not None:
            ids, entries = self._echoed(out, request) if first else ([], [])
            ids, entries = ids + new_tokens, entries + (sample.logprobs or [])[tokens:tokens + len(new_tokens)]
            lp = completion_logprobs(ids, entries, 0 if first else chars + len(prefix), self._decode)
        return {"index": index, "text": (prefix if first else "") + text, "logprobs": lp,
                "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}


def completion_logprobs(token_ids: list[int], entries: list[Optional[dict[int, Logprob]]], offset: int,
                        decode: Callable[[int], str]) -> dict:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset. The first token
    of an echoed prompt has no logprob: None in token_logprobs and top_logprobs, as vLLM writes it."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for token, entry in zip(token_ids, entries):
        if entry is None:
            text, logprob, alternatives = decode(token), None, None
        else:
            chosen = entry[token]
            text, logprob = chosen.decoded_token or "", clamp_logprob(chosen.logprob)
            alternatives = {(lp.decoded_token or ""): clamp_logprob(lp.logprob) for lp in entry.values()}
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        token_logprobs.append(logprob)
        top.append(alternatives)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
