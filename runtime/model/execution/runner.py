"""The model runner: owns the weights, the paged KV cache, the attention backend and the sampler.

Runs in a worker process (or in-process). Each step it turns a SchedulerOutput into input tensors and
attention metadata, runs the model, and samples the requests whose chunk reached their last token.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import mmap
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from actorserve.kernels.attention import AttentionMetadata, SequenceGroup
from actorserve.kernels.attention.selector import AttentionNeeds
from actorserve.kernels.attention.selector import select as select_attention
from actorserve.runtime.transport.messages import ModelRunnerOutput, PromptLogprobs, ScheduledChunk, SchedulerOutput
from actorserve.runtime.model.architectures.arch_config import ArchConfig
from actorserve.runtime.model.execution.cuda_graphs import DecodeGraphs
from actorserve.runtime.model.execution.decode_fast_path import DecodeFastPath
from actorserve.runtime.model.architectures.decoder import CausalLM
from actorserve.runtime.model.architectures.linear_attention import LinearLayerState, LinearStep
from actorserve.runtime.model.sampling.rejection_sampler import verify
from actorserve.runtime.model.sampling.sampler import (Sampler, SamplingRow, bitmask_to_allowed, noise_stream,
                                                       rank_logprobs)

log = logging.getLogger("actorserve")

# Prompt logprobs turn this many rows at a time into logits: a long prompt's [rows, vocab] would not fit
_PROMPT_LOGPROB_ROWS = 256


def kv_bytes_per_block(cfg: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
    """A block's K and V in every softmax-attention layer (a hybrid model's GDN layers keep none)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return cfg.kv_cache_tensors * len(cfg.attention_layers) * block_size * cfg.num_kv_heads * cfg.head_dim * elem


