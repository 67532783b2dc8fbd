"""``actorserve serve``: the frontend process hosting the OpenAI-compatible HTTP server.

Runs in the frontend process, which launches the scheduler and worker processes and talks to them over
ZMQ. The port opens once the engine is ready. When the engine dies, /health answers 503 and, after a
short grace for health checkers to see it, the server exits with status 1, as vLLM's does.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

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
    import uvicorn

    try:
        ctx = await build_context(engine, model, tokenizer, served_model_name)
        app = build_app(ctx, api_key)
        server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                               lifespan="off", timeout_graceful_shutdown=3))
        died = asyncio.ensure_future(_stop_when_dead(engine, server))
        print(f"actorserve: serving {ctx.model_name} on http://{host}:{port}", flush=True)
        await server.serve()
        died.cancel()
        return 1 if engine.is_dead else 0
    finally:
        await engine.close()


async def _stop_when_dead(engine, server) -> None:
    await engine.wait_dead()
    log.error("the engine died; /health answers 503 and the server stops in %.0f s", DEAD_GRACE_S)
    await asyncio.sleep(DEAD_GRACE_S)
    server.should_exit = True
