"""What completion and chat serving share: the engine handle, prompt checks, metered streams, SSE.

Runs in the frontend process. Prompts are tokenized here (the chat template needs the tokenizer anyway),
checked against the model's real vocabulary and context, and streamed from the engine; every stream is
timed for the metrics.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Sequence

from actorserve.frontend.errors import APIError
from actorserve.frontend.metrics import FrontendMetrics
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams, verify_prompt_token_ids
from actorserve.runtime.errors import EngineDeadError


@dataclass
class Prompt:
    text: Optional[str]
    token_ids: list[int]


@dataclass
class ServingContext:
    engine: Any  # AsyncEngine: generate(prompt, params, request_id), is_dead
    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int
    metrics: FrontendMetrics
    # ``actorserve serve`` opens its port while the engine starts: this completes the context (or fails)
    ready: Optional["asyncio.Future[None]"] = None

    async def wait_ready(self) -> None:
        """Until the engine is ready; APIError 503 if its start failed."""
        if self.ready is None or (self.ready.done() and not self.starting_or_failed()):
            return  # ready: the common case, without a shield per request
        try:
            await asyncio.shield(self.ready)
        except asyncio.CancelledError:
            if self.ready.cancelled():  # the server is stopping, not this request
                raise APIError(503, "the server is shutting down") from None
            raise
        except Exception as exc:
            raise APIError(503, f"the engine failed to start: {exc}") from None

    def starting_or_failed(self) -> bool:
        return self.ready is not None and (not self.ready.done() or self.ready.cancelled()
                                           or self.ready.exception() is not None)

    def check_model(self, name: Optional[str]) -> None:
        if name is not None and name != self.model_name:
            raise APIError(404, f"The model `{name}` does not exist.", "model")

    def check_prompt(self, prompt: Prompt, max_tokens: Optional[int]) -> int:
        """Vocabulary and context checks; returns the max_tokens to use (the rest of the context if None)."""
        try:
            verify_prompt_token_ids(prompt.token_ids, self.vocab_size)
        except ValueError as exc:
            raise APIError.bad_request(exc) from None
        n = len(prompt.token_ids)
        if n >= self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                f"your prompt has {n} tokens, leaving no room to generate.", "prompt")
        if max_tokens is not None and n + max_tokens > self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                                f"you requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} in the "
                                "completion). Please reduce the length of the prompt or the completion.",
                           "max_tokens")
        return self.max_model_len - n if max_tokens is None else max_tokens

    def build_params(self, request, max_tokens: Optional[int], logprobs: Optional[int]) -> SamplingParams:
        try:
            params = request.sampling_params(max_tokens, logprobs)
            params.verify_for_model(self.vocab_size, can_detokenize=True)
        except ValueError as exc:
            raise APIError.bad_request(exc) from None
        return params

    async def stream(self, prompt: Prompt, params: SamplingParams, request_id: str) -> AsyncIterator[RequestOutput]:
        """The engine's cumulative outputs for one prompt, timed; engine refusals become 400s."""
        timer = self.metrics.request_timer()
        last = None
        try:
            async for out in self.engine.generate({"prompt_token_ids": prompt.token_ids, "prompt": prompt.text},
                                                  params, request_id):
                if any(o.token_ids for o in out.outputs):
                    timer.token()
                last = out
                yield out
        except ValueError as exc:
            raise APIError.bad_request(exc) from None
        except EngineDeadError as exc:
            raise APIError(503, str(exc)) from None
        finally:
            if last is not None:
                timer.finish(len(last.prompt_token_ids), sum(len(o.token_ids) for o in last.outputs),
                             last.num_cached_tokens, [o.finish_reason for o in last.outputs])

    async def final(self, prompt: Prompt, params: SamplingParams, request_id: str) -> RequestOutput:
        last = None
        async for out in self.stream(prompt, params, request_id):
            last = out
        return last


async def merge(streams: Sequence[AsyncIterator]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators as (index, item), as items come; errors propagate."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, it: AsyncIterator) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        except BaseException as exc:  # hand every failure, cancellation included, to the consumer
            await queue.put((i, exc))
            return
        await queue.put((i, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def usage(prompts: Sequence[Prompt], outputs: Sequence[RequestOutput]) -> dict:
    """The OpenAI usage block of a response: every prompt's tokens and every sample's tokens."""
    prompt_tokens = sum(len(p.token_ids) for p in prompts)
    completion_tokens = sum(len(s.token_ids) for out in outputs for s in out.outputs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def now() -> int:
    return int(time.time())
