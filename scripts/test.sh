#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run ALL tests: C++ tests of the core and of the SIMT
# emulator (CMake + GoogleTest), the Python suite, and the CUDA kernels' test families in
# the SIMT emulation (scripts/simt_check.sh: coverage, ASan + UBSan, planted bugs), then the
# wheel route (scripts/wheel_check.sh). Tests
# marked cuda skip on a machine without a GPU; arguments go to the main pytest run, and
# with any argument the emulation step is skipped (a quick, partial run).
#
# --quick (the edit-test loop; CI runs the full command): setup only when needed (a set-up
# .venv skips setup.sh; the extension is rebuilt in place only when csrc/, setup.py or torch
# is newer than it), the C++ tests, then EVERY test of the main pytest run (-m "not simt")
# with SPECDEC_QUICK=1, under which the long chi-square and fuzz runs use reduced counts
# (python_tests/helpers.py: draws(); the fuzz suite's "quick" hypothesis profile), on two
# pytest-xdist workers; the CLI, example and fuzz subprocesses are forks of a helper that
# imported torch once (python_tests/cli_runner.py). Left out: the simt-marked tests and
# scripts/simt_check.sh (they JIT-compile the SIMT emulator builds: minutes) and the wheel
# route. Arguments after --quick go to one pytest process (no xdist) instead.
# Measured 2026-12-02 (commit bb71599; 2 cores, no GPU, nothing else running; .venv,
# extension and C++ tests built): 2m15s-2m39s end to end with torch's Inductor caches,
# pytest's cache (.pytest_cache: module order, SASS analysis) and the bytecode caches from an
# earlier run, of which ~7 s setup check and C++ tests; 4m09s for a first run with all empty.
# At commit 57742a3 (the vocabulary-parallel tests added, 1615 tests), warm: 2m55s (load 0.6
# at the start), 3m05s (load 1.7).
set -euo pipefail
cd "$(dirname "$0")/.."

# --long: the long profile instead (scripts/long_check.sh: the 10,000-step engine soak, the
# Python planted-bug check scripts/py_mutations.py, the op fuzzing's long hypothesis profile),
# on the set-up .venv (scripts/setup.sh first when there is none); arguments after --long
# name its steps (soak, mutations, fuzz). Neither the default run nor --quick includes it.
if [ "${1:-}" = "--long" ]; then
  shift
  [ -x .venv/bin/python ] || bash scripts/setup.sh
  exec bash scripts/long_check.sh "$@"
fi

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

# --quick on a set-up .venv (every package of scripts/setup.sh importable, specdec_ext
# installed): no pip run; the extension is rebuilt in place only when a source file under
# csrc/ (.h .cpp .cu .cuh, not the notes), setup.py or the installed torch is newer than
# specdec_ext/_C*.so (setup.py build_ext --inplace: torch's ninja build recompiles just the
# stale objects of build/), instead of setup.sh's ~4 min editable reinstall.
quick_setup() {
  [ -x .venv/bin/python ] || return 1
  .venv/bin/python - <<'PY' || return 1
import importlib.metadata, importlib.util, sys
need = ["torch", "numpy", "scipy", "pytest", "xdist", "hypothesis", "ninja", "setuptools", "wheel",
        "prometheus_client", "safetensors", "tokenizers", "tqdm", "transformers", "matplotlib"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
try:
    importlib.metadata.version("specdec_ext")
except importlib.metadata.PackageNotFoundError:
    missing.append("specdec_ext (not installed)")
if missing:
    print("[test] quick setup: the venv lacks " + ", ".join(missing) + ": running scripts/setup.sh")
    sys.exit(1)
PY
  local so newer
  so=$(ls -t specdec_ext/_C*.so 2>/dev/null | head -n 1)
  if [ -n "$so" ]; then
    # shellcheck disable=SC2046
    newer=$(find csrc setup.py $(ls .venv/lib/python3*/site-packages/torch/version.py 2>/dev/null) -newer "$so" -type f \
      \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \) -print -quit)
    if [ -z "$newer" ]; then
      echo "[test] quick setup: $so is newer than csrc/, setup.py and torch: no rebuild"
      return 0
    fi
    echo "[test] quick setup: $newer is newer than $so: rebuilding in place"
  else
    echo "[test] quick setup: no specdec_ext/_C*.so: building in place"
  fi
  local status=0 log
  log=$(mktemp)
  MAX_JOBS=${MAX_JOBS:-2} .venv/bin/python setup.py -q build_ext --inplace > "$log" 2>&1 || status=$?
  grep -v "psabi" "$log" || true
  rm -f "$log"
  if [ "$status" != 0 ]; then
    echo "[test] quick setup: the build failed (exit status $status)"
    exit 1
  fi
}

