"""The offline API, vLLM-compatible: ``LLM(model).generate(prompts, params)`` and ``LLM.chat``.

Drives the engine from synchronous code (``runtime.sync_engine``) and returns outputs in input order.
"""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence, Union

from actorserve.runtime.engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.engine.sleep import check_level, check_tags
from actorserve.runtime.errors import EngineSleepingError
from actorserve.runtime.logs import setup_logging
from actorserve.runtime.model_files import resolve_model_path
from actorserve.runtime.resolve import engine_config
from actorserve.runtime.sync_engine import SyncEngine, sync_engine
from actorserve.runtime.text.chat_template import render
from actorserve.runtime.text.tokenizer import load_tokenizer

PromptType = Union[str, dict[str, Any]]


class LLM:
    """With one pipeline stage and one replica the engine runs in this process; otherwise (or on Ray) in
    supervised processes (an AsyncEngine, or data-parallel replicas, on a background loop): the one
    ``SyncEngine`` that ``runtime.sync_engine`` picks for the config."""

    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        engine_args.setdefault("disable_log_stats", True)  # an offline run has its progress bar (as vLLM)
        self.config = engine_config(model, **engine_args)
        setup_logging(self.config.runtime.log_level)
        self._sync: SyncEngine = sync_engine(self.config)
        self._tokenizer = getattr(self._sync, "tokenizer", None)
        if self._tokenizer is None and not self.config.model.skip_tokenizer_init:
            self._tokenizer = load_tokenizer(self.config.model.tokenizer or resolve_model_path(self.config.model.model))

    @property
    def engine(self):
        """The engine core, where it runs in this process (None where it runs in the engine's processes)."""
        return getattr(self._sync, "core", None)

    def get_tokenizer(self):
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self._sync.info["vocab_size"]

    def close(self) -> None:
        """Stop the engine's processes (pipeline or data parallel); an in-process engine needs nothing."""
        self._sync.close()

    # -- sleep mode (vLLM's API) ------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Give back the KV cache's and the weights' memory until ``wake_up``: level 1 keeps a backing copy
        of the weights (a file), level 2 discards them and wake-up loads them from the checkpoint again.
        Needs ``enable_sleep_mode=True``."""
        check_level(level)
        self._sync.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore ``tags`` ("weights", "kv_cache"; None: both); generation works again once both are back."""
        check_tags(tags)
        self._sync.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self._sync.is_sleeping()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = _per_prompt(sampling_params, len(prompts))
        inputs = [self._to_token_ids(p) for p in prompts]
        return self._run(inputs, params, use_tqdm)

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template: Optional[str] = None,
             chat_template_kwargs: Optional[dict[str, Any]] = None, tools: Optional[list] = None,
             documents: Optional[list] = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them, through the chat template.
        Content may be a string or a list of text parts, as the HTTP server takes it; continuing the
        final message leaves out the generation prompt."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self._require_tokenizer()
        prompts = []
        for conv in conversations:
            text, ids = render(tok, conv, add_generation_prompt and not continue_final_message, continue_final_message,
                               chat_template, tools, documents, chat_template_kwargs)
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm)

    def beam_search(self, prompts: Union[PromptType, Sequence[PromptType]], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """vLLM's beam search (runtime/engine/beam_search.py): each prompt's ``params.beam_width`` best
        sequences, best first. Each step is one ``generate`` of every live beam, one token further."""
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        inputs = [self._to_token_ids(p)[1] for p in prompts]
        search = BeamSearch(inputs, params, self._sync.info.get("eos_token_id"), self._sync.info["max_model_len"])
        step = params.step_params()
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=params.max_tokens, desc="Beam search", unit="token", dynamic_ncols=True)
        try:
            while batch := search.pending():
                outs = self.generate([{"prompt_token_ids": ids} for ids in batch], step, use_tqdm=False)
                search.advance([out.outputs[0].logprobs[0] for out in outs])
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        tok = self._tokenizer
        return search.results(tok.decode if tok is not None else None)

    def _require_tokenizer(self):
        tok = self._tokenizer
        if tok is None:
            raise ValueError("this needs a tokenizer, and the engine was started with skip_tokenizer_init=True")
        return tok

    def _to_token_ids(self, prompt: PromptType) -> tuple[Optional[str], list[int]]:
        if isinstance(prompt, str):
            return prompt, self._require_tokenizer().encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], self._require_tokenizer().encode(prompt["prompt"])
        raise ValueError(f"prompt must be a string or a dict with 'prompt' or 'prompt_token_ids', got {prompt!r}")

    def _run(self, inputs, params: list[SamplingParams], use_tqdm: bool) -> list[RequestOutput]:
        if self.config.runtime.enable_sleep_mode and self.is_sleeping():  # (nothing would wake it while this waits)
            raise EngineSleepingError("the engine is asleep: call wake_up() before generate()")
        progress = _Progress(len(inputs), use_tqdm)
        try:
            return self._sync.run([(text, ids, p) for (text, ids), p in zip(inputs, params)], progress.done)
        finally:
            progress.close()


def _per_prompt(sampling_params, count: int) -> list[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    params = list(sampling_params)
    if len(params) != count:
        raise ValueError(f"got {len(params)} sampling_params for {count} prompts")
    return params


class _Progress:
    """The tqdm bar of finished prompts, with input and output tokens per second."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
        self.start, self.in_toks, self.out_toks = time.perf_counter(), 0, 0

    def done(self, out: RequestOutput) -> None:
        self.in_toks += len(out.prompt_token_ids)
        self.out_toks += sum(len(o.token_ids) for o in out.outputs)
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(f"in {self.in_toks / elapsed:.1f} tok/s, out {self.out_toks / elapsed:.1f} tok/s")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
