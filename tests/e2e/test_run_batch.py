"""Acceptance: ``actorserve run-batch`` in the OpenAI batch format, through the same serving code."""
import json
import subprocess
import sys


def test_run_batch(tmp_path, greedy_reference):
    ref = greedy_reference["prompts"][0]
    rows = [
        {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": ref["user_prompt"]}], "temperature": 0, "max_tokens": 64}},
        {"custom_id": "echo", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Name a colour."},
                               {"role": "assistant", "content": "My favourite colour is"}],
                  "echo": True, "add_generation_prompt": False, "continue_final_message": True,
                  "temperature": 0, "max_tokens": 5}},
        {"custom_id": "no-echo", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": "Say hi"}], "echo": True, "temperature": 0,
                  "max_tokens": 3}},
        {"custom_id": "completion", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 4, "echo": True}},
        {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
         "body": {"prompt": "x", "temperature": -1}},
    ]
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    done = subprocess.run([sys.executable, "-m", "actorserve.cli", "run-batch", "-i", str(src), "-o", str(out),
                           "--max-model-len", "1024", "--kv-cache-memory", str(64 << 20)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = {r["custom_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert list(results) == [r["custom_id"] for r in rows]
    chat = results["chat"]["response"]
    assert chat["status_code"] == 200 and chat["body"]["choices"][0]["message"]["content"] == ref["output_text"]
    echo = results["echo"]["response"]["body"]["choices"][0]["message"]["content"]
    assert echo.startswith("My favourite colour is") and len(echo) > len("My favourite colour is")
    assert not results["no-echo"]["response"]["body"]["choices"][0]["message"]["content"].startswith("Say hi")
    assert results["completion"]["response"]["body"]["choices"][0]["text"].startswith("The capital of France is")
    bad = results["bad"]
    assert bad["response"]["status_code"] == 400 and "temperature" in bad["error"]["message"]
    assert "Running batch" in done.stderr  # the progress bar
