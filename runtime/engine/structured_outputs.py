"""Structured outputs, the engine's side: what each constrained request may generate next.

Runs in the scheduler process, where the tokens and the tokenizer are (as vLLM V1's structured output
manager does). A request's ``StructuredOutputsParams`` is checked when it is added (a schema, regex or
grammar that does not parse is a ValueError naming the problem: HTTP 400), compiled on a thread of its
own, off the step loop, and the request is not admitted until its grammar is ready: it waits, and the
batch goes on. Each step the scheduler sends, with each constrained request that samples, the bitmask of
the tokens its grammar allows next; the sampler masks the other logits (``runtime.model.sampling.sampler``), and
the request's matcher takes each token that comes out. With speculative decoding, the drafts are checked
against the grammar ahead of the model (those it forbids are cut off) and each verifying row gets the
bitmask of its own position.

The backend is a seam (``StructuredOutputBackend``): xgrammar's CPU path today; llguidance or outlines-core
would be another class. A grammar's compile costs what its text decides (a 1 MB ``choice`` compiles for
minutes), so xgrammar compiles in a process of its own (``runtime.budgeted_child``) within
``grammar_compile_seconds`` and ``grammar_compile_memory``: one past either is a ValueError, the child
replaced (what it took goes back to the system), and the scheduler refuses the request (HTTP 400) before
admitting it (``prepare``). Compiled grammars cross back serialized and are cached, bounded in bytes and
owned by the backend instance, as is the child's own compiler cache.
"""
from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

from actorserve.runtime.budgeted_child import BudgetedChild, ChildDied, ChildOutOfMemory, ChildTimeout, JobFailed
from actorserve.runtime.engine.sampling_params import StructuredOutputsParams
from actorserve.runtime.text.reasoning_parsers import REASONING_PARSERS

if TYPE_CHECKING:  # torch loads only where a grammar is used: xgrammar fills its bitmasks into a tensor
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
    """xgrammar's grammars and matchers on the CPU; its compiles in a budgeted child process."""

    def __init__(self, tokenizer, vocab_size: int, seconds: float, memory_bytes: int,
                 cache_bytes: int = GRAMMAR_CACHE_BYTES) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.seconds, self.cache_bytes = seconds, cache_bytes
        self._child = BudgetedChild("grammar-compiler", _CompileInChild(self.info.serialize_json(), cache_bytes),
                                    memory_bytes)
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()  # least recently used first
        self._cached_bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def validate(params: StructuredOutputsParams) -> None:
        validate_with_xgrammar(params)

    def compile(self, params: StructuredOutputsParams) -> Any:
        key = (params.kind, _source(params))
        with self._lock:
            if key in self._compiled:
                self._compiled.move_to_end(key)
                return self._compiled[key]
        what = f"structured_outputs.{params.kind}"
        try:
            text = self._child.run(key, self.seconds)
        except ChildTimeout:
            raise ValueError(f"{what} did not compile within {self.seconds:g} s") from None
        except ChildOutOfMemory as exc:
            raise ValueError(f"{what} took {exc} to compile") from None
        except ChildDied:
            raise ValueError(f"the grammar compiler died compiling {what}") from None
        except JobFailed as exc:
            raise ValueError(f"{what} could not be compiled: {exc}") from None
        compiled = self.xgr.CompiledGrammar.deserialize_json(text, self.info)
        self._remember(key, compiled)
        return compiled

    def _remember(self, key: tuple[str, str], compiled: Any) -> None:
        size = int(compiled.memory_size_bytes) + len(key[1])
        with self._lock:
            if key in self._compiled or size > self.cache_bytes:
                return
            self._compiled[key] = compiled
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes:
                old_key, old = self._compiled.popitem(last=False)
                self._cached_bytes -= int(old.memory_size_bytes) + len(old_key[1])

    def matcher(self, compiled: Any) -> "Matcher":
        return _XgrammarMatcher(self.xgr.GrammarMatcher(compiled))

    def close(self) -> None:
        self._child.close()


class _CompileInChild:
    """The compiler process's side: xgrammar's compiler over the tokenizer's table, its own cache bounded."""

    def __init__(self, tokenizer_info_json: str, cache_bytes: int) -> None:
        self.tokenizer_info_json, self.cache_bytes = tokenizer_info_json, cache_bytes
        self.compiler = None

    def prepare(self) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.deserialize_json(self.tokenizer_info_json)
        self.compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True,
                                            cache_limit_bytes=self.cache_bytes)

    def __call__(self, job: tuple[str, str]) -> str:
        kind, source = job
        if kind == "json":
            compiled = self.compiler.compile_json_schema(source)
        elif kind == "json_object":
            compiled = self.compiler.compile_builtin_json_grammar()
        elif kind == "regex":
            compiled = self.compiler.compile_regex(source)
        else:
            compiled = self.compiler.compile_grammar(source)
        return compiled.serialize_json()


def _source(params: StructuredOutputsParams) -> str:
    """What is compiled: the schema, the regex, or the grammar's text ("" for any JSON object)."""
    if params.kind == "json":
        return params.json
    if params.kind == "regex":
        return params.regex
    if params.kind == "json_object":
        return ""
    return _grammar_text(params)


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


