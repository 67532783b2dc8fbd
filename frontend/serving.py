"""What completion and chat serving share: the engine handle, prompt checks, metered streams, SSE.

Runs in the frontend process. Prompts are tokenized here (the chat template needs the tokenizer anyway),
on a thread after a cheap length check, so that a huge prompt never stalls the loop that serves every
other request; then checked against the model's real vocabulary and context by the engine's own
validator (``verify_request``), and streamed from the engine; every stream is timed for the metrics.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional, Sequence

from actorserve.frontend.errors import RETRY_AFTER_S, APIError
from actorserve.frontend.metrics import FrontendMetrics
from actorserve.frontend.response_store import ResponseStore
from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.outputs import Logprob, RequestOutput
from actorserve.runtime.engine.sampling_params import (RequestLimits, SamplingParams, truncate_prompt,
                                                       verify_prompt_text, verify_request)
from actorserve.runtime.errors import EngineDeadError, EngineOverloadedError, EngineSleepingError
from actorserve.runtime.text.template_renderer import TemplateRenderer
from actorserve.runtime.text.tokenizer import encode

log = logging.getLogger("actorserve.frontend")


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
    max_n: int = 128
    max_token_chars: int = 1  # the longest token, in characters: the bound of the cheap length check
    chat_template: Optional[str] = None  # the server's --chat-template: for requests that give none
    trust_request_chat_template: bool = False  # --trust-request-chat-template: a request's own is rendered
    renderer: Optional[TemplateRenderer] = None  # a server's: templates render in its process, in its budget
    served_model_names: tuple[str, ...] = ()  # every name a request may give (model_name is the first)
    default_sampling: dict = field(default_factory=dict)  # --generation-config: for fields a request leaves unset
    tool_parser: Optional[str] = None  # --tool-call-parser with --enable-auto-tool-choice: "auto" tool choice
    reasoning_parser: Optional[str] = None  # the engine's: the thinking split from the answer
    responses: ResponseStore = field(default_factory=ResponseStore)  # the Responses API's stored responses
    log_requests: bool = True
    draining: bool = False  # SIGTERM: no new request is admitted; those in flight may finish (``drain``)
    closing: bool = False  # the drain's deadline passed: what is still in flight is aborted, and ends in a 503
    in_flight: set = field(default_factory=set)  # the engine request ids of ``stream``s under way
    # one thread: tokenizing is CPU work, and a queue of it must not take every core from the engine
    pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tokenize"))

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

    def response_name(self, requested: Optional[str]) -> str:
        """The name a response carries: the one the request used, if it is one of the served names."""
        return requested if requested in self.served_model_names else self.model_name

    def check_model(self, name: Optional[str]) -> None:
        if name is not None and name != self.model_name and name not in self.served_model_names:
            raise APIError(404, f"The model `{name}` does not exist.", "model")

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(self.vocab_size, self.max_model_len, self.max_n)

    def check_sequences(self, sequences: int) -> None:
        """A request's prompts x n (beams included) within what the engine queues at once (max_waiting_seqs):
        a request larger than the whole queue could never be admitted."""
        cap = self.engine.config.scheduler.max_waiting_seqs
        if cap is not None and sequences > cap:
            raise APIError(400, f"prompt: {sequences} sequences (prompts x n) are more than this server queues "
                                f"at once (--max-waiting-seqs {cap})", "prompt")

    def check_length(self, text: str, name: str = "prompt") -> None:
        """Before any tokenizing: valid Unicode, and not longer than the context could hold."""
        try:
            verify_prompt_text(text, self.max_model_len, self.max_token_chars, name)
        except ValueError as exc:
            raise APIError.bad_request(exc) from None

    async def off_loop(self, fn: Callable, *args) -> Any:
        """Tokenizer work on the pool's thread (the Rust tokenizer lets go of the GIL)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def encode(self, text: str, add_special_tokens: bool = True, name: str = "prompt") -> list[int]:
        self.check_length(text, name)
        return await self.off_loop(lambda: encode(self.tokenizer, text, add_special_tokens=add_special_tokens))

    def check_fields(self, request, request_id: str) -> None:
        """A field asking for what this server does not do is a 400; fields it does not know are named
        in one warning."""
        refused = request.unsupported_field()
        if refused is not None:
            raise APIError(400, f"{refused} is not supported by this server", refused)
        unknown = request.unknown_fields()
        if unknown:
            log.warning("request %s: ignored fields the server does not know: %s", request_id, ", ".join(unknown))

    def build_params(self, request, prompt: "Prompt", max_tokens: Optional[int], logprobs: Optional[int],
                     prompt_logprobs: Optional[int] = None, names: Optional[dict[str, str]] = None,
                     ) -> SamplingParams | BeamSearchParams:
        """The engine's own checks, as a 400 naming the field (by the request's name for it, ``names``);
        max_tokens None: the rest of the context. With ``use_beam_search``, the search's params.
        The prompt is truncated here first when the request asks (``truncate_prompt_tokens``), so the
        checks, the echo and the usage all see the prompt the engine runs."""
        try:
            ids = truncate_prompt(prompt.token_ids, request.truncate_prompt_tokens, self.max_model_len)
            if len(ids) != len(prompt.token_ids):
                prompt.token_ids = ids
                prompt.text = None if prompt.text is None else self.tokenizer.decode(ids)
            if max_tokens is None:
                max_tokens = self.default_sampling.get("max_tokens")
                room = max(1, self.max_model_len - len(prompt.token_ids))
                max_tokens = room if max_tokens is None else min(max_tokens, room)
            params = request.sampling_params(max_tokens, logprobs, prompt_logprobs, self.default_sampling)
            verify_request(prompt.token_ids, params, self.limits)
            if request.use_beam_search:
                return request.beam_search_params(params)
        except ValueError as exc:
            raise APIError.bad_request(exc, names) from None
        return params

    async def started(self, prompt: "Prompt", params: SamplingParams, request_id: str) -> AsyncIterator[RequestOutput]:
        """The stream once the engine has taken the request and answered: a refusal raises here, so a
        streamed request that is refused before it starts gets a plain 4xx, not a 200 and an SSE error."""
        it = self.stream(prompt, params, request_id)
        try:
            first = await it.__anext__()
        except BaseException:
            await it.aclose()
            raise
        return _prepend(first, it)

    async def started_all(self, jobs: Sequence[tuple["Prompt", SamplingParams, str]]) -> list[AsyncIterator]:
        """Every stream started, or none: one refusal closes (aborts) those already started."""
        results = await asyncio.gather(*(self.started(*job) for job in jobs), return_exceptions=True)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if failed is not None:
            for r in results:
                if not isinstance(r, BaseException):
                    await r.aclose()
            raise failed
        return list(results)

    async def stream(self, prompt: Prompt, params: SamplingParams | BeamSearchParams,
                     request_id: str) -> AsyncIterator[RequestOutput]:
        """The engine's cumulative outputs for one prompt, timed; engine refusals become 400s. With beam
        search's params, one output at the end (the engine runs the search): its best sequences as the
        samples."""
        if self.log_requests:
            log.info("request %s: %d prompt tokens, %s", request_id, len(prompt.token_ids), _changed(params))
        if self.closing:
            raise APIError(503, SHUTTING_DOWN)
        timer = self.metrics.request_timer()
        last = None
        self.in_flight.add(request_id)
        try:
            async for out in self.engine.generate({"prompt_token_ids": prompt.token_ids, "prompt": prompt.text},
                                                  params, request_id):
                if self.closing and out.finished and any(o.finish_reason == "abort" for o in out.outputs):
                    raise APIError(503, SHUTTING_DOWN + ": the request did not finish within the shutdown timeout")
                timer.tokens_seen(sum(len(o.token_ids) for o in out.outputs))
                last = out
                yield out
        except ValueError as exc:
            raise APIError.bad_request(exc) from None
        except (EngineDeadError, EngineSleepingError) as exc:
            raise APIError(503, str(exc)) from None
        except EngineOverloadedError as exc:
            raise APIError(503, str(exc), retry_after=RETRY_AFTER_S) from None
        finally:
            self.in_flight.discard(request_id)
            if last is not None:
                timer.finish(last)

    async def final(self, prompt: Prompt, params: SamplingParams, request_id: str) -> RequestOutput:
        last = None
        async for out in self.stream(prompt, params, request_id):
            last = out
        return last