# Seconds per step, printed as one line at the end (README: "The test command's steps").
STEP_NAME=""; STEP_START=0; TIMES=""
step() {
  local now; now=$(date +%s)
  [ -z "$STEP_NAME" ] || TIMES="$TIMES $STEP_NAME $(( now - STEP_START ))s,"
  STEP_NAME=$1; STEP_START=$now
}
RUN_START=$(date +%s)
trap 'step end; echo "[test] seconds per step:${TIMES%,}; total $(( $(date +%s) - RUN_START ))s"' EXIT

step setup
if [ "$QUICK" = 1 ] && quick_setup; then
  :
else
  bash scripts/setup.sh
fi
# A build that silently dropped the CUDA kernels must not pass CI.
if [ "${SPECDEC_FORCE_CUDA:-0}" = "1" ]; then
  .venv/bin/python -c "import specdec_ext, sys; sys.exit(0 if specdec_ext.has_cuda_kernels() else 'CUDA kernels missing')"
fi

step cpp_tests
echo "[test] C++ tests (core, SIMT emulator)"
cmake -S . -B cpp_tests/build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build cpp_tests/build -j2 >/dev/null
ctest --test-dir cpp_tests/build --output-on-failure
step headers
echo "[test] every csrc header compiles on its own"; bash scripts/header_check.sh

step pytest
echo "[test] Python tests"
if [ "$QUICK" = 1 ]; then
  echo "[test] quick tier: SPECDEC_QUICK=1 (reduced chi-square draws and fuzz examples), no SIMT emulation, no wheel route"
  # Bytecode caches on, whatever the environment says: pytest keeps its assertion-rewritten
  # test modules in __pycache__ only when Python may write bytecode, and rewriting them all
  # again costs each worker ~5 s of its ~12 s collection.
  export PYTHONDONTWRITEBYTECODE=
  if [ $# -gt 0 ]; then  # arguments: one pytest run with them
    SPECDEC_QUICK=1 .venv/bin/python -m pytest python_tests -q -rs -m "not simt" "$@"
  else
    # Two pytest-xdist workers, each test module whole on one of them (module fixtures set up
    # once), the modules that took longest in the last run first (python_tests/conftest.py).
    # Both workers share 2 cores: OpenMP threads wait passively (spinning, they slow the other
    # worker ~4x) and Inductor compiles in-process (no pool of compile subprocesses).
    OMP_WAIT_POLICY=PASSIVE TORCHINDUCTOR_COMPILE_THREADS=1 SPECDEC_QUICK=1 \
      .venv/bin/python -m pytest python_tests -q -rs -m "not simt" -n 2 --dist loadscope --no-loadscope-reorder
  fi
elif [ $# -eq 0 ]; then
  # The full counts, on two workers as the quick tier (same module scheduling and thread settings).
  OMP_WAIT_POLICY=PASSIVE TORCHINDUCTOR_COMPILE_THREADS=1 \
    .venv/bin/python -m pytest python_tests -q -rs -m "not simt" -n 2 --dist loadscope --no-loadscope-reorder
  for s in coverage mutations asan; do
    step "simt_$s"
    bash scripts/simt_check.sh "$s"
  done
  step wheel
  # The same build as setup's (CUDA kernels included): its objects in build/temp are reused
  # (setup.py: BuildExt), so the wheel costs a link and packaging, not a second compile.
  echo "[test] the wheel route: build a wheel from setup's objects, install it into a fresh venv, use it"
  bash scripts/wheel_check.sh
else
  .venv/bin/python -m pytest python_tests -q -rs "$@"
fi
