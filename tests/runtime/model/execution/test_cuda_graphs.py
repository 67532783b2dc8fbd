"""CUDA graphs of decode steps, the arithmetic and the bookkeeping on CPU (a fake graph records what is
captured and replayed): the capture sizes and their ceiling, padding a step to the next captured size,
what replays and what runs eagerly. The capture itself is under the cuda marker."""
import pytest
import torch

from actorserve.runtime.model.execution.cuda_graphs import DecodeGraphs, capture_sizes, padded_size


@pytest.mark.parametrize("max_num_seqs, max_batched, max_capture, sizes, expected", [
    (256, 2048, 512, None, [1, 2, 4, *range(8, 257, 8)]),  # max_num_seqs is the ceiling
    (256, 64, 512, None, [1, 2, 4, *range(8, 65, 8)]),  # the step's token budget is
    (1024, 8192, 100, None, [1, 2, 4, *range(8, 97, 8)]),  # the configured maximum is
    (3, 2048, 512, None, [1, 2]),
    (1, 1, 512, None, [1]),
    (256, 2048, 512, [600, 1, 100, 3, 3, 0, 257], [1, 3, 100]),  # given sizes, past the ceiling dropped
])
def test_capture_sizes_never_pass_the_ceiling(max_num_seqs, max_batched, max_capture, sizes, expected):
    got = capture_sizes(max_num_seqs, max_batched, max_capture, sizes)
    assert got == expected
    assert max(got) <= min(max_num_seqs, max_batched, max_capture)


def test_a_step_pads_to_the_next_captured_size_or_runs_eagerly():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(n, sizes) for n in (1, 2, 3, 5, 8, 9, 16, 17, 0)] == [1, 2, 4, 8, 8, 16, 16, None, None]


class FakeGraph:
    def __init__(self, size, log):
        self.size, self.log = size, log

    def replay(self):
        self.log.append(("replay", self.size))


def test_replay_bookkeeping():
    log = []
    loaded = []
    graphs = DecodeGraphs([1, 2, 4, 8], capture=lambda n: log.append(("capture", n)) or FakeGraph(n, log),
                          load=lambda rows, size: loaded.append((len(rows), size)),
                          output=lambda size, n: ("out", size, n))
    graphs.capture_all()
    assert log == [("capture", 8), ("capture", 4), ("capture", 2), ("capture", 1)]  # largest first
    log.clear()
    assert graphs.run([0] * 3, 3, True, eager=lambda: "eager") == ("out", 4, 3)
    assert graphs.run([0] * 8, 8, True, eager=lambda: "eager") == ("out", 8, 8)
    assert graphs.run([0] * 9, 9, True, eager=lambda: "eager") == "eager"  # above the largest: eager, never padded
    assert graphs.run([0] * 2, 2, False, eager=lambda: "eager") == "eager"  # prefills in the step
    assert log == [("replay", 4), ("replay", 8)] and loaded == [(3, 4), (8, 8)]
    assert graphs.stats.replays == {4: 1, 8: 1} and graphs.stats.eager == 2 and graphs.stats.padded_rows == 1


def test_no_graphs_on_the_cpu_or_with_enforce_eager(tiny_llama_dir):
    from actorserve.runtime.model.weights.loader import load_model
    from actorserve.runtime.model.execution.runner import ModelRunner

    model = load_model(str(tiny_llama_dir), "float32", skip_tokenizer=True).model
    assert ModelRunner(model, 8, 16, graph_sizes=[1, 2, 4]).graphs is None  # CPU
    if torch.cuda.is_available():
        assert ModelRunner(model.cuda(), 8, 16, device="cuda", fast_decode=False, graph_sizes=[1, 2]).graphs is None


@pytest.mark.cuda
def test_replayed_decode_steps_give_the_eager_logits(tiny_llama_dir):
    from actorserve.runtime.engine.sampling_params import SamplingParams
    from actorserve.runtime.transport.messages import NewRequest, ScheduledChunk, SchedulerOutput
    from actorserve.runtime.model.weights.loader import load_model
    from actorserve.runtime.model.execution.runner import ModelRunner

    model = load_model(str(tiny_llama_dir), "bfloat16", skip_tokenizer=True, device="cuda").model
    spec = SamplingParams(temperature=0.0)
    results = {}
    for sizes in ((), (1, 2, 4, 8)):
        runner = ModelRunner(model, 32, 16, device="cuda", attention_backend="triton", graph_sizes=sizes)
        runner.capture_graphs()
        assert (runner.graphs is not None) == bool(sizes)
        prompts = {f"r{i}": list(range(3 + i, 20 + 3 * i)) for i in range(3)}
        first = SchedulerOutput(1, [NewRequest(r, p, spec) for r, p in prompts.items()],
                                [ScheduledChunk(r, p, 0, [2 * i, 2 * i + 1], True)
                                 for i, (r, p) in enumerate(prompts.items())], [])
        runner.forward(runner.prepare_inputs(first))
        decode = SchedulerOutput(2, [], [ScheduledChunk(r, [7], len(p), [2 * i, 2 * i + 1], True)
                                         for i, (r, p) in enumerate(prompts.items())], [])
        results[sizes] = runner.forward(runner.prepare_inputs(decode)).float().cpu()
        if sizes:
            assert runner.graphs.stats.replays == {4: 1} and runner.graphs.stats.padded_rows == 1
    torch.testing.assert_close(results[(1, 2, 4, 8)], results[()], atol=2e-2, rtol=2e-2)
