"""Request schemas of the OpenAI-compatible API, with vLLM's extra sampling fields.

Pydantic validates types and shapes, as strictly as vLLM's schema: every string is valid Unicode (no
lone surrogates), no float is infinite or NaN, a message has the content its role needs, and tools,
tool_choice and response_format have OpenAI's shapes. Value ranges are left to SamplingParams, so that
the HTTP server, the ZMQ protocol and the Python API refuse exactly the same things with the same words.

A completion or chat request may carry fields this schema does not name. Those of OpenAI's and vLLM's
that would change the output and are not implemented here (``UNSUPPORTED``) are refused unless they
hold their neutral value: served as if absent, the answer would be silently wrong. Any other unknown
field is ignored and named in a warning, once per request, as vLLM does.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictInt,
                      model_validator)

from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.sampling_params import MAX_LOGPROBS, SamplingParams, check_text

TokenIds = list[StrictInt]
# How many items a list may hold, checked while the body is validated (the body size alone would let
# one request fan out into a hundred thousand prompts or messages)
MAX_PROMPTS = 2048
MAX_MESSAGES = 4096
MAX_TOOLS = 256


def _valid_text(text: str) -> str:
    check_text(text, "the string")
    return text


Text = Annotated[str, AfterValidator(_valid_text)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Schema):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class FunctionDefinition(_Schema):
    name: Text
    description: Optional[Text] = None
    parameters: Optional[dict[str, Any]] = None


class Tool(_Schema):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Schema):
    name: Text


class NamedToolChoice(_Schema):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(_Schema):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[dict[str, Any]] = None


# Fields of OpenAI's and vLLM's bodies that would change the output and are not implemented, each with
# the values that leave the output as it is (structured outputs and tool calling: issue 18)
UNSUPPORTED: dict[str, tuple] = {
    "best_of": (None, 1),
    "spaces_between_special_tokens": (None, True),
    "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,), "logits_processors": (None, []),
    "return_tokens_as_token_ids": (None, False), "return_token_ids": (None, False), "prompt_embeds": (None,),
    "priority": (None, 0), "vllm_xargs": (None, {}), "functions": (None, []), "function_call": (None, "none"),
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "web_search_options": (None,),
    "mm_processor_kwargs": (None, {}), "suffix": (None, ""),
}
# vLLM's older spellings of structured_outputs' keys, taken as they are
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# vLLM's sampling extras, which Responses and Messages requests may carry too: handed to the chat request as
# they are
SAMPLING_EXTRAS = ("min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos", "min_tokens",
                   "stop_token_ids", "logit_bias", "bad_words", "structured_outputs", "skip_special_tokens")
# Known fields that change nothing this server returns: accepted without a warning
ACCEPTED_UNUSED = frozenset({"metadata", "store", "service_tier", "request_id", "cache_salt", "kv_transfer_params",
                             "parallel_tool_calls", "top_logprobs", "max_completion_tokens", "reasoning_effort"})


class _SamplingFields(_Schema):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: Optional[Text] = None
    n: StrictInt = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[StrictInt] = None
    min_p: Optional[float] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[Text, list[Text]]] = None
    stop_token_ids: Optional[TokenIds] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    repetition_penalty: Optional[float] = None
    logit_bias: Optional[dict[str, float]] = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    echo: StrictBool = False
    user: Optional[Text] = None
    prompt_logprobs: Optional[StrictInt] = None
    allowed_token_ids: Optional[TokenIds] = None
    bad_words: Optional[list[Text]] = None
    truncate_prompt_tokens: Optional[StrictInt] = None
    response_format: Optional[ResponseFormat] = None
    structured_outputs: Optional[dict[str, Any]] = None
    use_beam_search: StrictBool = False
    length_penalty: float = 1.0

    @model_validator(mode="after")
    def _stream_options_need_stream(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be given when stream is true")
        if self.prompt_logprobs is not None and self.stream:  # vLLM's rule and words
            raise ValueError("`prompt_logprobs` are not available when `stream=True`.")
        return self

    def beam_search_params(self, params: SamplingParams) -> BeamSearchParams:
        """vLLM's use_beam_search: n beams, each up to the checked params' max_tokens. Logprobs and
        structured outputs are refused, having no place in the search; the other sampling fields do not
        apply to it (as in vLLM)."""
        if not 1 <= self.n <= MAX_LOGPROBS // 2:
            raise ValueError(f"n (the beam width, with use_beam_search) must be in [1, {MAX_LOGPROBS // 2}], "
                             f"got {self.n}")
        if params.logprobs is not None or params.prompt_logprobs is not None:
            raise ValueError("logprobs are not supported with use_beam_search")
        if params.structured_outputs is not None:
            raise ValueError("structured_outputs are not supported with use_beam_search")
        return BeamSearchParams(beam_width=self.n, max_tokens=params.max_tokens, ignore_eos=self.ignore_eos,
                                temperature=params.temperature, length_penalty=self.length_penalty,
                                include_stop_str_in_output=self.include_stop_str_in_output)

    def unsupported_field(self) -> Optional[str]:
        """The first field that asks for something this server does not do, if any."""
        extra = self.model_extra or {}
        return next((name for name, neutral in UNSUPPORTED.items()
                     if name in extra and not any(_same(extra[name], v) for v in neutral)), None)

    def unknown_fields(self) -> list[str]:
        return sorted(name for name in (self.model_extra or {}) if name not in UNSUPPORTED
                      and name not in ACCEPTED_UNUSED and name not in GUIDED)

    def structured(self) -> Optional[dict[str, Any]]:
        """What constrains the output, as StructuredOutputsParams' fields: ``structured_outputs``, or
        ``response_format`` (json_object; json_schema's ``schema``), or vLLM's older ``guided_*`` fields.
        ValueError where they ask for two things or a shape is wrong."""
        asked = []
        if self.structured_outputs is not None:
            asked.append(dict(self.structured_outputs))
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked.append({"json_object": True})
        elif fmt is not None and fmt.type == "json_schema":
            schema = (fmt.json_schema or {}).get("schema")
            if not isinstance(schema, dict):
                raise ValueError("response_format json_schema must hold a \"schema\" object")
            asked.append({"json": schema})
        guided = {key: (self.model_extra or {})[name] for name, key in GUIDED.items()
                  if (self.model_extra or {}).get(name) is not None}
        if guided:
            asked.append(guided)
        if len(asked) > 1:
            raise ValueError("structured_outputs: give one of structured_outputs, response_format and guided_*")
        return asked[0] if asked else None

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int],
                        prompt_logprobs: Optional[int] = None, defaults: Optional[dict] = None) -> SamplingParams:
        """Raises ValueError naming the field, exactly as the Python API does. A field the request leaves
        unset takes ``defaults`` (the model's generation config), then SamplingParams' own."""
        defaults = defaults or {}
        given = {name: getattr(self, name) if getattr(self, name) is not None else defaults.get(name) for name in (
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty")}
        given = {name: value for name, value in given.items() if value is not None}
        return SamplingParams(
            n=self.n, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            logit_bias=self.logit_bias, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            max_tokens=max_tokens, logprobs=logprobs, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, prompt_logprobs=prompt_logprobs,
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            truncate_prompt_tokens=self.truncate_prompt_tokens, structured_outputs=self.structured(), **given,
        )


def _same(value, neutral) -> bool:
    """Equal, and a flag only to a flag: 0 is not the neutral False."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    return value == neutral


class CompletionRequest(_SamplingFields):
    prompt: Union[Annotated[list[TokenIds], Field(max_length=MAX_PROMPTS)], TokenIds,
                  Annotated[list[Text], Field(max_length=MAX_PROMPTS)], Text]
    max_tokens: Optional[StrictInt] = 16
    logprobs: Optional[StrictInt] = None
    add_special_tokens: StrictBool = True


class TextPart(_Schema):
    type: Literal["text"]
    text: Text

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data):
        """An image, audio or file part is refused by its type, not as a content that is not a string."""
        kind = data.get("type") if isinstance(data, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise ValueError(f"content parts of type {kind!r} are not supported: the served model takes text only")
        return data


class ChatMessage(_Schema):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[Text, Annotated[list[TextPart], Field(max_length=MAX_MESSAGES)], None] = None
    name: Optional[Text] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[Text] = None

    @model_validator(mode="after")
    def _content_for_the_role(self):
        """Only an assistant message may go without content (it may carry tool calls instead)."""
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: Optional[StrictInt] = None
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template: Optional[Text] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    documents: Optional[list[dict[str, Any]]] = Field(None, max_length=MAX_MESSAGES)
    add_special_tokens: StrictBool = False  # the template writes them (vLLM's default for chat)
    reasoning_effort: Optional[Literal["low", "medium", "high"]] = None  # handed to the template, as vLLM
    tools: Optional[list[Tool]] = Field(None, max_length=MAX_TOOLS)
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    # the tool calls' structured outputs (frontend.tool_calls.constraint), set by the serving code
    _tools_constraint: Optional[dict[str, Any]] = PrivateAttr(default=None)

    def structured(self) -> Optional[dict[str, Any]]:
        base = super().structured()
        if self._tools_constraint is None:
            return base
        if base is not None:
            raise ValueError("structured_outputs: a required or named tool_choice constrains the output "
                             "itself; it cannot be combined with response_format or structured_outputs")
        return self._tools_constraint


class TokenizeRequest(_Schema):
    model: Optional[Text] = None
    prompt: Optional[Text] = None
    messages: Optional[list[ChatMessage]] = Field(None, max_length=MAX_MESSAGES)
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Schema):
    model: Optional[Text] = None
    tokens: TokenIds
