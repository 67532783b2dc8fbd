"""The FlashInfer backend's contract with its kernels, on CPU: a fake flashinfer module takes the place
of the real one, asserts the exact dtypes, devices and contiguity of everything it receives (whatever
dtypes the step's metadata came in), and computes attention from the page indices it is given, so the
backend's output also checks its indices against the torch backend. And the one version pin: every
mention of flashinfer-python's version agrees with it."""
import re
from pathlib import Path

import pytest
import torch

from actorserve.kernels.attention import AttentionMetadata, TorchRefBackend
from actorserve.kernels.attention.flashinfer import FLASHINFER_VERSION, FlashInferBackend
from tests.kernels.attention.groups import sequence_group, slot_mapping

ROOT = Path(__file__).resolve().parents[3]


def _check_index(x, name):
    assert x.dtype == torch.int32, f"{name} is {x.dtype}"
    assert x.is_contiguous(), f"{name} is not contiguous"


class _Wrapper:
    def __init__(self, workspace, layout):
        assert layout == "NHD" and workspace.dtype == torch.uint8
        assert not workspace.any(), "FlashInfer's workspace must be zeroed"
        self.planned = None
        self.plans = 0

    def _attend(self, q, caches, qo_indptr):
        k_cache, v_cache = caches
        for c in caches:
            assert c.is_contiguous() and c.dtype == self.planned["kv_data_type"]
        assert q.is_contiguous() and q.dtype == self.planned["q_data_type"]
        indptr, indices, last = self.planned["kv_indptr"], self.planned["kv_indices"], self.planned["last"]
        bs, kvh, d = k_cache.shape[1:]
        g = q.shape[1] // kvh
        out = torch.empty_like(q)
        for b in range(len(indptr) - 1):
            pages = indices[indptr[b]:indptr[b + 1]].long()
            n = (len(pages) - 1) * bs + int(last[b])
            keys = k_cache[pages].reshape(-1, kvh, d)[:n].float().repeat_interleave(g, dim=1)
            values = v_cache[pages].reshape(-1, kvh, d)[:n].float().repeat_interleave(g, dim=1)
            lo, hi = int(qo_indptr[b]), int(qo_indptr[b + 1])
            queries = q[lo:hi].float()
            scores = torch.einsum("qhd,khd->hqk", queries, keys) * self.planned["sm_scale"]
            cap = self.planned["logits_soft_cap"]
            if cap is not None:
                scores = torch.tanh(scores / cap) * cap
            positions = torch.arange(n - (hi - lo), n)
            keys_at = torch.arange(n)[None, None, :]
            scores.masked_fill_(keys_at > positions[None, :, None], float("-inf"))
            if self.planned["window_left"] >= 0:  # keys more than window_left left of the query are out
                scores.masked_fill_(keys_at < positions[None, :, None] - self.planned["window_left"], float("-inf"))
            out[lo:hi] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), values).to(q.dtype)
        return out


class _Decode(_Wrapper):
    CUDA_CORE_GROUPS = (1, 2, 3, 4, 6, 8, 16)  # FlashInfer 0.7's CUDA-core decode kernels, as it dispatches them

    def __init__(self, workspace, layout, use_tensor_cores=False):
        super().__init__(workspace, layout)
        self.use_tensor_cores = use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             pos_encoding_mode, sm_scale, q_data_type, kv_data_type, window_left, logits_soft_cap):
        group = num_qo_heads // num_kv_heads
        if not self.use_tensor_cores and group not in self.CUDA_CORE_GROUPS:
            raise RuntimeError(f"Unsupported group_size: {group}")  # (what FlashInfer raises)
        for x, name in ((indptr, "indptr"), (indices, "indices"), (last_page_len, "last_page_len")):
            _check_index(x, name)
        assert pos_encoding_mode == "NONE" and 1 <= int(last_page_len.min()) and int(last_page_len.max()) <= page_size
        self.plans += 1
        self.planned = dict(kv_indptr=indptr, kv_indices=indices, last=last_page_len, sm_scale=sm_scale,
                            q_data_type=q_data_type, kv_data_type=kv_data_type, window_left=window_left,
                            logits_soft_cap=logits_soft_cap)

    def run(self, q, caches):
        return self._attend(q, caches, torch.arange(q.shape[0] + 1))


class _Prefill(_Wrapper):
    def plan(self, qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
             causal, sm_scale, q_data_type, kv_data_type, window_left, logits_soft_cap):
        for x, name in ((qo_indptr, "qo_indptr"), (indptr, "indptr"), (indices, "indices"),
                        (last_page_len, "last_page_len")):
            _check_index(x, name)
        assert causal
        self.plans += 1
        self.planned = dict(kv_indptr=indptr, kv_indices=indices, last=last_page_len, sm_scale=sm_scale,
                            q_data_type=q_data_type, kv_data_type=kv_data_type, qo_indptr=qo_indptr,
                            window_left=window_left, logits_soft_cap=logits_soft_cap)

    def run(self, q, caches):
        return self._attend(q, caches, self.planned["qo_indptr"])


