"""The offline API, vLLM-compatible: ``LLM(model).generate(prompts, params)`` and ``LLM.chat``.

Runs the engine in the caller's process and returns outputs in input order.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Optional, Sequence, Union

from actorserve.runtime.resolve import engine_config
from actorserve.runtime.engine.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from actorserve.runtime.engine.outputs import RequestOutput
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.background import BackgroundEngine
from actorserve.runtime.engine.sleep import check_level, check_tags
from actorserve.runtime.errors import EngineSleepingError
from actorserve.runtime.inprocess import build_engine
from actorserve.runtime.logs import setup_logging
from actorserve.runtime.text.chat_template import render
from actorserve.runtime.model.loader import resolve_model_path
from actorserve.runtime.text.tokenizer import load_tokenizer

PromptType = Union[str, dict[str, Any]]


class LLM:
    """With one pipeline stage and one replica the engine runs in this process; otherwise (or on Ray) in
    supervised processes (an AsyncEngine, or data-parallel replicas, on a background loop)."""

    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        engine_args.setdefault("disable_log_stats", True)  # an offline run has its progress bar (as vLLM)
        self.config = engine_config(model, **engine_args)
        setup_logging(self.config.runtime.log_level)
        self._ids = itertools.count()
        self.engine = None
        self._background = None
        parallel = self.config.parallel
        if (parallel.pipeline_parallel_size == 1 and parallel.data_parallel_size == 1
                and parallel.distributed_executor_backend == "mp"):
            self.engine, loaded = build_engine(self.config)
            self._tokenizer = loaded.tokenizer
        else:
            self._tokenizer = None if self.config.model.skip_tokenizer_init else load_tokenizer(
                self.config.model.tokenizer or resolve_model_path(self.config.model.model))
            self._background = BackgroundEngine(self.config)

    def get_tokenizer(self):
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return self.engine.facts.vocab_size if self.engine is not None else self._background.info["vocab_size"]

    def close(self) -> None:
        """Stop the engine's processes (pipeline parallel); an in-process engine needs nothing."""
        if self._background is not None:
            self._background.close()
            self._background = None

    # -- sleep mode (vLLM's API) ------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Give back the KV cache's and the weights' memory until ``wake_up``: level 1 keeps a backing copy
        of the weights (a file), level 2 discards them and wake-up loads them from the checkpoint again.
        Needs ``enable_sleep_mode=True``."""
        check_level(level)
        if self._background is not None:
            return self._background.call(self._background.engine.sleep(level))
        mode = self._sleep_mode()
        if not mode.sleeping:
            self.engine.sleep()
            mode.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore ``tags`` ("weights", "kv_cache"; None: both); generation works again once both are back."""
        check_tags(tags)
        if self._background is not None:
            return self._background.call(self._background.engine.wake_up(tags))
        mode = self._sleep_mode()
        mode.wake_up(tags)
        if not mode.sleeping:
            self.engine.wake_up()

    def is_sleeping(self) -> bool:
        if self._background is not None:
            return self._background.call(self._background.engine.is_sleeping())
        return self._sleep_mode().sleeping

    def _sleep_mode(self):
        mode = self.engine.executor.sleep_mode
        if mode is None:
            raise ValueError("sleep mode is off: make the LLM with enable_sleep_mode=True")
        return mode

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
        facts = self.engine.facts if self.engine is not None else None
        eos = facts.eos_token_id if facts is not None else self._background.info.get("eos_token_id")
        max_len = facts.max_model_len if facts is not None else self._background.info["max_model_len"]
        search = BeamSearch(inputs, params, eos, max_len)
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
        if self._background is not None:
            return self._run_background(inputs, params, use_tqdm)
        ids = [f"offline-{next(self._ids)}" for _ in inputs]
        added = []
        try:
            for rid, (text, token_ids), p in zip(ids, inputs, params):
                self.engine.add_request(rid, token_ids, p, prompt=text)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            raise
        return self._drain(ids, use_tqdm)

    def _run_background(self, inputs, params, use_tqdm: bool) -> list[RequestOutput]:
        progress = _Progress(len(inputs), use_tqdm)
        try:
            requests = [({"prompt_token_ids": ids, "prompt": text}, p) for (text, ids), p in zip(inputs, params)]
            return self._background.run(requests, progress.done)
        finally:
            progress.close()

    def _drain(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        progress = _Progress(len(ids), use_tqdm)
        try:
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.finished and out.request_id not in done:
                        done[out.request_id] = out
                        progress.done(out)
        except BaseException:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        finally:
            progress.close()
        return [done[rid] for rid in ids]


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
