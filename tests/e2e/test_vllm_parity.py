"""What a vLLM user's code sends, through the official openai client: scoring by echo and logprobs (as
lm-eval does), prompt logprobs, vLLM's extra sampling fields, chat template options, and fields that
must be refused (not served as if absent) or named in a warning."""
import openai
import pytest
import torch

from actorserve import BeamSearchParams, SamplingParams
from actorserve.runtime.text.chat_template import render
from tests.e2e.server import API_KEY, http

MODEL = "SmolLM2-135M-Instruct"
CONTEXT = "Question: What is the capital of France?\nAnswer:"
CONTINUATION = " The capital of France is Paris."


def test_log_likelihood_of_a_continuation_as_lm_eval_asks_for_it(client, smollm, hf_smollm):
    """echo + max_tokens 0 + logprobs: the prompt scored, nothing generated. The continuation's logprobs
    sum to what LLM.generate(prompt_logprobs=...) and a transformers forward pass give."""
    tok = smollm.get_tokenizer()
    context_len = len(tok.encode(CONTEXT))
    ids = tok.encode(CONTEXT + CONTINUATION)
    assert ids[:context_len] == tok.encode(CONTEXT)  # the continuation starts on a token boundary
    resp = client.completions.create(model=MODEL, prompt=CONTEXT + CONTINUATION, max_tokens=0, echo=True,
                                     logprobs=1, temperature=0)
    choice = resp.choices[0]
    assert choice.text == CONTEXT + CONTINUATION
    assert resp.usage.completion_tokens == 0 and resp.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert "".join(lp.tokens) == CONTEXT + CONTINUATION and len(lp.tokens) == len(ids)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(len(top) >= 1 for top in lp.top_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    served = sum(lp.token_logprobs[context_len:])

    out = smollm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)[0]
    embedded = sum(out.prompt_logprobs[i][ids[i]].logprob for i in range(context_len, len(ids)))
    with torch.no_grad():
        ref = hf_smollm(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    transformers_sum = sum(ref[i - 1, ids[i]].item() for i in range(context_len, len(ids)))
    assert served == pytest.approx(embedded, abs=1e-5)
    assert served == pytest.approx(transformers_sum, abs=1e-4)


def test_echo_with_logprobs_covers_prompt_then_output_streamed_or_not(client):
    prompt = "The capital of France is"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, logprobs=2,
                                      temperature=0).choices[0]
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, logprobs=2, temperature=0).choices[0]
    n_prompt = len(whole.logprobs.tokens) - 3
    assert whole.text == prompt + plain.text
    assert whole.logprobs.tokens[n_prompt:] == plain.logprobs.tokens
    assert whole.logprobs.token_logprobs[n_prompt:] == plain.logprobs.token_logprobs
    assert "".join(whole.logprobs.tokens[:n_prompt]) == prompt and whole.logprobs.token_logprobs[0] is None
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, logprobs=2,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    values = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == whole.logprobs.tokens and values == whole.logprobs.token_logprobs
    only = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in only) == prompt
    assert [c.choices[0].finish_reason for c in only][-1] == "length"


def test_prompt_logprobs_in_completions_and_chat(client, server):
    resp = client.completions.create(model=MODEL, prompt="Hello there, friend", max_tokens=1,
                                     extra_body={"prompt_logprobs": 2})
    entries = resp.choices[0].model_extra["prompt_logprobs"]
    assert entries[0] is None and len(entries) == resp.usage.prompt_tokens
    assert all(2 <= len(e) <= 3 and all({"logprob", "rank", "decoded_token"} <= set(v) for v in e.values())
               for e in entries[1:])
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, stream=True,
                                  extra_body={"prompt_logprobs": 1})
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=0)


def test_vllm_sampling_fields(client):
    prompt = "The capital of France is"
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0).choices[0].text
    assert "Paris" in plain
    banned = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                       extra_body={"bad_words": ["Paris"]}).choices[0].text
    assert "Paris" not in banned
    cut = client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5, 6, 7], max_tokens=1, echo=True,
                                    extra_body={"truncate_prompt_tokens": 2})
    assert cut.usage.prompt_tokens == 2
    with pytest.raises(openai.BadRequestError, match="allowed_token_ids"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                                  extra_body={"allowed_token_ids": [10 ** 6]})


def test_allowed_token_ids_are_the_only_tokens(client):
    out = client.completions.create(model=MODEL, prompt="Count: 1", max_tokens=6, temperature=1.0, seed=1,
                                    extra_body={"allowed_token_ids": [314, 315], "return_tokens_as_token_ids": False,
                                                "ignore_eos": True})
    tok_ids = http("POST", client.base_url.__str__().replace("/v1/", "/tokenize"),
                   {"prompt": out.choices[0].text, "add_special_tokens": False},
                   headers={"Authorization": f"Bearer {API_KEY}"}).json()["tokens"]
    assert set(tok_ids) <= {314, 315}


