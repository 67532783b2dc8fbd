"""llama.cpp as a peer, through llama-cpp-python's C API: the same GGUF, the same token ids, the same
thread count, greedy.

Batched work uses llama.cpp's multi-sequence decode, as its server's slots do: each prompt is its own
sequence, all prompts go in one ``llama_decode`` (logits for each one's last token only), then one
``llama_decode`` per step carries the next token of every sequence. Greedy picks the argmax of each row
(cheaper than llama.cpp's sampler chain, so the peer is not slowed by sampling we do not ask of it).
Install with ``pip install -e .[bench]``.
"""
from __future__ import annotations

import ctypes
import time

import numpy as np


class LlamaCpp:
    def __init__(self, gguf_path: str, threads: int, max_sequences: int, context: int, unified: bool,
                 batch: int = 2048) -> None:
        """``unified``: one KV buffer for all sequences (needed when one sequence may use most of the
        context); else each sequence gets context / max_sequences cells, which llama.cpp advises when
        many sequences share no prefix."""
        import llama_cpp as lc

        self.lc = lc
        self._quiet = lc.llama_log_callback(lambda level, text, user: None)  # kept: C holds the pointer
        lc.llama_log_set(self._quiet, ctypes.c_void_p())
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(gguf_path.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        params = lc.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = context, batch, min(batch, 512)
        params.n_seq_max = max_sequences
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = unified
        self.ctx = lc.llama_init_from_model(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))
        self.batch_size = batch
        self.batch = lc.llama_batch_init(batch, 0, 1)

    @property
    def build(self) -> str:
        """The instruction sets this llama.cpp build uses (``llama_print_system_info``, the flags set)."""
        info = self.lc.llama_print_system_info().decode()
        return " ".join(part.split(":")[-1].split("=")[0].strip() for part in info.split("|")
                        if part.strip().endswith("= 1") and "REPACK" not in part)

    def close(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)

    def generate(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
        """Seconds for all prompts, exactly new_tokens each (the first from the prefill), and the tokens."""
        self.lc.llama_memory_clear(self.lc.llama_get_memory(self.ctx), True)
        start = time.perf_counter()
        entries = [(tok, pos, seq, pos == len(p) - 1) for seq, p in enumerate(prompts) for pos, tok in enumerate(p)]
        first: dict[int, int] = {}
        for lo in range(0, len(entries), self.batch_size):  # the prefill, n_batch tokens a call
            chunk = entries[lo:lo + self.batch_size]
            self._decode(chunk)
            first.update({seq: self._argmax(i) for i, (_, _, seq, wants) in enumerate(chunk) if wants})
        out = [[first[s]] for s in range(len(prompts))]
        lengths = [len(p) for p in prompts]
        for step in range(1, new_tokens):
            self._decode([(out[s][-1], lengths[s] + step - 1, s, True) for s in range(len(prompts))])
            for s in range(len(prompts)):
                out[s].append(self._argmax(s))
        return time.perf_counter() - start, out

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        b = self.batch
        for i, (tok, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        if self.lc.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed (is the context large enough?)")

    def _argmax(self, row: int) -> int:
        ptr = self.lc.llama_get_logits_ith(self.ctx, row)
        return int(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,)).argmax())
