"""``actorserve run-batch``: the OpenAI batch file format through the same serving code as HTTP.

Runs in the launcher's process. Each input line is ``{"custom_id", "method": "POST", "url", "body"}`` with
url ``/v1/completions`` or ``/v1/chat/completions``; each output line is
``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`` in input order.
All requests are submitted at once and batched by the engine; a bar shows progress.
"""
from __future__ import annotations

import asyncio
import json
import uuid

from pydantic import ValidationError

from actorserve.frontend.errors import APIError, error_body
from actorserve.frontend.protocol import ChatCompletionRequest, CompletionRequest
from actorserve.frontend.serving import ServingContext
from actorserve.frontend.serving_chat import ChatServing
from actorserve.frontend.serving_completion import CompletionServing


async def run_batch(ctx: ServingContext, lines: list[str], show_progress: bool = True) -> list[dict]:
    routes = {"/v1/completions": (CompletionRequest, CompletionServing(ctx)),
              "/v1/chat/completions": (ChatCompletionRequest, ChatServing(ctx))}
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(lines), desc="Running batch", dynamic_ncols=True)

    async def one(index: int, line: str) -> dict:
        try:
            return await _one(routes, index, line)
        finally:
            if bar is not None:
                bar.update(1)

    try:
        return await asyncio.gather(*[one(i, line) for i, line in enumerate(lines)])
    finally:
        if bar is not None:
            bar.close()


async def _one(routes, index: int, line: str) -> dict:
    request_id = f"batch-{index}-{uuid.uuid4().hex[:8]}"
    custom_id = None
    try:
        item = json.loads(line)
        custom_id = item.get("custom_id")
        if item.get("method", "POST") != "POST" or item.get("url") not in routes:
            raise APIError(400, f"unsupported method/url {item.get('method')} {item.get('url')}", "url")
        schema, serving = routes[item["url"]]
        body = schema.model_validate({**item.get("body", {}), "stream": False})
        result, status = await serving.create(body, request_id), 200
    except APIError as exc:
        result, status = error_body(exc.status, exc.message, exc.param), exc.status
    except (ValidationError, ValueError) as exc:
        result, status = error_body(400, str(exc)), 400
    error = None if status == 200 else result["error"]
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": result}, "error": error}
