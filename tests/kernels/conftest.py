"""The kernels' triton forms (the ``*_triton`` modules, their tests marked ``triton``) run on CPU tensors in
triton's interpreter here (a GPU runs them compiled): the switch must be on before any kernel module is
imported, since triton reads it at ``@triton.jit``."""
import os

import pytest

if not os.environ.get("ACTORSERVE_TRITON_COMPILED"):  # (set on a GPU machine to test the compiled kernels)
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device():
    import torch

    return "cuda" if os.environ.get("ACTORSERVE_TRITON_COMPILED") and torch.cuda.is_available() else "cpu"
