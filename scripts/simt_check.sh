#!/usr/bin/env bash
# The CUDA kernels' test families run in the SIMT emulation (python_tests/test_*_gpu.py,
# marker simt; csrc/simt/NOTES.md), in the emulator builds CI runs:
#   bash scripts/simt_check.sh coverage    -O2 --coverage: every emulated test, then the gcov line
#                                          coverage of csrc/cuda (fails below 95% of kernel-body lines)
#   bash scripts/simt_check.sh asan        AddressSanitizer + UBSan (memcheck analog): every emulated
#                                          family except the chi-square laws
#   bash scripts/simt_check.sh mutations   proof of power: planted bugs must fail the tests
#   bash scripts/simt_check.sh             all three (coverage, mutations, asan)
# Needs the venv of scripts/setup.sh and Boost.Context (libboost-context-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
TESTS=(python_tests/test_*_gpu.py)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(coverage mutations asan)

for step in "${steps[@]}"; do
  start=$(date +%s)
  case "$step" in
    coverage)
      echo "[simt] emulated tests, coverage build (-O2 --coverage)"
      SPECDEC_SIMT_BUILD=coverage $PY -c "from specdec_ext.testing import simt; simt.load()"
      $PY scripts/simt_coverage.py --reset
      SPECDEC_SIMT_BUILD=coverage $PY -m pytest "${TESTS[@]}" -m simt -q -p no:cacheprovider
      $PY scripts/simt_coverage.py --min 95
      ;;
    asan)
      echo "[simt] emulated tests, ASan + UBSan build (one random schedule per call)"
      # Python and torch are not instrumented: the ASan runtime is preloaded (with libstdc++,
      # whose __cxa_throw ASan must find first), leaks are not reported (Python's allocator),
      # UBSan stops at the first finding. One schedule: this run looks for memory errors;
      # schedule independence is the coverage run's check.
      LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
      ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      SPECDEC_SIMT_BUILD=asan SPECDEC_SIMT_SCHEDULES=7 \
        $PY -m pytest "${TESTS[@]}" -m "simt and not law" -q -p no:cacheprovider
      ;;
    mutations)
      echo "[simt] proof of power: planted bugs"
      $PY scripts/simt_mutations.py
      ;;
    *) echo "unknown step '$step' (coverage | asan | mutations)" >&2; exit 2 ;;
  esac
  echo "[simt] $step: $(( $(date +%s) - start )) s"
done
