"""SamplingParams with vLLM's names, validated when built; the one validator of every request.

SamplingParams is a msgspec Struct: the object a Python caller or the HTTP frontend builds is the one the
ZMQ protocol carries (``add_request``'s ``params``) and the scheduler hands its workers, so a setting has
one definition from the request to the sampler. Range checks happen at construction, whoever builds the
params: the HTTP frontend, the codec decoding a ZMQ ``add_request`` or a worker's batch, or a Python
caller. Checks that need the engine (token ids against the
vocabulary, lengths against the context, ``n`` against the configured maximum) are ``verify_request``,
run by the frontend before it sends and by the engine when it admits, so the three ways in refuse the
same things with the same words. Every bound is finite: an integer that reaches torch or msgpack fits
in 64 bits, every list has a ceiling, and a float is finite.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import msgspec

from actorserve.runtime.config import MAX_N

GREEDY_TEMPERATURE = 1e-5  # below it, sampling is greedy: is_greedy is the one place that decides


def is_greedy(temperature: float) -> bool:
    return temperature < GREEDY_TEMPERATURE


MAX_LOGPROBS = 20
MAX_TOKENS = 1 << 31  # any context is shorter; the engine checks the real one
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_TOKEN_ID_LIST = 4096  # stop_token_ids, logit_bias and allowed_token_ids entries
MAX_BAD_WORDS = 256
LOGIT_BIAS_BOUND = 100.0  # biases are clamped to +-100, as OpenAI and vLLM do
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)  # what torch.Generator.manual_seed takes
MAX_GRAMMAR_CHARS = 256 * 1024  # a JSON schema's text, a regex or a grammar
MAX_CHOICES = 1024
TOP_K_MAX = (1 << 31) - 1  # top_k is clamped to the vocabulary when sampled


class StructuredOutputsParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """vLLM's structured outputs: exactly one of these constrains what may be generated
    (``runtime.engine.structured_outputs``): a JSON schema (a dict or its text), any JSON object, a
    regular expression, one of a list of strings, or an EBNF (GBNF-style) grammar."""

    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        _check(len(given) == 1, "structured_outputs", f"must give exactly one of json, regex, choice, grammar "
                                                      f"and json_object, got {given or 'none'}")
        if isinstance(self.json, dict):
            import json as _json

            self.json = _json.dumps(self.json)
        for name in ("json", "regex", "grammar"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, str) and 0 < len(value) <= MAX_GRAMMAR_CHARS),
                   f"structured_outputs.{name}", f"must be a non-empty string (a schema: an object) of at most "
                                                 f"{MAX_GRAMMAR_CHARS} characters")
            if value is not None:
                check_text(value, f"structured_outputs.{name}")
        if self.choice is not None:
            _check(isinstance(self.choice, (list, tuple)) and 0 < len(self.choice) <= MAX_CHOICES
                   and all(isinstance(c, str) and 0 < len(c) <= MAX_STOP_CHARS for c in self.choice),
                   "structured_outputs.choice", f"must be a list of 1 to {MAX_CHOICES} non-empty strings of at "
                                                f"most {MAX_STOP_CHARS} characters")
            self.choice = list(self.choice)
        _check(self.json_object in (None, True, False), "structured_outputs.json_object", "must be a boolean")

    @property
    def kind(self) -> str:
        return next(name for name in ("json", "regex", "choice", "grammar", "json_object")
                    if getattr(self, name) not in (None, False))

    def to_dict(self) -> dict:
        return {self.kind: getattr(self, self.kind)}

    @classmethod
    def of(cls, value) -> "StructuredOutputsParams":
        """From a StructuredOutputsParams or a dict of its fields (an unknown key is a ValueError)."""
        if isinstance(value, cls):
            return value
        _check(isinstance(value, dict), "structured_outputs", f"must be an object, got {type(value).__name__}")
        known = set(cls.__struct_fields__)
        unknown = sorted(set(value) - known)
        _check(not unknown, "structured_outputs", f"has unknown keys {unknown} (known: {sorted(known)})")
        return cls(**value)


class SamplingParams(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """Unset fields take vLLM's defaults; an unknown one is refused where it is decoded (a misspelt
    parameter must not be silently ignored)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[dict[int, float]] = None
    stop: Optional[Union[str, list[str]]] = None
    stop_token_ids: Optional[list[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    # logprobs of the prompt's tokens (the first has none), with this many alternatives each, as vLLM
    prompt_logprobs: Optional[int] = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # only these tokens may be sampled (vLLM's allowed_token_ids); logprobs still see every token
    allowed_token_ids: Optional[list[int]] = None
    # words never generated: their tokens (with and without a leading space) are banned where the
    # output so far would complete them, as vLLM's bad_words
    bad_words: Optional[list[str]] = None
    # keep only the prompt's last k tokens (-1: as many as the context allows), as vLLM
    truncate_prompt_tokens: Optional[int] = None
    detokenize: bool = True
    # what may be generated: a StructuredOutputsParams, or a dict of its fields
    structured_outputs: Optional[StructuredOutputsParams] = None

    def __post_init__(self) -> None:
        if self.structured_outputs is not None:
            self.structured_outputs = StructuredOutputsParams.of(self.structured_outputs)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias:
            _check(len(self.logit_bias) <= MAX_TOKEN_ID_LIST, "logit_bias",
                   f"has {len(self.logit_bias)} entries, more than {MAX_TOKEN_ID_LIST}")
            self.logit_bias = {_as_token_id(k, "logit_bias"): _bias(v) for k, v in self.logit_bias.items()}
        if self.top_k == -1:
            self.top_k = 0
        if self.allowed_token_ids is not None:
            _check(isinstance(self.allowed_token_ids, (list, tuple)), "allowed_token_ids",
                   "must be a list of token ids")
            _check(0 < len(self.allowed_token_ids) <= MAX_TOKEN_ID_LIST, "allowed_token_ids",
                   f"must hold between 1 and {MAX_TOKEN_ID_LIST} token ids, got {len(self.allowed_token_ids)}")
            self.allowed_token_ids = [_as_token_id(t, "allowed_token_ids") for t in self.allowed_token_ids]
        if self.bad_words is not None:
            _check(isinstance(self.bad_words, (list, tuple)), "bad_words", "must be a list of strings")
            self.bad_words = list(self.bad_words)
        self._verify()

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    def _verify(self) -> None:
        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, "n", f"must be an integer in [1, {MAX_N}], got {self.n!r}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value), name,
                   f"must be a finite number, got {value!r}")
        _check(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(_is_int(self.top_k) and 0 <= self.top_k <= TOP_K_MAX, "top_k",
               f"must be -1, 0 or in [1, {TOP_K_MAX}], got {self.top_k!r}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        _check(self.max_tokens is None or (_is_int(self.max_tokens) and 1 <= self.max_tokens <= MAX_TOKENS),
               "max_tokens", f"must be an integer in [1, {MAX_TOKENS}], got {self.max_tokens!r}")
        _check(_is_int(self.min_tokens) and 0 <= self.min_tokens <= MAX_TOKENS, "min_tokens",
               f"must be an integer in [0, {MAX_TOKENS}], got {self.min_tokens!r}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or (_is_int(value) and 0 <= value <= MAX_LOGPROBS), name,
                   f"must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")
        _check_truncation(self.truncate_prompt_tokens)
        if self.bad_words is not None:
            _check(len(self.bad_words) <= MAX_BAD_WORDS, "bad_words",
                   f"has {len(self.bad_words)} words, more than {MAX_BAD_WORDS}")
            _check(all(isinstance(w, str) and 0 < len(w.strip()) and len(w) <= MAX_STOP_CHARS for w in self.bad_words),
                   "bad_words", f"must be non-blank strings of at most {MAX_STOP_CHARS} characters")
            for w in self.bad_words:
                check_text(w, "bad_words")
        lo, hi = SEED_RANGE
        _check(self.seed is None or (_is_int(self.seed) and lo <= self.seed <= hi), "seed",
               f"must be an integer in [-2^63, 2^64 - 1], got {self.seed!r}")
        _check(len(self.stop) <= MAX_STOP_STRINGS, "stop", f"has {len(self.stop)} strings, more than {MAX_STOP_STRINGS}")
        _check(all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in self.stop), "stop",
               f"must be non-empty strings of at most {MAX_STOP_CHARS} characters")
        for s in self.stop:
            check_text(s, "stop")
        _check(len(self.stop_token_ids) <= MAX_TOKEN_ID_LIST, "stop_token_ids",
               f"has {len(self.stop_token_ids)} ids, more than {MAX_TOKEN_ID_LIST}")
        self.stop_token_ids = [_as_token_id(tid, "stop_token_ids") for tid in self.stop_token_ids]

    def verify_for_model(self, vocab_size: int, can_detokenize: bool) -> None:
        """Check what needs the model: every token id against the embedding rows (not len(tokenizer))."""
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        _check(not bad, "stop_token_ids", f"has ids {bad} outside the vocabulary [0, {vocab_size})")
        bad = [t for t in (self.logit_bias or {}) if not 0 <= t < vocab_size]
        _check(not bad, "logit_bias", f"has token ids {bad} outside the vocabulary [0, {vocab_size})")
        bad = [t for t in (self.allowed_token_ids or []) if not 0 <= t < vocab_size]
        _check(not bad, "allowed_token_ids", f"has ids {bad[:10]} outside the vocabulary [0, {vocab_size})")
        _check(can_detokenize or not self.stop, "stop", "stop strings need a tokenizer (skip_tokenizer_init is set)")
        _check(can_detokenize or not self.bad_words, "bad_words",
               "bad words need a tokenizer (skip_tokenizer_init is set)")

    def child(self, index: int) -> "SamplingParams":
        """One of the n samples as its own request; seeded children get distinct, reproducible seeds
        (modulo 2^64, as torch takes them, so the last seeds of the range wrap instead of overflowing).
        The prompt's logprobs are the same for every sample: the first computes them, and the others
        may take its prompt from the prefix cache."""
        seed = None if self.seed is None else (self.seed + index) % (1 << 64)
        return msgspec.structs.replace(self, n=1, seed=seed,
                                       prompt_logprobs=self.prompt_logprobs if index == 0 else None)


@dataclass(frozen=True)
class RequestLimits:
    """What an engine admits, from its config and its model: every way in checks a request against it."""

    vocab_size: int
    max_model_len: int
    max_n: int


def truncate_prompt(token_ids: list[int], k: Optional[int], max_model_len: int) -> list[int]:
    """The prompt as ``truncate_prompt_tokens`` = k leaves it: its last k tokens (-1: the context's worth
    less one, so that a token can be generated). Every way in calls this before ``verify_request``."""
    if k is None:
        return token_ids
    _check_truncation(k)
    if k == -1:
        k = max_model_len - 1
    return token_ids[-k:] if len(token_ids) > k else token_ids


def verify_request(token_ids: list[int], params: SamplingParams, limits: RequestLimits,
                   can_detokenize: bool = True) -> None:
    """The engine-dependent checks, in the words the HTTP frontend and the Python API both use."""
    n, ctx = len(token_ids), limits.max_model_len
    _check(n < ctx, "prompt", f"has {n} tokens: this model's maximum context length is {ctx} tokens "
                              "(max_model_len), leaving no room to generate")  # first: a long list is refused unread
    verify_prompt_token_ids(token_ids, limits.vocab_size)
    params.verify_for_model(limits.vocab_size, can_detokenize)
    _check(params.n <= limits.max_n, "n", f"must be at most {limits.max_n} (the server's max_n), got {params.n}")
    _check(n + params.min_tokens <= ctx, "min_tokens", f"must leave the prompt room in this model's maximum context "
                                                      f"length of {ctx} tokens: at most {ctx - n} after its {n}, got "
                                                      f"{params.min_tokens}")
    if params.max_tokens is not None and n + params.max_tokens > ctx:
        raise ValueError(f"max_tokens: this model's maximum context length is {ctx} tokens. However, you "
                         f"requested {n + params.max_tokens} tokens ({n} in the prompt, {params.max_tokens} "
                         "in the completion). Please reduce the length of the prompt or the completion.")


def prompt_text_bound(max_model_len: int, max_token_chars: int) -> int:
    """The most characters a prompt may have: no token covers more than ``max_token_chars`` characters,
    so a text longer than twice (for normalizers) ``max_model_len`` of them cannot fit."""
    return 2 * max_model_len * max(1, max_token_chars)


def verify_prompt_text(text: str, max_model_len: int, max_token_chars: int, name: str = "prompt") -> None:
    """Before tokenizing: a text past ``prompt_text_bound`` cannot fit, and is refused without the work."""
    check_text(text, name)
    bound = prompt_text_bound(max_model_len, max_token_chars)
    _check(len(text) <= bound, name, f"has {len(text)} characters, more than this model's maximum context length "
                                     f"of {max_model_len} tokens can hold")


def verify_prompt_token_ids(token_ids: list[int], vocab_size: int) -> None:
    _check(len(token_ids) > 0, "prompt", "must not be empty")
    bad = [t for t in token_ids if not (_is_int(t) and 0 <= t < vocab_size)]
    _check(not bad, "prompt_token_ids", f"has ids {bad[:10]} outside the vocabulary [0, {vocab_size})")


def check_text(text: str, name: str) -> None:
    """Text must be valid Unicode: a lone surrogate (JSON allows "\\ud800") cannot be tokenized or sent."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} contains a lone surrogate ({text[exc.start]!a} at {exc.start}), which is not "
                         "valid Unicode") from None


def _check_truncation(k) -> None:
    _check(k is None or (_is_int(k) and (k == -1 or 1 <= k <= MAX_TOKENS)), "truncate_prompt_tokens",
           f"must be -1 or an integer in [1, {MAX_TOKENS}], got {k!r}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bias(value) -> float:
    try:
        bias = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias values must be numbers, got {value!r}") from None
    _check(not math.isnan(bias), "logit_bias", "values must be numbers, got NaN")
    return max(-LOGIT_BIAS_BOUND, min(LOGIT_BIAS_BOUND, bias))


def _as_token_id(value, name: str) -> int:
    try:
        token = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not an integer token id") from None
    if isinstance(value, float) and value != token or isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not an integer token id")
    if not -(1 << 63) <= token < (1 << 63):
        raise ValueError(f"{name}: {value!r} is not a token id of any vocabulary")
    return token


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")
