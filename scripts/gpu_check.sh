#!/usr/bin/env bash
# The GPU checks of actorserve, in one run of under 10 minutes on one GPU (README: "GPU workers"):
#   1. installs .[cuda,test] (flashinfer-python==0.7.2.post1, triton);
#   2. runs the cuda-marked tests (among them the bf16 reference test on CUDA, teacher-forced, CUDA graph
#      replay against eager, and PP=2 over NCCL where two GPUs are present) and the triton kernels'
#      tests compiled for the GPU instead of interpreted;
#   3. prints the batch-1 and batch-64 decode benchmark, with the batch-1 step against its bound.
# Exit status: 0 when every check passed, 1 when one failed, 2 when there is no GPU here (nothing ran).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -lt 1 ]; then
    echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi lists none): nothing was checked."
    exit 2
fi
step() { echo; echo "== $*"; }
status=0

step "GPUs ($gpus)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
step "install .[cuda,test]"
$PY -m pip install -q -e '.[cuda,test]' ||
    echo "gpu_check: the install failed (offline?); going on with what is installed"
if ! $PY -c "import torch; assert torch.cuda.is_available(); print('torch', torch.__version__, torch.version.cuda)"
then
    echo "gpu_check: torch sees no CUDA device (a CPU build of torch?): install a CUDA build of torch first."
    exit 1
fi
step "cuda-marked tests (bf16 reference on CUDA, CUDA graphs, PP=2 over NCCL on two GPUs)"
timeout 300 $PY -m pytest -q -m cuda tests -p no:cacheprovider -rs || status=1
step "triton kernels, compiled"
export ACTORSERVE_TRITON_COMPILED=1
timeout 180 $PY -m pytest -q tests/kernels/triton -p no:cacheprovider || status=1
step "decode benchmark (bench/gpu_decode.py)"
timeout 180 $PY bench/gpu_decode.py || status=1
step "done: $([ $status -eq 0 ] && echo 'every check passed' || echo 'a check FAILED (above)')"
exit $status
