"""What a vLLM user's code sends, through the official openai client: scoring by echo and logprobs (as
lm-eval does), prompt logprobs, vLLM's extra sampling fields, chat template options, and fields that
must be refused (not served as if absent) or named in a warning."""
import openai
import pytest
import torch

from actorserve import SamplingParams
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
    {"response_format": {"type": "json_object"}}, {"guided_json": {"type": "object"}},
    {"structured_outputs": {"choice": ["a", "b"]}}, {"use_beam_search": True}, {"best_of": 3},
    {"logits_processors": ["x"]}, {"suffix": "end"}, {"spaces_between_special_tokens": False},
], ids=lambda b: next(iter(b)))
def test_fields_that_would_change_the_output_are_refused(client, body):
    name = next(iter(body))
    with pytest.raises(openai.BadRequestError, match=name) as err:
        client.completions.create(model=MODEL, prompt="Hi", max_tokens=1, extra_body=body)
    assert err.value.body["param"] == name


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