@pytest.mark.parametrize("body", [
    {"best_of": 3}, {"guided_decoding_backend": "outlines"},
    {"logits_processors": ["x"]}, {"suffix": "end"}, {"spaces_between_special_tokens": False},
], ids=lambda b: next(iter(b)))
def test_fields_that_would_change_the_output_are_refused(client, body):
    name = next(iter(body))
    with pytest.raises(openai.BadRequestError, match=name) as err:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, extra_body=body)
    assert err.value.body["param"] == name


def test_beam_search_answers_as_llm_beam_search(client, smollm):
    """use_beam_search with n beams: the choices are LLM.beam_search's sequences, best first, whole or
    streamed, for completions and for chat."""
    params = BeamSearchParams(beam_width=3, max_tokens=6)
    want = smollm.beam_search("The capital of France is", params)[0].sequences
    got = client.completions.create(model=MODEL, prompt="The capital of France is", n=3, max_tokens=6,
                                    extra_body={"use_beam_search": True})
    assert [c.text for c in got.choices] == [s.text for s in want]
    assert [c.finish_reason for c in got.choices] == [s.finish_reason for s in want]
    prompt_len = len(smollm.get_tokenizer().encode("The capital of France is"))
    assert got.usage.completion_tokens == sum(len(s.tokens) - prompt_len for s in want)
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", n=3, max_tokens=6,
                                            stream=True, extra_body={"use_beam_search": True}))
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i) for i in range(3)]
    assert streamed == [s.text for s in want]

    messages = [{"role": "user", "content": "Say yes."}]
    want = smollm.beam_search([{"prompt_token_ids": render(smollm.get_tokenizer(), messages)[1]}], params)[0].sequences
    chat = client.chat.completions.create(model=MODEL, messages=messages, n=3, max_tokens=6,
                                          extra_body={"use_beam_search": True})
    assert [c.message.content for c in chat.choices] == [s.text for s in want]
    assert chat.choices[0].finish_reason == "stop"  # the best beam ends in EOS
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.completions.create(model=MODEL, prompt="Hi", n=2, max_tokens=2, logprobs=1,
                                  extra_body={"use_beam_search": True})
    with pytest.raises(openai.BadRequestError, match="beam width"):
        client.completions.create(model=MODEL, prompt="Hi", n=11, max_tokens=2, extra_body={"use_beam_search": True})


def test_neutral_values_pass_and_unknown_fields_are_named_in_a_warning(client, server):
    ok = client.completions.create(model=MODEL, prompt="Hi", max_tokens=1,
                                   extra_body={"use_beam_search": False, "best_of": 1, "priority": 0,
                                               "no_such_option": 5, "another_unknown": "x"})
    assert ok.choices[0].finish_reason == "length"
    assert b"ignored fields the server does not know: another_unknown, no_such_option" in server.output()


def test_chat_template_kwargs_tools_and_text_parts(client):
    template = "{% for m in messages %}{{ m['content'] | upper if shout else m['content'] }}{% endfor %}"
    messages = [{"role": "user", "content": [{"type": "text", "text": "say "}, {"type": "text", "text": "hi"}]}]
    loud = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, extra_body={
        "chat_template": template, "chat_template_kwargs": {"shout": True}, "echo": False})
    quiet = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, extra_body={
        "chat_template": template, "chat_template_kwargs": {"shout": False}})
    tok = lambda text: len(http("POST", client.base_url.__str__().replace("/v1/", "/tokenize"),  # noqa: E731
                                {"prompt": text, "add_special_tokens": False},
                                headers={"Authorization": f"Bearer {API_KEY}"}).json()["tokens"])
    assert (loud.usage.prompt_tokens, quiet.usage.prompt_tokens) == (tok("SAY HI"), tok("say hi"))
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, tools=tools)
    shown = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1, tools=tools,
                                           tool_choice="none")
    assert shown.choices[0].finish_reason in ("length", "stop")


def test_start_up_is_logged_phase_by_phase_with_access_lines(client, server):
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    log = server.output().decode()
    for phase in ("loading ", "weights loaded in ", "KV cache budget ", "KV cache: ", "worker0 ready in ",
                  "scheduler ready in "):
        assert phase in log, phase
    assert '"POST /v1/completions HTTP/1.1" 200' in log  # uvicorn's access log
    assert "prompt tokens, params: max_tokens=1" in log  # the request's own line


def test_a_taken_port_fails_at_once_before_the_model_loads():
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "actorserve.cli", "serve", "--port",
                               str(taken.getsockname()[1])], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and time.monotonic() - started < 30
    assert "cannot listen on http://127.0.0.1:" in proc.stderr and "loading" not in proc.stderr + proc.stdout


