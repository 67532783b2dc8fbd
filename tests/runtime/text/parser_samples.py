"""Feeding an answer to an OutputParser whole and in chunks of every size, as a stream delivers it."""
import json

from actorserve.runtime.text.output_parser import OutputParser


def parsed(make, text):
    """(reasoning, content, [(name, arguments)]) of the whole answer."""
    out = make().parse(text)
    return out.reasoning, out.content, [(c.name, json.loads(c.arguments)) for c in out.calls]


def streamed(make, text, size):
    """The same, joined from the deltas of a stream that grows ``size`` characters at a time."""
    parser, reasoning, content, calls = make(), "", "", []
    for end in range(size, len(text) + size, size):
        delta = parser.feed(text[:end], final=end >= len(text))
        reasoning, content = reasoning + delta.reasoning, content + delta.content
        for d in delta.calls:
            if d.name is not None:
                assert d.index == len(calls), "a call's first delta comes in order"
                calls.append([d.name, ""])
            calls[d.index][1] += d.arguments
    return reasoning or None, content or None, [(name, json.loads(args)) for name, args in calls]


def check(make, text, expected):
    assert parsed(make, text) == expected
    for size in range(1, len(text) + 1):
        assert streamed(make, text, size) == expected, f"chunks of {size}"


def make_parser(reasoning=None, tools=None):
    return lambda: OutputParser(reasoning() if reasoning else None, tools() if tools else None)
