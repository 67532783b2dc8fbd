"""The chat template, one way for every caller: ``LLM.chat``, the HTTP server and ``/tokenize``.

A message may give its content as a string or as a list of text parts (``[{"type": "text", "text":
...}]``, as OpenAI clients send it); both become one string before the template sees them, so a template
written for strings renders either. Template errors are the request's fault: a ValueError naming them.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from actorserve.runtime.text.template_renderer import TemplateRenderer
from actorserve.runtime.text.tokenizer import encode

_PASSED = ("name", "tool_calls", "tool_call_id")  # kept beside role and content when a message has them


def message_text(content: Any) -> str:
    """A message's content as one string: a string as it is, text parts joined, None as empty."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"messages: content part {part!r} is not supported: only text parts "
                                 "({'type': 'text', 'text': ...}) are")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"messages: content must be a string or a list of text parts, got {type(content).__name__}")


def normalize_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f"messages: each message must be a dict with a 'role', got {message!r}")
    out = {"role": message["role"], "content": message_text(message.get("content"))}
    out.update({k: message[k] for k in _PASSED if message.get(k) is not None})
    return out


def render(tokenizer, messages: Sequence[Any], add_generation_prompt: bool = True,
           continue_final_message: bool = False, chat_template: Optional[str] = None,
           tools: Optional[list] = None, documents: Optional[list] = None,
           template_kwargs: Optional[dict[str, Any]] = None, add_special_tokens: bool = False,
           renderer: Optional[TemplateRenderer] = None, max_chars: int = 0) -> tuple[str, list[int]]:
    """The templated text and its tokens. Raises ValueError for what the caller got wrong. With a
    ``renderer``, the template runs in its process, within its budget and ``max_chars`` of text (the
    server's renders); without, here (``LLM.chat``: the caller's own templates)."""
    conversation = [normalize_message(m) for m in messages]
    if not conversation:
        raise ValueError("messages must not be empty")
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    if continue_final_message and conversation[-1]["role"] != "assistant":
        raise ValueError("continue_final_message needs a final assistant message")
    kwargs = dict(template_kwargs or {})
    reserved = {"conversation", "tokenize", "chat_template", "add_generation_prompt", "continue_final_message",
                "tools", "documents"} & set(kwargs)
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(reserved))}: they are request fields")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template (a base model's file carries none): give one with "
                         "chat_template= (LLM.chat) or --chat-template (actorserve serve), or send completions")
    if renderer is not None:
        text = renderer.render(tokenizer, conversation, max_chars, chat_template, tools, documents,
                               add_generation_prompt, continue_final_message, kwargs)
        return text, encode(tokenizer, text, add_special_tokens=add_special_tokens)
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False, chat_template=chat_template,
                                             add_generation_prompt=add_generation_prompt,
                                             continue_final_message=continue_final_message, tools=tools,
                                             documents=documents, **kwargs)
    except Exception as exc:  # jinja's errors, and a template that raises on purpose
        raise ValueError(f"the chat template could not be applied: {exc}") from None
    return text, encode(tokenizer, text, add_special_tokens=add_special_tokens)
