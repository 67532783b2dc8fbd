"""Every reasoning format, whole and streamed in chunks of every size: the same thinking and answer; and
with a tool parser after it, the calls in the answer."""
import pytest

from actorserve.runtime.text.reasoning_parsers import REASONING_PARSERS
from actorserve.runtime.text.tool_parsers import TOOL_PARSERS
from tests.runtime.text.parser_samples import check, make_parser

SAMPLES = [
    ("deepseek_r1", "Two and two.\n</think>\n\nThe answer is 4.", ("Two and two.\n", "\n\nThe answer is 4.", [])),
    ("deepseek_r1", "<think>Hmm, 4.</think>Four.", ("Hmm, 4.", "Four.", [])),
    ("deepseek_r1", "Still thinking when cut", ("Still thinking when cut", None, [])),
    ("qwen3", "<think>\nA < B\n</think>\n\nB is larger.", ("\nA < B\n", "\n\nB is larger.", [])),
    ("qwen3", "A plain answer.", (None, "A plain answer.", [])),
    ("qwen3", "<think>cut short", ("cut short", None, [])),
    ("glm45", "<think>x</think>y", ("x", "y", [])),
    ("seed_oss", "<seed:think>plan</seed:think>done", ("plan", "done", [])),
]


@pytest.mark.parametrize("name,text,expected", SAMPLES)
def test_whole_and_streamed_split_alike(name, text, expected):
    check(make_parser(REASONING_PARSERS[name]), text, expected)


def test_enable_thinking_false_leaves_the_answer_whole():
    text = "<think>x</think>y"
    check(lambda: make_parser(lambda: REASONING_PARSERS["qwen3"]({"enable_thinking": False}))(), text,
          (None, text, []))


def test_calls_are_read_from_the_answer_after_the_thinking():
    text = ('<think>I should call <tool_call>.</think>\nCalling.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}'
            "\n</tool_call>")
    check(make_parser(REASONING_PARSERS["qwen3"], lambda: TOOL_PARSERS["hermes"]()), text,
          ("I should call <tool_call>.", "Calling.", [("f", {"x": 1})]))
