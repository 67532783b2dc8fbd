"""The offline API, vLLM-compatible: ``LLM(model).generate(prompts, params)`` and ``LLM.chat``.

Runs the engine in the caller's process and returns outputs in input order.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Optional, Sequence, Union

from runtime.config import EngineConfig
from runtime.engine.outputs import RequestOutput
from runtime.engine.sampling_params import SamplingParams
from runtime.inprocess import build_engine

PromptType = Union[str, dict[str, Any]]


class LLM:
    def __init__(self, model: Optional[str] = None, **engine_args: Any) -> None:
        self.config = EngineConfig.from_engine_args(model, **engine_args)
        self.engine, self._loaded = build_engine(self.config)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self._loaded.tokenizer

    @property
    def vocab_size(self) -> int:
        return self.engine.facts.vocab_size

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params = _per_prompt(sampling_params, len(prompts))
        inputs = [self._to_token_ids(p) for p in prompts]
        return self._run(inputs, params, use_tqdm)

    def chat(self, messages, sampling_params=None, use_tqdm: bool = True, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template: Optional[str] = None) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them, through the chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self._require_tokenizer()
        prompts = []
        for conv in conversations:
            text = tok.apply_chat_template(conv, tokenize=False, chat_template=chat_template,
                                           add_generation_prompt=add_generation_prompt and not continue_final_message,
                                           continue_final_message=continue_final_message)
            prompts.append({"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm)

    def _require_tokenizer(self):
        tok = self._loaded.tokenizer
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

    def _drain(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = _progress(len(ids)) if use_tqdm else None
        start, in_toks, out_toks = time.perf_counter(), 0, 0
        try:
            while len(done) < len(ids):
                for out in self.engine.step():
                    if out.finished and out.request_id not in done:
                        done[out.request_id] = out
                        in_toks += len(out.prompt_token_ids)
                        out_toks += sum(len(o.token_ids) for o in out.outputs)
                        if bar is not None:
                            elapsed = max(time.perf_counter() - start, 1e-9)
                            bar.set_postfix_str(f"in {in_toks / elapsed:.1f} tok/s, out {out_toks / elapsed:.1f} tok/s")
                            bar.update(1)
        except BaseException:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
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


def _progress(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
