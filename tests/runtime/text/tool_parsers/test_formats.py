"""Every tool-call format on the text its models write (from each format's documentation), whole and
streamed in chunks of every size from one character up: the same calls and the same content."""
import pytest

from actorserve.runtime.text.tool_parsers import TOOL_PARSERS
from tests.runtime.text.parser_samples import check, make_parser

PARIS = {"city": "Paris"}
TOKYO = {"city": "Tokyo"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "hours": {"type": "array"}, "scale": {"type": "number"}}}}}]

SAMPLES = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
         (None, None, [("get_weather", PARIS)])),
        ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo"}}\n</tool_call>',
         (None, "Let me check.", [("get_weather", PARIS), ("get_time", TOKYO)])),
        ("The weather <b>is</b> fine.", (None, "The weather <b>is</b> fine.", [])),
        ('<tool_call>\n{"name": "get_weather", "argu', (None, '<tool_call>\n{"name": "get_weather", "argu', [])),
        ('<tool_call>{not json}</tool_call> <tool_call>{"name": "get_time", "arguments": {"city": "Tokyo"}}'
         '</tool_call>',
         (None, "<tool_call>{not json}</tool_call>", [("get_time", TOKYO)])),
    ],
    "llama3_json": [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', (None, None, [("get_weather", PARIS)])),
        ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_time", "parameters": {"city": "Tokyo"}}',
         (None, None, [("get_weather", PARIS), ("get_time", TOKYO)])),
        ("It is sunny in {Paris}.", (None, "It is sunny in {Paris}.", [])),
        ('{"answer": 42}', (None, '{"answer": 42}', [])),
        ('{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}', (None, None, [("get_weather", PARIS)])),
    ],
    "mistral": [
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "get_time", "arguments": {"city": "Tokyo"}}]',
         (None, None, [("get_weather", PARIS), ("get_time", TOKYO)])),
        ('Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"city": "Tokyo"}',
         (None, "Sure.", [("get_weather", PARIS), ("get_time", TOKYO)])),
        ('[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}', (None, None, [("get_weather", PARIS)])),
        ("No [tools] needed.", (None, "No [tools] needed.", [])),
    ],
    "pythonic": [
        ("[get_weather(city=\"Paris\"), get_time(city='Tokyo')]",
         (None, None, [("get_weather", PARIS), ("get_time", TOKYO)])),
        ('<|python_start|>[get_weather(city="Paris")]<|python_end|>', (None, None, [("get_weather", PARIS)])),
        ('[search(query="a, b)", limit=5, filters={"lang": "en"}, exact=True, tags=None)]',
         (None, None, [("search", {"query": "a, b)", "limit": 5, "filters": {"lang": "en"}, "exact": True,
                                   "tags": None})])),
        ("[1, 2, 3] are numbers", (None, "[1, 2, 3] are numbers", [])),
        ("The answer is 4.", (None, "The answer is 4.", [])),
    ],
    "qwen3_xml": [
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[9, 12]\n</parameter>\n"
         "<parameter=scale>\n1.5\n</parameter>\n</function>\n</tool_call>",
         (None, None, [("get_weather", {"city": "Paris", "days": 3, "metric": True, "hours": [9, 12],
                                        "scale": 1.5})])),
        ("I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n</function>\n"
         "</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=city>\nTokyo\n</parameter>\n</function>\n"
         "</tool_call>",
         (None, "I will look.", [("get_weather", {"city": "New\nYork"}), ("get_time", TOKYO)])),
        ("<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
         (None, None, [("get_weather", {"days": "three"})])),
        ("No call <here>.", (None, "No call <here>.", [])),
    ],
    "deepseek_v3": [
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
         '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', (None, None, [("get_weather", PARIS)])),
        ("Checking both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
         '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n'
         '{"city": "Tokyo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
         (None, "Checking both.", [("get_weather", PARIS), ("get_time", TOKYO)])),
        ("Plain <｜answer｜>.", (None, "Plain <｜answer｜>.", [])),
    ],
}
CASES = [(name, text, expected) for name, samples in SAMPLES.items() for text, expected in samples]


@pytest.mark.parametrize("name,text,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole_and_streamed_give_the_same_calls_and_text(name, text, expected):
    check(make_parser(tools=lambda: TOOL_PARSERS[name](TOOLS)), text, expected)


def test_every_vllm_name_the_issue_asks_for_is_served():
    assert {"hermes", "llama3_json", "mistral", "pythonic", "qwen3_xml", "qwen3_coder", "deepseek_v3"} <= set(
        TOOL_PARSERS)
