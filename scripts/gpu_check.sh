#!/usr/bin/env bash
# The GPU checks of actorserve, unattended, offline, in under 8 minutes on one GPU: scripts/gpu_check.py says
# what runs (install from gpu-wheels/, the cuda-marked and triton tests compiled, every family against
# transformers on the GPU, CUDA graphs against eager, the decode benchmark) and writes gpu_check.json.
# Beforehand, where there is a network: python scripts/fetch_gpu_wheels.py (the wheels the GPU image lacks).
# Exit status: 0 when every check passed, 1 when one failed, 2 when there is no GPU here (nothing ran).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" scripts/gpu_check.py "$@"
