"""Structured outputs, the engine's side: what each constrained request may generate next.

Runs in the scheduler process, where the tokens and the tokenizer are (as vLLM V1's structured output
manager does). A request's ``StructuredOutputsParams`` is checked when it is added (a schema, regex or
grammar that does not parse is a ValueError naming the problem: HTTP 400), compiled on a thread of its
own, off the step loop, and the request is not admitted until its grammar is ready: it waits, and the
batch goes on. Each step the scheduler sends, with each constrained request that samples, the bitmask of
the tokens its grammar allows next; the sampler masks the other logits (``runtime.model.sampler``), and
the request's matcher takes each token that comes out. With speculative decoding, the drafts are checked
against the grammar ahead of the model (those it forbids are cut off) and each verifying row gets the
bitmask of its own position.

The backend is a seam (``StructuredOutputBackend``): xgrammar's CPU path today; llguidance or outlines-core
would be another class. Compiled grammars are cached by the backend's compiler, bounded in bytes and
owned by the instance.
"""
from __future__ import annotations

import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from actorserve.runtime.engine.sampling_params import StructuredOutputsParams

if TYPE_CHECKING:  # torch loads where a grammar is used (the scheduler, the worker), not in the frontend
    import torch

log = logging.getLogger("actorserve")

GRAMMAR_CACHE_BYTES = 64 << 20  # compiled grammars kept by the backend's compiler
INSTALL_HINT = "structured outputs need xgrammar: pip install 'actorserve[structured]'"


class StructuredOutputBackend(Protocol):
    """A backend class: ``validate`` is static (it runs before any tokenizer table is built), the rest
    belongs to an instance made with the tokenizer and the vocabulary size."""

    @staticmethod
    def validate(params: StructuredOutputsParams) -> None:
        """ValueError naming what does not parse; cheap (no tokenizer work)."""

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar (any object ``matcher`` takes); may be slow: runs off the step loop."""

    def matcher(self, compiled: Any) -> "Matcher":
        """A fresh matcher at the grammar's start."""


class Matcher(Protocol):
    def fill_bitmask(self, out: "torch.Tensor") -> None:
        """The allowed next tokens into ``out`` (int32 words, bit j of word i: token 32 i + j)."""

    def accept(self, token: int) -> bool: ...

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (drafts checked ahead of the model)."""

    def is_terminated(self) -> bool: ...


class XgrammarBackend:
    """xgrammar's grammars and matchers on the CPU."""

    def __init__(self, tokenizer, vocab_size: int, cache_bytes: int = GRAMMAR_CACHE_BYTES) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=True,
                                            cache_limit_bytes=cache_bytes)

    @staticmethod
    def validate(params: StructuredOutputsParams) -> None:
        validate_with_xgrammar(params)

    def compile(self, params: StructuredOutputsParams) -> Any:
        kind = params.kind
        if kind == "json":
            return self.compiler.compile_json_schema(params.json)
        if kind == "json_object":
            return self.compiler.compile_builtin_json_grammar()
        if kind == "regex":
            return self.compiler.compile_regex(params.regex)
        return self.compiler.compile_grammar(_grammar_text(params))

    def matcher(self, compiled: Any) -> "Matcher":
        return _XgrammarMatcher(self.xgr.GrammarMatcher(compiled))


class _XgrammarMatcher:
    def __init__(self, matcher) -> None:
        self.m = matcher

    def fill_bitmask(self, out: "torch.Tensor") -> None:
        self.m.fill_next_token_bitmask(out.view(1, -1), 0)

    def accept(self, token: int) -> bool:
        return bool(self.m.accept_token(token))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return bool(self.m.is_terminated())


def validate_with_xgrammar(params: StructuredOutputsParams) -> None:
    """Parse the request's schema, regex or grammar (no tokenizer needed); ValueError with the parser's
    reason where it does not parse, or where xgrammar is not installed."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    kind = params.kind
    try:
        if kind == "json":
            try:
                json.loads(params.json)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured_outputs.json is not valid JSON: {e}") from None
            xgr.Grammar.from_json_schema(params.json)
        elif kind == "regex":
            xgr.Grammar.from_regex(params.regex)
        elif kind in ("grammar", "choice"):
            xgr.Grammar.from_ebnf(_grammar_text(params))
    except RuntimeError as e:  # xgrammar's parse errors: "[time] file:line: reason"
        reason = str(e).strip().splitlines()[0]
        reason = reason.split(": ", 1)[1] if reason.startswith("[") and ": " in reason else reason
        raise ValueError(f"structured_outputs.{kind} is not valid: {reason}") from None


def _grammar_text(params: StructuredOutputsParams) -> str:
    """An EBNF grammar: the request's own, or one alternative per choice (each a JSON-escaped literal)."""
    if params.kind == "choice":
        return "root ::= " + " | ".join(json.dumps(c) for c in params.choice)
    return params.grammar