class FakeFlashInfer:
    BatchDecodeWithPagedKVCacheWrapper = _Decode
    BatchPrefillWithPagedKVCacheWrapper = _Prefill


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (5, 0.0), (3, 0.5)], ids=["plain", "window", "window+cap"])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_the_kernels_get_int32_indices_and_contiguous_tensors_and_the_right_pages(index_dtype, window, softcap):
    g = torch.Generator().manual_seed(0)
    kvh, h, d, bs, blocks = 2, 4, 16, 4, 20
    decode = sequence_group([1, 1, 1], [8, 3, 0], [[4, 9, 2], [7], [11]], 0, index_dtype)
    prefill = sequence_group([6, 2], [0, 5], [[1, 3], [5, 6]], 3, index_dtype)
    slots = slot_mapping((decode, prefill), bs)
    meta = AttentionMetadata(torch.tensor(slots, dtype=index_dtype), decode, prefill)
    qkv = torch.randn(len(slots), (h + 2 * kvh) * d, generator=g).to(torch.bfloat16)
    q, k, v = (x.view(len(slots), -1, d) for x in qkv.split([h * d, kvh * d, kvh * d], -1))  # strided, as models give
    ref_cache = torch.randn(2, kvh, blocks, bs, d, generator=g).to(torch.bfloat16)  # cached prefixes: noise
    before = ref_cache.clone()
    ref = TorchRefBackend(kvh, blocks, bs)
    ref_meta = AttentionMetadata(torch.tensor(slots), sequence_group([1, 1, 1], [8, 3, 0], [[4, 9, 2], [7], [11]], 0,
                                                             torch.int64),
                                 sequence_group([6, 2], [0, 5], [[1, 3], [5, 6]], 3, torch.int64))
    expected = ref.forward(q, k, v, ref_cache[0], ref_cache[1], ref.prepare(ref_meta), d ** -0.5, window, softcap)

    backend = FlashInferBackend(kvh, blocks, bs, kernels=FakeFlashInfer())
    assert backend.kv_cache_shape(blocks, bs, kvh, d) == (blocks, bs, kvh, d)
    caches = [c.permute(1, 2, 0, 3).contiguous() for c in before]  # the same cache, in FlashInfer's layout
    plan = backend.prepare(meta)
    for layer in range(2):  # planned once a step, run in every layer
        got = backend.forward(q, k, v, caches[0], caches[1], plan, d ** -0.5, window, softcap)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    assert [w.plans for w in backend._wrappers.values()] == [1, 1]
    written = ref_cache.permute(0, 2, 3, 1, 4).reshape(2, -1, kvh, d)[:, slots]
    assert torch.equal(torch.stack(caches).view(2, -1, kvh, d)[:, slots], written)


@pytest.mark.parametrize("heads, kv_heads, tensor_cores", [(8, 2, False), (7, 1, True), (10, 2, True), (16, 1, True)],
                         ids=["group-4", "group-7-qwen2.5-7b", "group-5-qwen2.5-14b", "group-16"])
def test_decodes_of_every_group_size_plan_on_the_kernels_that_take_it(heads, kv_heads, tensor_cores):
    """The CUDA-core decode takes groups of 1, 2, 3, 4, 6, 8 or 16 query heads a KV head; past 4 (as vLLM)
    the backend builds tensor-core decode wrappers, which take any, and the rows are still right."""
    g = torch.Generator().manual_seed(1)
    d, bs, blocks = 16, 4, 12
    decode = sequence_group([1, 1], [6, 2], [[4, 9], [7]], 0)
    slots = slot_mapping((decode,), bs)
    meta = AttentionMetadata(torch.tensor(slots), decode, None)
    q = torch.randn(len(slots), heads, d, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(len(slots), kv_heads, d, generator=g).to(torch.bfloat16) for _ in range(2))
    cache = torch.randn(2, kv_heads, blocks, bs, d, generator=g).to(torch.bfloat16)
    ref = TorchRefBackend(kv_heads, blocks, bs)
    ref_caches = cache.clone()
    expected = ref.forward(q, k, v, ref_caches[0], ref_caches[1], ref.prepare(meta), d ** -0.5)
    backend = FlashInferBackend(kv_heads, blocks, bs, kernels=FakeFlashInfer())
    caches = [c.permute(1, 2, 0, 3).contiguous() for c in cache]
    got = backend.forward(q, k, v, caches[0], caches[1], backend.prepare(meta), d ** -0.5)
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)
    (wrapper,) = backend._wrappers.values()
    assert wrapper.use_tensor_cores is tensor_cores
    if heads // kv_heads == 7:  # the fake refuses what FlashInfer refuses: a group of 7 on CUDA cores
        with pytest.raises(RuntimeError, match="group_size"):
            _Decode(torch.zeros(8, dtype=torch.uint8), "NHD").plan(
                *(torch.zeros(2, dtype=torch.int32),) * 3, heads, kv_heads, d, bs, pos_encoding_mode="NONE",
                sm_scale=1.0, q_data_type=q.dtype, kv_data_type=q.dtype, window_left=-1, logits_soft_cap=None)


def test_every_mention_of_the_flashinfer_version_agrees_with_the_pin():
    mentions = {}
    for path in [ROOT / "setup.cfg", ROOT / "README.md", ROOT / "scripts" / "gpu_check.sh",
                 *(ROOT / "docs").glob("*.md")]:
        if path.exists():
            for found in re.findall(r"flashinfer-python\s*[=~<>!]=\s*([\w.]+)", path.read_text()):
                mentions.setdefault(found, []).append(path.name)
    assert "setup.cfg" in mentions.get(FLASHINFER_VERSION, []), mentions  # the cuda extra pins it
    assert set(mentions) == {FLASHINFER_VERSION}, mentions
