"""Assemble the engine's pieces: load the model (or one stage), size the KV cache, wire core and runner.

``load_worker`` is what a worker does at start-up (in a WorkerActor process, or here); ``build_engine``
puts a whole engine in the caller's process for the offline ``LLM``.
"""
from __future__ import annotations

import logging
import time

from actorserve.kernels import capability
from actorserve.runtime.config import EngineConfig
from actorserve.runtime.engine.core import EngineCore, ModelFacts
from actorserve.runtime.model.loader import LoadedModel, load_model
from actorserve.runtime.model.runner import ModelRunner, kv_bytes_per_block

log = logging.getLogger("actorserve")


def model_facts(loaded: LoadedModel, config: EngineConfig, num_blocks: int) -> ModelFacts:
    tok = loaded.tokenizer
    eos = tok.eos_token_id if tok is not None and tok.eos_token_id is not None else loaded.cfg.eos_token_id
    max_len = config.model.max_model_len or loaded.cfg.max_position_embeddings
    # vocab_size is the embedding rows (load_weights checked the checkpoint against it).
    return ModelFacts(vocab_size=loaded.cfg.vocab_size, eos_token_id=eos,
                      max_model_len=max_len, num_kv_blocks=num_blocks)


def num_kv_blocks(loaded: LoadedModel, config: EngineConfig, per_block: int) -> int:
    budget = config.cache.resolved_kv_cache_memory()
    max_len = config.model.max_model_len or loaded.cfg.max_position_embeddings
    # More than every sequence at full length can never be used.
    useful = config.scheduler.max_num_seqs * -(-max_len // config.cache.block_size)
    return max(0, min(budget // per_block, useful))


def load_worker(config: EngineConfig, with_tokenizer: bool, pp_rank: int = 0,
                ) -> tuple[ModelRunner, ModelFacts, LoadedModel]:
    """Load the weights (of one pipeline stage), size and allocate the KV cache: a worker's start-up.

    Every stage sizes the pool as if it held all layers, so that all stages (and PP=1) agree on the
    number of blocks; a stage then allocates them for its own layers only."""
    m = config.model
    max_len = m.max_model_len
    paths = config.device.resolve()
    capability.use(paths)  # before any kernel is built or weight prepacked
    started = time.perf_counter()
    loaded = load_model(m.model, m.dtype, max_positions=max_len, tokenizer=m.tokenizer,
                        skip_tokenizer=m.skip_tokenizer_init or not with_tokenizer, pp_rank=pp_rank,
                        pp_size=config.parallel.pipeline_parallel_size, quantization=m.quantization)
    if max_len is not None and max_len > loaded.cfg.max_position_embeddings:
        raise ValueError(f"max_model_len {max_len} exceeds the model's context length "
                         f"{loaded.cfg.max_position_embeddings}")
    loaded_at = time.perf_counter()
    per_block = kv_bytes_per_block(loaded.cfg, config.cache.block_size, loaded.model.dtype)
    blocks = num_kv_blocks(loaded, config, per_block)
    runner = ModelRunner(loaded.model, blocks, config.cache.block_size, seed=m.seed, fast_decode=not m.enforce_eager)
    log.info("%s; decode fast path: %s", paths.describe(), "on" if runner.fast_decode is not None else "off")
    log.info("model loaded in %.2f s; KV cache: %d blocks of %d tokens (%d tokens, %.1f MiB), allocated in %.2f s",
             loaded_at - started, blocks, config.cache.block_size, blocks * config.cache.block_size,
             blocks * per_block / 2**20, time.perf_counter() - loaded_at)
    return runner, model_facts(loaded, config, blocks), loaded


def build_engine(config: EngineConfig) -> tuple[EngineCore, LoadedModel]:
    runner, facts, loaded = load_worker(config, with_tokenizer=True)
    return EngineCore(config, runner, facts, loaded.tokenizer), loaded