SHUTTING_DOWN = "the server is shutting down"


async def drain(ctx: ServingContext, timeout: float) -> None:
    """SIGTERM's drain: admit nothing more (503s, /health 503), let what is in flight finish for up to
    ``timeout`` seconds, then abort the rest, each of which ends in a 503 (an error event and [DONE] in a
    stream), and wait for them to say so."""
    loop = asyncio.get_running_loop()
    ctx.draining = True
    deadline = loop.time() + timeout
    while ctx.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.05)
    ctx.closing = True
    for request_id in list(ctx.in_flight):
        await ctx.engine.abort(request_id)
    deadline = loop.time() + min(timeout, 2.0)
    while ctx.in_flight and loop.time() < deadline:
        await asyncio.sleep(0.05)


_DEFAULTS = SamplingParams()
_LOGGED_CHARS = 300


def _changed(params: SamplingParams | BeamSearchParams) -> str:
    """The fields a request set, for its log line, cut short (a request may carry kilobytes of them); all of
    a beam search's."""
    fields = ", ".join(f"{name}={getattr(params, name)!r}" for name in params.__struct_fields__
                       if getattr(params, name) != getattr(_DEFAULTS, name, None))
    return f"params: {fields[:_LOGGED_CHARS]}{'...' if len(fields) > _LOGGED_CHARS else ''}"


