"""The ``actorserve`` command line: ``generate`` runs the offline engine once; ``serve-zmq`` serves the ZMQ protocol."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Optional, Sequence

from actorserve.engine_flags import add_engine_arguments, engine_kwargs, expand_config_file
from actorserve.frontend.response_store import ResponseStore
from actorserve.frontend.tool_calls import PARSERS
from actorserve.runtime.errors import ActorServeError


# the engine's defaults where it serves clients it does not know (serve, serve-zmq), under the flags given: a
# bounded queue (a client's fan-out of prompts x n is refused, not queued ahead of everyone for minutes)
SERVING_DEFAULTS = {"max_waiting_seqs": 4096}


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="a .gguf file, an HF model directory, or an HF hub id in the "
                                                 "local HF cache (default: the embedded SmolLM2)")
    p.add_argument("--config", metavar="FILE", help="a YAML file of these flags (flags given here win)")
    add_engine_arguments(p)


def _generate(a: argparse.Namespace) -> int:
    from actorserve import LLM, SamplingParams

    params = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens,
                            seed=a.sampling_seed, stop=a.stop or None, n=a.n)
    llm = LLM(a.model, **engine_kwargs(a))
    if a.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in a.prompt], params, use_tqdm=False)
    else:
        outs = llm.generate(a.prompt, params, use_tqdm=False)
    for out in outs:
        for completion in out.outputs:
            print(completion.text if a.chat else out.prompt + completion.text)
    return 0


def _serve_zmq(a: argparse.Namespace) -> int:
    import asyncio
    import signal

    import uvloop

    from actorserve import AsyncEngine

    async def serve() -> int:
        engine = AsyncEngine(a.model, client_address=a.address, client_api_key=a.api_key,
                             curve_secret_key=a.curve_secret_key, curve_authorized_keys=a.curve_authorized_keys,
                             **{**SERVING_DEFAULTS, **engine_kwargs(a)})
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await engine.start()
            print(f"actorserve: serving the ZMQ protocol on {a.address}", flush=True)
            dead = asyncio.ensure_future(engine.wait_dead())
            await asyncio.wait({dead, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
            code = 1 if dead.done() else 0
            dead.cancel()
            return code
        finally:
            await engine.close()

    return uvloop.run(serve())


def _engine_from(a: argparse.Namespace, serving: bool = False, **extra):
    """An AsyncEngine, or data-parallel replicas of one (--data-parallel-size); ``serving``: under
    ``SERVING_DEFAULTS`` where the flags leave them unset."""
    from actorserve.runtime.resolve import engine_config
    from actorserve.runtime.data_parallel import make_engine

    kwargs = {**(SERVING_DEFAULTS if serving else {}), **engine_kwargs(a)}
    return make_engine(engine_config(a.model, **extra, **kwargs))


def _serve_http(a: argparse.Namespace) -> int:
    import uvloop

    from actorserve.frontend.server import HttpLimits, ServeOptions, check_address_free, read_chat_template, serve

    a.model = a.model_tag or a.model
    limits = HttpLimits(**{f.name: getattr(a, f.name) for f in dataclasses.fields(HttpLimits)}).validate()
    if a.enable_auto_tool_choice and a.tool_call_parser is None:
        print(f"actorserve: error: --enable-auto-tool-choice needs --tool-call-parser (one of {', '.join(PARSERS)})",
              file=sys.stderr)
        return 2
    options = ServeOptions(served_model_names=tuple(a.served_model_name or ()), api_key=a.api_key,
                           chat_template=read_chat_template(a.chat_template),
                           trust_request_chat_template=a.trust_request_chat_template,
                           tool_parser=a.tool_call_parser if a.enable_auto_tool_choice else None,
                           responses_store_entries=a.responses_store_entries,
                           responses_store_bytes=a.responses_store_bytes,
                           generation_config=a.generation_config, uvicorn_log_level=a.uvicorn_log_level,
                           access_log=not a.disable_uvicorn_access_log, log_requests=not a.disable_log_requests)
    check_address_free(a.host, a.port)  # before the model loads: a taken port fails at once
    engine = _engine_from(a, serving=True, client_address=a.zmq_address, client_api_key=a.zmq_api_key)
    return uvloop.run(serve(engine, a.host, a.port, a.model, options, limits))


def _http_limit_args(p: argparse.ArgumentParser) -> None:
    """One flag per HttpLimits field, typed and defaulted as the field is."""
    import typing

    from actorserve.frontend.server import HttpLimits

    hints = typing.get_type_hints(HttpLimits)
    for f in dataclasses.fields(HttpLimits):
        p.add_argument("--" + f.name.replace("_", "-"), type=hints[f.name], default=f.default)


def _run_batch(a: argparse.Namespace) -> int:
    import json

    import uvloop

    from actorserve.frontend.batch import run_batch
    from actorserve.frontend.server import build_context

    with open(a.input_file) as f:
        lines = [line for line in f if line.strip()]

    async def run() -> list[dict]:
        engine = _engine_from(a)
        try:
            ctx = await build_context(engine, a.model, a.served_model_name or ())
            return await run_batch(ctx, lines)
        finally:
            await engine.close()

    results = uvloop.run(run())
    with open(a.output_file, "w") as f:
        for row in results:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    failed = sum(1 for r in results if r["error"] is not None)
    print(f"actorserve: {len(results) - failed} succeeded, {failed} failed -> {a.output_file}", file=sys.stderr)
    return 0


def _bench_parsers(sub) -> None:
    from actorserve.benchmarks import offline, serve

    bench = sub.add_parser("bench", help="benchmarks: serve (any OpenAI server), throughput, latency")
    kinds = bench.add_subparsers(dest="bench_command", required=True)
    serve.add_arguments(kinds.add_parser("serve", help="load against an OpenAI-compatible server"))
    tp = kinds.add_parser("throughput", help="offline LLM throughput")
    offline.add_engine_arguments(tp)
    tp.add_argument("--num-prompts", type=int, default=256)
    tp.add_argument("--no-progress", action="store_true")
    lat = kinds.add_parser("latency", help="one batch, timed per step")
    offline.add_engine_arguments(lat)
    lat.add_argument("--batch-size", type=int, default=1)


def _bench(a: argparse.Namespace) -> int:
    from actorserve.benchmarks import offline, serve

    return {"serve": serve.main, "throughput": offline.throughput, "latency": offline.latency}[a.bench_command](a)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="actorserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a completion for one or more prompts")
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--chat", action="store_true", help="apply the chat template to each prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--stop", action="append")
    gen.add_argument("--sampling-seed", type=int, default=None)
    _engine_args(gen)
    zmq_server = sub.add_parser("serve-zmq", help="serve the ZMQ client protocol (docs/protocol.md)")
    zmq_server.add_argument("--address", default="tcp://127.0.0.1:5555", help="tcp://HOST:PORT or ipc://PATH")
    zmq_server.add_argument("--api-key", default=None, help="every client message must carry this api_key")
    zmq_server.add_argument("--curve-secret-key", default=None,
                            help="CurveZMQ: the server's key pair (a zmq.auth .key_secret certificate file)")
    zmq_server.add_argument("--curve-authorized-keys", default=None,
                            help="CurveZMQ: a folder of the public certificates of the clients allowed in")
    _engine_args(zmq_server)
    http = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    http.add_argument("model_tag", nargs="?", default=None, help="a .gguf file or HF directory")
    http.add_argument("--host", default="127.0.0.1")
    http.add_argument("--port", type=int, default=8000)
    http.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1")
    http.add_argument("--served-model-name", nargs="+", default=None,
                      help="the names the API answers to (the first is the one reported); default: the model's")
    http.add_argument("--chat-template", default=None,
                      help="a chat template file, or the template itself, for requests that give none")
    http.add_argument("--trust-request-chat-template", action="store_true",
                      help="render a request's own chat_template (a template is a program: without this flag it "
                           "is a 400)")
    http.add_argument("--enable-auto-tool-choice", action="store_true",
                      help='"auto" tool choice (also tools without tool_choice): the --tool-call-parser finds the '
                           "model's calls in its answer")
    http.add_argument("--tool-call-parser", default=None, choices=list(PARSERS),
                      help="the format the model writes its tool calls in (docs/http-api.md: tool parsers)")
    http.add_argument("--responses-store-entries", type=int, default=ResponseStore.max_entries,
                      help="stored Responses (store=true, for previous_response_id) kept at most; the oldest go first")
    http.add_argument("--responses-store-bytes", type=int, default=ResponseStore.max_bytes,
                      help="the stored Responses' size at most, in bytes")
    http.add_argument("--generation-config", default="auto",
                      help="auto: the model's generation_config.json gives the sampling defaults of requests "
                           "(as vLLM); vllm: none; or a folder holding a generation_config.json")
    http.add_argument("--uvicorn-log-level", default="info",
                      choices=["critical", "error", "warning", "info", "debug", "trace"])
    http.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access log line per request")
    http.add_argument("--disable-log-requests", action="store_true",
                      help="no log line per request naming its prompt size and sampling parameters")
    http.add_argument("--zmq-address", default=None,
                      help="also serve the ZMQ client protocol (docs/protocol.md) here: tcp://HOST:PORT or ipc://PATH")
    http.add_argument("--zmq-api-key", default=None, help="every ZMQ client message must carry this api_key")
    _http_limit_args(http)
    _engine_args(http)
    batch = sub.add_parser("run-batch", help="run an OpenAI batch file (JSONL) offline")
    batch.add_argument("-i", "--input-file", required=True)
    batch.add_argument("-o", "--output-file", required=True)
    batch.add_argument("--served-model-name", nargs="+", default=None)
    _engine_args(batch)
    _bench_parsers(sub)
    args = parser.parse_args(expand_config_file(list(sys.argv[1:] if argv is None else argv)))
    commands = {"generate": _generate, "serve-zmq": _serve_zmq, "serve": _serve_http, "run-batch": _run_batch,
                "bench": _bench}
    try:
        return commands[args.command](args)
    except (ValueError, ActorServeError) as exc:
        print(f"actorserve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
