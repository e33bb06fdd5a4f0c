#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run ALL tests: C++ core tests (CMake + GoogleTest)
# and the Python suite. CUDA tests skip on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${CI:-}" = "true" ] && command -v nvcc >/dev/null 2>&1; then
  export SPECDEC_FORCE_CUDA=1   # CI: CUDA code that does not compile fails the run
fi

# GoogleTest and CMake from Debian's packages when missing.
if ! { [ -f /usr/include/gtest/gtest.h ] && command -v cmake >/dev/null 2>&1; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libgtest-dev cmake g++ >/dev/null
fi

bash scripts/setup.sh
# A build that silently dropped the CUDA kernels must not pass CI.
if [ "${SPECDEC_FORCE_CUDA:-0}" = "1" ]; then
  .venv/bin/python -c "import specdec_ext, sys; sys.exit(0 if specdec_ext.has_cuda_kernels() else 'CUDA kernels missing')"
fi

echo "[test] C++ core tests"
cmake -S . -B cpp_tests/build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build cpp_tests/build -j2 >/dev/null
ctest --test-dir cpp_tests/build --output-on-failure

echo "[test] Python tests"
.venv/bin/python -m pytest python_tests -q -rs "$@"
