"""``actorserve serve``: the frontend process hosting the OpenAI-compatible HTTP server.

Runs in the frontend process, which launches the scheduler and worker processes and talks to them over
ZMQ. The port opens once the engine is ready. When the engine dies, /health answers 503 and, after a
short grace for health checkers to see it, the server exits with status 1, as vLLM's does.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Optional

import uvicorn

from frontend.app import build_app
from frontend.metrics import FrontendMetrics
from frontend.serving import ServingContext

log = logging.getLogger("actorserve.frontend")

DEAD_GRACE_S = 2.0


async def build_context(engine, model: Optional[str], tokenizer_path: Optional[str],
                        served_model_name: Optional[str]) -> ServingContext:
    """Start the engine and load the tokenizer side by side."""
    from runtime.model.loader import DEFAULT_MODEL_NAME, load_tokenizer, resolve_model_path

    path = resolve_model_path(model)
    loop = asyncio.get_running_loop()
    tokenizer_job = loop.run_in_executor(None, load_tokenizer, tokenizer_path or path)
    try:
        await engine.start()
    finally:
        tokenizer = await tokenizer_job
    name = served_model_name or (model if model is not None else DEFAULT_MODEL_NAME)
    info = engine.info
    return ServingContext(engine, tokenizer, name, info["max_model_len"], info["vocab_size"], FrontendMetrics(name))


async def serve(engine, host: str, port: int, model: Optional[str], tokenizer: Optional[str] = None,
                served_model_name: Optional[str] = None, api_key: Optional[str] = None) -> int:
    try:
        ctx = await build_context(engine, model, tokenizer, served_model_name)
        app = build_app(ctx, api_key)
        server = _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                        timeout_graceful_shutdown=3))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_exit)
        server.announce = ctx.model_name
        died = asyncio.ensure_future(_stop_when_dead(engine, server))
        await server.serve()
        died.cancel()
        return 1 if engine.is_dead else 0
    finally:
        await engine.close()


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
        if self.started:  # the port is open now, not before
            print(f"actorserve: serving {self.announce} on http://{self.config.host}:{self.config.port}", flush=True)


async def _stop_when_dead(engine, server) -> None:
    await engine.wait_dead()
    log.error("the engine died; /health answers 503 and the server stops in %.0f s", DEAD_GRACE_S)
    await asyncio.sleep(DEAD_GRACE_S)
    server.should_exit = True
