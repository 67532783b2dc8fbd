"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``."""
from __future__ import annotations

import json
import re
from typing import Optional

from fastapi.responses import JSONResponse

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 413: "BadRequestError",
          500: "InternalServerError", 503: "ServiceUnavailableError"}
_FIELD = re.compile(r"^([a-z_]+)[: ]")


RETRY_AFTER_S = 1  # what a 503 for a full queue tells a client (and a gateway) to wait before sending again


class APIError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None,
                 retry_after: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after = retry_after

    @classmethod
    def bad_request(cls, exc: Exception, names: Optional[dict[str, str]] = None) -> "APIError":
        """A ValueError from validation; its message starts with the field it names. names: the request's
        own name for an engine field it was given under another (chat's top_logprobs for logprobs)."""
        text = str(exc)
        match = _FIELD.match(text)
        field = match.group(1) if match else None
        if field is not None and names and field in names:
            field, text = names[field], names[field] + text[len(field):]
        return cls(400, text, field)


def error_body(status: int, message: str, param: Optional[str] = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "BadRequestError"), "param": param,
                      "code": status}}


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors)
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
                    500: "api_error", 503: "overloaded_error"}


def anthropic_error_body(status: int, message: str) -> dict:
    """``{"type": "error", "error": {"type", "message"}}``, as Anthropic's API and its SDK read it."""
    return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(status, "invalid_request_error"),
                                       "message": message}}


def error_response(exc: APIError, anthropic: bool = False) -> JSONResponse:
    """The error in OpenAI's shape, or in Anthropic's for its API's routes."""
    if anthropic:
        body = anthropic_error_body(exc.status, exc.message)
    else:
        body = error_body(exc.status, exc.message, exc.param)
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return JSONResponse(body, status_code=exc.status, headers=headers)


def sse_error(exc: APIError) -> str:
    return f"data: {json.dumps(error_body(exc.status, exc.message, exc.param))}\n\n"
