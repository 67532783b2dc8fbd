"""The FastAPI application: routes, authentication, request ids, and errors in the shape of the API a
request came to (Anthropic's on /v1/messages, OpenAI's elsewhere).

Runs in the frontend process. Malformed JSON and schema violations are 400 (not FastAPI's 422); an
error the request did not cause is a 500 in the same shape, logged with the request id; a client
that disconnects has its request aborted in the scheduler; ``X-Request-Id`` is honoured and returned.
The API key is taken as OpenAI's clients send it (``Authorization: Bearer``) and as Anthropic's do
(``x-api-key``).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Optional

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import actorserve
from actorserve.frontend.errors import APIError, error_response
from actorserve.frontend.messages_protocol import CountTokensRequest, MessagesRequest
from actorserve.frontend.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from actorserve.frontend.responses_protocol import ResponsesRequest
from actorserve.frontend.serving import SHUTTING_DOWN, ServingContext, now
from actorserve.frontend.serving_chat import ChatServing, render_chat
from actorserve.frontend.serving_completion import CompletionServing
from actorserve.frontend.serving_messages import MessagesServing
from actorserve.frontend.serving_responses import ResponsesServing
from actorserve.runtime.errors import EngineDeadError, EngineSleepingError

log = logging.getLogger("actorserve.frontend")

_WITHOUT_ENGINE = ("/health", "/ping", "/version")  # answered while the engine starts
_WITH_KEY = ("/v1", "/sleep", "/wake_up", "/is_sleeping")  # what --api-key guards


def build_app(ctx: ServingContext, api_key: Optional[str] = None) -> FastAPI:
    app = FastAPI(title="actorserve", version=actorserve.__version__)
    completions, chat = CompletionServing(ctx), ChatServing(ctx)
    _install_errors(app)

    @app.middleware("http")
    async def auth_and_request_id(request: Request, call_next):
        path = request.url.path
        if api_key is not None and path.startswith(_WITH_KEY):
            if (request.headers.get("authorization") != f"Bearer {api_key}"
                    and request.headers.get("x-api-key") != api_key):
                return _error(path, APIError(401, "Invalid or missing API key"))
        request.state.request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        if ctx.draining and path not in _WITHOUT_ENGINE:  # (SIGTERM: serving.drain)
            return _error(path, APIError(503, SHUTTING_DOWN))
        if path not in _WITHOUT_ENGINE:
            try:
                await ctx.wait_ready()  # requests that arrive while the engine starts wait for it
            except APIError as exc:
                return _error(path, exc)
        try:
            response = await call_next(request)
        except Exception as exc:  # no handler took it: not the request's fault
            log.exception("request %s failed", request.state.request_id)
            response = _error(path, APIError(500, f"internal error: {type(exc).__name__}"))
        response.headers["X-Request-Id"] = request.state.request_id
        return response

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request):
        return await _serve(request, completions, body)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        return await _serve(request, chat, body)

    @app.get("/v1/models")
    async def models():
        names = ctx.served_model_names or (ctx.model_name,)
        return {"object": "list", "data": [_model_card(ctx, name) for name in names]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        if model_id not in (ctx.served_model_names or (ctx.model_name,)):
            raise APIError(404, f"The model `{model_id}` does not exist.", "model")
        return _model_card(ctx, model_id)

    _responses_routes(app, ResponsesServing(ctx, chat))
    _messages_routes(app, MessagesServing(ctx, chat))

    @app.get("/health")
    @app.get("/ping")  # vLLM's alias of /health (SageMaker's name for it), also as a POST
    @app.post("/ping")
    async def health():
        if ctx.starting_or_failed() or ctx.draining:
            return Response(status_code=503)
        try:
            await ctx.engine.check_health()
        except EngineDeadError:
            return Response(status_code=503)
        replicas = ctx.engine.replica_states()
        if not all(r["alive"] for r in replicas):  # data parallel: the others serve on
            return JSONResponse({"status": "degraded", "replicas": replicas}, status_code=200)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        pong = None if ctx.engine.is_dead else await ctx.engine.check_health()
        ctx.metrics.set_replicas(ctx.engine.replica_states())
        return Response(ctx.metrics.render(pong), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give exactly one of prompt and messages", "prompt")
        if body.messages is not None:
            tokens = (await render_chat(ctx, body.messages, body.add_generation_prompt, False)).token_ids
        else:
            tokens = await ctx.encode(body.prompt, body.add_special_tokens)
        return {"count": len(tokens), "max_model_len": ctx.max_model_len, "tokens": tokens}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        ctx.check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < ctx.vocab_size]
        if bad:
            raise APIError(400, f"tokens has ids {bad[:10]} outside the vocabulary [0, {ctx.vocab_size})", "tokens")
        if len(body.tokens) > ctx.max_model_len:
            raise APIError(400, f"tokens has {len(body.tokens)} ids, more than the context of {ctx.max_model_len}",
                           "tokens")
        return {"prompt": await ctx.off_loop(ctx.tokenizer.decode, body.tokens)}

    @app.get("/version")
    async def version():
        return {"version": actorserve.__version__}

    if ctx.engine.config.runtime.enable_sleep_mode:
        _sleep_routes(app, ctx)

    return app


def _model_card(ctx: ServingContext, name: str) -> dict:
    return {"id": name, "object": "model", "created": now(), "owned_by": "actorserve", "root": ctx.model_name,
            "max_model_len": ctx.max_model_len}


def _responses_routes(app: FastAPI, responses: ResponsesServing) -> None:
    """OpenAI's Responses API (serving_responses)."""

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request):
        return await _serve(request, responses, body)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return responses.get(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return responses.delete(response_id)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str):
        return await responses.cancel(response_id)