class ThinkingGate:
    """A reasoning model's thinking, which the grammar does not constrain: it holds the grammar back until
    the answer writes the end tag (read from the decoded tail of its tokens), as vLLM's reasoning-aware
    structured outputs do."""

    TAIL = 16  # tokens decoded to find the end tag: more than any tokenizer splits it into

    def __init__(self, end: str, decode: Callable[[list[int]], str]) -> None:
        self.end, self.decode = end, decode
        self.thinking = True
        self._tail: list[int] = []

    @staticmethod
    def thinking_at_start(parser: type, prompt_tail: str) -> bool:
        """Whether the answer starts inside a thinking block: the template opened one and did not close it,
        or the format opens it in the prompt (``start_in_prompt``) and the template did not close it (a
        thinking-off template writes an empty block). Where the answer would have to open the block itself,
        the grammar applies from its first token (so it answers without thinking)."""
        opened, closed = prompt_tail.rfind(parser.start), prompt_tail.rfind(parser.end)
        if opened > closed:
            return True
        return closed < 0 and parser.start_in_prompt

    def accept(self, token: int) -> None:
        self._tail = (self._tail + [token])[-self.TAIL:]
        if self.end in self.decode(self._tail):
            self.thinking = False


class GrammarState:
    """One request's grammar: compiling (a future), then a matcher of its own; held back while a reasoning
    model thinks (``gate``)."""

    def __init__(self, future: "Future[Any]", matcher_of: Callable[[Any], Matcher], stop_ids: list[int],
                 gate: Optional[ThinkingGate] = None) -> None:
        self.future, self.matcher_of, self.stop_ids = future, matcher_of, stop_ids
        self.matcher: Optional[Matcher] = None
        self.error: Optional[str] = None
        self.gate = gate

    def thinking(self) -> bool:
        return self.gate is not None and self.gate.thinking

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

    def bitmask(self, vocab_size: int) -> Optional[bytes]:
        """The tokens the grammar allows next; None (any) while the model thinks."""
        if self.thinking():
            return None
        import torch

        words = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)
        if self.matcher is not None:
            self.matcher.fill_bitmask(words)
        else:  # a grammar that passed the check but failed to compile (none known): only a stop token
            for t in self.stop_ids:
                words[t // 32] |= 1 << (t % 32) if t % 32 < 31 else -(1 << 31)
        return words.numpy().tobytes()

    def accept(self, token: int) -> bool:
        if self.thinking():
            self.gate.accept(token)
            return True
        return self.matcher is not None and self.matcher.accept(token)

    def terminated(self) -> bool:
        """The grammar took a stop token: the output is complete, and nothing may follow (even where
        ignore_eos or min_tokens would go on)."""
        return not self.thinking() and self.matcher is not None and self.matcher.is_terminated()

    def draft_bitmasks(self, drafts: list[int], vocab_size: int) -> tuple[list[int], bytes]:
        """For draft tokens (speculative decoding): the longest prefix the grammar takes (up to, not
        including, a token that would end it), and the bitmasks of the rows that verify them, one a row:
        the grammar's state now, then after each kept draft. The matcher is left as it was. None while the
        model thinks: a draft could pass the end of the thinking, where the grammar starts."""
        if self.thinking():
            return [], None
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
    """Checks, compiles (one thread, off the step loop; in the backend's budget) and tracks the grammars of
    the engine's requests."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: Optional[int], compile_seconds: float = 10.0,
                 compile_memory: int = 1 << 30, reasoning_parser: Optional[str] = None) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.reasoning = None if reasoning_parser is None else REASONING_PARSERS[reasoning_parser]
        self.compile_seconds, self.compile_memory = compile_seconds, compile_memory
        self.stop_ids = [] if eos_token_id is None else [eos_token_id]
        # called (from the grammar thread) each time a grammar is compiled: an engine loop that waits for
        # work sets this to wake itself, since a request that waited for its grammar can now be admitted
        self.on_compiled: Optional[Callable[[], None]] = None
        self.backend_class: type = XgrammarBackend
        self._backend: Optional[StructuredOutputBackend] = None
        self._backend_lock = threading.Lock()
        self._pool: Optional[ThreadPoolExecutor] = None

    def validate(self, params: StructuredOutputsParams) -> None:
        if self.tokenizer is None:
            raise ValueError("structured_outputs needs a tokenizer (skip_tokenizer_init is set)")
        self.backend_class.validate(params)

    def prepare(self, params: StructuredOutputsParams) -> "Future[Any]":
        """The request's grammar compiled (on the grammar thread) ahead of its admission: a compile that
        fails or runs past its budget raises there, so the request is refused as a whole (a 400), and the
        samples' own compiles (``start``) then find it cached."""
        return self._submit(params)

    def start(self, params: StructuredOutputsParams, prompt_token_ids: Sequence[int] = ()) -> GrammarState:
        """Compilation begins now, on the grammar thread; ``GrammarState.ready`` says when it is done. With a
        reasoning parser, the grammar waits for the end of the thinking where the answer starts inside it."""
        future = self._submit(params)
        if self.on_compiled is not None:
            callback = self.on_compiled
            future.add_done_callback(lambda _: callback())
        gate = None
        if self.reasoning is not None:
            tail = self.tokenizer.decode(list(prompt_token_ids[-ThinkingGate.TAIL * 4:]))
            if ThinkingGate.thinking_at_start(self.reasoning, tail):
                gate = ThinkingGate(self.reasoning.end, self.tokenizer.decode)
        return GrammarState(future, self._matcher, self.stop_ids, gate)

    def _submit(self, params: StructuredOutputsParams) -> "Future[Any]":
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="actorserve-grammar")
        return self._pool.submit(self._compile, params)

    def _compile(self, params: StructuredOutputsParams) -> Any:
        return self.backend().compile(params)

    def _matcher(self, compiled: Any) -> Matcher:
        return self.backend().matcher(compiled)  # (asked once compiled: the backend exists by then)

    def backend(self) -> StructuredOutputBackend:
        with self._backend_lock:
            if self._backend is None:  # its tokenizer table takes a moment: built on the grammar thread, once
                self._backend = self.backend_class(self.tokenizer, self.vocab_size, self.compile_seconds,
                                                   self.compile_memory)
            return self._backend

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self._backend, "close", None)
        if close is not None:
            close()
