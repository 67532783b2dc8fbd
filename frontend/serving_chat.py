"""/v1/chat/completions: the chat template, n samples, whole or streamed as SSE."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import AsyncIterator, Optional

import pydantic

from actorserve.frontend import tool_calls
from actorserve.frontend.echo import echo_prefix
from actorserve.frontend.errors import APIError, sse_error
from actorserve.frontend.protocol import ChatCompletionRequest, ChatMessage
from actorserve.frontend.serving import (SSE_DONE, Prompt, ServingContext, clamp_logprob, now, prompt_logprobs_json,
                                         sse, usage)
from actorserve.runtime.engine.outputs import CompletionOutput, Logprob
from actorserve.runtime.engine.sampling_params import SamplingParams, prompt_text_bound
from actorserve.runtime.text.chat_template import render
from actorserve.runtime.text.output_parser import OutputParser
from actorserve.runtime.text.reasoning_parsers import REASONING_PARSERS
from actorserve.runtime.text.tool_parsers import TOOL_PARSERS, ToolCall

log = logging.getLogger("actorserve.frontend")


async def render_chat(ctx: ServingContext, messages: list[ChatMessage], add_generation_prompt: bool,
                      continue_final_message: bool, chat_template: Optional[str] = None,
                      tools: Optional[list] = None, documents: Optional[list] = None,
                      template_kwargs: Optional[dict] = None, add_special_tokens: bool = False) -> Prompt:
    """The template and the tokenizer run on the pool's thread, after the cheap length check; the
    server's ``--chat-template`` stands in for a request that names none, and a request's own is rendered
    only under ``--trust-request-chat-template``. A server renders in its ``TemplateRenderer``'s process,
    within its budget and the prompt's length bound, before anything is tokenized."""
    if chat_template is not None and not ctx.trust_request_chat_template:
        raise APIError(400, "chat_template: a request's own chat template is refused unless the server runs "
                            "with --trust-request-chat-template", "chat_template")
    ctx.check_length("".join(m.text() for m in messages), "messages")
    conversation = [m.model_dump(exclude_none=True) for m in messages]
    bound = prompt_text_bound(ctx.max_model_len, ctx.max_token_chars)
    try:
        text, ids = await ctx.off_loop(lambda: render(
            ctx.tokenizer, conversation, add_generation_prompt, continue_final_message,
            chat_template or ctx.chat_template, tools, documents, template_kwargs, add_special_tokens,
            ctx.renderer, bound))
    except ValueError as exc:
        raise APIError(400, str(exc), "messages") from None
    return Prompt(text, ids)


@dataclass
class ChatTurn:
    """A chat request made ready for the engine: what Responses and Messages share with chat."""

    prompt: Prompt
    params: SamplingParams
    mode: Optional[tool_calls.ToolMode]
    tools: Optional[list[dict]]
    template_kwargs: dict

    def output_parser(self, reasoning_parser: Optional[str]) -> OutputParser:
        """A sample's reader: the server's reasoning parser, then the tool mode's parser."""
        reasoning = None if reasoning_parser is None else REASONING_PARSERS[reasoning_parser](self.template_kwargs)
        return OutputParser(reasoning, tool_calls.parser_of(self.mode, self.tools))


