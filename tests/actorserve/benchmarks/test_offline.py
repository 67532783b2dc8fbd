"""``bench latency`` and ``bench throughput`` on a tiny model: the figures they report are consistent."""
import argparse
import json

from actorserve.benchmarks import offline


def parse(kind, tiny_llama_dir, tmp_path, *extra):
    p = argparse.ArgumentParser()
    offline.add_engine_arguments(p)
    if kind == "latency":
        p.add_argument("--batch-size", type=int, default=1)
    else:
        p.add_argument("--num-prompts", type=int, default=4)
        p.add_argument("--no-progress", action="store_true")
    return p.parse_args(["--model", str(tiny_llama_dir), "--kv-cache-memory", str(8 << 20), "--max-model-len", "256",
                         "--input-len", "8", "--output-len", "12", "--skip-tokenizer-init",
                         "--result-file", str(tmp_path / "r.json"), *extra])


def test_latency_reports_decode_steps_and_a_host_share(tiny_llama_dir, tmp_path):
    assert offline.latency(parse("latency", tiny_llama_dir, tmp_path, "--batch-size", "3")) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert 0.0 <= r["host_share_of_decode_step"] <= 1.0 and 0.0 <= r["engine_share"] <= 1.0
    assert r["decode_step_ms"]["median"] > 0 and r["decode_tok_s"] > 0


def test_throughput_counts_every_output_token(tiny_llama_dir, tmp_path):
    assert offline.throughput(parse("throughput", tiny_llama_dir, tmp_path, "--no-progress")) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["output_tokens"] == 4 * 12
