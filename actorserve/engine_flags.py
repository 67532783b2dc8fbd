"""The engine's command-line flags, generated from the config fields (``runtime.config.option``).

Every command that builds an engine (``generate``, ``serve``, ``serve-zmq``, ``run-batch``, ``bench
throughput|latency``) takes these same flags, so a flag cannot mean one thing in one command and another
elsewhere. A flag left out is not passed on: the config's own default (or environment variable) applies.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from typing import Any, Iterator

from actorserve.runtime.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, RuntimeConfig,
                                       SchedulerConfig)
from actorserve.runtime.resolve import REGISTRIES

SECTIONS = (ModelConfig, CacheConfig, SchedulerConfig, ParallelConfig, DeviceConfig, RuntimeConfig)
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?|[KMGT]i?|[kmgt]i)$")
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def human_int(text: str) -> int:
    """An integer as vLLM's flags take one: ``32k`` is 32000, ``32K`` (or ``32Ki``) is 32768, ``1.5G``
    is 1.5 * 2^30; plain digits as they are."""
    match = _HUMAN_INT.match(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (32000, 32k, 32K or 4Gi style)")
    number, unit = match.groups()
    binary = unit[:1].isupper() or unit.endswith("i")
    value = float(number) * (1024 if binary else 1000) ** _POWERS[unit[:1].lower()]
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(value)


def engine_fields() -> Iterator[tuple[dataclasses.Field, type]]:
    """(field, its base type) for every config field that is a flag."""
    for klass in SECTIONS:
        hints = typing.get_type_hints(klass)
        for f in dataclasses.fields(klass):
            if f.metadata.get("cli"):
                yield f, _base(hints[f.name])


def _base(hint) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine flags (the config's fields)")
    for f, base in engine_fields():
        meta = f.metadata
        default = f.default if f.default is not dataclasses.MISSING else "from the environment"
        shown = "" if default is None or "default" in meta["help"] else f" (default: {default})"
        kwargs: dict[str, Any] = dict(dest=f.name, default=None, help=meta["help"] + shown)
        if base is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif meta.get("parse") is not None:
            kwargs["type"] = _argument_type(meta["parse"])
        else:
            kwargs["type"] = human_int if base is int else base
            if meta["choices"] is not None:
                kwargs["choices"] = list(meta["choices"])
            if meta["registry"] is not None:  # the registry's names (runtime.resolve checks them)
                names = REGISTRIES[meta["registry"]]
                kwargs["choices"] = list(names)
                described = "; ".join(f"{name}: {summary}" for name, summary in names.items() if summary)
                kwargs["help"] = meta["help"] + (f" ({described})" if described else "") + shown
        group.add_argument(flag_name(f.name), *meta["aliases"], **kwargs)


def _argument_type(parse):
    """``parse`` as an argparse type: its ValueError becomes argparse's usage error, with the reason."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given, as engine arguments (``LLM(**kw)``, ``AsyncEngine(**kw)``)."""
    return {f.name: getattr(args, f.name) for f, _ in engine_fields() if getattr(args, f.name, None) is not None}


def config_file_arguments(path: str) -> list[str]:
    """A YAML file of flags (``max_model_len: 32k``, ``enable_prefix_caching: false``, lists for flags
    that take several values) as command-line arguments, as vLLM's ``--config``."""
    import yaml

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: the file must map flag names to values")
    argv: list[str] = []
    for key, value in data.items():
        flag = flag_name(str(key).lstrip("-"))
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + flag[2:])
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def expand_config_file(argv: list[str]) -> list[str]:
    """argv with ``--config FILE`` replaced by the file's flags, placed first so that flags given on
    the command line win."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv) or arg.startswith("--config="):
            path = argv[i + 1] if arg == "--config" else arg.split("=", 1)[1]
            rest = argv[:i] + argv[i + (2 if arg == "--config" else 1):]
            command = 1 if rest and not rest[0].startswith("-") else 0
            if rest[:1] == ["bench"]:
                command = 2
            return rest[:command] + config_file_arguments(path) + rest[command:]
    return argv

