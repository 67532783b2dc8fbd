"""``--tokenizer`` reaches every process that tokenizes or detokenizes: given a tokenizer whose ids for
" Paris" and " London" are swapped, the server's answer to the capital question reads London, which it can
only do if the scheduler (which detokenizes) uses that tokenizer as well as the frontend (which tokenizes)."""
import json

import openai
import pytest

from tests.e2e.server import API_KEY, Server, http

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def swapped_tokenizer(tmp_path_factory):
    from actorserve.runtime.model_files import resolve_model_path
    from actorserve.runtime.text.tokenizer import load_tokenizer

    directory = tmp_path_factory.mktemp("swapped-tokenizer")
    own = load_tokenizer(resolve_model_path(None))
    own.save_pretrained(directory)
    path = directory / "tokenizer.json"
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    vocab["ĠParis"], vocab["ĠLondon"] = vocab["ĠLondon"], vocab["ĠParis"]
    path.write_text(json.dumps(spec))
    return directory, own.convert_tokens_to_ids("ĠParis")


def test_the_scheduler_detokenizes_with_the_given_tokenizer(swapped_tokenizer):
    directory, paris = swapped_tokenizer
    server = Server("--tokenizer", str(directory))
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
        reply = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0,
                                               max_tokens=16)
        text = reply.choices[0].message.content
        assert "London" in text and "Paris" not in text, text
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=16, stream=True))
        assert streamed == text
        tokens = http("POST", server.base_url + "/tokenize", {"prompt": " London"}).json()["tokens"]
        assert tokens == [paris]  # the frontend tokenizes with it too: its " London" is the model's " Paris"
    finally:
        assert server.stop() == 0


def test_the_embedded_engine_uses_the_given_tokenizer_too(swapped_tokenizer):
    from actorserve import LLM, SamplingParams

    llm = LLM(tokenizer=str(swapped_tokenizer[0]), kv_cache_memory=32 << 20, max_model_len=512)
    out = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0].text
    assert "London" in out and "Paris" not in out, out
