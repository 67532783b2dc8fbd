"""The sampler, vectorised over the batch.

Order follows vLLM: raw logprobs are taken first; then logit_bias, min_tokens masking and penalties;
greedy rows take the argmax; the rest are divided by temperature, filtered by min_p, top_k and top_p,
and drawn by the exponential race (argmax of p / E, E ~ Exp(1)). A seeded request draws its noise from
its own generator, one vector per token, so its output does not depend on what else is in the batch.
Each role that draws noise for a request (the target's sampler, a draft model) has a stream of its own,
seeded by the request's seed salted with the role (``stream_seed``): two roles never draw the same noise.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional

import torch

from actorserve.kernels import triton_route
from actorserve.kernels.elementwise import argmax
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.engine.outputs import Logprob, ranked


@dataclass
class SamplingRow:
    """One row of the batch: its request's params, its generator (seeded requests only), its token history,
    for this step only the tokens its grammar allows (structured outputs; None: any), and what the engine
    derived from the model for it: the EOS id (None where EOS is ignored), masked with the stop ids until
    min_tokens are out, and each bad word's tokens as the tokenizer splits it."""

    params: SamplingParams
    generator: Optional[torch.Generator]
    prompt_ids: list[int]
    output_ids: list[int]
    allowed: Optional[torch.Tensor] = None
    eos_token_id: Optional[int] = None
    bad_words_token_ids: Optional[list[list[int]]] = None


def stream_seed(seed: int, role: str) -> int:
    """The seed of ``role``'s noise stream ("target", "draft") for a request seeded ``seed``."""
    return int.from_bytes(hashlib.blake2b(f"{role}:{seed}".encode(), digest_size=8).digest(), "little")