def test_generation_config_defaults_and_served_names(tmp_path):
    import json

    from actorserve.frontend.protocol import CompletionRequest
    from actorserve.frontend.server import generation_defaults, new_context

    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 7, "do_sample": True}))
    defaults = generation_defaults(str(tmp_path), None)
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "max_tokens": 7}
    assert generation_defaults("vllm", None) == {} and generation_defaults("auto", None) == {}  # GGUF: none
    with pytest.raises(ValueError, match="generation_config.json"):
        generation_defaults(str(tmp_path / "nowhere"), None)
    request = CompletionRequest(prompt="x", temperature=1.0)
    params = request.sampling_params(16, None, None, defaults)
    assert (params.temperature, params.top_p) == (1.0, 0.9)  # what the request set wins

    ctx = new_context(None, None, ("first", "second"))
    assert ctx.model_name == "first" and ctx.response_name("second") == "second"
    ctx.check_model("second")
    with pytest.raises(Exception, match="does not exist"):
        ctx.check_model("third")


def scrape_all(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = http("GET", server.base_url + "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(values: dict, name: str, required: bool = True, **labels) -> float:
    """The sum of the samples of ``name`` with these labels (a label set never observed: 0, or an error)."""
    found = [v for (n, ls), v in values.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items())]
    assert found or not required, (name, labels)
    return sum(found)


def test_metrics_count_a_known_workload_as_vllm_names_them(client, server):
    before = scrape_all(server)
    requests, new_tokens = 3, 6
    prompt_tokens = 0
    for i in range(requests):
        prompt_tokens += client.completions.create(model=MODEL, prompt=f"Count to ten: {i}", max_tokens=new_tokens,
                                                   temperature=0, extra_body={"ignore_eos": True}).usage.prompt_tokens
    stopped = client.completions.create(model=MODEL, prompt="Say yes.", max_tokens=8, temperature=0,
                                        stop=[" "], extra_body={"min_tokens": 1})
    prompt_tokens += stopped.usage.prompt_tokens
    after = scrape_all(server)
    delta = lambda name, **labels: metric(after, name, **labels) - metric(before, name, False, **labels)  # noqa: E731
    ours = {"model_name": MODEL, "engine": "0"}
    assert all(dict(labels).get("model_name") == MODEL and dict(labels).get("engine") == "0"
               for (name, labels), _ in after.items() if name.startswith("vllm:") and name != "vllm:cache_config_info")
    assert delta("vllm:request_success_total", finished_reason="length", **ours) == requests
    assert delta("vllm:request_success_total", finished_reason="stop", **ours) == 1
    generated = requests * new_tokens + stopped.usage.completion_tokens
    assert delta("vllm:generation_tokens_total", **ours) == generated
    assert delta("vllm:request_generation_tokens_sum", **ours) == generated
    assert delta("vllm:request_generation_tokens_count", **ours) == requests + 1
    assert delta("vllm:request_prompt_tokens_count", **ours) == requests + 1
    assert delta("vllm:request_prompt_tokens_sum", **ours) == prompt_tokens
    assert delta("vllm:prompt_tokens_total", **ours) == prompt_tokens
    assert delta("vllm:prefix_cache_queries_total", **ours) == prompt_tokens
    assert delta("vllm:time_to_first_token_seconds_count", **ours) == requests + 1
    assert delta("vllm:e2e_request_latency_seconds_count", **ours) == requests + 1
    assert delta("vllm:inter_token_latency_seconds_count", **ours) == generated - (requests + 1)
    assert delta("vllm:time_per_output_token_seconds_count", **ours) == requests + (stopped.usage.completion_tokens > 1)
    for phase in ("queue", "prefill", "decode", "inference"):
        assert delta(f"vllm:request_{phase}_time_seconds_count", **ours) == requests + 1, phase
    assert delta("vllm:iteration_tokens_total_count", **ours) >= new_tokens  # one step a token, at least
    assert delta("vllm:iteration_tokens_total_sum", **ours) >= generated
    assert metric(after, "vllm:num_preemptions_total", **ours) >= 0
    assert metric(after, "vllm:time_to_first_token_seconds_bucket", le="0.001", **ours) >= 0
    assert metric(after, "vllm:cache_config_info", block_size="16", enable_prefix_caching="True") == 1


def test_server_flags_for_names_template_and_quiet_logs(tmp_path):
    from tests.e2e.server import Server

    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    server = Server("--chat-template", str(template), "--served-model-name", "alpha", "beta",
                    "--disable-log-requests", "--disable-uvicorn-access-log")
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
        assert [m.id for m in client.models.list().data] == ["alpha", "beta"]
        resp = client.chat.completions.create(model="beta", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=1, extra_body={"echo": False})
        assert resp.model == "beta"
        tokens = http("POST", server.base_url + "/tokenize", {"prompt": "[user] hi\n", "add_special_tokens": False},
                      headers={"Authorization": f"Bearer {API_KEY}"}).json()["tokens"]
        assert resp.usage.prompt_tokens == len(tokens)  # the server's template, not the model's
        log = server.output().decode()
        assert "prompt tokens, params" not in log and '"POST /v1/chat/completions' not in log
    finally:
        assert server.stop() == 0
