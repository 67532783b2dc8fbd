"""The import boundaries docs/architecture.md draws: every import in the project's sources (at the top of a
module or inside a function) is read, and one that crosses a boundary the document forbids fails here,
naming the file and the import."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = {"runtime": "actorserve.runtime", "kernels": "actorserve.kernels", "frontend": "actorserve.frontend",
        "actorserve": "actorserve"}
WEB = ("fastapi", "starlette", "uvicorn")

# (what imports, what it may not import, why): prefixes of dotted module names
RULES = [
    ("actorserve.runtime", WEB, "only the frontend serves HTTP"),
    ("actorserve.kernels", WEB, "only the frontend serves HTTP"),
    ("actorserve.runtime", ("actorserve.frontend",), "the runtime is the frontend's, not the other way round"),
    ("actorserve.kernels", ("actorserve.frontend", "actorserve.runtime.engine", "actorserve.runtime.model",
                            "actorserve.runtime.actors", "actorserve.runtime.transport", "actorserve.runtime.text"),
     "kernels sit below everything but the config"),
    ("actorserve.runtime.engine", ("actorserve.runtime.model", "actorserve.runtime.actors", "actorserve.kernels"),
     "the engine is pure logic: the worker's packages are the workers'"),
    ("actorserve.runtime.text", ("actorserve.runtime.model", "actorserve.runtime.engine", "actorserve.kernels",
                                 "torch"), "text is the tokenizer's and the templates': no tensors, no model"),
    ("actorserve.runtime.transport", ("actorserve.runtime.model", "actorserve.runtime.actors"),
     "wire types and sockets know no model and no actor"),
    ("actorserve.frontend", ("actorserve.runtime.model", "actorserve.kernels"),
     "the frontend serves HTTP: models are the workers' (model_files says where a model's files are)"),
    ("actorserve.runtime.actors.scheduler_actor", ("actorserve.runtime.model", "actorserve.kernels"),
     "the scheduler runs the engine core, not the model"),
    ("actorserve.runtime.process", ("actorserve.runtime.actors",),
     "spawning a child is below the actors it runs (runtime.actors.child is the child's main)"),
    ("actorserve.runtime.config", ("actorserve",), "the config is the bottom of the graph: registries check its "
                                                   "names when it is resolved (runtime.resolve)"),
]
# what may be done to os.environ outside runtime.config: set a default for the processes that follow
ENV_WRITES = ("setdefault",)


def _modules():
    for top, package in TOPS.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT / top).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            yield path, ".".join((package, *parts))


def _imports(path: Path, module: str):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = module.split(".")[:len(module.split(".")) - node.level + (path.name == "__init__.py")]
                yield ".".join(base + ([node.module] if node.module else []))
            else:
                yield node.module


def _within(name: str, prefixes) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("importer,forbidden,why", RULES, ids=[f"{r[0]} !-> {','.join(r[1])}" for r in RULES])
def test_no_import_crosses_a_boundary(importer, forbidden, why):
    crossings = [f"{path.relative_to(ROOT)}: import {name}"
                 for path, module in _modules() if _within(module, importer)
                 for name in _imports(path, module) if _within(name, forbidden)]
    assert not crossings, f"{why}:\n" + "\n".join(crossings)


def test_only_the_config_reads_the_environment():
    reads = []
    for path, module in _modules():
        if module == "actorserve.runtime.config":
            continue
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if _is_os(node, "getenv") or _is_os(node, "environ") and not (
                    isinstance(parents.get(node), ast.Attribute) and parents[node].attr in ENV_WRITES):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not reads, "read the variable through a function of runtime/config.py:\n" + "\n".join(reads)


def _is_os(node, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def test_the_rules_see_the_imports_they_judge():
    """The walk finds what it should: the frontend does import FastAPI, and the engine the text package."""
    found = {name for path, module in _modules() if _within(module, "actorserve.frontend")
             for name in _imports(path, module)}
    assert any(_within(name, WEB) for name in found)
    found = {name for path, module in _modules() if _within(module, "actorserve.runtime.engine")
             for name in _imports(path, module)}
    assert any(_within(name, "actorserve.runtime.text") for name in found)
    found = {name for path, module in _modules() if module == "actorserve.kernels.capability"
             for name in _imports(path, module)}
    assert "actorserve.runtime.config" in found
