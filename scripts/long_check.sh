#!/usr/bin/env bash
# The long profile (bash scripts/test.sh --long, or this script on a set-up .venv): the checks
# too long for the default suite, each a stronger run of something the default suite samples.
#
#   1. the engine soak at 10,000 steps (python_tests/test_soak.py; the default suite runs a
#      short soak): caches equal a fresh prefill every 500 steps and after every sequence, the
#      paged block pool back to its baseline after each sequence, resident memory flat after
#      warm-up, and a second soak with the same seed giving the same tokens;
#   2. the Python planted-bug check (scripts/py_mutations.py): every bug planted in a copy of
#      the package (engine, op wrappers, caches, shims) must fail the tests named with it;
#   3. the op fuzzing at its long hypothesis profile (python_tests/test_fuzz_ops.py,
#      SPECDEC_FUZZ_PROFILE=long: 5000 random examples per op instead of CI's 200).
#
# Every step runs even when an earlier one failed; the exit status is 1 if any failed.
# Arguments: the steps to run (soak, mutations, fuzz; default all of them), e.g.
#   bash scripts/long_check.sh soak mutations
# Measured 2026-12-03 (2 shared cores, no GPU, other test runs on the machine): the soak
# 2m08s (4m22s under a heavier load), the planted-bug check 3m38s (14 bugs); the long fuzz
# profile was not run or timed here (5000 examples per op instead of CI's 200).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(soak mutations fuzz)

failed=()
for step in "${STEPS[@]}"; do
  start=$(date +%s)
  case "$step" in
    soak)
      echo "[long] engine soak: 10,000 steps (python_tests/test_soak.py)"
      SPECDEC_SOAK_STEPS=10000 $PY -m pytest python_tests/test_soak.py -q -rs -s -p no:cacheprovider ;;
    mutations)
      echo "[long] Python planted bugs (scripts/py_mutations.py)"
      $PY scripts/py_mutations.py ;;
    fuzz)
      echo "[long] op fuzzing, long profile (SPECDEC_FUZZ_PROFILE=long python_tests/test_fuzz_ops.py)"
      SPECDEC_FUZZ_PROFILE=long $PY -m pytest python_tests/test_fuzz_ops.py -q -rs -p no:cacheprovider ;;
    *)
      echo "[long] unknown step '$step' (soak, mutations, fuzz)" >&2
      exit 2 ;;
  esac
  status=$?
  echo "[long] $step: exit status $status, $(( $(date +%s) - start )) s"
  [ "$status" = 0 ] || failed+=("$step")
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "[long] FAILED: ${failed[*]}"
  exit 1
fi
echo "[long] every step passed: ${STEPS[*]}"