def noise_stream(seed: int, role: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` (where the noise it draws is used), seeded for ``role``."""
    return torch.Generator(device=device).manual_seed(stream_seed(seed, role))


class Sampler:
    """``seed`` seeds the stream of the requests that have no seed of their own, salted by ``role``: the
    target's sampler, or a draft model's."""

    def __init__(self, seed: int = 0, role: str = "target", device: torch.device | str = "cpu") -> None:
        self._generator = noise_stream(seed, role, device)

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]):
        """logits [B, V] in the model's dtype -> (token ids [B] as a list, logprobs per row or None).

        A batch of plain greedy rows is ranked in the model's dtype (widening is exact, so the argmax is
        the same); anything else works on an fp32 copy."""
        if all(_plain_greedy(r) for r in rows):
            return argmax(logits).tolist(), [None] * len(rows)
        logits, logprobs = _processed(logits, rows)
        greedy = [r.params.greedy for r in rows]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, rows, greedy)
        token_list = tokens.tolist()
        return token_list, _finish_logprobs(logprobs, token_list)

    def distributions(self, logits: torch.Tensor, rows: list[SamplingRow]):
        """What a row's token is drawn from, for the rejection sampler: (probabilities [B, V] after
        temperature, min_p, top-k and top-p, or None where every row is greedy; each row's argmax after
        bias, bans and penalties; the state ``logprobs_of`` reads)."""
        if all(_plain_greedy(r) for r in rows):
            return None, argmax(logits), None
        logits, logprobs = _processed(logits, rows)
        greedy = [r.params.greedy for r in rows]
        probs = None if all(greedy) else _probabilities(logits, rows, greedy)
        return probs, logits.argmax(dim=-1), logprobs

    def uniform(self, generator: Optional[torch.Generator]) -> float:
        """One draw from U[0, 1), from a seeded request's own stream or else the shared one."""
        generator = generator or self._generator
        return float(torch.rand(1, generator=generator, device=generator.device))

    def draw(self, probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
        """A token from the (unnormalised) probabilities of one row, by the exponential race."""
        noise = torch.empty_like(probs).exponential_(generator=generator or self._generator)
        return int((probs / noise).argmax())

    @staticmethod
    def logprobs_of(state, rows: list[int], tokens: list[int]) -> list[Optional[list[Logprob]]]:
        """The logprobs of ``tokens[i]`` at row ``rows[i]`` of a ``distributions`` call."""
        if state is None:
            return [None] * len(tokens)
        logprobs, wanted = state
        return _finish_logprobs((logprobs[rows], [wanted[r] for r in rows]), tokens)

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow], greedy: list[bool]) -> torch.Tensor:
        argmax = logits.argmax(dim=-1)
        noise = torch.empty_like(logits)
        shared = [i for i, row in enumerate(rows) if row.generator is None]
        if shared:
            noise[shared] = torch.empty(len(shared), logits.shape[1], device=logits.device).exponential_(
                generator=self._generator)
        for i, row in enumerate(rows):
            if row.generator is not None:
                noise[i].exponential_(generator=row.generator)
        kernel = _triton_sampling(logits)
        if kernel is not None:  # top-k / top-p and the race in one launch, on the same noise
            scaled = _apply_min_p(_scaled(logits, rows, greedy), rows)
            vocab = logits.shape[1]
            k = torch.tensor([r.params.top_k if 0 < r.params.top_k < vocab else 0 for r in rows], device=logits.device)
            p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32, device=logits.device)
            sampled = kernel.top_k_top_p_sample(scaled, k, p, noise)
        else:
            sampled = (_probabilities(logits, rows, greedy) / noise).argmax(dim=-1)
        return torch.where(torch.tensor(greedy, device=argmax.device), argmax, sampled)


def _triton_sampling(logits: torch.Tensor):
    """The triton sampling kernel for logits on a GPU, where triton is installed; else None."""
    return triton_route.for_tensor(logits, "actorserve.kernels.sampling.top_k_top_p_triton")


def _processed(logits: torch.Tensor, rows: list[SamplingRow]):
    """fp32 logits after logit_bias, the bans and the penalties, and the raw logprobs' state."""
    logits = logits.float()
    logprobs = _top_logprobs(logits, rows)
    logits = _apply_bias_and_min_tokens(logits, rows)
    return _apply_penalties(logits, rows), logprobs


def _scaled(logits: torch.Tensor, rows: list[SamplingRow], greedy: list[bool]) -> torch.Tensor:
    """Processed logits over each row's temperature (greedy rows at temperature 1)."""
    temps = torch.tensor([1.0 if g else r.params.temperature for r, g in zip(rows, greedy)], dtype=torch.float32,
                         device=logits.device)
    return logits / temps[:, None]


def _probabilities(logits: torch.Tensor, rows: list[SamplingRow], greedy: list[bool]) -> torch.Tensor:
    """Processed logits to the probabilities a sampled row draws from (greedy rows at temperature 1)."""
    logits = _apply_min_p(_scaled(logits, rows, greedy), rows)
    logits = apply_top_k_top_p(logits, rows)
    return logits.softmax(dim=-1)


def _plain_greedy(row: SamplingRow) -> bool:
    """A row whose token is the argmax of its raw logits: greedy, and nothing below alters or reads them."""
    params = row.params
    return (params.greedy and params.logprobs is None and not params.logit_bias and row.allowed is None
            and params.allowed_token_ids is None and not row.bad_words_token_ids
            and len(row.output_ids) >= params.min_tokens and params.repetition_penalty == 1.0
            and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0)


def _apply_bias_and_min_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """logit_bias, then the bans: allowed_token_ids, bad words, the stop tokens until min_tokens, and the
    grammar's mask."""
    cloned = False
    for i, row in enumerate(rows):
        params = row.params
        banned = _banned_bad_words(row.bad_words_token_ids, row.output_ids) if row.bad_words_token_ids else []
        if len(row.output_ids) < params.min_tokens:
            banned += list(params.stop_token_ids) + ([row.eos_token_id] if row.eos_token_id is not None else [])
        if not params.logit_bias and not banned and params.allowed_token_ids is None and row.allowed is None:
            continue
        if not cloned:
            logits, cloned = logits.clone(), True
        if params.logit_bias:
            ids = torch.tensor(list(params.logit_bias.keys()), dtype=torch.long, device=logits.device)
            logits[i].index_add_(0, ids, torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype,
                                                      device=logits.device))
        if params.allowed_token_ids is not None:
            keep = torch.zeros(logits.shape[1], dtype=torch.bool, device=logits.device)
            keep[torch.tensor(params.allowed_token_ids, dtype=torch.long, device=logits.device)] = True
            logits[i].masked_fill_(~keep, float("-inf"))
        if banned:
            logits[i, torch.tensor(banned, dtype=torch.long, device=logits.device)] = float("-inf")
        if row.allowed is not None:  # the grammar's mask (its width is the model's vocabulary)
            logits[i, :row.allowed.shape[0]].masked_fill_(~row.allowed, float("-inf"))
    return logits


def _banned_bad_words(words: list[list[int]], output_ids: list[int]) -> list[int]:
    """The last token of every bad word whose other tokens end the output so far (a one-token word is
    always banned), as vLLM applies bad_words."""
    banned = []
    for word in words:
        head = len(word) - 1
        if head == 0 or (len(output_ids) >= head and output_ids[-head:] == word[:-1]):
            banned.append(word[-1])
    return banned


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    idx = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0
           or r.params.presence_penalty != 0.0 or r.params.frequency_penalty != 0.0]
    if not idx:
        return logits
    logits = logits.clone()
    vocab = logits.shape[1]
    sub = logits[idx]
    device = logits.device
    out_counts = torch.zeros(len(idx), vocab, dtype=torch.float32, device=device)
    seen = torch.zeros(len(idx), vocab, dtype=torch.bool, device=device)
    for j, i in enumerate(idx):
        out = torch.tensor(rows[i].output_ids, dtype=torch.long, device=device)
        out_counts[j].index_add_(0, out, torch.ones(len(out), device=device))
        seen[j, torch.tensor(rows[i].prompt_ids, dtype=torch.long, device=device)] = True
    seen |= out_counts > 0
    rep = torch.tensor([rows[i].params.repetition_penalty for i in idx], device=device)[:, None]
    penalised = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalised, sub)
    freq = torch.tensor([rows[i].params.frequency_penalty for i in idx], device=device)[:, None]
    pres = torch.tensor([rows[i].params.presence_penalty for i in idx], device=device)[:, None]
    sub = sub - freq * out_counts - pres * (out_counts > 0).float()
    logits[idx] = sub
    return logits


def _apply_min_p(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    min_p = torch.tensor([r.params.min_p for r in rows], dtype=torch.float32, device=logits.device)
    if not bool((min_p > 0).any()):
        return logits
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    vocab = logits.shape[1]
    k = torch.tensor([r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows], dtype=torch.long)
    p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32)
    if bool((k == vocab).all()) and bool((p >= 1.0).all()):
        return logits
    return top_k_top_p_mask(logits, k, p)


def top_k_top_p_mask(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """logits [B, V] with what top-k (k [B], V: off) and then top-p (p [B], over what top-k keeps,
    renormalised; 1: off) drop set to -inf; the most likely token always survives."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    k, p = k.to(logits.device), p.to(logits.device)
    position = torch.arange(vocab, device=logits.device)[None, :]
    drop = position >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
    drop |= before >= p[:, None]
    drop[:, 0] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _top_logprobs(logits: torch.Tensor, rows: list[SamplingRow]):
    wanted = [r.params.logprobs for r in rows]
    if all(w is None for w in wanted):
        return None
    return logits.log_softmax(dim=-1), wanted


def _finish_logprobs(state, tokens: list[int]) -> list[Optional[list[Logprob]]]:
    if state is None:
        return [None] * len(tokens)
    logprobs, wanted = state
    out: list[Optional[list[Logprob]]] = [None] * len(tokens)
    for n in {n for n in wanted if n is not None}:
        rows = [i for i, w in enumerate(wanted) if w == n]
        chosen = torch.tensor([tokens[i] for i in rows], dtype=torch.long, device=logprobs.device)
        values, ranks, top_ids, top_values = rank_logprobs(logprobs[rows], chosen, n)
        for j, i in enumerate(rows):
            out[i] = ranked(tokens[i], values[j], ranks[j], top_ids[j], top_values[j])
    return out


def rank_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, top_n: int):
    """For rows of logprobs [R, V] and one chosen token a row: its logprob, its rank (1 + how many tokens
    are strictly likelier, as vLLM counts) and the top_n tokens and logprobs, as Python lists."""
    values = logprobs.gather(1, chosen[:, None])
    ranks = (logprobs > values).sum(dim=-1) + 1
    if top_n > 0:
        top = logprobs.topk(top_n, dim=-1)
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    else:
        top_ids, top_values = [[] for _ in range(len(chosen))], [[] for _ in range(len(chosen))]
    return values[:, 0].tolist(), ranks.tolist(), top_ids, top_values


def bitmask_to_allowed(bitmask: bytes, vocab_size: int) -> torch.Tensor:
    """The bool masks [rows, vocab_size] of the tokens each of a chunk's grammar bitmasks allows (the
    scheduler's ``GrammarState.bitmask``): one row a bitmask of (vocab_size + 31) // 32 words."""
    words = torch.frombuffer(bytearray(bitmask), dtype=torch.int32).view(-1, (vocab_size + 31) // 32)
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()
