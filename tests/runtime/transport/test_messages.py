"""Every wire type survives the codec unchanged; garbage is a ProtocolError, never a crash."""
import typing

import msgspec
import pytest
import torch

from actorserve.runtime.engine.batch import (ModelRunnerOutput, NewRequest, PromptLogprobs, SamplingSpec,
                                             ScheduledChunk, SchedulerOutput, TokenLogprobs)
from actorserve.runtime.transport import messages as m
from actorserve.runtime.transport.codec import Codec, ProtocolError

SPEC = SamplingSpec(0.7, 0.9, 5, 0.0, 3, 0.0, 0.1, 1.1, {3: 1.5}, 2, [7], 2, 4)
EXAMPLES = [
    m.AddRequest("r1", m.WireSamplingParams(temperature=0.0, stop=["\n"], logit_bias={5: -1.0}), [1, 2, 3]),
    m.AddRequest("r2", m.WireSamplingParams(), prompt="hello"),
    m.AddRequest("r3", m.WireSamplingParams(), [1, 2], beam_search=m.WireBeamSearchParams(4, 32, length_penalty=0.5)),
    m.AbortRequest("r1"),
    m.PauseRequest("r1"),
    m.PauseRequest("r1", False, api_key="k"),
    m.RequestOutputDelta("r1", [m.SampleDelta(0, [5, 6], "ab", [[m.TokenLogprob(5, -0.1, 1, "a")]], "stop", "x")],
                         True, [1, 2, 3], 16),
    m.RequestOutputDelta("r1", [], False, [1, 2], 0, [None, [m.TokenLogprob(2, -1.5, 3, "b"),
                                                              m.TokenLogprob(1, -0.2, 1, "a")]]),
    m.ErrorReply("ValueError", "top_p must be in (0, 1]", "r9"),
    m.HealthPing(7),
    m.HealthPong(7, 3, 1, 0.25),
    m.HealthPong(8, 0, 0, 0.0, 2, [1, 0, 3] + [0] * 11, 40),
    m.HealthPong(9, 1, 0, 0.5, 0, [], 0, 5, 20, 12, [5, 4, 2, 1]),
    m.RequestOutputDelta("r2", [], True, timings=m.RequestTimings(0.01, 0.2, 1.5, 1.7)),
    m.ExecuteBatch(SchedulerOutput(4, [NewRequest("a", [1, 2], SPEC)],
                                   [ScheduledChunk("a", [1, 2], 0, [3], True),
                                    ScheduledChunk("b", [5, 6, 7], 9, [4], True, num_draft=2)], ["old"])),
    m.StepResult(ModelRunnerOutput(4, {"a": [9], "b": [6, 8]},
                                   {"a": [TokenLogprobs(-0.5, 2, [1, 9], [-0.1, -0.5])]})),
    m.StepResult(ModelRunnerOutput(5, {}, {}, {"a": PromptLogprobs(1, [-2.0], [4], [[7]], [[-0.5]])})),
    m.WorkerReady(0, 49152, 2, 8192, 100),
    m.Shutdown("test"),
    m.ErrorReply("ValueError", "sleep level must be 1 or 2", nonce=4),
    m.SleepRequest(3, 2, released={"weights": 100}),
    m.WakeUpRequest(4, ["kv_cache"]),
    m.SleepStatusRequest(5),
    m.SleepStatus(3, True, 2, {"weights": 100, "kv_cache": 64}),
    m.SleepStatus(4, True, 1, error="the checkpoint is gone"),
]


def test_every_union_member_has_an_example():
    assert {type(e) for e in EXAMPLES} == set(typing.get_args(m.Message))


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip(message):
    codec = Codec()
    decoded, tensors = codec.decode(codec.encode(message))
    assert decoded == message and tensors == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_tensors_travel_as_frames_bit_exact(dtype):
    codec = Codec()
    t = (torch.randn(3, 5) * 10).to(dtype)
    frames = codec.encode(m.HealthPing(1), [t, torch.empty(0, 4, dtype=dtype)])
    assert len(frames) == 4
    _, (back, empty) = codec.decode([bytes(f) for f in frames])
    assert back.dtype == dtype and torch.equal(back, t)
    assert empty.shape == (0, 4) and empty.dtype == dtype


@pytest.mark.parametrize("frames", [
    [], [b"\xff\x00garbage"], [msgspec.msgpack.encode({"type": "nope"})],
    [msgspec.msgpack.encode({"type": "abort_request"})],  # a required field missing
    [msgspec.msgpack.encode({"type": "abort_request", "request_id": 5})],  # a wrong type
])
def test_garbage_is_a_protocol_error(frames):
    with pytest.raises(ProtocolError):
        Codec().decode(frames)


def test_wire_sampling_params_mirror_sampling_params():
    """The wire struct is spelled out for the protocol's sake; it must not drift from SamplingParams."""
    import dataclasses

    from actorserve.runtime.engine.sampling_params import SamplingParams

    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    wire = m.WireSamplingParams()
    for name in m.WireSamplingParams.__struct_fields__:
        assert name in defaults and getattr(wire, name) == defaults[name], name
    missing = set(defaults) - set(m.WireSamplingParams.__struct_fields__)
    assert missing == {"detokenize"}  # a Python-side switch: every wire client gets text