def _zeroed_caches(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                   layers: int, tensors: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's K and V pools, all zeros (a never-written slot must not hold a NaN that masking cannot
    hide); with ``tensors`` 1 (MLA's latent, read as both) the pair is one pool twice. On the CPU they are
    views of one anonymous mapping, which the OS hands out as zero pages when first touched: start-up does
    not write gigabytes of zeros, and untouched blocks cost no memory."""
    nbytes = tensors * layers * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes == 0:  # (an empty mapping is an error)
        pool = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(tensors * layers)]
    else:
        # (private: sleep mode gives its pages back with MADV_DONTNEED, which a shared mapping would keep)
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        pool = torch.frombuffer(mapping, dtype=torch.uint8).view(dtype).view(tensors * layers, *shape)
    return [(pool[tensors * i], pool[tensors * i + tensors - 1]) for i in range(layers)]


def _drafted_decode(chunk: ScheduledChunk) -> bool:
    """A decode step's token and its draft tokens (speculative decoding), nothing of a prompt."""
    return chunk.num_draft > 0 and len(chunk.token_ids) == chunk.num_draft + 1 and chunk.sample


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: Any  # the attention backend's plan of the step (``backend.prepare``)
    # rows of the hidden states to turn into logits: one per sampled request, 1 + its drafts where it has any
    logits_indices: torch.Tensor
    sample_ids: list[str]  # request ids in the order of logits_indices
    chunk_rows: list[tuple[ScheduledChunk, int]]  # each chunk and the row of its first token
    drafts: Optional[list[list[int]]] = None  # each sampled request's draft tokens, where any has some
    grammar_bitmasks: list[Optional[bytes]] = dataclasses.field(default_factory=list)  # by sample_ids
    decode_only: bool = False  # one row a sequence, nothing of a prompt's chunk (what a CUDA graph replays)
    linear_step: Optional[LinearStep] = None  # the step's sequences for a hybrid model's GDN layers


class ModelRunner:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int, seed: int = 0,
                 device: str = "cpu", fast_decode: bool = True, drafter=None,
                 attention_backend: Optional[str] = None, graph_sizes: Sequence[int] = (),
                 num_state_slots: int = 0, kv_cache_dtype: Optional[torch.dtype] = None) -> None:
        """``kv_cache_dtype``: what the softmax-attention layers' K/V pools hold (default: the model's dtype)."""
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        dtype = model.dtype
        self.kv_dtype = dtype if kv_cache_dtype is None else kv_cache_dtype
        needs = AttentionNeeds(self.device.type, dtype, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, block_size,
                               cfg.sliding_window, kv_dtype=self.kv_dtype)
        self.backend = select_attention(needs, attention_backend)(cfg.num_kv_heads, num_blocks, block_size)
        shape = self.backend.kv_cache_shape(num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        # one entry per local layer: K and V pools for softmax attention, the recurrent states of a GDN layer
        linear = [int(name) in cfg.linear_layers for name in model.model.layers]
        if any(linear) and num_state_slots < 1:
            raise ValueError("a model with linear-attention layers needs state slots (num_state_slots)")
        pools = iter(_zeroed_caches(shape, self.kv_dtype, self.device, linear.count(False), cfg.kv_cache_tensors))
        self.num_state_slots = num_state_slots if any(linear) else 0
        self.kv_caches = [LinearLayerState.zeros(cfg, num_state_slots, dtype, self.device) if is_linear
                          else next(pools) for is_linear in linear]
        self.sampler = Sampler(seed, device=self.device)
        self._rows: dict[str, SamplingRow] = {}
        # speculative decoding's draft model (runtime.model.execution.draft_proposer), on the stage that samples
        self.drafter = drafter
        self._plans = (fast_decode, tuple(graph_sizes))
        self.build_plans()
        self.sleep_mode = None  # runtime.model.memory.sleep_mode.SleepMode, where the engine was started with it

    def build_plans(self) -> None:
        """The step plans that bind the weights' and caches' addresses: the decode fast path, and on CUDA the
        decode graphs' capture (``capture_graphs``)."""
        fast_decode, graph_sizes = self._plans
        # decode-only steps skip module dispatch where the model's kernels allow (None: every step eager)
        self.fast_decode = DecodeFastPath.build(self.model, self.backend, self.kv_dtype) if fast_decode else None
        # decode steps replayed from CUDA graphs (captured by ``capture_graphs``), where the backend allows
        self.graphs: Optional[DecodeGraphs] = None
        self._static: Optional[dict[str, Any]] = None
        if (self.device.type == "cuda" and fast_decode and graph_sizes and getattr(self.backend, "capturable", False)
                and not self.num_state_slots):  # (the GDN layers' host-side bookkeeping is not capturable)
            self.graphs = DecodeGraphs(graph_sizes, self._capture, self._load_static, self._static_output)

    def drop_plans(self) -> None:
        """Let go of what ``build_plans`` and ``capture_graphs`` made (sleep mode builds them again)."""
        self.fast_decode, self.graphs, self._static = None, None, None

    def runners(self) -> list[tuple[str, "ModelRunner"]]:
        """This runner and its draft model's, by name: what holds weights and KV caches."""
        return [("", self)] + ([("draft.", self.drafter.runner)] if self.drafter is not None else [])

    @property
    def is_last_stage(self) -> bool:
        return self.model.stage.last

    def execute(self, batch: SchedulerOutput, hidden_in: Optional[torch.Tensor] = None):
        """The sampled tokens (a ModelRunnerOutput) on the last stage; elsewhere the hidden states that
        the next stage takes as ``hidden_in``."""
        for _, runner in self.runners():
            runner.copy_blocks(batch.block_copies)
        if not self.is_last_stage:
            return self.run_layers(self.prepare_inputs(batch), hidden_in)
        self._update_states(batch)
        draft_probs: dict[str, torch.Tensor] = {}
        if self.drafter is not None:
            batch, draft_probs = self.drafter.propose(batch, self._rows)
        inputs = self.prepare_inputs(batch)
        hidden = self.run_layers(inputs, hidden_in)
        prompt_logprobs = self._prompt_logprobs(hidden, inputs)
        logits = self._logits(hidden, inputs.logits_indices)
        rows = [self._rows[rid] for rid in inputs.sample_ids]
        masks = [None if b is None else bitmask_to_allowed(b, logits.shape[-1]).to(logits.device)
                 for b in inputs.grammar_bitmasks]
        for row, mask in zip(rows, masks):
            row.allowed = None if mask is None else mask[0]
        if inputs.drafts is not None:
            tokens, logprobs = verify(self.sampler, logits, rows, inputs.drafts, masks,
                                      [draft_probs.get(rid) for rid in inputs.sample_ids] if draft_probs else None)
        else:
            one, one_logprobs = self.sampler(logits, rows)
            tokens, logprobs = [[t] for t in one], [[lp] for lp in one_logprobs]
        for row, new in zip(rows, tokens):
            row.output_ids.extend(new)
        return ModelRunnerOutput(
            step=batch.step,
            sampled=dict(zip(inputs.sample_ids, tokens)),
            logprobs={rid: lp for rid, lp in zip(inputs.sample_ids, logprobs) if lp and lp[0] is not None},
            prompt_logprobs=prompt_logprobs,
        )

    @torch.inference_mode()
    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write of forked beams: each source block into its destination in every softmax-attention
        layer's pools (a linear-attention layer's state is a request's own, not a block's)."""
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], device=self.device)
        dst = torch.tensor([d for _, d in pairs], device=self.device)
        dim = self.backend.block_dim
        for cache in self.kv_caches:
            if isinstance(cache, LinearLayerState):
                continue
            for pool in {id(t): t for t in cache}.values():  # (MLA's latent pool is K and V at once)
                pool.index_copy_(dim, dst, pool.index_select(dim, src))

    @torch.inference_mode()
    def _logits(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden[indices])

    @torch.inference_mode()
    def _prompt_logprobs(self, hidden: torch.Tensor, inputs: ModelInputs) -> dict[str, PromptLogprobs]:
        """For each chunk of a request that asked for them: the logprob and rank of every prompt token
        the chunk's rows predict (row p predicts token p + 1), and the top alternatives, from the raw
        logits as the sampled tokens' logprobs are. The row that predicts the first output token is the
        sampler's, not the prompt's."""
        out: dict[str, PromptLogprobs] = {}
        for chunk, first_row in inputs.chunk_rows:
            row = self._rows.get(chunk.request_id)
            if row is None or row.params.prompt_logprobs is None:
                continue
            prompt = row.prompt_ids
            first, last = chunk.start + 1, min(chunk.start + len(chunk.token_ids), len(prompt) - 1)
            if last < first:
                continue
            top_n = row.params.prompt_logprobs
            values, ranks, top_ids, top_values = [], [], [], []
            for lo in range(first, last + 1, _PROMPT_LOGPROB_ROWS):
                hi = min(lo + _PROMPT_LOGPROB_ROWS, last + 1)
                rows = torch.arange(first_row + lo - 1 - chunk.start, first_row + hi - 1 - chunk.start,
                                    device=hidden.device)
                logprobs = self._logits(hidden, rows).float().log_softmax(dim=-1)
                targets = torch.tensor(prompt[lo:hi], dtype=torch.long, device=logprobs.device)
                v, r, ti, tv = rank_logprobs(logprobs, targets, top_n)
                values += v
                ranks += r
                top_ids += ti
                top_values += tv
            out[chunk.request_id] = PromptLogprobs(first, values, ranks, top_ids, top_values)
        return out

    def _update_states(self, batch: SchedulerOutput) -> None:
        for rid in batch.finished_request_ids:
            self._rows.pop(rid, None)
        for new in batch.new_requests:
            seed = new.params.seed
            generator = None if seed is None else noise_stream(seed, "target", self.device)
            self._rows[new.request_id] = SamplingRow(new.params, generator, list(new.prompt_token_ids), [],
                                                     eos_token_id=new.eos_token_id,
                                                     bad_words_token_ids=new.bad_words_token_ids)

    # -- CUDA graphs ------------------------------------------------------------------------------------------
    def capture_graphs(self) -> None:
        """Capture every decode size (at load, before serving); a model whose forward cannot be captured
        runs eagerly, with a warning."""
        if self.graphs is None:
            return
        rows = self.graphs.sizes[-1]
        max_blocks = -(-self.model.rotary.cos.shape[0] // self.block_size)
        self._static = {"input_ids": torch.zeros(rows, dtype=torch.long, device=self.device),
                        "positions": torch.zeros(rows, dtype=torch.long, device=self.device),
                        "plan": self.backend.static_plan(rows, max_blocks, self.device), "outputs": {}, "pool": None}
        try:
            self.graphs.capture_all()
        except Exception as e:  # noqa: BLE001 - eager is always correct
            log.warning("CUDA graph capture failed (%s); decode steps run eagerly", e)
            self.graphs, self._static = None, None

    @torch.inference_mode()
    def _capture(self, size: int):
        static = self._static
        plan = self.backend.static_view(static["plan"], size)
        args = (static["input_ids"][:size], static["positions"][:size], self.kv_caches, plan, self.backend)
        self.model(*args)  # once eagerly: triton compiles its kernels outside the capture
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=static["pool"]):
            static["outputs"][size] = self.model(*args)
        static["pool"] = graph.pool()
        return graph

    def _load_static(self, inputs: ModelInputs, size: int) -> None:
        static, n = self._static, inputs.input_ids.shape[0]
        static["input_ids"][:n].copy_(inputs.input_ids, non_blocking=True)
        static["input_ids"][n:size].zero_()
        static["positions"][:n].copy_(inputs.positions, non_blocking=True)
        static["positions"][n:size].zero_()
        self.backend.load_plan(static["plan"], inputs.meta, size)

    def _static_output(self, size: int, n: int) -> torch.Tensor:
        return self._static["outputs"][size][:n]

    @torch.inference_mode()
    def run_layers(self, inputs: ModelInputs, hidden_in: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.graphs is not None and hidden_in is None:
            return self.graphs.run(inputs, inputs.input_ids.shape[0], inputs.decode_only,
                                   lambda: self.model(inputs.input_ids, inputs.positions, self.kv_caches,
                                                      inputs.meta, self.backend, hidden_in))
        if self.fast_decode is not None and self.fast_decode.applies(inputs.meta):
            return self.fast_decode(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, hidden_in)
        return self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta, self.backend, hidden_in,
                          inputs.linear_step)

    def forward(self, inputs: ModelInputs, hidden_in: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The logits of the rows that sample."""
        return self._logits(self.run_layers(inputs, hidden_in), inputs.logits_indices)

    def prepare_inputs(self, batch: SchedulerOutput) -> ModelInputs:
        decodes: list[ScheduledChunk] = []
        prefills: list[ScheduledChunk] = []
        for c in batch.chunks:
            (decodes if len(c.token_ids) == 1 or _drafted_decode(c) else prefills).append(c)
        ordered = decodes + prefills
        ids, positions, slots, logits_indices, sample_ids, chunk_rows = [], [], [], [], [], []
        drafts: list[list[int]] = []
        bitmasks: list[Optional[bytes]] = []
        bs = self.block_size
        for chunk in ordered:
            chunk_rows.append((chunk, len(ids)))
            span = range(chunk.start, chunk.start + len(chunk.token_ids))
            ids.extend(chunk.token_ids)
            positions.extend(span)
            slots.extend(chunk.block_ids[p // bs] * bs + p % bs for p in span)
            if chunk.sample:  # the last real token's row, and each draft's
                logits_indices.extend(range(len(ids) - 1 - chunk.num_draft, len(ids)))
                sample_ids.append(chunk.request_id)
                drafts.append(chunk.token_ids[len(chunk.token_ids) - chunk.num_draft:])
                bitmasks.append(chunk.grammar_bitmask)
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        # a decode with drafts is attended as one decode row a token, each seeing the cache up to itself
        # (the step writes every row's K and V before any row attends): decode steps stay decode-only
        rows = [ScheduledChunk(c.request_id, [t], c.start + j, c.block_ids, c.sample)
                for c in decodes for j, t in enumerate(c.token_ids)]
        meta = AttentionMetadata(
            slot_mapping=as_long(slots),
            decode=self._group(rows, 0),
            prefill=self._group(prefills, len(rows)),
        )
        return ModelInputs(as_long(ids), as_long(positions), self.backend.prepare(meta), as_long(logits_indices),
                           sample_ids, chunk_rows, drafts if any(drafts) else None, bitmasks, not prefills,
                           self._linear_step(decodes, prefills) if self.num_state_slots else None)

    def _linear_step(self, decodes: list[ScheduledChunk], prefills: list[ScheduledChunk]) -> LinearStep:
        """Each sequence's rows, state slot and whether it starts afresh, for the GDN layers."""
        for c in decodes + prefills:
            if not 0 <= c.state_slot < self.num_state_slots:
                raise ValueError(f"request {c.request_id}: state slot {c.state_slot} is outside the "
                                 f"{self.num_state_slots} slots")
            if c.num_draft:
                raise ValueError("speculative decoding does not serve models with linear-attention layers")
        cu = [0]
        for c in prefills:
            cu.append(cu[-1] + len(c.token_ids))
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long, device=self.device)  # noqa: E731
        return LinearStep(len(decodes), as_long([c.state_slot for c in decodes]),
                          torch.tensor([c.start == 0 for c in decodes], dtype=torch.bool, device=self.device),
                          cu, [c.state_slot for c in prefills], [c.start == 0 for c in prefills])

    def _group(self, chunks: list[ScheduledChunk], token_start: int) -> Optional[SequenceGroup]:
        """The attention plan of consecutive chunks of the step."""
        if not chunks:
            return None
        max_blocks = max(len(c.block_ids) for c in chunks)
        tables = torch.tensor([list(c.block_ids) + [0] * (max_blocks - len(c.block_ids)) for c in chunks],
                              dtype=torch.long)
        q_lens = [len(c.token_ids) for c in chunks]
        seq_lens = [c.start + n for c, n in zip(chunks, q_lens)]
        starts = [0]
        for n in q_lens:
            starts.append(starts[-1] + n)
        return SequenceGroup(
            token_start=token_start, token_end=token_start + starts[-1],
            block_tables=tables.to(self.device), seq_lens=torch.tensor(seq_lens, device=self.device),
            query_start_loc=torch.tensor(starts, device=self.device),
            max_query_len=max(q_lens), max_seq_len=max(seq_lens),
            query_lens=tuple(q_lens), context_lens=tuple(c.start for c in chunks),
        )
