#!/usr/bin/env bash
# Set up a fresh machine: a venv in .venv with torch 2.14.1 (CUDA 13.0 build, from
# local disk here) and the test/bench tools, then build + install specdec_ext into it.
# With nvcc present the CUDA kernels are built too; SPECDEC_FORCE_CUDA=1 makes a
# missing nvcc an error (CI sets it), SPECDEC_CPU_ONLY=1 skips CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${SPECDEC_TORCH_SPEC:-torch==2.14.1}

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "$TORCH_SPEC" numpy scipy pytest pytest-xdist hypothesis ninja setuptools wheel \
  prometheus_client safetensors tokenizers tqdm transformers matplotlib

export MAX_JOBS=${MAX_JOBS:-2}
echo "[setup] building specdec_ext (MAX_JOBS=$MAX_JOBS)"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | grep -v "psabi" || true
.venv/bin/python -c "import specdec_ext; print('[setup] specdec_ext', specdec_ext.__version__, 'CUDA kernels:', specdec_ext.has_cuda_kernels())"
