"""Beam search as vLLM's ``LLM.beam_search`` runs it: on top of generation, not inside the sampler.

Each step asks the engine for one token of every live beam, with the ``2 * beam_width`` likeliest next
tokens' logprobs. Every beam is then extended by each of those tokens; a candidate ending in EOS is set
aside as finished, and the ``beam_width`` best of the rest go on. Each step submits whole sequences, so
the prefix cache is what keeps it from recomputing them: the engine core runs a served request's search
(``EngineCore``, each step's beams in one batch), and ``LLM.beam_search`` drives its prompts' searches
through ``generate``. At the end the finished and the live beams are
ranked together by their score: the cumulative logprob over the length (prompt included, a final EOS
not) to the power ``length_penalty``.

``BeamSearch`` holds that state between steps, so that a synchronous caller (``LLM``) and an async one
drive the same loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import msgspec

from actorserve.runtime.engine.outputs import Logprob
from actorserve.runtime.engine.sampling_params import MAX_LOGPROBS, SamplingParams


# a score divides by the length to this power: past it, a length of a few thousand tokens overflows a float
MAX_LENGTH_PENALTY = 10.0


class BeamSearchParams(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """vLLM's: beams kept a step, tokens to generate, and the score's length penalty; a msgspec Struct,
    as SamplingParams, so that ``add_request`` carries this same object."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        width = self.beam_width
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_LOGPROBS // 2:
            raise ValueError(f"beam_width must be an integer in [1, {MAX_LOGPROBS // 2}] (each step asks for "
                             f"2 * beam_width logprobs, at most {MAX_LOGPROBS}), got {width!r}")
        tokens = self.max_tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {tokens!r}")
        penalty = self.length_penalty
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float)) or not math.isfinite(penalty) \
                or abs(penalty) > MAX_LENGTH_PENALTY:
            raise ValueError(f"length_penalty must be a number in [-{MAX_LENGTH_PENALTY:g}, {MAX_LENGTH_PENALTY:g}] "
                             f"(the exponent of the score's length), got {penalty!r}")
        # the step's own params check the temperature, as generation does
        self.step_params()

    @property
    def n(self) -> int:
        """The samples a search answers with: its best beam_width sequences."""
        return self.beam_width

    def step_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=1, logprobs=2 * self.beam_width, temperature=self.temperature,
                              ignore_eos=True)


@dataclass
class BeamSearchSequence:
    """One beam: its tokens (the prompt's first), each step's candidates' logprobs, the sum of its own."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None  # "stop" (EOS) or "length"
    stop_reason: Optional[int] = None


@dataclass
class BeamSearchOutput:
    """A prompt's best ``beam_width`` sequences, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(tokens: list[int], cum_logprob: float, eos_token_id: Optional[int], length_penalty: float) -> float:
    length = len(tokens) - (1 if eos_token_id is not None and tokens and tokens[-1] == eos_token_id else 0)
    return cum_logprob / (length ** length_penalty)


class BeamSearch:
    """The beams of several prompts between steps: ``pending`` gives the sequences to run one token further,
    ``advance`` takes each one's next-token logprobs, ``results`` ranks what is left."""

    def __init__(self, prompts: list[list[int]], params: BeamSearchParams, eos_token_id: Optional[int],
                 max_model_len: int) -> None:
        self.params = params
        self.eos = None if params.ignore_eos else eos_token_id  # what finishes a beam
        self.eos_token_id = eos_token_id  # what the score leaves out of the length, as vLLM's does
        self.max_model_len = max_model_len
        self.prompt_lengths = [len(p) for p in prompts]
        self.beams = [[BeamSearchSequence(list(p))] for p in prompts]
        self.finished: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        self.steps = 0

    def _key(self, beam: BeamSearchSequence) -> float:
        return beam_score(beam.tokens, beam.cum_logprob, self.eos_token_id, self.params.length_penalty)

    def pending(self) -> list[list[int]]:
        """The live beams' sequences, prompt by prompt; empty once the search is over. A beam that fills the
        context can go no further and is finished for length."""
        if self.steps >= self.params.max_tokens:
            return []
        for live, done in zip(self.beams, self.finished):
            full = [b for b in live if len(b.tokens) >= self.max_model_len]
            for beam in full:
                beam.finish_reason = "length"
                done.append(beam)
            live[:] = [b for b in live if len(b.tokens) < self.max_model_len]
        return [b.tokens for live in self.beams for b in live]

    def advance(self, next_logprobs: list[dict[int, Logprob]]) -> None:
        """One step: next_logprobs[i] holds the candidates after pending()[i]."""
        width = self.params.beam_width
        at = 0
        for p, live in enumerate(self.beams):
            candidates = []
            for beam in live:
                step = next_logprobs[at]
                at += 1
                for token, lp in step.items():
                    new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [step],
                                             beam.cum_logprob + lp.logprob)
                    if token == self.eos:
                        new.finish_reason, new.stop_reason = "stop", token
                        self.finished[p].append(new)
                    else:
                        candidates.append(new)
            candidates.sort(key=self._key, reverse=True)
            self.beams[p] = candidates[:width]
        if at != len(next_logprobs):
            raise ValueError(f"advance got {len(next_logprobs)} results for {at} beams")
        self.steps += 1

    def results(self, decode: Optional[Callable[[list[int]], str]]) -> list[BeamSearchOutput]:
        outputs = []
        for p, (live, done) in enumerate(zip(self.beams, self.finished)):
            for beam in live:
                beam.finish_reason = beam.finish_reason or "length"
            ranked = sorted(done + live, key=self._key, reverse=True)[:self.params.beam_width]
            for beam in ranked:
                generated = beam.tokens[self.prompt_lengths[p]:]
                if beam.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                    generated = generated[:-1]
                beam.text = decode(generated) if decode is not None else None
            outputs.append(BeamSearchOutput(ranked))
        return outputs
