"""Structured outputs, the engine's side: the parameters' checks, the bitmask's bit order, and a request
whose grammar is still compiling waits without holding up the batch."""
import threading

import pytest
import torch

from actorserve.runtime.engine.sampling_params import SamplingParams, StructuredOutputsParams
from actorserve.runtime.engine.structured_outputs import (GrammarState, StructuredOutputManager,
                                                          validate_with_xgrammar)
from actorserve.runtime.model.sampling.sampler import bitmask_to_allowed
from tests.runtime.engine.test_scheduler import expected, make_engine

xgrammar = pytest.importorskip("xgrammar")


def test_exactly_one_constraint_and_its_shapes():
    p = StructuredOutputsParams(json={"type": "object"})
    assert p.kind == "json" and p.json == '{"type": "object"}' and p.to_dict() == {"json": '{"type": "object"}'}
    assert StructuredOutputsParams.of({"choice": ["a", "b"]}).kind == "choice"
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs.regex == "a+"
    for bad, why in [({}, "exactly one"), ({"regex": "a", "grammar": "b"}, "exactly one"), ({"choice": []}, "choice"),
                     ({"choice": ["a", 3]}, "choice"), ({"regex": ""}, "regex"), ({"bogus": 1}, "unknown keys"),
                     ({"json_object": "yes"}, "json_object")]:
        with pytest.raises(ValueError, match=why):
            StructuredOutputsParams.of(bad)


@pytest.mark.parametrize("params,why", [
    ({"json": '{"type": "objectx"}'}, "objectx"), ({"json": "{oops"}, "not valid JSON"),
    ({"regex": "(a"}, "regex is not valid"), ({"grammar": "root ::= "}, "grammar is not valid"),
])
def test_what_does_not_parse_is_a_value_error_naming_it(params, why):
    with pytest.raises(ValueError, match=why):
        validate_with_xgrammar(StructuredOutputsParams.of(params))


