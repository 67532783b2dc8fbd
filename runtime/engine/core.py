"""The engine loop without I/O: admit requests, schedule a step, hand it to an executor, apply the result.

Runs in the scheduler process (or in the caller's, for the offline API). The executor is anything with
``execute(SchedulerOutput) -> ModelRunnerOutput``: a local model runner, or the workers behind ZMQ.
Stop conditions are decided here, where the tokens are: EOS, stop token ids, stop strings, max_tokens and
the model's context length. Beam search runs here too (``BeamSearchParams``): one request whose every step
is its live beams, one token further each, scheduled together in the step after the last one's results.
A beam forks from its parent copy-on-write (``KVCacheManager.fork``): the parent's full blocks shared,
its last, partly filled block copied by the worker, so each step computes one token a beam, a decode.
Where blocks cannot be shared so (a sliding window, linear-attention states) or none is free for the
copy, a beam is queued as a request of its own, whose prompt the prefix cache mostly serves.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Optional, Protocol, Union

from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.beam_search import BeamSearch, BeamSearchParams
from actorserve.runtime.transport.messages import ModelRunnerOutput, PromptLogprobs, SchedulerOutput
from actorserve.runtime.text.detokenizer import IncrementalDetokenizer
from actorserve.runtime.engine.kv_cache_manager import KVCacheManager
from actorserve.runtime.engine.outputs import (CompletionOutput, Logprob, RequestMetrics, RequestOutput, RequestUpdate,
                                               SampleDelta, logprob_entries, ranked)
from actorserve.runtime.engine.request import Request, RequestStatus
from actorserve.runtime.engine.sampling_params import RequestLimits, SamplingParams, truncate_prompt, verify_request
from actorserve.runtime.engine.scheduler import Scheduler
from actorserve.runtime.engine.stats import StepTokens
from actorserve.runtime.engine.structured_outputs import StructuredOutputManager
from actorserve.runtime.errors import EngineOverloadedError, EngineSleepingError
from actorserve.runtime.text.tokenizer import bad_words_token_ids

log = logging.getLogger("actorserve")


class Executor(Protocol):
    def execute(self, batch: SchedulerOutput) -> ModelRunnerOutput: ...


@dataclass(frozen=True)
class ModelFacts:
    """What the engine must know of the model, read by the worker at load time."""

    vocab_size: int  # embedding rows: the bound every client token id is checked against
    eos_token_id: Optional[int]
    max_model_len: int
    num_kv_blocks: int
    # every layer slides over this many tokens: blocks that fall out of the window are freed (None: keep all)
    sliding_window: Optional[int] = None
    # recurrent-state slots of a hybrid model's linear-attention layers, one per running request (0: none)
    num_state_slots: int = 0


class _Sequence:
    """One of a request's n samples: the scheduler's Request plus its detokenizer and output."""

    def __init__(self, request: Request, output: CompletionOutput, detok: Optional[IncrementalDetokenizer]):
        self.request = request
        self.output = output
        self.detok = detok
        self.sent_tokens = 0  # tokens already handed out in updates

    def take_update(self) -> SampleDelta:
        out = self.output
        start, self.sent_tokens = self.sent_tokens, len(out.token_ids)
        text = self.detok.take_new_text(final=out.finished()) if self.detok is not None else ""
        logprobs = logprob_entries(out.logprobs[start:] if out.logprobs is not None else None)
        return SampleDelta(out.index, out.token_ids[start:], text, logprobs, out.finish_reason, out.stop_reason)


class _Group:
    def __init__(self, output: RequestOutput, sequences: list[_Sequence]) -> None:
        self.output = output
        self.sequences = sequences
        self.arrived = time.monotonic()
        self.scheduled: Optional[float] = None  # its first step
        self.first_token: Optional[float] = None

    def finish(self) -> None:
        now = time.monotonic()
        scheduled = self.scheduled if self.scheduled is not None else now
        first = self.first_token if self.first_token is not None else now
        self.output.metrics = RequestMetrics(queued_time=scheduled - self.arrived, prefill_time=first - scheduled,
                                             decode_time=now - first, inference_time=now - scheduled)


class _BeamGroup(_Group):
    """A beam search: ``sequences`` are its current step's beams, each a one-token request of its own."""

    def __init__(self, output: RequestOutput, search: BeamSearch, step_params: SamplingParams, forks: bool) -> None:
        super().__init__(output, [])
        self.search = search
        self.step_params = step_params
        self.paused = False
        self.forks = forks  # beams fork their parents' blocks (else each is queued on its own)
        # the step's finished beams' block tables, held for their children: request id -> (table, computed)
        self.held: dict[str, tuple[list, int]] = {}


