"""Seeded sampling through the whole engine, and every sampling option on the real model."""
import pytest

from actorserve import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLM(str(tiny_llama_dir), skip_tokenizer_init=True, kv_cache_memory=1 << 20, max_model_len=512)


def test_seed_gives_the_same_output_whatever_the_batch(tiny):
    seeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=32, seed=42, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    alone = tiny.generate(prompt, seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": [i + 1] * (3 + i)} for i in range(9)]
    noise = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True)
    batch = tiny.generate(others[:4] + [prompt] + others[4:], [noise] * 4 + [seeded] + [noise] * 5, use_tqdm=False)
    assert batch[4].outputs[0].token_ids == alone
    unseeded = tiny.generate([prompt] * 4, SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True),
                             use_tqdm=False)
    assert len({tuple(o.outputs[0].token_ids) for o in unseeded}) > 1


def test_n_with_seed_is_reproducible_and_distinct(tiny):
    params = SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7, ignore_eos=True)
    prompt = {"prompt_token_ids": list(range(40))}
    first = tiny.generate(prompt, params, use_tqdm=False)[0]
    second = tiny.generate([{"prompt_token_ids": [3, 3]}, prompt], params, use_tqdm=False)[1]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in second.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) == 3


def test_stop_strings_tokens_logprobs_on_the_default_model(smollm, greedy_reference):
    ref = greedy_reference["prompts"][1]
    prompt = {"prompt_token_ids": ref["prompt_ids"]}
    out = smollm.generate(prompt, SamplingParams(temperature=0, max_tokens=64, stop=["ocean,"]), use_tqdm=False)[0]
    first = out.outputs[0]
    assert first.text == ref["output_text"].split("ocean,")[0]
    assert first.finish_reason == "stop" and first.stop_reason == "ocean,"

    stop_id = ref["output_ids"][5]
    out = smollm.generate(prompt, SamplingParams(temperature=0, max_tokens=64, stop_token_ids=[stop_id],
                                                 logprobs=2), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == ref["output_ids"][:6] and out.stop_reason == stop_id
    assert len(out.logprobs) == 6
    for token, entry in zip(out.token_ids, out.logprobs):
        assert entry[token].rank == 1 and len(entry) == 2  # greedy: the sampled token is the top one
        assert next(iter(entry)) == token
        assert entry[token].decoded_token == smollm.get_tokenizer().decode([token])
    assert out.cumulative_logprob == pytest.approx(sum(e[t].logprob for t, e in zip(out.token_ids, out.logprobs)))


def test_min_tokens_and_ignore_eos(smollm, greedy_reference):
    ref = greedy_reference["prompts"][0]  # stops on EOS after 8 tokens
    prompt = {"prompt_token_ids": ref["prompt_ids"]}
    out = smollm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, min_tokens=10), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) >= 10
    assert out.outputs[0].token_ids[:7] == ref["output_ids"][:7]
    out = smollm.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 12 and out.outputs[0].finish_reason == "length"


def test_bad_words_allowed_tokens_and_truncation_on_the_real_model(smollm):
    prompt = "The capital of France is"
    greedy = SamplingParams(temperature=0, max_tokens=8)
    plain = smollm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].text
    assert "Paris" in plain
    banned = smollm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, bad_words=["Paris"]),
                             use_tqdm=False)[0].outputs[0].text
    assert "Paris" not in banned and banned != plain

    tok = smollm.get_tokenizer()
    allowed = tok.encode(" yes no", add_special_tokens=False)
    out = smollm.generate(prompt, SamplingParams(temperature=0, max_tokens=5, allowed_token_ids=allowed),
                          use_tqdm=False)[0].outputs[0]
    assert set(out.token_ids) <= set(allowed)

    ids = tok.encode("one two three four five six seven eight")
    cut = smollm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=4,
                                                                    truncate_prompt_tokens=3), use_tqdm=False)[0]
    tail = smollm.generate({"prompt_token_ids": ids[-3:]}, SamplingParams(temperature=0, max_tokens=4),
                           use_tqdm=False)[0]
    assert cut.prompt_token_ids == ids[-3:] and cut.outputs[0].token_ids == tail.outputs[0].token_ids


def test_chat_takes_text_parts_and_template_kwargs(smollm):
    as_string = smollm.chat([{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=4),
                            use_tqdm=False)[0]
    as_parts = smollm.chat([{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text",
                                                                                        "text": "hi."}]}],
                           SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert as_parts.prompt == as_string.prompt and as_parts.outputs[0].text == as_string.outputs[0].text
    template = "{% for m in messages %}{{ m['content'] | upper if shout else m['content'] }}{% endfor %}"
    loud = smollm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1), use_tqdm=False,
                       chat_template=template, chat_template_kwargs={"shout": True})[0]
    quiet = smollm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1), use_tqdm=False,
                        chat_template=template, chat_template_kwargs={"shout": False})[0]
    assert (loud.prompt, quiet.prompt) == ("HI", "hi")
    with pytest.raises(ValueError, match="image_url"):
        smollm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                    use_tqdm=False)