class ChatServing:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def prepare(self, request: ChatCompletionRequest, request_id: str,
                      renamed: Optional[dict[str, str]] = None) -> ChatTurn:
        """``renamed``: the request's own name for a chat field it came under another name (Responses'
        max_output_tokens), which its errors then use."""
        self.ctx.check_model(request.model)
        if request.top_logprobs is not None and not request.logprobs:
            raise APIError(400, "top_logprobs needs logprobs to be true", "top_logprobs")
        try:
            mode = tool_calls.mode_of(request, self.ctx.tool_parser)
        except ValueError as exc:
            raise APIError(400, str(exc), "tool_choice") from None
        request._tools_constraint = tool_calls.constraint(request, mode)
        if mode is not None and mode.kind == "auto" and TOOL_PARSERS[mode.parser].needs_special_tokens:
            request.skip_special_tokens = False  # the parser's markers are special tokens (as vLLM does)
        self.ctx.check_fields(request, request_id)
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        template_kwargs = dict(request.chat_template_kwargs or {})
        if request.reasoning_effort is not None:
            template_kwargs.setdefault("reasoning_effort", request.reasoning_effort)
        prompt = await render_chat(self.ctx, request.messages, request.add_generation_prompt,
                                   request.continue_final_message, request.chat_template, tools,
                                   request.documents, template_kwargs, request.add_special_tokens)
        requested = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        names = {"logprobs": "top_logprobs", **(renamed or {})}
        if request.max_completion_tokens is not None:
            names["max_tokens"] = "max_completion_tokens"
        params = self.ctx.build_params(request, prompt, requested, logprobs, request.prompt_logprobs, names)
        return ChatTurn(prompt, params, mode, tools, template_kwargs)

    async def prepare_from(self, body: dict, unknown: list[str], request_id: str, param: str,
                           renamed: dict[str, str]) -> ChatTurn:
        """Another API's request (Responses, Messages), served as the chat request ``body`` it amounts to:
        its ``unknown`` fields named in one warning, a body chat's schema refuses a 400 naming ``param``."""
        if unknown:
            log.warning("request %s: ignored fields the server does not know: %s", request_id, ", ".join(unknown))
        try:
            chat = ChatCompletionRequest.model_validate(body)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise APIError(400, f"{where}: {first.get('msg')}", param) from None
        return await self.prepare(chat, request_id, renamed)

    async def create(self, request: ChatCompletionRequest, request_id: str) -> dict:
        turn = await self.prepare(request, request_id)
        out = await self.ctx.final(turn.prompt, turn.params, request_id)
        prefix = echo_prefix(request, turn.prompt.text)
        choices = []
        for s in out.outputs:
            parsed = turn.output_parser(self.ctx.reasoning_parser).parse(s.text)
            message = {"role": "assistant", "content": prefix + parsed.content if parsed.content is not None
                       else (prefix or None)}
            if parsed.reasoning is not None:
                message["reasoning"] = message["reasoning_content"] = parsed.reasoning
            if turn.mode is not None:
                message["tool_calls"] = [tool_calls.call_json(c) for c in parsed.calls]
            choices.append({"index": s.index, "message": message,
                            "logprobs": chat_logprobs(s, request.top_logprobs or 0) if request.logprobs else None,
                            "finish_reason": tool_calls.finish_reason(turn.mode, s.finish_reason, parsed.calls),
                            "stop_reason": s.stop_reason})
        body = {"id": f"chatcmpl-{request_id}", "object": "chat.completion", "created": now(),
                "model": self.ctx.response_name(request.model), "choices": choices,
                "usage": usage([turn.prompt], [out])}
        if request.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(out.prompt_logprobs)
        return body

    async def stream(self, request: ChatCompletionRequest, request_id: str) -> AsyncIterator[str]:
        """Errors before the stream starts (the engine's refusal included) are plain 4xx."""
        turn = await self.prepare(request, request_id)
        outputs = await self.ctx.started(turn.prompt, turn.params, request_id)
        return self._events(request, request_id, turn, outputs)

    async def _events(self, request, request_id, turn: ChatTurn, outputs) -> AsyncIterator[str]:
        head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "created": now(),
                "model": self.ctx.response_name(request.model)}
        prefix = echo_prefix(request, turn.prompt.text)
        sent = {i: (0, 0) for i in range(request.n)}
        done: set[int] = set()  # samples whose finish_reason went out: nothing more for them
        parsers = {i: turn.output_parser(self.ctx.reasoning_parser) for i in range(request.n)}
        options = request.stream_options
        continuous = options is not None and options.include_usage and options.continuous_usage_stats
        last = None
        try:
            for i in range(request.n):
                delta = {"role": "assistant", "content": prefix}
                yield sse({**head, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}]})
            async for out in outputs:
                last = out
                for s in out.outputs:
                    chunk = _delta(s, sent, done, request)
                    if chunk is not None and parsers[s.index].active:
                        chunk = _parsed(parsers[s.index], s, chunk, turn.mode)
                    if chunk is not None:
                        extra = {"usage": usage([turn.prompt], [out])} if continuous else {}
                        yield sse({**head, "choices": [chunk], **extra})
            if options and options.include_usage and last is not None:
                yield sse({**head, "choices": [], "usage": usage([turn.prompt], [last])})
        except APIError as exc:
            yield sse_error(exc)
        except Exception as exc:  # after the 200: the error travels in the stream, and is logged
            log.exception("request %s failed while streaming", request_id)
            yield sse_error(APIError(500, f"internal error: {type(exc).__name__}"))
        finally:
            await outputs.aclose()
        yield SSE_DONE


def _parsed(parser: OutputParser, s: CompletionOutput, chunk: dict, mode: Optional[tool_calls.ToolMode]):
    """The chunk's text read by the sample's parser: its thinking, content and calls as deltas."""
    news = parser.feed(s.text, final=bool(chunk["finish_reason"]))
    delta: dict = {}
    if news.reasoning:
        delta["reasoning"] = delta["reasoning_content"] = news.reasoning
    if news.content:
        delta["content"] = news.content
    if news.calls:
        delta["tool_calls"] = [{"index": c.index, "function": {"arguments": c.arguments}} if c.name is None else
                               {"index": c.index, **tool_calls.call_json(ToolCall(c.name, c.arguments))}
                               for c in news.calls]
    chunk["delta"] = delta
    if chunk["finish_reason"]:
        chunk["finish_reason"] = tool_calls.finish_reason(mode, chunk["finish_reason"], parser.calls)
    if not delta and not chunk["finish_reason"] and chunk["logprobs"] is None:
        return None
    return chunk


def _delta(s: CompletionOutput, sent: dict, done: set, request: ChatCompletionRequest) -> Optional[dict]:
    if s.index in done:
        return None
    chars, tokens = sent[s.index]
    text, new_tokens = s.text[chars:], s.token_ids[tokens:]
    if not text and not new_tokens and not s.finish_reason:
        return None
    sent[s.index] = (len(s.text), len(s.token_ids))
    if s.finish_reason:
        done.add(s.index)
    lp = None
    if request.logprobs:
        window = CompletionOutput(s.index, token_ids=new_tokens, logprobs=(s.logprobs or [])[tokens:])
        lp = chat_logprobs(window, request.top_logprobs or 0)
    return {"index": s.index, "delta": {"content": text} if text else {}, "logprobs": lp,
            "finish_reason": s.finish_reason, "stop_reason": s.stop_reason}


def _entry(lp: Logprob) -> dict:
    token = lp.decoded_token or ""
    return {"token": token, "logprob": clamp_logprob(lp.logprob), "bytes": list(token.encode("utf-8"))}


def chat_logprobs(sample: CompletionOutput, top_n: int) -> dict:
    content = []
    for token, entry in zip(sample.token_ids, sample.logprobs or []):
        ranked = sorted(entry.values(), key=lambda lp: lp.rank)[:top_n]
        content.append({**_entry(entry[token]), "top_logprobs": [_entry(lp) for lp in ranked]})
    return {"content": content}
