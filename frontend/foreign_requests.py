"""What reading another API's request as a chat request needs, for Responses and Messages alike: the
check of its extra fields, and its text and string fields, each refused with a 400 naming the field."""
from __future__ import annotations

from typing import Any

from actorserve.frontend.errors import APIError
from actorserve.frontend.protocol import SAMPLING_EXTRAS, _same


def check_extra(extra: dict, unsupported: dict[str, tuple], accepted: frozenset) -> list[str]:
    """A 400 for the first field asking for what is not served (it holds no neutral value); the names of
    the fields nobody knows, for a warning."""
    for name, neutral in unsupported.items():
        if name in extra and not any(_same(extra[name], v) for v in neutral):
            raise APIError(400, f"{name} is not supported by this server", name)
    return sorted(n for n in extra if n not in unsupported and n not in accepted and n not in SAMPLING_EXTRAS)


def sampling_extras(extra: dict) -> dict:
    """vLLM's sampling fields the request carries, handed to the chat request as they are."""
    return {k: v for k, v in extra.items() if k in SAMPLING_EXTRAS}


def text_of(content: Any, kinds: tuple[str, ...], where: str, param: str) -> str:
    """A string, or the text of a list of text parts (of ``kinds``); any other part is a 400 naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where} must be a string or a list of text parts", param)
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise APIError(400, f"{where}: content of type {kind!r} is not supported: the served model takes "
                                "text only", param)
        parts.append(part["text"])
    return "".join(parts)


def string_field(item: dict, key: str, where: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{key} must be a string", param)
    return value
