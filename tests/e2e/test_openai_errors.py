"""Acceptance: a table of bad requests, each the right 4xx in the OpenAI error shape; the server serves on."""
import pytest

from tests.e2e.server import API_KEY, http

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "Hi"}]
VOCAB = 49152

CASES = [
    ("malformed JSON", COMP, b'{"prompt": "x",', None, 400, None),
    ("body is an array", COMP, None, ["x"], 400, None),
    ("missing prompt", COMP, None, {"max_tokens": 3}, 400, "prompt"),
    ("missing messages", CHAT, None, {"max_tokens": 3}, 400, "messages"),
    ("empty messages", CHAT, None, {"messages": []}, 400, "messages"),
    ("prompt is a number", COMP, None, {"prompt": 5}, 400, "prompt"),
    ("empty prompt list", COMP, None, {"prompt": []}, 400, "prompt"),
    ("empty prompt string", COMP, None, {"prompt": ""}, 400, "prompt"),
    ("negative max_tokens", COMP, None, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens is a string", COMP, None, {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("temperature -1", COMP, None, {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("top_p 2", CHAT, None, {"messages": MSG, "top_p": 2}, 400, "top_p"),
    ("top_k -5", COMP, None, {"prompt": "x", "top_k": -5}, 400, "top_k"),
    ("min_p 2", COMP, None, {"prompt": "x", "min_p": 2}, 400, "min_p"),
    ("n 0", COMP, None, {"prompt": "x", "n": 0}, 400, "n"),
    ("presence_penalty 5", COMP, None, {"prompt": "x", "presence_penalty": 5}, 400, "presence_penalty"),
    ("repetition_penalty 0", COMP, None, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("logprobs 50", COMP, None, {"prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("stop_token_ids [vocab_size]", COMP, None, {"prompt": "x", "stop_token_ids": [VOCAB]}, 400, "stop_token_ids"),
    ("stop_token_ids [-1]", CHAT, None, {"messages": MSG, "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("logit_bias id = vocab_size", COMP, None, {"prompt": "x", "logit_bias": {str(VOCAB): 1}}, 400, "logit_bias"),
    ("logit_bias negative id", CHAT, None, {"messages": MSG, "logit_bias": {"-1": 1}}, 400, "logit_bias"),
    ("prompt ids outside the vocab", COMP, None, {"prompt": [1, VOCAB]}, 400, "prompt_token_ids"),
    ("prompt over the context", COMP, None, {"prompt": [5] * 1100}, 400, "prompt"),
    ("prompt + max_tokens over the context", COMP, None, {"prompt": [5] * 1000, "max_tokens": 100}, 400,
     "max_tokens"),
    ("min_tokens > max_tokens", COMP, None, {"prompt": "x", "max_tokens": 2, "min_tokens": 5}, 400, "min_tokens"),
    ("min_tokens 1e9", COMP, None, {"prompt": "x", "min_tokens": 10 ** 9}, 400, "min_tokens"),
    ("beam length_penalty 1e308", COMP, None, {"prompt": "x", "use_beam_search": True, "n": 2, "max_tokens": 2,
                                               "length_penalty": 1e308}, 400, "length_penalty"),
    ("beam length_penalty -1e308", CHAT, None, {"messages": MSG, "use_beam_search": True, "n": 2, "max_tokens": 2,
                                                "length_penalty": -1e308}, 400, "length_penalty"),
    ("streamed beam length_penalty 1e308", COMP, None, {"prompt": "x", "use_beam_search": True, "n": 2,
                                                        "max_tokens": 2, "stream": True, "length_penalty": 1e308},
     400, "length_penalty"),
    ("stop is not strings", COMP, None, {"prompt": "x", "stop": [1, 2]}, 400, "stop"),
    ("unknown role", CHAT, None, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("content is a number", CHAT, None, {"messages": [{"role": "user", "content": 7}]}, 400, "messages"),
    ("an image part", CHAT, None, {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     400, "'image_url' are not supported"),
    ("top_logprobs without logprobs", CHAT, None, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ("top_logprobs 21", CHAT, None, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("max_completion_tokens 0", CHAT, None, {"messages": MSG, "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("continue a user message", CHAT, None,
     {"messages": MSG, "continue_final_message": True, "add_generation_prompt": False}, 400, "messages"),
    ("unknown model", COMP, None, {"model": "gpt-9", "prompt": "x"}, 404, "model"),
]


@pytest.mark.parametrize("name,path,raw,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, name, path, raw, body, status, param):
    reply = http("POST", server.base_url + path, json_body=body, raw=raw, headers=AUTH)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    if param is not None:
        assert param in (error["param"] or "") or param in error["message"], error
    if "vocab" in name or "ids" in name:
        assert str(VOCAB) in error["message"]
    ok = http("POST", server.base_url + COMP, {"prompt": "Hello", "max_tokens": 2}, headers=AUTH)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}])
def test_bad_api_key_is_401(server, headers):
    reply = http("POST", server.base_url + COMP, {"prompt": "x"}, headers=headers)
    assert reply.status_code == 401 and reply.json()["error"]["code"] == 401


def test_unknown_route_is_404_in_the_openai_shape(server):
    reply = http("POST", server.base_url + "/v1/embeddingz", {"input": "x"}, headers=AUTH)
    assert reply.status_code == 404 and reply.json()["error"]["type"] == "NotFoundError"


def test_health_is_open(server):
    assert http("GET", server.base_url + "/health").status_code == 200
    for method in ("GET", "POST"):  # vLLM's alias
        assert http(method, server.base_url + "/ping").status_code == 200
