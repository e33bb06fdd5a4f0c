#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run ALL tests: C++ tests of the core and of the SIMT
# emulator (CMake + GoogleTest), the Python suite, and the CUDA kernels' test families in
# the SIMT emulation (scripts/simt_check.sh: coverage, ASan + UBSan, planted bugs), then the
# wheel route (scripts/wheel_check.sh). Tests
# marked cuda skip on a machine without a GPU; arguments go to the main pytest run, and
# with any argument the emulation step is skipped (a quick, partial run).
#
# --quick (the edit-test loop; CI runs the full command): the same setup and C++ tests,
# then EVERY test of the main pytest run (-m "not simt") with SPECDEC_QUICK=1, under which
# the long chi-square and fuzz runs use reduced counts (python_tests/helpers.py: draws();
# the fuzz suite's "quick" hypothesis profile). Left out: the simt-marked tests and
# scripts/simt_check.sh (they JIT-compile the SIMT emulator builds: minutes) and the wheel
# route. Arguments after --quick go to that pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi

if [ "${CI:-}" = "true" ] && command -v nvcc >/dev/null 2>&1; then
  export SPECDEC_FORCE_CUDA=1   # CI: CUDA code that does not compile fails the run
fi

# GoogleTest, CMake and Boost.Context (the SIMT emulator's fibers) from Debian's packages when missing.
if ! { [ -f /usr/include/gtest/gtest.h ] && [ -f /usr/include/boost/context/fiber.hpp ] && command -v cmake >/dev/null 2>&1; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq libgtest-dev cmake g++ libboost-context-dev >/dev/null
fi

bash scripts/setup.sh
# A build that silently dropped the CUDA kernels must not pass CI.
if [ "${SPECDEC_FORCE_CUDA:-0}" = "1" ]; then
  .venv/bin/python -c "import specdec_ext, sys; sys.exit(0 if specdec_ext.has_cuda_kernels() else 'CUDA kernels missing')"
fi

echo "[test] C++ tests (core, SIMT emulator)"
cmake -S . -B cpp_tests/build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build cpp_tests/build -j2 >/dev/null
ctest --test-dir cpp_tests/build --output-on-failure

echo "[test] Python tests"
if [ "$QUICK" = 1 ]; then
  echo "[test] quick tier: SPECDEC_QUICK=1 (reduced chi-square draws and fuzz examples), no SIMT emulation, no wheel route"
  if [ $# -gt 0 ]; then  # arguments: one pytest run with them
    SPECDEC_QUICK=1 .venv/bin/python -m pytest python_tests -q -rs -m "not simt" "$@"
  else
    # two pytest processes over alternate test files, side by side: much of the run is
    # single-threaded (subprocess start-up, torch.compile), so 2 cores do it in ~2/3 the time
    mapfile -t files < <(ls python_tests/test_*.py)
    shard() { for i in "${!files[@]}"; do [ $((i % 2)) = "$1" ] && echo "${files[$i]}"; done; }
    logs=$(mktemp -d)
    for s in 0 1; do
      # shellcheck disable=SC2046
      SPECDEC_QUICK=1 .venv/bin/python -m pytest $(shard $s) -q -rs -m "not simt" -p no:cacheprovider \
        > "$logs/shard$s.log" 2>&1 &
      pids[$s]=$!
    done
    status=0
    for s in 0 1; do
      wait "${pids[$s]}" || status=1
      echo "[test] quick shard $((s + 1)) of 2:"
      cat "$logs/shard$s.log"
    done
    exit "$status"
  fi
elif [ $# -eq 0 ]; then
  .venv/bin/python -m pytest python_tests -q -rs -m "not simt"
  bash scripts/simt_check.sh
  echo "[test] the wheel route: build a wheel (CPU kernels), install it into a fresh venv, use it"
  SPECDEC_CPU_ONLY=1 bash scripts/wheel_check.sh
else
  .venv/bin/python -m pytest python_tests -q -rs "$@"
fi