def test_the_bitmask_bit_order_is_xgrammars():
    words = torch.zeros(3, dtype=torch.int32)
    for t in (0, 31, 32, 70):
        words[t // 32] |= (1 << (t % 32)) if t % 32 < 31 else -(1 << 31)
    allowed = bitmask_to_allowed(words.numpy().tobytes() * 2, 80)  # two rows' bitmasks, one after the other
    assert allowed.shape == (2, 80) and allowed[1].nonzero().view(-1).tolist() == [0, 31, 32, 70]


class _AllowAll:
    def fill_bitmask(self, out):
        out.fill_(-1)

    def accept(self, token):
        return True

    def rollback(self, num_tokens):
        pass

    def is_terminated(self):
        return False


class _GatedBackend:
    """Compiles only once the test opens the gate; its matchers allow every token."""

    def __init__(self):
        self.gate = threading.Event()

    def compile(self, params):
        assert self.gate.wait(30)
        return "compiled"

    def matcher(self, compiled):
        return _AllowAll()


def test_a_request_whose_grammar_is_compiling_waits_and_the_batch_goes_on(monkeypatch):
    engine, _ = make_engine()
    backend = _GatedBackend()
    manager = StructuredOutputManager(object(), 1000, None)
    monkeypatch.setattr(manager, "backend", lambda: backend)
    monkeypatch.setattr(manager, "validate", lambda params: None)
    woken = threading.Event()
    manager.on_compiled = woken.set
    engine.structured = manager
    engine.add_request("constrained", [5, 6, 7], SamplingParams(max_tokens=4, structured_outputs={"regex": "a"}))
    engine.add_request("free", [1, 2, 3], SamplingParams(max_tokens=4))
    done = {}
    for _ in range(6):  # the free request runs to its end while the grammar compiles
        for out in engine.step():
            done[out.request_id] = out
    assert "free" in done and done["free"].outputs[0].token_ids == expected([1, 2, 3], 4)
    assert "constrained" not in done and engine.scheduler.requests["constrained"].num_computed_tokens == 0
    backend.gate.set()
    assert woken.wait(10)  # the engine loop is told, so that it schedules again
    while engine.has_unfinished_requests():
        for out in engine.step():
            done[out.request_id] = out
    assert done["constrained"].outputs[0].token_ids == expected([5, 6, 7], 4)


def test_a_failed_compile_lets_the_request_only_stop():
    from concurrent.futures import Future

    future = Future()
    future.set_exception(RuntimeError("boom"))
    state = GrammarState(future, None, [2])
    assert state.ready() and "boom" in state.error
    allowed = bitmask_to_allowed(state.bitmask(40), 40)
    assert allowed[0].nonzero().view(-1).tolist() == [2]


def test_drafts_are_cut_where_the_grammar_forbids_them_and_each_row_gets_its_mask():
    """With a real matcher over the model's tokenizer: a regex of digits takes "1" "2" but not "x"; the
    rows' masks are the state before each kept draft, and the matcher is left where it was."""
    from actorserve.runtime.model.weights.loader import load_tokenizer
    from actorserve.runtime.model_files import resolve_model_path

    tok = load_tokenizer(resolve_model_path(None))
    manager = StructuredOutputManager(tok, 49152, 2)
    state = manager.start(StructuredOutputsParams(regex="[0-9]+"))
    state.future.result(timeout=60)
    assert state.ready() and state.matcher is not None
    one, two, x = (tok.convert_tokens_to_ids(t) for t in ("1", "2", "x"))
    kept, masks = state.draft_bitmasks([one, two, x, one], 49152)
    assert kept == [one, two]
    allowed = bitmask_to_allowed(masks, 49152)
    assert allowed.shape == (3, 49152) and all(bool(allowed[j, one]) and not bool(allowed[j, x]) for j in range(3))
    assert not bool(allowed[0, 2])  # nothing yet: the stop token is not allowed before a digit
    assert bool(allowed[1, 2])  # after "1" the output may end
    assert torch.equal(bitmask_to_allowed(state.bitmask(49152), 49152)[0], allowed[0])  # rolled back
    manager.close()


def _big_choice() -> StructuredOutputsParams:
    """1 MB of alternatives, as many and as long as a request may give (1024 of 1000 characters): a grammar
    that compiled for minutes on the one grammar thread."""
    return StructuredOutputsParams(choice=[big_choice_text(i) for i in range(1024)])


def big_choice_text(i: int) -> str:
    return (f"option {i}: " + " ".join(f"w{(i * 7919 + j) % 100003}" for j in range(200)))[:1000]


@pytest.fixture(scope="module")
def tokenizer():
    from actorserve.runtime.model.weights.loader import load_tokenizer
    from actorserve.runtime.model_files import resolve_model_path

    return load_tokenizer(resolve_model_path(None))


def test_a_compile_past_its_time_budget_is_a_value_error_and_the_next_compiles(tokenizer):
    """The compile runs in the budgeted child: past its seconds the child is killed, the request's compile
    is a ValueError (the scheduler's 400), and a fresh child serves the next grammar, whose matcher works."""
    import time

    manager = StructuredOutputManager(tokenizer, 49152, 2, compile_seconds=2.0)
    try:
        manager.prepare(StructuredOutputsParams(regex="[0-9]+")).result(timeout=120)  # (the child started)
        start = time.monotonic()
        with pytest.raises(ValueError, match="did not compile within 2 s"):
            manager.prepare(_big_choice()).result(timeout=60)
        assert time.monotonic() - start < 10
        state = manager.start(StructuredOutputsParams(regex="[a-c]+"))
        state.future.result(timeout=120)
        assert state.ready() and state.matcher is not None
        a, x = tokenizer.convert_tokens_to_ids("a"), tokenizer.convert_tokens_to_ids("x")
        allowed = bitmask_to_allowed(state.bitmask(49152), 49152)[0]
        assert bool(allowed[a]) and not bool(allowed[x])
    finally:
        manager.close()


def test_the_child_compiles_what_xgrammar_compiles_here(tokenizer):
    """A grammar compiled in the child and deserialized gives the masks of one compiled in this process."""
    schema = '{"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}'
    manager = StructuredOutputManager(tokenizer, 49152, 2)
    try:
        state = manager.start(StructuredOutputsParams(json=schema))
        state.future.result(timeout=120)
        assert state.ready() and state.matcher is not None
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=49152)
        local = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_json_schema(schema))
        ids = tokenizer.encode('{"age": 4', add_special_tokens=False)
        for token in [None, *ids]:
            if token is not None:
                assert state.accept(token) and local.accept_token(token)
            words = torch.zeros((49152 + 31) // 32, dtype=torch.int32)
            local.fill_next_token_bitmask(words.view(1, -1), 0)
            assert state.bitmask(49152) == words.numpy().tobytes()
    finally:
        manager.close()


def _digits_after_thinking(tok, prompt: str):
    manager = StructuredOutputManager(tok, 49152, 2, reasoning_parser="deepseek_r1")
    state = manager.start(StructuredOutputsParams(regex="[0-9]+"), tok.encode(prompt))
    state.future.result(timeout=60)
    assert state.ready()
    return manager, state


def test_with_a_reasoning_parser_the_grammar_waits_for_the_end_of_the_thinking(tokenizer):
    """deepseek_r1: the answer starts inside the thinking (its template opens it); the grammar allows any
    token (no mask, no drafts) until the answer writes </think>, then constrains what follows."""
    tok = tokenizer
    manager, state = _digits_after_thinking(tok, "<|im_start|>assistant\n<think>\n")
    x, one = tok.convert_tokens_to_ids("x"), tok.convert_tokens_to_ids("1")
    for token in tok.encode("x is 2, so"):
        assert state.bitmask(49152) is None and state.draft_bitmasks([x], 49152) == ([], None)
        assert state.accept(token) and not state.terminated()
    for token in tok.encode("</think>"):
        state.accept(token)
    allowed = bitmask_to_allowed(state.bitmask(49152), 49152)[0]
    assert bool(allowed[one]) and not bool(allowed[x])  # the answer: digits only
    assert state.accept(one) and not state.accept(x)
    manager.close()


@pytest.mark.parametrize("prompt,thinking", [
    ("<|im_start|>assistant\n", True),  # deepseek_r1: its template opens the block (or the answer does)
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # a thinking-off template closed it
])
def test_a_block_the_template_closed_leaves_the_grammar_on_from_the_start(tokenizer, prompt, thinking):
    manager, state = _digits_after_thinking(tokenizer, prompt)
    assert (state.bitmask(49152) is None) == thinking
    manager.close()


def test_formats_the_answer_opens_itself_are_constrained_unless_the_prompt_opened_the_block():
    from actorserve.runtime.engine.structured_outputs import ThinkingGate
    from actorserve.runtime.text.reasoning_parsers import REASONING_PARSERS

    qwen3 = REASONING_PARSERS["qwen3"]
    assert not ThinkingGate.thinking_at_start(qwen3, "<|im_start|>assistant\n")  # it answers without thinking
    assert ThinkingGate.thinking_at_start(qwen3, "<|im_start|>assistant\n<think>\n")  # (thinking-only models)
    assert not ThinkingGate.thinking_at_start(qwen3, "assistant\n<think>\n\n</think>\n\n")
