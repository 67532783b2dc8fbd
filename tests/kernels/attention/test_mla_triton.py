"""An MLA model (DeepSeek-V2) on the triton backend, in its interpreter: its logits equal the torch
backend's, and a decode step run over the static plan a CUDA graph captures (the step's plan copied into
static buffers, padded to the captured size) gives the eager step's logits: the latent attention needs
no metadata of its own, so graph capture covers its decodes whole."""
import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton  # a triton form: make test-isa leaves these to the first pass

from actorserve.runtime.engine.sampling_params import SamplingParams  # noqa: E402
from actorserve.runtime.transport.messages import NewRequest, ScheduledChunk, SchedulerOutput  # noqa: E402
from actorserve.runtime.model.weights.loader import load_model  # noqa: E402
from actorserve.runtime.model.execution.runner import ModelRunner  # noqa: E402
from tests.conftest import save_tiny_model  # noqa: E402
from tests.runtime.model.architectures.test_mla import SHAPE  # noqa: E402

SPEC = SamplingParams(temperature=0.0)


def test_mla_through_the_triton_backend_and_its_static_plan(tmp_path, device):
    model = load_model(str(save_tiny_model("deepseek_v2", tmp_path / "ds", **SHAPE)), "float32",
                       skip_tokenizer=True, device=device).model
    prompts = {"a": [5, 9, 2, 77, 31, 8, 120, 4, 66, 13, 250, 7, 19, 3, 200, 41, 90, 15], "b": [3, 1, 4, 1, 5]}
    prefill = SchedulerOutput(1, [NewRequest(r, p, SPEC) for r, p in prompts.items()],
                              [ScheduledChunk("a", prompts["a"], 0, [2, 5], True),
                               ScheduledChunk("b", prompts["b"], 0, [7], True)], [])
    decode = SchedulerOutput(2, [], [ScheduledChunk("a", [17], 18, [2, 5], True),
                                     ScheduledChunk("b", [23], 5, [7], True)], [])
    logits = {}
    for name in ("torch", "triton"):
        runner = ModelRunner(model, 16, 16, fast_decode=False, attention_backend=name, device=device)
        logits[name] = [runner.forward(runner.prepare_inputs(s)) for s in (prefill, decode)]
    for ref, got in zip(logits["torch"], logits["triton"]):
        torch.testing.assert_close(got.cpu(), ref.cpu(), atol=1e-4, rtol=1e-4)

    # the decode again, from the same cache, over static buffers of 4 rows (2 real, 2 padding)
    runner = ModelRunner(model, 16, 16, fast_decode=False, attention_backend="triton", device=device)
    runner.forward(runner.prepare_inputs(prefill))
    inputs = runner.prepare_inputs(decode)
    backend, size = runner.backend, 4
    runner._static = {"input_ids": torch.zeros(8, dtype=torch.long, device=device),
                      "positions": torch.zeros(8, dtype=torch.long, device=device),
                      "plan": backend.static_plan(8, 4, device), "outputs": {}, "pool": None}
    runner._load_static(inputs, size)
    static = runner._static
    with torch.inference_mode():
        hidden = model(static["input_ids"][:size], static["positions"][:size], runner.kv_caches,
                       backend.static_view(static["plan"], size), backend)
    replayed = runner._logits(hidden[:2], torch.arange(2, device=device))
    torch.testing.assert_close(replayed.cpu(), logits["triton"][1].cpu(), atol=1e-5, rtol=1e-5)