def _messages_routes(app: FastAPI, messages: MessagesServing) -> None:
    """Anthropic's Messages API (serving_messages); its errors in Anthropic's shape (``_error``)."""

    @app.post("/v1/messages")
    async def create_message(body: MessagesRequest, request: Request):
        return await _serve(request, messages, body)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest, request: Request):
        return await messages.count_tokens(body, request.state.request_id)


def _error(path: str, exc: APIError) -> JSONResponse:
    """The error in the shape of the API the request came to."""
    return error_response(exc, anthropic=path.startswith("/v1/messages"))


def _sleep_routes(app: FastAPI, ctx: ServingContext) -> None:
    """vLLM's operator endpoints of sleep mode, served only where the engine was started with it."""

    async def done(call) -> Response:
        try:
            await call
        except ValueError as exc:  # a bad level or tag
            raise APIError.bad_request(exc) from None
        return Response(status_code=200)

    @app.post("/sleep")
    async def sleep(level: int = 1):
        return await done(ctx.engine.sleep(level))

    @app.post("/wake_up")
    async def wake_up(tags: Optional[list[str]] = Query(None)):
        return await done(ctx.engine.wake_up(tags))

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": await ctx.engine.is_sleeping()}


async def _serve(request: Request, serving, body):
    """The request's work, raced against the client leaving (which aborts it in the scheduler)."""
    request_id = request.state.request_id
    if body.stream:  # the stream starts once the engine took the request: a refusal is a plain 4xx
        start = asyncio.ensure_future(serving.stream(body, request_id))
        events = await _unless_disconnected(request, start)
        if events is None:
            return Response(status_code=499)
        return _EventStream(events, media_type="text/event-stream")
    result = await _unless_disconnected(request, asyncio.ensure_future(serving.create(body, request_id)))
    return Response(status_code=499) if result is None else result


class _EventStream(StreamingResponse):
    """Starlette's, closing its events when it ends however it ends: a client that leaves while the writer
    waits for room (it stopped reading) cancels the writer, not the events, which would otherwise keep its
    request in the engine until they were garbage-collected."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()


async def _unless_disconnected(request: Request, work: asyncio.Future):
    gone = asyncio.ensure_future(_disconnected(request))
    done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    if work in done:
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        return work.result()
    work.cancel()  # the client left: cancelling the stream aborts the request in the scheduler
    results = await asyncio.gather(work, return_exceptions=True)
    if hasattr(results[0], "aclose"):  # a stream that started just as the client left
        await results[0].aclose()
    return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "body"}


def _is_field(part) -> bool:
    """A field name or index of an error's location, not a union member's type tag."""
    return isinstance(part, int) or (part.isidentifier() and part not in _TYPE_TAGS)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return _error(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        # of a union's failures, the one our own validators raised says most (a lone surrogate, say)
        first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else {})
        if first.get("type") == "json_invalid":
            detail = (first.get("ctx") or {}).get("error", "")
            return _error(request.url.path, APIError(400, f"invalid JSON in the request body: {detail}"))
        where = ".".join(str(p) for p in first.get("loc", ()) if _is_field(p))
        message = f"{where}: {first.get('msg', 'invalid request')}" if where else first.get("msg", "invalid request")
        return _error(request.url.path, APIError(400, message, where or None))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(request.url.path, APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(EngineDeadError)
    @app.exception_handler(EngineSleepingError)
    async def unavailable(request: Request, exc: Exception):
        return _error(request.url.path, APIError(503, str(exc)))
