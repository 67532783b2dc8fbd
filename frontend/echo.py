"""The one rule for ``echo``, used by every path (completions and chat, streaming or not, single or batch).

Completions echo the prompt. Chat echoes only a trailing assistant message, the prefix the model is asked
to continue, never the user's turn.
"""
from __future__ import annotations

from typing import Optional, Union

from actorserve.frontend.protocol import ChatCompletionRequest, CompletionRequest


def echo_prefix(request: Union[CompletionRequest, ChatCompletionRequest], prompt_text: Optional[str]) -> str:
    if not request.echo:
        return ""
    if isinstance(request, ChatCompletionRequest):
        last = request.messages[-1]
        return last.text() if last.role == "assistant" else ""
    return prompt_text or ""
