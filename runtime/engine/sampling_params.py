"""SamplingParams with vLLM's names, validated when built.

Range checks happen at construction; checks that need the model (token ids against the vocab) happen in
``verify_for_model`` when a request is admitted, before anything reaches the batch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Union

_GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
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
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    detokenize: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias:
            self.logit_bias = {_as_token_id(k, "logit_bias"): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == -1:
            self.top_k = 0
        self._verify()

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def _verify(self) -> None:
        _check(isinstance(self.n, int) and self.n >= 1, "n", f"must be an integer >= 1, got {self.n!r}")
        _check(self.temperature >= 0.0, "temperature", f"must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", f"must be -1, 0 or >= 1, got {self.top_k!r}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", f"must be in [-2, 2], got {self.presence_penalty}")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty}")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", f"must be > 0, got {self.repetition_penalty}")
        _check(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
               "max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens", f"must be >= 0, got {self.min_tokens!r}")
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"must be <= max_tokens={self.max_tokens}, got {self.min_tokens}")
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= MAX_LOGPROBS),
               "logprobs", f"must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        _check(self.seed is None or isinstance(self.seed, int), "seed", f"must be an integer, got {self.seed!r}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        for tid in self.stop_token_ids:
            _as_token_id(tid, "stop_token_ids")

    def verify_for_model(self, vocab_size: int, can_detokenize: bool) -> None:
        """Check what needs the model: every token id against the embedding rows (not len(tokenizer))."""
        bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
        _check(not bad, "stop_token_ids", f"has ids {bad} outside the vocabulary [0, {vocab_size})")
        bad = [t for t in (self.logit_bias or {}) if not 0 <= t < vocab_size]
        _check(not bad, "logit_bias", f"has token ids {bad} outside the vocabulary [0, {vocab_size})")
        _check(can_detokenize or not self.stop, "stop", "stop strings need a tokenizer (skip_tokenizer_init is set)")

    def child(self, index: int) -> "SamplingParams":
        """One of the n samples as its own request; seeded children get distinct, reproducible seeds."""
        seed = None if self.seed is None else self.seed + index
        return dataclasses.replace(self, n=1, seed=seed)


def verify_prompt_token_ids(token_ids: list[int], vocab_size: int) -> None:
    _check(len(token_ids) > 0, "prompt", "must not be empty")
    bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
    _check(not bad, "prompt_token_ids", f"has ids {bad[:10]} outside the vocabulary [0, {vocab_size})")


def _as_token_id(value, name: str) -> int:
    try:
        token = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not an integer token id") from None
    if isinstance(value, float) and value != token or isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not an integer token id")
    return token


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")
