"""``actorserve serve``: the frontend process hosting the OpenAI-compatible HTTP server.

Runs in the frontend process, which launches the scheduler and worker processes and talks to them over
ZMQ. The port opens at once, while the engine starts: /health answers 503 until it is ready, and requests
wait for it. A start that fails answers every waiting and later request with a 503 in the OpenAI shape
(EngineStartError's message), as does an engine that dies; /health answers 503 and, after a short grace
for health checkers to see it, the server exits with status 1, as vLLM's does.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from dataclasses import dataclass
from typing import Optional

import uvicorn

from actorserve.frontend.app import build_app
from actorserve.frontend.http_limits import BodyLimit, header_timeout_protocol
from actorserve.frontend.metrics import FrontendMetrics
from actorserve.frontend.serving import ServingContext

log = logging.getLogger("actorserve.frontend")

DEAD_GRACE_S = 2.0


@dataclass(frozen=True)
class HttpLimits:
    """What one connection may take from the HTTP server; the CLI flags are these fields."""

    timeout_keep_alive: int = 5  # seconds an idle keep-alive connection stays open
    request_read_timeout: float = 10.0  # seconds for a request's head, and again for its body, to arrive
    limit_concurrency: int = 1024  # connections (and requests) at once; beyond, uvicorn answers 503

    def validate(self) -> "HttpLimits":
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"{f.name} must be > 0, got {getattr(self, f.name)}")
        return self


def new_context(engine, model: Optional[str], served_model_name: Optional[str]) -> ServingContext:
    """A context whose engine has not started yet: ``complete_context`` fills in the rest."""
    from actorserve.runtime.model.loader import DEFAULT_MODEL_NAME

    name = served_model_name or (model if model is not None else DEFAULT_MODEL_NAME)
    return ServingContext(engine, None, name, 0, 0, FrontendMetrics(name))


async def complete_context(ctx: ServingContext, model: Optional[str]) -> None:
    """Start the engine and load the tokenizer side by side: the engine's own (``--tokenizer`` is in its
    config, so the scheduler detokenizes with the one this process tokenizes with)."""
    from actorserve.runtime.model.loader import resolve_model_path
    from actorserve.runtime.model.tokenizer import load_tokenizer

    tokenizer_path = ctx.engine.config.model.tokenizer
    loop = asyncio.get_running_loop()
    tokenizer_job = loop.run_in_executor(None, lambda: load_tokenizer(tokenizer_path or resolve_model_path(model)))
    try:
        await ctx.engine.start()
    finally:
        tokenizer = await tokenizer_job
    from actorserve.runtime.model.tokenizer import max_token_chars

    info = ctx.engine.info
    ctx.tokenizer, ctx.max_model_len, ctx.vocab_size = tokenizer, info["max_model_len"], info["vocab_size"]
    ctx.max_n = ctx.engine.config.scheduler.max_n
    ctx.max_token_chars = await asyncio.get_running_loop().run_in_executor(None, max_token_chars, tokenizer)


async def build_context(engine, model: Optional[str], served_model_name: Optional[str]) -> ServingContext:
    ctx = new_context(engine, model, served_model_name)
    await complete_context(ctx, model)
    return ctx


async def serve(engine, host: str, port: int, model: Optional[str], served_model_name: Optional[str] = None,
                api_key: Optional[str] = None, limits: HttpLimits = HttpLimits()) -> int:
    ctx = new_context(engine, model, served_model_name)
    ctx.ready = asyncio.ensure_future(complete_context(ctx, model))
    app = BodyLimit(build_app(ctx, api_key), engine.config.runtime.max_request_body_bytes,
                    limits.request_read_timeout)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                    timeout_graceful_shutdown=3, timeout_keep_alive=limits.timeout_keep_alive,
                                    limit_concurrency=limits.limit_concurrency,
                                    http=header_timeout_protocol(limits.request_read_timeout)))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_exit)
    watch = asyncio.ensure_future(_watch(ctx, server))
    try:
        await server.serve()
        return 1 if watch.done() or engine.is_dead else 0
    finally:
        watch.cancel()
        ctx.ready.cancel()
        await asyncio.gather(ctx.ready, watch, return_exceptions=True)
        await engine.close()
        ctx.pool.shutdown(wait=False, cancel_futures=True)


async def _watch(ctx: ServingContext, server: "_Server") -> None:
    """Announce the engine once it is ready; stop the server once its start failed or it died."""
    try:
        await ctx.ready
        print(f"actorserve: serving {ctx.model_name} on http://{server.config.host}:{server.config.port}", flush=True)
        await ctx.engine.wait_dead()
        log.error("the engine died; /health answers 503 and the server stops in %.0f s", DEAD_GRACE_S)
    except Exception as exc:
        log.error("the engine failed to start (%s); requests get 503, the server stops in %.0f s", exc, DEAD_GRACE_S)
    await asyncio.sleep(DEAD_GRACE_S)
    server.should_exit = True


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture (it re-raises the signal at the end, which would kill the
    process before the engine is closed); our handlers ask it to exit instead."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def request_exit(self) -> None:
        self.should_exit = True

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            print(f"actorserve: listening on http://{self.config.host}:{self.config.port}; the engine is starting",
                  flush=True)
