#!/usr/bin/env bash
# Build the installed llama-cpp-python's own version of llama.cpp for AVX2 + FMA + F16C only (no AVX-512,
# no VNNI), into DIR/lib, as the peer of our AVX2 paths: a CPU with AVX2 alone runs llama.cpp's AVX2 build,
# and the bench runs it with LLAMA_CPP_LIB_PATH=DIR/lib (bench/README.md says how).
# Usage: bench/llama_cpp_avx2.sh [DIR]   (DIR defaults to bench/.llama-cpp-avx2; a few minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-bench/.llama-cpp-avx2}
PY=${PY:-.venv/bin/python}
VERSION=$($PY -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF \
-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF \
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  $PY -m pip wheel --no-deps --no-binary llama-cpp-python --no-cache-dir -w "$WORK" "llama-cpp-python==$VERSION"
mkdir -p "$DIR"
$PY -m zipfile -e "$WORK"/llama_cpp_python-*.whl "$WORK/wheel"
rm -rf "$DIR/lib"
cp -r "$WORK/wheel/llama_cpp/lib" "$DIR/lib"
if objdump -d "$DIR"/lib/libggml-cpu.so | grep -qE '%zmm|vpdpbusd'; then
  echo "the build has AVX-512 or VNNI instructions: not an AVX2 peer" >&2
  exit 1
fi
echo "llama.cpp $VERSION for AVX2 in $DIR/lib: LLAMA_CPP_LIB_PATH=$(realpath "$DIR/lib")"
