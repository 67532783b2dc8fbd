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
import json
import logging
import os
import signal
import socket
from dataclasses import dataclass
from typing import Optional, Sequence

import uvicorn

from actorserve.frontend.app import build_app
from actorserve.frontend.http_limits import BodyLimit, header_timeout_protocol
from actorserve.frontend.metrics import FrontendMetrics
from actorserve.frontend.response_store import ResponseStore
from actorserve.frontend.serving import ServingContext, drain

log = logging.getLogger("actorserve.frontend")

DEAD_GRACE_S = 2.0


@dataclass(frozen=True)
class HttpLimits:
    """What one connection may take from the HTTP server; the CLI flags are these fields."""

    timeout_keep_alive: int = 5  # seconds an idle keep-alive connection stays open
    request_read_timeout: float = 10.0  # seconds for a request's head, and again for its body, to arrive
    limit_concurrency: int = 1024  # connections (and requests) at once; beyond, uvicorn answers 503
    chat_template_seconds: float = 5.0  # a chat template's render, in its own process; longer is a 400
    chat_template_memory: int = 512 << 20  # bytes that render may allocate; more is a 400
    # each connection's kernel send buffer (SO_SNDBUF), and as much again in its transport: what a client that
    # stops reading takes before the server's writer blocks and flow control pauses its request
    # (runtime/client.py); it also bounds a response's rate to twice this a round trip: 320 KB/s at 100 ms, a
    # token stream's needs many times over; raise it for large responses to far clients
    send_buffer_bytes: int = 16 << 10

    def validate(self) -> "HttpLimits":
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"{f.name} must be > 0, got {getattr(self, f.name)}")
        return self


@dataclass(frozen=True)
class ServeOptions:
    """What ``actorserve serve`` adds to the engine's config: names, templates, logs."""

    served_model_names: tuple[str, ...] = ()  # the first is the one reported; default: the model's
    api_key: Optional[str] = None
    chat_template: Optional[str] = None
    trust_request_chat_template: bool = False  # render a request's own chat_template (else it is a 400)
    tool_parser: Optional[str] = None  # "auto" tool choice's parser (--enable-auto-tool-choice --tool-call-parser)
    responses_store_entries: int = ResponseStore.max_entries  # stored Responses (store=true) kept at most
    responses_store_bytes: int = ResponseStore.max_bytes  # and their size at most, in bytes of JSON
    generation_config: str = "auto"  # "auto": the model's generation_config.json; "vllm": none; or a folder
    uvicorn_log_level: str = "info"
    access_log: bool = True
    log_requests: bool = True


def check_address_free(host: str, port: int) -> None:
    """Bind the address once and let it go: a port in use is an error at once, not after the model loads."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            sock.bind(address)
        except OSError as exc:
            raise ValueError(f"cannot listen on http://{host}:{port}: {exc.strerror}") from None


def read_chat_template(value: Optional[str]) -> Optional[str]:
    """--chat-template: a file's text, or the template itself when no such file exists."""
    if value is None or not os.path.isfile(value):
        return value
    with open(value) as f:
        return f.read()


def generation_defaults(choice: str, model: Optional[str]) -> dict:
    """The sampling defaults a generation_config.json gives (vLLM's --generation-config): what a request
    leaves unset takes them. "vllm": none; "auto": the model directory's file, if it has one."""
    if choice == "vllm":
        return {}
    if choice == "auto":
        from actorserve.runtime.model_files import resolve_model_path

        folder = resolve_model_path(model)
        if not os.path.isdir(folder):
            return {}  # a GGUF file carries no generation config
    else:
        folder = choice
    path = os.path.join(folder, "generation_config.json")
    if not os.path.isfile(path):
        if choice != "auto":
            raise ValueError(f"--generation-config: {path} does not exist")
        return {}
    with open(path) as f:
        config = json.load(f)
    names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}
    defaults = {ours: config[theirs] for theirs, ours in names.items() if config.get(theirs) is not None}
    if defaults:
        log.info("sampling defaults from %s (requests that leave them unset take them): %s", path, defaults)
    return defaults


def new_context(engine, model: Optional[str], served_model_names: Sequence[str] = (),
                options: Optional[ServeOptions] = None, limits: Optional[HttpLimits] = None) -> ServingContext:
    """A context whose engine has not started yet: ``complete_context`` fills in the rest. With ``limits``
    (a server's), chat templates render in a process of their own within its budget."""
    from actorserve.runtime.model_files import DEFAULT_MODEL_NAME
    from actorserve.runtime.text.template_renderer import TemplateRenderer

    names = tuple(served_model_names) or (model if model is not None else DEFAULT_MODEL_NAME,)
    options = options or ServeOptions()
    renderer = None if limits is None else TemplateRenderer(limits.chat_template_seconds, limits.chat_template_memory)
    return ServingContext(engine, None, names[0], 0, 0, FrontendMetrics(names[0]), served_model_names=names,
                          chat_template=options.chat_template, log_requests=options.log_requests,
                          tool_parser=options.tool_parser,
                          responses=ResponseStore(options.responses_store_entries, options.responses_store_bytes),
                          renderer=renderer,
                          trust_request_chat_template=options.trust_request_chat_template)


