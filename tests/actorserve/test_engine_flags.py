"""The CLI flags come from the config fields: every engine command takes the same ones, with vLLM's
spellings, human-readable sizes, a YAML --config, and docs/cli.md names exactly them."""
import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from actorserve import cli
from actorserve.engine_flags import SECTIONS, engine_fields, engine_kwargs, expand_config_file, human_int
from actorserve.runtime.resolve import engine_config

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def parser() -> argparse.ArgumentParser:
    captured = {}

    def parse(self, args=None, namespace=None):
        captured["parser"] = self
        raise SystemExit(0)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = parse
    try:
        with pytest.raises(SystemExit):
            cli.main(["generate", "x"])
    finally:
        argparse.ArgumentParser.parse_args = original
    return captured["parser"]


def subcommands(p: argparse.ArgumentParser, prefix=()) -> dict:
    found = {}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + (name,)] = sub
                found.update(subcommands(sub, prefix + (name,)))
    return found


def options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings if s not in ("-h", "--help")}


def test_every_config_field_decides_whether_it_is_a_flag():
    for klass in SECTIONS:
        for f in dataclasses.fields(klass):
            assert "cli" in f.metadata, f"{klass.__name__}.{f.name} is not declared with option()"
            assert not f.metadata["cli"] or f.metadata["help"], f"{klass.__name__}.{f.name} has no help"


def test_every_engine_command_takes_the_same_engine_flags():
    subs = subcommands(parser())
    engine = {"--" + f.name.replace("_", "-") for f, _ in engine_fields()}
    commands = [("generate",), ("serve",), ("serve-zmq",), ("run-batch",), ("bench", "latency"),
                ("bench", "throughput")]
    for command in commands:
        assert engine <= options(subs[command]), command


@pytest.mark.parametrize("text,value", [("2048", 2048), ("32k", 32000), ("32K", 32768), ("32Ki", 32768),
                                        ("4G", 4 << 30), ("4g", 4 * 10 ** 9), ("1.5K", 1536), ("512Mi", 512 << 20)])
def test_human_readable_integers(text, value):
    assert human_int(text) == value


@pytest.mark.parametrize("text", ["", "-3", "1.5", "12x", "k"])
def test_what_is_not_an_integer_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        human_int(text)


def serve_args(*argv: str) -> argparse.Namespace:
    return subcommands(parser())[("serve",)].parse_args(list(argv))


def test_vllm_spellings_become_one_config():
    a = serve_args("--max-model-len", "1k", "--kv-cache-memory-bytes", "64Mi", "--no-enable-prefix-caching",
                   "--dtype", "half", "-q", "int8", "--block-size", "32", "--served-model-name", "a", "b")
    kw = engine_kwargs(a)
    assert kw == {"max_model_len": 1000, "kv_cache_memory": 64 << 20, "enable_prefix_caching": False,
                  "dtype": "half", "quantization": "int8", "block_size": 32}
    assert a.served_model_name == ["a", "b"]
    config = engine_config(None, **{**kw, "dtype": "half"})
    assert config.model.dtype == "float16" and not config.cache.enable_prefix_caching
    assert engine_kwargs(serve_args("--no-prefix-caching")) == {"enable_prefix_caching": False}  # the old spelling
    assert engine_kwargs(serve_args()) == {}  # a flag not given leaves the config's default


def test_speculative_config_is_vllms_json(capsys):
    a = serve_args("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4, '
                                           '"prompt_lookup_max": 4, "prompt_lookup_min": 2}')
    config = engine_config(None, **engine_kwargs(a))
    spec = config.scheduler.speculative_config
    assert (spec.method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == \
        ("ngram", 4, 2, 4)
    for bad in ('{"method": "ngram"', '{"method": "medusa", "num_speculative_tokens": 2}'):
        with pytest.raises(SystemExit):
            serve_args("--speculative-config", bad)
        assert "speculative_config" in capsys.readouterr().err  # the reason, not a traceback
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        engine_config(None, speculative_config={"method": "ngram"})


def test_a_yaml_config_gives_flags_and_the_command_line_wins(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("max_model_len: 2k\nenable_prefix_caching: false\nserved_model_name: [x, y]\nport: 9000\n")
    argv = expand_config_file(["serve", "--config", str(path), "--port", "8001"])
    assert argv[:1] == ["serve"] and argv[-2:] == ["--port", "8001"]
    a = subcommands(parser())[("serve",)].parse_args(argv[1:])
    assert (a.max_model_len, a.enable_prefix_caching, a.served_model_name, a.port) == (2000, False, ["x", "y"], 8001)
    bench = expand_config_file(["bench", "latency", f"--config={path}"])
    assert bench[:2] == ["bench", "latency"]


def test_the_cli_doc_names_exactly_the_parsers_flags():
    section = CLI_DOC.read_text()
    named = set(re.findall(r"(?<![\w-])(--[a-z](?:[a-z0-9-]*[a-z0-9])?|-[a-z]{1,2})(?![\w-])", section))
    subs = subcommands(parser())
    flags = set().union(*(options(p) for p in subs.values()))
    negated = {f for f in flags if f.startswith("--no-") and "--" + f[5:] in flags}  # --x gives --no-x
    assert flags - negated - named == set(), "flags docs/cli.md does not name"
    assert named - flags == set(), "flags docs/cli.md names that no command takes"
