"""Request schemas of the OpenAI-compatible API, with vLLM's extra sampling fields.

Pydantic validates types and shapes; value ranges are left to SamplingParams, so that the HTTP server and
the Python API refuse exactly the same things with the same words. Unknown fields are ignored, as vLLM
and OpenAI do.
"""
from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from actorserve.runtime.engine.sampling_params import SamplingParams

TokenIds = list[StrictInt]


class StreamOptions(BaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    n: StrictInt = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[StrictInt] = None
    min_p: Optional[float] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[str, list[str]]] = None
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
    user: Optional[str] = None

    def sampling_params(self, max_tokens: Optional[int], logprobs: Optional[int]) -> SamplingParams:
        """Raises ValueError naming the field, exactly as the Python API does."""
        given = {name: getattr(self, name) for name in (
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty") if getattr(self, name) is not None}
        return SamplingParams(
            n=self.n, seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids,
            logit_bias=self.logit_bias, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
            max_tokens=max_tokens, logprobs=logprobs, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output, **given,
        )


class CompletionRequest(_SamplingFields):
    prompt: Union[list[TokenIds], TokenIds, list[str], str]
    max_tokens: Optional[StrictInt] = 16
    logprobs: Optional[StrictInt] = None
    suffix: Optional[str] = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[StrictInt] = None
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: StrictBool = False
    top_logprobs: Optional[StrictInt] = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template: Optional[str] = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[ChatMessage]] = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    tokens: TokenIds