class EngineCore:
    def __init__(self, config: EngineConfig, executor: Executor, facts: ModelFacts, tokenizer=None) -> None:
        block_size = config.cache.block_size
        if facts.num_kv_blocks * block_size < facts.max_model_len:
            raise ValueError(
                f"the KV cache holds {facts.num_kv_blocks * block_size} tokens, fewer than max_model_len="
                f"{facts.max_model_len}; raise kv_cache_memory or lower max_model_len"
            )
        self.config = config
        self.facts = facts
        self.executor = executor
        self.tokenizer = tokenizer
        self.limits = RequestLimits(facts.vocab_size, facts.max_model_len, config.scheduler.max_n)
        caching = config.cache.enable_prefix_caching
        if facts.num_state_slots:
            if config.scheduler.speculative_config is not None:
                raise ValueError("speculative decoding does not serve models with linear-attention layers yet "
                                 "(a rejected draft would have advanced their recurrent state)")
            if caching:  # a cached block of keys does not give back the recurrent state at its end
                log.info("prefix caching is off: the model has linear-attention layers")
            caching = False
        self.kv = KVCacheManager(facts.num_kv_blocks, block_size, caching, facts.sliding_window,
                                 facts.num_state_slots)
        self.scheduler = Scheduler(config.scheduler, self.kv, facts.vocab_size)
        self.structured = StructuredOutputManager(tokenizer, facts.vocab_size, facts.eos_token_id,
                                                  config.scheduler.grammar_compile_seconds,
                                                  config.scheduler.grammar_compile_memory,
                                                  config.scheduler.reasoning_parser)
        self._groups: dict[str, _Group] = {}
        self._by_seq: dict[str, tuple[_Group, _Sequence]] = {}
        self._arrivals = itertools.count()
        self.step_tokens = StepTokens()
        self.asleep = False  # sleep mode: nothing is scheduled; the KV cache's contents are gone

    # -- sleep mode ---------------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Stop scheduling before the workers release their memory: every running request goes back to
        the waiting queue (computed again after wake-up, nothing lost), and cached prefixes are forgotten."""
        if self.num_in_flight:
            raise RuntimeError("sleep with a step in flight")
        for group in self._groups.values():  # a beam's parent blocks will not survive: its children recompute
            if isinstance(group, _BeamGroup):
                self._release_held(group)
        self.scheduler.preempt_all()
        self.kv.pool.reset_cache()
        self.asleep = True

    def wake_up(self) -> None:
        self.asleep = False

    # -- requests -----------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    params: Union[SamplingParams, BeamSearchParams], prompt: Optional[str] = None) -> None:
        """Validate against the model and queue; raises ValueError (naming the field) without side effects."""
        if request_id in self._groups:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if self.asleep and not self.config.runtime.sleep_queue_requests:
            raise EngineSleepingError("the engine is asleep (sleep mode): wake it up first, or start it with "
                                      "sleep_queue_requests to have requests wait")
        if isinstance(params, BeamSearchParams):
            self._add_beam_search(request_id, prompt_token_ids, params, prompt)
            return
        truncated = truncate_prompt(prompt_token_ids, params.truncate_prompt_tokens, self.limits.max_model_len)
        if len(truncated) != len(prompt_token_ids):  # the text is then what is left of it
            prompt_token_ids = truncated
            prompt = self.tokenizer.decode(truncated) if prompt is not None and self.tokenizer is not None else None
        verify_request(prompt_token_ids, params, self.limits, self.tokenizer is not None)
        if params.structured_outputs is not None:
            self.structured.validate(params.structured_outputs)
        self._check_queue(params.n)
        bad_words = None
        if params.bad_words:
            bad_words = bad_words_token_ids(self.tokenizer, params.bad_words, self.facts.vocab_size)
        output = RequestOutput(request_id, prompt, list(prompt_token_ids), [])
        if params.prompt_logprobs is not None:
            output.prompt_logprobs = [None] * len(prompt_token_ids)
        group = _Group(output, [])
        leader: Optional[Request] = None
        for index in range(params.n):
            child = params.child(index) if params.n > 1 else params
            seq = self._new_sequence(f"{request_id}#{index}" if params.n > 1 else request_id,
                                     prompt_token_ids, child, index)
            seq.request.wait_for = leader
            seq.request.bad_words_token_ids = bad_words
            if params.structured_outputs is not None:  # compiled once: the cache serves the other samples
                seq.request.grammar = self.structured.start(params.structured_outputs, prompt_token_ids)
            leader = leader or seq.request
            group.sequences.append(seq)
            output.outputs.append(seq.output)
            self._by_seq[seq.request.request_id] = (group, seq)
        self._groups[request_id] = group
        for seq in group.sequences:
            self.scheduler.add(seq.request)

    def _add_beam_search(self, request_id: str, prompt_ids: list[int], params: BeamSearchParams,
                         prompt: Optional[str]) -> None:
        step = params.step_params()
        verify_request(prompt_ids, step, self.limits, self.tokenizer is not None)
        self._check_queue(params.beam_width)
        output = RequestOutput(request_id, prompt, list(prompt_ids), [CompletionOutput(i)
                                                                       for i in range(params.beam_width)])
        forks = self.kv.sliding_window is None and not self.kv.num_state_slots
        group = _BeamGroup(output, BeamSearch([list(prompt_ids)], params, self.facts.eos_token_id,
                                              self.facts.max_model_len), step, forks)
        self._groups[request_id] = group
        self._next_beams(group)

    def _next_beams(self, group: _BeamGroup) -> Optional[RequestUpdate]:
        """Queue the search's next step, every live beam at once; at its end, the update with the best
        sequences as the samples."""
        parents = {}
        for seq in group.sequences:
            self._by_seq.pop(seq.request.request_id, None)
            held = group.held.pop(seq.request.request_id, None)
            if held is not None:
                parents[tuple(seq.request.prompt_token_ids)] = held
        group.sequences = []
        search, rid = group.search, group.output.request_id
        for k, ids in enumerate(search.pending()):
            seq = self._new_sequence(f"{rid}~{search.steps}.{k}", ids, group.step_params, k)
            seq.detok = None  # only the candidates' logprobs are read
            seq.request.paused = group.paused
            group.sequences.append(seq)
            self._by_seq[seq.request.request_id] = (group, seq)
            parent = parents.get(tuple(ids[:-1]))
            copies = None if parent is None else self.kv.fork(seq.request, *parent)
            if copies is None:
                self.scheduler.add(seq.request)
            else:
                self.scheduler.add_forked(seq.request, copies)
        for table, _ in parents.values():
            self.kv.release(table)
        if group.sequences:
            return None
        n = len(group.output.prompt_token_ids)
        results = search.results(self.tokenizer.decode if self.tokenizer is not None else None)[0].sequences
        group.output.outputs = [CompletionOutput(i, s.text or "", s.tokens[n:], s.cum_logprob, None, s.finish_reason,
                                                 s.stop_reason) for i, s in enumerate(results)]
        group.output.finished = True
        group.finish()
        del self._groups[rid]
        return RequestUpdate(group.output, [SampleDelta(o.index, o.token_ids, o.text, None, o.finish_reason,
                                                         o.stop_reason) for o in group.output.outputs])

    def _release_held(self, group: _BeamGroup) -> None:
        for table, _ in group.held.values():
            self.kv.release(table)
        group.held.clear()

    def _check_queue(self, n: int) -> None:
        """``max_waiting_seqs``: n samples more than it are a ValueError (never admitted), and more than the
        queue has room for an EngineOverloadedError (admitted once it drains)."""
        cap = self.config.scheduler.max_waiting_seqs
        if cap is None:
            return
        if n > cap:
            raise ValueError(f"n: {n} samples are more sequences than this engine queues (max_waiting_seqs {cap})")
        waiting = len(self.scheduler.waiting)
        if waiting + n > cap:
            raise EngineOverloadedError(f"the engine's queue is full: {waiting} sequences wait for a place in the "
                                        f"batch (max_waiting_seqs {cap}); send the request again shortly")

    def _new_sequence(self, seq_id: str, prompt_ids: list[int], params: SamplingParams, index: int) -> _Sequence:
        max_total = self.facts.max_model_len
        if params.max_tokens is not None:
            max_total = min(max_total, len(prompt_ids) + params.max_tokens)
        request = Request(seq_id, list(prompt_ids), params, next(self._arrivals), max_total, self.facts.eos_token_id)
        detok = None
        if self.tokenizer is not None and params.detokenize:
            detok = IncrementalDetokenizer(self.tokenizer, params.stop, params.skip_special_tokens,
                                           params.include_stop_str_in_output)
        logprobs = [] if params.logprobs is not None else None
        cumulative = 0.0 if params.logprobs is not None else None
        return _Sequence(request, CompletionOutput(index, logprobs=logprobs, cumulative_logprob=cumulative), detok)

    def abort_request(self, request_id: str) -> Optional[RequestUpdate]:
        """Stop a request and free its blocks; the update ends each unfinished sample with "abort"."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return None
        samples = []
        for seq in group.sequences:
            self._by_seq.pop(seq.request.request_id, None)
            if not seq.output.finished():
                seq.output.finish_reason = "abort"
                self.scheduler.finish(seq.request, RequestStatus.FINISHED_ABORTED)
                samples.append(seq.take_update())
        if isinstance(group, _BeamGroup):  # its samples are the search's, none of them done
            self._release_held(group)
            for out in group.output.outputs:
                out.finish_reason = "abort"
            samples = [SampleDelta(o.index, [], "", None, "abort", None) for o in group.output.outputs]
        group.output.finished = True
        group.finish()
        return RequestUpdate(group.output, samples)

    def pause_request(self, request_id: str, paused: bool) -> None:
        """Flow control: a paused request is not scheduled (its blocks go back to the queue's turn) until it
        is resumed; its client has fallen behind its outputs. An unknown id (finished, aborted) is ignored."""
        group = self._groups.get(request_id)
        if isinstance(group, _BeamGroup):
            group.paused = paused
        for seq in group.sequences if group is not None else ():
            seq.request.paused = paused

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    # -- one step -----------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step with the local executor; returns the cumulative outputs that changed."""
        batch = self.schedule()
        if batch is None:
            return []
        return [u.output for u in self.apply(self.executor.execute(batch))]

    def schedule(self) -> Optional[SchedulerOutput]:
        """The next step's batch, or None when there is nothing to run (or all of it is in flight)."""
        if self.asleep or not self.scheduler.has_unfinished():
            return None
        batch = self.scheduler.schedule()
        if not batch.chunks:
            return None
        self.step_tokens.observe(batch.num_tokens)
        now = None
        for chunk in batch.chunks:
            group = self._by_seq[chunk.request_id][0]
            if group.scheduled is None:
                group.scheduled = now = now or time.monotonic()
        return batch

    @property
    def num_in_flight(self) -> int:
        return self.scheduler.num_in_flight

    def apply(self, result: ModelRunnerOutput) -> list[RequestUpdate]:
        """Take a step's sampled tokens; returns an update for every request that changed."""
        changed: dict[str, tuple[_Group, list[_Sequence]]] = {}
        for rid, prompt_logprobs in result.prompt_logprobs.items():
            found = self._by_seq.get(rid)
            if found is not None:  # (not aborted while the step ran)
                self._fill_prompt_logprobs(found[0].output, prompt_logprobs)
        for request, tokens in self.scheduler.update(result.step, result.sampled):
            group, seq = self._by_seq[request.request_id]
            if isinstance(group, _BeamGroup) and group.forks:  # its children will fork its blocks
                group.held[request.request_id] = (self.kv.detach(request), request.num_computed_tokens)
            logprobs = result.logprobs.get(request.request_id)
            for j, token in enumerate(tokens):  # kept drafts, then the model's token: up to a stop
                request.output_token_ids.append(token)
                if request.grammar is not None:
                    request.grammar.accept(token)
                self._append(seq, token, None if logprobs is None else logprobs[j])
                if seq.output.finished():
                    break
            else:
                self.kv.publish_full_blocks(request)  # the kept drafts' blocks, now that they are tokens
            changed.setdefault(group.output.request_id, (group, []))[1].append(seq)
        updates = []
        now = None
        for request_id, (group, seqs) in changed.items():
            if group.first_token is None:
                group.first_token = now = now or time.monotonic()
            if isinstance(group, _BeamGroup):
                if group.search.steps == 0:
                    group.output.num_cached_tokens = group.sequences[0].request.num_cached_tokens
                if all(s.output.finished() for s in group.sequences):  # the step's every beam: the next
                    group.search.advance([s.output.logprobs[0] for s in group.sequences])
                    update = self._next_beams(group)
                    if update is not None:
                        updates.append(update)
                continue
            group.output.num_cached_tokens = group.sequences[0].request.num_cached_tokens
            if all(s.output.finished() for s in group.sequences):
                group.output.finished = True
                group.finish()
                del self._groups[request_id]
                for seq in group.sequences:
                    self._by_seq.pop(seq.request.request_id, None)
            updates.append(RequestUpdate(group.output, [s.take_update() for s in seqs]))
        return updates

    def _append(self, seq: _Sequence, token: int, logprobs: Optional[list[Logprob]]) -> None:
        out, request = seq.output, seq.request
        out.token_ids.append(token)
        if logprobs is not None and out.logprobs is not None:
            out.logprobs.append(self._logprob_entry(logprobs))
            out.cumulative_logprob += logprobs[0].logprob
        n_out = len(request.output_token_ids)
        stop_string = None
        if seq.detok is not None:
            stop_string = seq.detok.add(token, check_stop=n_out > request.params.min_tokens)
            out.text = seq.detok.text
        finish = self._check_stop(request, token, stop_string)
        if finish is not None:
            status, out.stop_reason = finish
            out.finish_reason = status.value
            self.scheduler.finish(request, status)

    def _check_stop(self, request: Request, token: int, stop_string: Optional[str]):
        params = request.params
        n_out = len(request.output_token_ids)
        if stop_string is not None:
            return RequestStatus.FINISHED_STOPPED, stop_string
        if n_out >= params.min_tokens:
            if token == request.eos_token_id and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED, None
            if token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if request.grammar is not None and request.grammar.terminated():
            return RequestStatus.FINISHED_STOPPED, None if token == request.eos_token_id else token
        if request.num_tokens >= request.max_total_tokens:
            return RequestStatus.FINISHED_LENGTH, None
        return None

    def _logprob_entry(self, ranked_entries: list[Logprob]) -> dict[int, Logprob]:
        """A position's entries by token id, the chosen token first, then the top-N (as vLLM orders them),
        each with its text."""
        entry: dict[int, Logprob] = {}
        for lp in ranked_entries:
            if lp.token_id not in entry:
                lp.decoded_token = self._decode_one(lp.token_id)
                entry[lp.token_id] = lp
        return entry

    def _fill_prompt_logprobs(self, output: RequestOutput, lp: PromptLogprobs) -> None:
        """By position: a preempted request computes its prompt again, and writes the same values."""
        ids = output.prompt_token_ids
        for i, (value, rank, top_ids, top_values) in enumerate(zip(lp.logprobs, lp.ranks, lp.top_token_ids,
                                                                   lp.top_logprobs)):
            position = lp.start + i
            output.prompt_logprobs[position] = self._logprob_entry(ranked(ids[position], value, rank, top_ids,
                                                                          top_values))

    def _decode_one(self, token: int) -> Optional[str]:
        return None if self.tokenizer is None else self.tokenizer.decode([token])

    # -- statistics -----------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.kv.pool.num_free_blocks