class GrammarState:
    """One request's grammar: compiling (a future), then a matcher of its own."""

    def __init__(self, future: "Future[Any]", matcher_of: Callable[[Any], Matcher], stop_ids: list[int]) -> None:
        self.future, self.matcher_of, self.stop_ids = future, matcher_of, stop_ids
        self.matcher: Optional[Matcher] = None
        self.error: Optional[str] = None

    def ready(self) -> bool:
        """Compiled, or failed (``error``: the request then may only stop)."""
        if self.matcher is not None or self.error is not None:
            return True
        if not self.future.done():
            return False
        try:
            compiled = self.future.result()
            self.matcher = self.matcher_of(compiled)
        except Exception as e:  # noqa: BLE001 - a compiler's failure ends this request, not the engine
            self.error = f"structured_outputs could not be compiled: {e}"
            log.error("%s; the request ends at once", self.error)
        return True

    def bitmask(self, vocab_size: int) -> bytes:
        import torch

        words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        if self.matcher is not None:
            self.matcher.fill_bitmask(words)
        else:  # a grammar that passed the check but failed to compile (none known): only a stop token
            for t in self.stop_ids:
                words[t // 32] |= 1 << (t % 32) if t % 32 < 31 else -(1 << 31)
        return words.numpy().tobytes()

    def accept(self, token: int) -> bool:
        return self.matcher is not None and self.matcher.accept(token)

    def terminated(self) -> bool:
        """The grammar took a stop token: the output is complete, and nothing may follow (even where
        ignore_eos or min_tokens would go on)."""
        return self.matcher is not None and self.matcher.is_terminated()

    def draft_bitmasks(self, drafts: list[int], vocab_size: int) -> tuple[list[int], bytes]:
        """For draft tokens (speculative decoding): the longest prefix the grammar takes (up to, not
        including, a token that would end it), and the bitmasks of the rows that verify them, one a row:
        the grammar's state now, then after each kept draft. The matcher is left as it was."""
        if self.matcher is None:
            return [], self.bitmask(vocab_size)
        masks, kept = [self.bitmask(vocab_size)], []
        for token in drafts:
            if not self.matcher.accept(token):
                break
            kept.append(token)
            if self.matcher.is_terminated():  # a stop token: the output ends there, nothing to verify after
                break
            masks.append(self.bitmask(vocab_size))
        self.matcher.rollback(len(kept))
        if len(masks) < len(kept) + 1:
            kept.pop()
        return kept, b"".join(masks)


class StructuredOutputManager:
    """Checks, compiles (one thread, off the step loop) and tracks the grammars of the engine's requests."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: Optional[int]) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_ids = [] if eos_token_id is None else [eos_token_id]
        # called (from the grammar thread) each time a grammar is compiled: an engine loop that waits for
        # work sets this to wake itself, since a request that waited for its grammar can now be admitted
        self.on_compiled: Optional[Callable[[], None]] = None
        self.backend_class: type = XgrammarBackend
        self._backend: Optional[StructuredOutputBackend] = None
        self._pool: Optional[ThreadPoolExecutor] = None

    def validate(self, params: StructuredOutputsParams) -> None:
        if self.tokenizer is None:
            raise ValueError("structured_outputs needs a tokenizer (skip_tokenizer_init is set)")
        self.backend_class.validate(params)

    def start(self, params: StructuredOutputsParams) -> GrammarState:
        """Compilation begins now, on the grammar thread; ``GrammarState.ready`` says when it is done."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="actorserve-grammar")
        future = self._pool.submit(self._compile, params)
        if self.on_compiled is not None:
            callback = self.on_compiled
            future.add_done_callback(lambda _: callback())
        return GrammarState(future, self._matcher, self.stop_ids)

    def _compile(self, params: StructuredOutputsParams) -> Any:
        return self.backend().compile(params)

    def _matcher(self, compiled: Any) -> Matcher:
        return self.backend().matcher(compiled)  # (asked once compiled: the backend exists by then)

    def backend(self) -> StructuredOutputBackend:
        if self._backend is None:  # its tokenizer table takes a moment: built on the grammar thread, once
            self._backend = self.backend_class(self.tokenizer, self.vocab_size)
        return self._backend

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def bitmask_to_allowed(bitmask: bytes, vocab_size: int) -> "torch.Tensor":
    """The bool masks [rows, vocab_size] of the tokens each of a chunk's bitmasks allows (the sampler's
    side): one row a bitmask of (vocab_size + 31) // 32 words."""
    import torch

    words = torch.frombuffer(bytearray(bitmask), dtype=torch.int32).view(-1, (vocab_size + 31) // 32)
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()
