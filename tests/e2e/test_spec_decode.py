"""Speculative decoding through the HTTP server: a server started with vLLM's --speculative-config (ngram,
or the default model drafting for itself) gives the greedy answers of one without it, streamed and not,
and /metrics counts its drafts."""
import json
import re
import urllib.request

import openai
import pytest

from actorserve.runtime.model_files import resolve_model_path

from tests.e2e.server import API_KEY, Server
from tests.e2e.test_openai_server import MODEL

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
DRAFT = {"method": "draft_model", "model": resolve_model_path(None), "num_speculative_tokens": 4}
CODE = ("def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
        "Repeat the function above exactly.")


def _answers(client):
    messages = [{"role": "user", "content": CODE}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64, temperature=0,
                                            stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    text = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,", max_tokens=24,
                                     temperature=0).choices[0].text
    return whole.choices[0].message.content, streamed, text


@pytest.mark.parametrize("config", [NGRAM, DRAFT], ids=["ngram", "draft_model"])
def test_drafts_keep_the_greedy_answers_and_are_counted(client, config):
    plain = _answers(client)
    spec = Server("--speculative-config", json.dumps(config))
    try:
        spec_client = openai.OpenAI(base_url=spec.base_url + "/v1", api_key=API_KEY, max_retries=0)
        assert _answers(spec_client) == plain
        request = urllib.request.Request(spec.base_url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"})
        page = urllib.request.urlopen(request, timeout=10).read().decode()
    finally:
        assert spec.stop() == 0

    def value(name, extra=""):
        found = re.search(rf'^{name}_total{{[^}}]*{extra}[^}}]*}} ([0-9.e+]+)$', page, re.M)
        assert found, name
        return float(found.group(1))
    drafts, proposed, kept = (value(f"vllm:spec_decode_{n}") for n in ("num_drafts", "num_draft_tokens",
                                                                         "num_accepted_tokens"))
    assert 0 < drafts <= proposed and 0 < kept <= proposed
    if config is DRAFT:  # the same model: its argmax is the target's
        assert kept == proposed
    per_pos = [value("vllm:spec_decode_num_accepted_tokens_per_pos", f'position="{i}"') for i in range(4)]
    assert sum(per_pos) == kept and per_pos == sorted(per_pos, reverse=True)
