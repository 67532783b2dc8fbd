"""Every wire type survives the codec unchanged; garbage is a ProtocolError, never a crash; a request whose
params are out of range is a RefusedValue that still names it."""
import typing

import msgspec
import pytest
import torch

from actorserve.runtime.engine.beam_search import BeamSearchParams
from actorserve.runtime.engine.outputs import Logprob, RequestMetrics, SampleDelta
from actorserve.runtime.engine.sampling_params import SamplingParams
from actorserve.runtime.transport import messages as m
from actorserve.runtime.transport.codec import Codec, ProtocolError, RefusedValue
from actorserve.runtime.transport.messages import (ModelRunnerOutput, NewRequest, PromptLogprobs, ScheduledChunk,
                                                   SchedulerOutput)

PARAMS = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=3, frequency_penalty=0.1, repetition_penalty=1.1,
                        logit_bias={3: 1.5}, min_tokens=2, stop_token_ids=[7], logprobs=4, stop=["\n"],
                        structured_outputs={"json": {"type": "object"}})
EXAMPLES = [
    m.AddRequest("r1", SamplingParams(temperature=0.0, stop=["\n"], logit_bias={5: -1.0}), [1, 2, 3]),
    m.AddRequest("r2", SamplingParams(), prompt="hello"),
    m.AddRequest("r3", SamplingParams(), [1, 2], beam_search=BeamSearchParams(4, 32, length_penalty=0.5)),
    m.AddRequest("r4", PARAMS, [1, 2]),
    m.AbortRequest("r1"),
    m.PauseRequest("r1"),
    m.PauseRequest("r1", False, api_key="k"),
    m.RequestOutputDelta("r1", [SampleDelta(0, [5, 6], "ab", [[Logprob(5, -0.1, 1, "a")]], "stop", "x")],
                         True, [1, 2, 3], 16),
    m.RequestOutputDelta("r1", [], False, [1, 2], 0, [None, [Logprob(2, -1.5, 3, "b"),
                                                              Logprob(1, -0.2, 1, "a")]]),
    m.ErrorReply("ValueError", "top_p must be in (0, 1]", "r9"),
    m.HealthPing(7),
    m.HealthPong(7, 3, 1, 0.25),
    m.HealthPong(8, 0, 0, 0.0, 2, [1, 0, 3] + [0] * 11, 40),
    m.HealthPong(9, 1, 0, 0.5, 0, [], 0, 5, 20, 12, [5, 4, 2, 1]),
    m.RequestOutputDelta("r2", [], True, timings=RequestMetrics(0.01, 0.2, 1.5, 1.7)),
    m.ExecuteBatch(SchedulerOutput(4, [NewRequest("a", [1, 2], PARAMS, 2, [[4, 5]])],
                                   [ScheduledChunk("a", [1, 2], 0, [3], True),
                                    ScheduledChunk("b", [5, 6, 7], 9, [4], True, num_draft=2)], ["old"])),
    m.StepResult(ModelRunnerOutput(4, {"a": [9], "b": [6, 8]},
                                   {"a": [[Logprob(9, -0.5, 2), Logprob(1, -0.1, 1), Logprob(9, -0.5, 2)]]})),
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


@pytest.mark.parametrize("params", [{"temperature": -1.0}, {"n": 2 ** 63}, {"stop_token_ids": [2 ** 63]},
                                    {"structured_outputs": {"regex": "a", "choice": ["b"]}}])
def test_params_out_of_range_are_refused_naming_the_request(params):
    frame = msgspec.msgpack.encode({"type": "add_request", "request_id": "r7", "params": params, "api_key": "k",
                                    "version": 3})
    with pytest.raises(RefusedValue) as refused:
        Codec().decode([frame])
    assert (refused.value.request_id, refused.value.api_key, refused.value.version) == ("r7", "k", 3)
    with pytest.raises(ValueError) as direct:
        SamplingParams(**params)
    assert str(refused.value) == str(direct.value)  # the constructor's words, whoever builds the params


@pytest.mark.parametrize("params", [{"temperature": "hot"}, {"temprature": 0.5}])
def test_params_of_the_wrong_shape_are_a_protocol_error(params):
    frame = msgspec.msgpack.encode({"type": "add_request", "request_id": "r7", "params": params})
    with pytest.raises(ProtocolError) as refused:
        Codec().decode([frame])
    assert not isinstance(refused.value, RefusedValue)
