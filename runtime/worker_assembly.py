"""The worker assembly: load the model (or one pipeline stage) and its draft, size and allocate the KV cache,
build the runner, each part from its own sub-config.

``load_worker`` is what every worker does at start-up (a WorkerActor, in a child process, a Ray actor or on
the caller's loop); ``build_engine`` puts a whole engine, core and runner, in the caller's process for the
offline ``LLM``.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

import torch

from actorserve.kernels import capability
from actorserve.runtime.config import CacheConfig, EngineConfig, SchedulerConfig, SpeculativeConfig
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.model.execution.cuda_graphs import capture_sizes
from actorserve.runtime.model.execution.draft_proposer import DraftModelProposer
from actorserve.runtime.model.architectures.linear_attention import LinearLayerState
from actorserve.runtime.model.weights.loader import LoadedModel, load_model
from actorserve.runtime.model_files import resolve_model_path
from actorserve.runtime.model.execution.runner import ModelRunner, kv_bytes_per_block
from actorserve.runtime.model.memory.sleep_mode import SleepMode

log = logging.getLogger("actorserve")


def model_facts(loaded: LoadedModel, scheduler: SchedulerConfig, num_blocks: int, max_len: int) -> ModelFacts:
    tok = loaded.tokenizer
    eos = tok.eos_token_id if tok is not None and tok.eos_token_id is not None else loaded.cfg.eos_token_id
    # vocab_size is the embedding rows (load_weights checked the checkpoint against it).
    spec = scheduler.speculative_config
    # (a draft model keeps its own keys on the same blocks, whatever window the target has)
    frees = loaded.cfg.all_layers_windowed and not (spec is not None and spec.method == "draft_model")
    return ModelFacts(vocab_size=loaded.cfg.vocab_size, eos_token_id=eos,
                      max_model_len=max_len, num_kv_blocks=num_blocks,
                      sliding_window=loaded.cfg.sliding_window if frees else None,
                      num_state_slots=state_slots(loaded, scheduler))


def state_slots(loaded: LoadedModel, scheduler: SchedulerConfig) -> int:
    """Recurrent-state slots for a hybrid model: one for each request that may run at once."""
    return scheduler.max_num_seqs if loaded.cfg.linear_layers else 0


def num_kv_blocks(loaded: LoadedModel, cache: CacheConfig, scheduler: SchedulerConfig, max_len: int,
                  per_block: int, reserved: int = 0) -> int:
    """Blocks of ``per_block`` bytes in the KV budget, less ``reserved`` (a hybrid model's state slots)."""
    budget, source = cache.kv_cache_budget()
    if reserved:
        if reserved >= budget:
            raise ValueError(f"the recurrent states of {scheduler.max_num_seqs} sequences take "
                             f"{reserved / 2**20:.1f} MiB, the whole KV cache budget ({budget / 2**20:.1f} MiB): "
                             f"lower max_num_seqs or raise kv_cache_memory")
        log.info("recurrent-state slots take %.1f MiB of the KV cache budget", reserved / 2**20)
        budget -= reserved
    # More than every sequence at full length can never be used.
    useful = scheduler.max_num_seqs * -(-max_len // cache.block_size)
    # (a model without softmax-attention layers keeps no keys: its blocks are bookkeeping and cost nothing)
    blocks = max(0, min(budget // per_block, useful)) if per_block else useful
    log.info("KV cache budget %.2f GiB (%s)%s", budget / 2**30, source,
             f"; {blocks} blocks hold every sequence at full length" if blocks == useful else "")
    return blocks


def load_worker(config: EngineConfig, with_tokenizer: bool, pp_rank: int = 0,
                ) -> tuple[ModelRunner, ModelFacts, LoadedModel]:
    """Load the weights (of one pipeline stage), size and allocate the KV cache: a worker's start-up.

    Every stage sizes the pool as if it held all layers, so that all stages (and PP=1) agree on the
    number of blocks; a stage then allocates them for its own layers only."""
    m = config.model
    max_len = m.max_model_len
    paths = capability.paths_for(config.device)
    device = config.device.torch_device(pp_rank)
    capability.use(paths)  # before any kernel is built or weight prepacked
    if paths.isa != paths.hardware_isa and (above := capability.libraries_above(paths.isa)):
        log.warning("CPU override %s: torch's %s in this process ran before the override and stay above it; "
                    "start the process with %s to emulate the lesser CPU whole", paths.isa, " and ".join(above),
                    " ".join(f"{k}={v}" for k, v in capability.library_env(paths.isa, paths.hardware_isa).items()))
    started, resident = time.perf_counter(), _resident_bytes()
    path = resolve_model_path(m.model)
    log.info("loading %s (%.1f MiB)%s", path, _size(path) / 2**20,
             f", pipeline stage {pp_rank + 1} of {config.parallel.pipeline_parallel_size}"
             if config.parallel.pipeline_parallel_size > 1 else "")
    load = lambda skip_tokenizer: load_model(  # noqa: E731
        m.model, m.dtype, max_positions=max_len, tokenizer=m.tokenizer, skip_tokenizer=skip_tokenizer, pp_rank=pp_rank,
        pp_size=config.parallel.pipeline_parallel_size, quantization=m.quantization, device=device)
    loaded = load(m.skip_tokenizer_init or not with_tokenizer)
    if max_len is not None and max_len > loaded.cfg.max_position_embeddings:
        raise ValueError(f"max_model_len {max_len} exceeds the model's context length "
                         f"{loaded.cfg.max_position_embeddings}")
    context_len = max_len or loaded.cfg.max_position_embeddings
    loaded_at = time.perf_counter()
    log.info("weights loaded in %.2f s: %.1f M parameters in %s%s, resident memory +%.1f MiB", loaded_at - started,
             loaded.model.num_parameters() / 1e6, str(loaded.model.dtype).removeprefix("torch."),
             f", {m.quantization}" if m.quantization else "", (_resident_bytes() - resident) / 2**20)
    spec = config.scheduler.speculative_config
    draft = _load_draft(spec, loaded, context_len, device)
    kv_dtype = kv_cache_dtype(config.cache, loaded.model.dtype)  # (the draft model's too: the same dtype)
    per_block = kv_bytes_per_block(loaded.cfg, config.cache.block_size, kv_dtype)
    if draft is not None:  # its cache has as many blocks, addressed by the same block tables
        per_block += kv_bytes_per_block(draft.cfg, config.cache.block_size, kv_dtype)
    slots = state_slots(loaded, config.scheduler)
    blocks = num_kv_blocks(loaded, config.cache, config.scheduler, context_len, per_block,
                           slots * len(loaded.cfg.linear_layers)
                           * LinearLayerState.bytes_per_slot(loaded.cfg, loaded.model.dtype))
    drafter = None
    if draft is not None:
        drafter = DraftModelProposer(ModelRunner(draft.model, blocks, config.cache.block_size, device=device,
                                                 fast_decode=not m.enforce_eager,
                                                 attention_backend=config.device.attention_backend,
                                                 kv_cache_dtype=kv_dtype), seed=m.seed)
    d, s = config.device, config.scheduler
    graph_sizes = capture_sizes(s.max_num_seqs, s.max_num_batched_tokens, d.max_cudagraph_capture_size,
                                d.cudagraph_capture_sizes)
    runner = ModelRunner(loaded.model, blocks, config.cache.block_size, seed=m.seed, fast_decode=not m.enforce_eager,
                         drafter=drafter, device=device, attention_backend=d.attention_backend,
                         graph_sizes=graph_sizes, num_state_slots=slots, kv_cache_dtype=kv_dtype)
    runner.capture_graphs()
    if config.runtime.enable_sleep_mode:
        def reload() -> list:
            target = load(True)
            redrafted = [_load_draft(spec, target, context_len, device).model] if draft is not None else []
            return [target.model] + redrafted

        runner.sleep_mode = SleepMode(runner, reload)
    log.info("%s; decode fast path: %s", paths.describe(), "on" if runner.fast_decode is not None else "off")
    log.info("KV cache: %d blocks of %d tokens (%d tokens, %.1f MiB, %s), allocated in %.2f s",
             blocks, config.cache.block_size, blocks * config.cache.block_size,
             blocks * per_block / 2**20, str(kv_dtype).removeprefix("torch."), time.perf_counter() - loaded_at)
    return runner, model_facts(loaded, config.scheduler, blocks, context_len), loaded


def kv_cache_dtype(cache: CacheConfig, model_dtype: torch.dtype) -> torch.dtype:
    """What a model of ``model_dtype`` keeps its K and V in under ``--kv-cache-dtype``."""
    return model_dtype if cache.kv_cache_dtype == "auto" else getattr(torch, cache.kv_cache_dtype)


def _load_draft(spec: Optional[SpeculativeConfig], target: LoadedModel, max_len: int,
                device: str) -> Optional[LoadedModel]:
    """The draft model of speculative decoding's draft_model method, in the target's dtype, on the target's
    device; ValueError where it cannot draft for this target."""
    if spec is None or spec.method != "draft_model":
        return None
    draft = load_model(spec.model, str(target.model.dtype).removeprefix("torch."), skip_tokenizer=True,
                       quantization=spec.quantization, device=device)
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError(f"the draft model {spec.model} has a vocabulary of {draft.cfg.vocab_size} tokens, the "
                         f"target {target.cfg.vocab_size}: a draft model must share the target's tokenizer")
    if draft.cfg.max_position_embeddings < max_len:
        raise ValueError(f"the draft model {spec.model} takes {draft.cfg.max_position_embeddings} positions, "
                         f"fewer than max_model_len {max_len}: lower --max-model-len")
    log.info("draft model %s: %.1f M parameters, %d speculative tokens a step", draft.path,
             draft.model.num_parameters() / 1e6, spec.num_speculative_tokens)
    return draft


def _resident_bytes() -> int:
    """This process's resident memory (Linux; 0 elsewhere): what loading the weights added to it."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _size(path: str) -> int:
    """A file's size, or a directory's files' together."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    return os.path.getsize(path)


def build_engine(config: EngineConfig) -> tuple[EngineCore, LoadedModel]:
    runner, facts, loaded = load_worker(config, with_tokenizer=True)
    return EngineCore(config, runner, facts, loaded.tokenizer), loaded