async def complete_context(ctx: ServingContext, model: Optional[str], generation_config: str = "vllm") -> None:
    """Start the engine and load the tokenizer side by side: the engine's own (``--tokenizer`` is in its
    config, so the scheduler detokenizes with the one this process tokenizes with)."""
    from actorserve.runtime.model_files import resolve_model_path
    from actorserve.runtime.text.tokenizer import load_tokenizer

    tokenizer_path = ctx.engine.config.model.tokenizer
    ctx.reasoning_parser = ctx.engine.config.scheduler.reasoning_parser  # the engine's, as its grammars' gate
    loop = asyncio.get_running_loop()
    tokenizer_job = loop.run_in_executor(None, lambda: load_tokenizer(tokenizer_path or resolve_model_path(model)))
    renderer_job = loop.run_in_executor(None, ctx.renderer.start) if ctx.renderer is not None else None
    try:
        await ctx.engine.start()
    finally:
        tokenizer = await tokenizer_job
        if renderer_job is not None:
            await renderer_job
    from actorserve.runtime.text.tokenizer import max_token_chars

    info = ctx.engine.info
    ctx.tokenizer, ctx.max_model_len, ctx.vocab_size = tokenizer, info["max_model_len"], info["vocab_size"]
    ctx.max_n = ctx.engine.config.scheduler.max_n
    ctx.max_token_chars = await asyncio.get_running_loop().run_in_executor(None, max_token_chars, tokenizer)
    ctx.default_sampling = generation_defaults(generation_config, model)
    config = ctx.engine.config
    ctx.metrics.set_cache_config(config.cache.block_size, info["num_kv_blocks"], config.cache.enable_prefix_caching,
                                 config.cache.kv_cache_dtype)


async def build_context(engine, model: Optional[str], served_model_names: Sequence[str] = ()) -> ServingContext:
    """A batch file's context: its requests are the operator's, their chat templates rendered in-process."""
    ctx = new_context(engine, model, served_model_names, ServeOptions(trust_request_chat_template=True))
    await complete_context(ctx, model)
    return ctx


async def serve(engine, host: str, port: int, model: Optional[str], options: ServeOptions = ServeOptions(),
                limits: HttpLimits = HttpLimits()) -> int:
    ctx = new_context(engine, model, options.served_model_names, options, limits)
    ctx.ready = asyncio.ensure_future(complete_context(ctx, model, options.generation_config))
    app = BodyLimit(build_app(ctx, options.api_key), engine.config.runtime.max_request_body_bytes,
                    limits.request_read_timeout)
    server = _Server(uvicorn.Config(app, host=host, port=port, log_level=options.uvicorn_log_level,
                                    access_log=options.access_log, lifespan="off",
                                    timeout_graceful_shutdown=3, timeout_keep_alive=limits.timeout_keep_alive,
                                    limit_concurrency=limits.limit_concurrency,
                                    http=header_timeout_protocol(limits.request_read_timeout,
                                                                  limits.send_buffer_bytes)),
                     send_buffer_bytes=limits.send_buffer_bytes)
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task] = []

    def on_signal() -> None:
        """The first SIGTERM or SIGINT drains (``serving.drain``, within --shutdown-timeout) and then stops;
        a second stops at once."""
        if draining:
            server.request_exit()
            return
        timeout = engine.config.runtime.shutdown_timeout
        log.info("stopping: no new requests; those in flight have %g s to finish", timeout)
        draining.append(asyncio.ensure_future(_drain_then_exit(ctx, server, timeout)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    watch = asyncio.ensure_future(_watch(ctx, server))
    try:
        await server.serve()
        return 1 if watch.done() or engine.is_dead else 0
    finally:
        watch.cancel()
        ctx.ready.cancel()
        for task in draining:
            task.cancel()
        await asyncio.gather(ctx.ready, watch, *draining, return_exceptions=True)
        await engine.close()
        ctx.pool.shutdown(wait=False, cancel_futures=True)
        ctx.renderer.close()


async def _drain_then_exit(ctx: ServingContext, server: "_Server", timeout: float) -> None:
    try:
        await drain(ctx, timeout)
    finally:
        server.request_exit()


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
    process before the engine is closed); our handlers ask it to exit instead. Its listening sockets get
    the send buffer size every accepted connection inherits."""

    def __init__(self, config: uvicorn.Config, send_buffer_bytes: int) -> None:
        super().__init__(config)
        self.send_buffer_bytes = send_buffer_bytes

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    def request_exit(self) -> None:
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's, then the connections still open cut: a client that stopped reading keeps its response's
        writer waiting for room past the graceful timeout, and the cancelled task would wait there again
        (sending its error), holding the process open for good."""
        await super().shutdown(sockets)
        for connection in list(self.server_state.connections):
            connection.transport.abort()
        if self.server_state.tasks:
            await asyncio.wait(list(self.server_state.tasks), timeout=1.0)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for sock in server.sockets:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
        if self.started:
            print(f"actorserve: listening on http://{self.config.host}:{self.config.port}; the engine is starting",
                  flush=True)
