"""Continuous batching with chunked prefill, prefix caching and preemption by recompute (FCFS).

Each step the running requests go first (decodes and unfinished prefill chunks), then waiting requests
while the token budget, ``max_num_seqs`` and free KV blocks allow. When blocks run out, the newest running
request is preempted: its blocks are freed and it is recomputed later from its tokens. With speculative
decoding a decode carries draft tokens (``runtime.engine.spec_decode``) where the budget and free blocks
allow them without preempting anyone; the slots of the drafts the sampler rejects are given back when
the step is answered. A paused request (``Request.paused``: its client stopped taking its outputs) is
preempted at its next turn and left in the queue until resumed; the prefix cache keeps what it computed,
while the blocks are not needed by others.
"""
from __future__ import annotations

from typing import Optional

from actorserve.runtime.config import SchedulerConfig
from actorserve.runtime.transport.messages import NewRequest, ScheduledChunk, SchedulerOutput
from actorserve.runtime.engine.kv_cache_manager import KVCacheManager
from actorserve.runtime.engine.request import Request, RequestStatus
from actorserve.runtime.engine.spec_decode import TO_PROPOSE, SpecDecodeStats, make_proposer
from actorserve.runtime.engine.waiting_queue import WaitingQueue


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager, vocab_size: int = 0) -> None:
        self.config = config
        self.vocab_size = vocab_size  # the grammar bitmasks' width
        self.kv = kv
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._step = 0
        # Batches sent but not yet answered (up to the pipeline depth): each request, its tokens and its drafts
        self._in_flight: dict[int, list[tuple[Request, int, list[int]]]] = {}
        self._finished_ids: list[str] = []
        self._known_to_worker: set[str] = set()
        self.num_preemptions = 0
        self.num_prompt_tokens = 0  # prompt tokens computed (a preempted prompt counts again)
        self.num_generation_tokens = 0
        self.proposer = make_proposer(config.speculative_config)
        self._draft_bitmasks: dict[str, bytes] = {}  # a constrained request's rows' bitmasks, from _drafts
        self._block_copies: list[tuple[int, int]] = []  # forked requests' copy-on-write, for the next batch
        self.spec_stats = SpecDecodeStats(config.speculative_config)

    # -- admission and removal ---------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def add_forked(self, request: Request, block_copies: list[tuple[int, int]]) -> None:
        """A request whose blocks ``KVCacheManager.fork`` gave it, computed up to its last token: it joins the
        running batch at once, and the worker copies its blocks before the next step."""
        self.requests[request.request_id] = request
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self._block_copies += block_copies

    def finish(self, request: Request, status: RequestStatus) -> None:
        """Take a request out of the batch for good and free its blocks."""
        if request.status.finished:
            return
        was, request.status = request.status, status
        if was == RequestStatus.RUNNING:
            self.running.remove(request)
        else:  # waiting, or preempted back into the queue
            self.waiting.discard(request)
        self.kv.free(request)
        del self.requests[request.request_id]
        if request.request_id in self._known_to_worker:
            self._known_to_worker.discard(request.request_id)
            self._finished_ids.append(request.request_id)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # -- one step ---------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """The next batch. Requests already in an unanswered batch wait for its result (pipeline
        parallelism keeps several batches in flight); with one stage there is never one."""
        self._step += 1
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int, list[int]]] = []
        stalled = False
        busy = {r.request_id for batch in self._in_flight.values() for r, _, _ in batch}
        for request in list(self.running):
            if budget <= 0:
                break
            if request.request_id in busy or request.status is not RequestStatus.RUNNING:
                continue
            if request.paused:  # its place in the batch goes to those whose clients read
                self.running.remove(request)
                self._preempt(request)
                continue
            n = min(request.num_tokens - request.num_computed_tokens, budget)
            drafts = self._drafts(request, budget) if n == request.num_tokens - request.num_computed_tokens == 1 \
                else []
            if drafts:
                n += len(drafts)
            elif not self._make_room(request, n, busy):
                stalled = True  # out of blocks: it was preempted, or must wait for batches in flight
                break
            scheduled.append((request, n, drafts))
            budget -= n
        if not stalled:
            self._admit_waiting(scheduled, budget)
        if scheduled:
            self._in_flight[self._step] = scheduled
        return self._build_output(scheduled)

    def _drafts(self, request: Request, budget: int) -> list[int]:
        """Draft tokens to verify after a decode's token, their KV slots allocated with it; none where the
        proposer has none, or they would pass max_tokens or the context, or take blocks that are not free
        (drafts never preempt anyone)."""
        if self.proposer is None:
            return []
        limit = min(budget - 1, request.max_total_tokens - request.num_tokens - 1)
        if limit <= 0 or (request.grammar is not None and self.proposer.in_worker):
            return []
        drafts = self.proposer.propose(request.token_slice(0, request.num_tokens), limit)
        if drafts and request.grammar is not None:  # the grammar cuts off what it forbids
            drafts, bitmasks = request.grammar.draft_bitmasks(drafts, self.vocab_size)
            if drafts:
                self._draft_bitmasks[request.request_id] = bitmasks
        if drafts and not self.kv.allocate(request, 1 + len(drafts)):
            self._draft_bitmasks.pop(request.request_id, None)
            return []
        return drafts

    def _make_room(self, request: Request, n: int, busy: set[str]) -> bool:
        """Allocate for n tokens, preempting the newest idle running requests until it fits."""
        while not self.kv.allocate(request, n):
            victim = next((r for r in reversed(self.running) if r.request_id not in busy), None)
            if victim is None:
                return False
            self.running.remove(victim)
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def preempt_all(self) -> None:
        """Every running request back to the head of the waiting queue, its blocks freed, to be computed
        again when scheduled (sleep mode gives the KV cache's memory back). Nothing may be in flight."""
        if self._in_flight:
            raise RuntimeError("preempt_all with a batch in flight")
        for request in reversed(self.running):
            self.kv.free(request)
            request.num_computed_tokens = 0
            request.status = RequestStatus.PREEMPTED
            self.waiting.appendleft(request)
        self.running.clear()

    def _admit_waiting(self, scheduled: list[tuple[Request, int, list[int]]], budget: int) -> None:
        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting.head()
            if request.paused or _blocked_on_sibling(request) or (request.grammar is not None
                                                                   and not request.grammar.ready()):
                skipped.append(self.waiting.popleft())  # (a grammar still compiling: the batch goes on)
                continue
            # a prompt's logprobs come from computing it: a cached prefix would leave them out (as vLLM)
            cached = self.kv.find_cached_prefix(request) if request.params.prompt_logprobs is None else []
            num_cached = len(cached) * self.kv.block_size
            n = request.num_tokens - num_cached
            if n > budget and not self.config.enable_chunked_prefill:
                break
            n = min(n, budget)
            if not self.kv.allocate(request, n, cached):
                break
            self.waiting.popleft()
            if request.num_preemptions == 0:
                self.kv.pool.queries += len(request.prompt_token_ids)
                self.kv.pool.hits += num_cached
                request.num_cached_tokens = num_cached
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append((request, n, []))
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _build_output(self, scheduled: list[tuple[Request, int, list[int]]]) -> SchedulerOutput:
        new_requests = []
        chunks = []
        for request, n, drafts in scheduled:
            if request.request_id not in self._known_to_worker:
                self._known_to_worker.add(request.request_id)
                new_requests.append(NewRequest(
                    request.request_id, request.prompt_token_ids, request.params,
                    None if request.params.ignore_eos else request.eos_token_id, request.bad_words_token_ids))
            start, real = request.num_computed_tokens, n - len(drafts)
            proposed = bool(drafts) and drafts[0] == TO_PROPOSE  # the worker's draft model fills them
            tokens = request.token_slice(start, start + real) + ([] if proposed else drafts)
            sample = start + real == request.num_tokens
            bitmask = self._draft_bitmasks.pop(request.request_id, None) if drafts else None
            if sample and request.grammar is not None and bitmask is None:  # one a row: the token's, then each draft's
                bitmask = request.grammar.bitmask(self.vocab_size)
            chunks.append(ScheduledChunk(
                request.request_id, tokens, start, self.kv.block_ids(request.request_id),
                sample=sample, num_draft=0 if proposed else len(drafts), propose=len(drafts) if proposed else 0,
                grammar_bitmask=bitmask, state_slot=self.kv.state_slot(request.request_id),
            ))
        finished, copies = [], []
        if chunks:  # an empty batch is never sent: keep the news for the next one
            finished, self._finished_ids = self._finished_ids, []
            copies, self._block_copies = self._block_copies, []
        return SchedulerOutput(self._step, new_requests, chunks, finished, copies)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def update(self, step: int, sampled: dict[str, list[int]]) -> list[tuple[Request, list[int]]]:
        """Advance the requests of batch ``step``; returns (request, new tokens) for those that sampled: the
        drafts it kept, then the model's own token. The caller appends them to the request's output, one
        at a time, up to a stop; the slots of rejected drafts are given back here."""
        produced = []
        for request, n, drafts in self._in_flight.pop(step, []):
            if request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            start, real = request.num_computed_tokens, n - len(drafts)
            done = start + real == request.num_tokens
            tokens = sampled[request.request_id] if done else []
            kept = len(tokens) - 1 if drafts else 0
            request.num_computed_tokens += real + kept
            if drafts:
                self.spec_stats.observe(len(drafts), kept)
                self.kv.trim(request, request.num_computed_tokens + 1)  # the kept ones and the next token
            self.num_prompt_tokens += max(0, min(start + real, len(request.prompt_token_ids)) - start)
            self.kv.publish_full_blocks(request)
            if done:
                self.num_generation_tokens += len(tokens)
                produced.append((request, tokens))
        return produced

def _blocked_on_sibling(request: Request) -> bool:
    leader: Optional[Request] = request.wait_for
    if leader is None:
        return False
    if leader.status.finished or leader.prompt_done:
        request.wait_for = None
        return False
    return True