async def _prepend(first, rest: AsyncIterator) -> AsyncIterator:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def merge(streams: Sequence[AsyncIterator]) -> AsyncIterator[tuple[int, Any]]:
    """Interleave several async iterators as (index, item), as items come; errors propagate. The queue
    holds about one item a stream: a consumer that stops leaves the backlog in the streams themselves,
    where flow control sees it (runtime/client.py)."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=max(1, len(streams)))
    done = object()

    async def pump(i: int, it: AsyncIterator) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        except asyncio.CancelledError as exc:  # (the consumer, gone, cancels its pumps: never wait for room)
            if not queue.full():
                queue.put_nowait((i, exc))
            raise
        except Exception as exc:  # hand every failure to the consumer
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


def usage(prompts: Sequence[Prompt], outputs: Sequence[RequestOutput], generated: bool = True) -> dict:
    """The OpenAI usage block of a response: every prompt's tokens and every sample's tokens (none when
    only the prompt is returned: an echo with max_tokens 0)."""
    prompt_tokens = sum(len(p.token_ids) for p in prompts)
    completion_tokens = sum(len(s.token_ids) for out in outputs for s in out.outputs) if generated else 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def clamp_logprob(value: float) -> float:
    """JSON has no -inf: a token the model rules out reads -9999.0, as vLLM writes it."""
    return max(value, -9999.0)


def prompt_logprobs_json(entries: Optional[list[Optional[dict[int, Logprob]]]]) -> Optional[list]:
    """RequestOutput.prompt_logprobs as vLLM's responses carry them: None for the first token, then
    {token id: {logprob, rank, decoded_token}} for each."""
    if entries is None:
        return None
    return [None if e is None else {str(tid): {"logprob": clamp_logprob(lp.logprob), "rank": lp.rank,
                                               "decoded_token": lp.decoded_token} for tid, lp in e.items()}
            for e in entries]


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def now() -> int:
    return int(time.time())
