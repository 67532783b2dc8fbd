"""``LLM.beam_search`` on the default model: against the same search run on transformers' logits, and with
one beam, against greedy decoding."""
import pytest
import torch

from actorserve import BeamSearchParams, SamplingParams
from actorserve.runtime.text.chat_template import render


def hf_beam_search(model, prompt: list[int], width: int, steps: int, eos: int) -> list[tuple[list[int], float]]:
    """vLLM's beam search written out on a transformers forward pass: every beam extended by its 2 * width
    likeliest next tokens, an EOS candidate set aside, the width best others kept; then all ranked by the
    cumulative logprob over the length (EOS not counted)."""
    beams, finished = [(list(prompt), 0.0)], []
    for _ in range(steps):
        candidates = []
        for tokens, cum in beams:
            with torch.no_grad():
                logprobs = model(torch.tensor([tokens])).logits[0, -1].float().log_softmax(-1)
            top = logprobs.topk(2 * width)
            for lp, token in zip(top.values.tolist(), top.indices.tolist()):
                (finished if token == eos else candidates).append((tokens + [token], cum + lp))
        beams = sorted(candidates, key=lambda b: b[1] / len(b[0]), reverse=True)[:width]

    def score(b):
        return b[1] / (len(b[0]) - (b[0][-1] == eos))
    return sorted(finished + beams, key=score, reverse=True)[:width]


def test_one_beam_is_greedy_decoding(smollm):
    params = BeamSearchParams(beam_width=1, max_tokens=12, ignore_eos=True)
    best = smollm.beam_search("The capital of France is", params)[0].sequences[0]
    greedy = smollm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=12, logprobs=0),
                             use_tqdm=False)[0].outputs[0]
    prompt_len = len(smollm.get_tokenizer().encode("The capital of France is"))
    assert best.tokens[prompt_len:] == greedy.token_ids
    assert best.cum_logprob == pytest.approx(greedy.cumulative_logprob, abs=1e-3)
    assert best.text == greedy.text and best.finish_reason == "length"


@pytest.mark.parametrize("chat", [False, True])  # the chat prompt's best beam ends in EOS within the steps
def test_beams_match_the_same_search_on_transformers_logits(smollm, hf_smollm, chat):
    tok = smollm.get_tokenizer()
    if chat:
        _, prompt = render(tok, [{"role": "user", "content": "Say yes."}])
    else:
        prompt = tok.encode("The capital of France is")
    width, steps = 3, 6
    out = smollm.beam_search([{"prompt_token_ids": prompt}], BeamSearchParams(beam_width=width, max_tokens=steps))
    got = out[0].sequences
    want = hf_beam_search(hf_smollm, prompt, width, steps, tok.eos_token_id)
    assert [s.tokens for s in got] == [tokens for tokens, _ in want]
    assert [s.cum_logprob for s in got] == pytest.approx([cum for _, cum in want], abs=1e-3)
    for s in got:
        assert s.tokens[:len(prompt)] == prompt
        assert s.cum_logprob == pytest.approx(sum(lps[t].logprob for lps, t in zip(s.logprobs, s.tokens[len(prompt):])))
        ends_in_eos = s.tokens[-1] == tok.eos_token_id
        assert s.finish_reason == ("stop" if ends_in_eos else "length")
        assert s.text == tok.decode(s.tokens[len(prompt):len(s.tokens) - ends_in_eos])
    if chat:
        assert got[0].finish_reason == "stop" and got[-1].finish_reason == "length"


def test_bad_prompts_and_params_are_refused_before_anything_runs(smollm):
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    for penalty in (1e308, -1e308, 10.5, float("nan")):  # (a score's length to this power overflowed: a 500)
        with pytest.raises(ValueError, match="length_penalty"):
            BeamSearchParams(beam_width=2, max_tokens=4, length_penalty=penalty)
    with pytest.raises(ValueError, match="prompt"):
        smollm.beam_search([{"prompt_token_ids": [1, 10 ** 9]}], BeamSearchParams(beam_width=2, max_tokens=2))
    # and the engine serves on
    assert smollm.beam_search("Hi", BeamSearchParams(beam_width=2, max_tokens=2))[0].sequences
