#!/usr/bin/env bash
# Every header under csrc/ (*.h, *.cuh) compiles on its own: a translation unit holding only
# `#include "that/header"` compiles, in each mode the build uses the header in (issue 30,
# item 3). A header that compiles only after another one was included first fails here.
#
#   host    csrc/core, csrc/cpu, csrc/args, csrc/*.h: g++ -fsyntax-only -std=c++20 with the
#           extension's include paths and defines (setup.py: csrc/, torch's include dirs,
#           Python, torch's nvidia/cu13 headers, CUDA; -DSPECDEC_WITH_CUDA=1).
#   core17  csrc/core (framework-free): g++ -fsyntax-only -std=c++17 -I csrc, nothing else,
#           as cpp_tests (CMakeLists.txt) compiles them: no torch, no CUDA header may creep in.
#   simt    csrc/cuda (but launch_cuda.h and torch_backend.h, host mode), csrc/simt: host C++ through the SIMT emulation,
#           g++ -fsyntax-only -std=c++20 -DSPECDEC_SIMT -I csrc/simt/include -I csrc
#           (specdec_ext/testing/simt.py load(); torch's paths are left out on purpose:
#           the kernel and emulator headers are torch-free).
#   nvcc    csrc/cuda and csrc/core, with the real CUDA toolchain as setup.py's nvcc line
#           (nvcc -x cu -std=c++20, the __CUDA_NO_HALF*__ defines, --expt-relaxed-constexpr),
#           front ends only: -fdevice-syntax-only -Xcompiler -fsyntax-only, -o /dev/null
#           (a full device compile of the *_launch.cuh headers costs ~70 s each). Why:
#           the SIMT headers (csrc/simt/include) declare every emulated CUDA type whichever
#           one is included, so a .cuh missing e.g. <cuda_fp16.h> passes simt and fails
#           here; core's __CUDA_ARCH__ branches compile only here; and
#           csrc/cuda/launch_cuda.h is the real-CUDA launch backend (cudaLaunchKernel,
#           cudaOccupancy*, stream capture), which has no SIMT form: nvcc mode only.
#           Without nvcc this mode is skipped with a note (an error under SPECDEC_FORCE_CUDA=1).
#
# Note: -fsyntax-only checks what does not depend on a template parameter; a name looked up
# only at instantiation is checked by the real builds.
#
# Prints the first header that fails, with its compiler error, and exits 1; else how many
# headers it checked. Two jobs at a time (HEADER_CHECK_JOBS); 40-50 s on 2 cores.
#   bash scripts/header_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
# torch's and Python's include dirs without importing torch (a few seconds saved)
read -r TORCH_DIR PY_INC < <("$PY" - <<'PY'
import importlib.util, sysconfig
spec = importlib.util.find_spec("torch")
print(spec.submodule_search_locations[0] if spec else "/nonexistent", sysconfig.get_paths()["include"])
PY
)
SITE=$(dirname "$TORCH_DIR")
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

COMMON_HOST=(-std=c++20 -fsyntax-only -Wall -Wno-unknown-pragmas -DSPECDEC_WITH_CUDA=1 -I"$ROOT/csrc"
  -I"$SITE/nvidia/cu13/include" -I"$TORCH_DIR/include" -I"$TORCH_DIR/include/torch/csrc/api/include"
  -I"$CUDA_HOME/include" -I"$PY_INC")
CORE17=(-std=c++17 -fsyntax-only -Wall -Wextra -I"$ROOT/csrc")
SIMT=(-std=c++20 -fsyntax-only -Wall -Wno-unknown-pragmas -fno-strict-aliasing -DSPECDEC_SIMT
  -I"$ROOT/csrc/simt/include" -I"$ROOT/csrc")
NVCC_FLAGS=(-x cu -std=c++20 -DSPECDEC_WITH_CUDA=1 -I"$ROOT/csrc" -I"$SITE/nvidia/cu13/include"
  -I"$TORCH_DIR/include" -I"$TORCH_DIR/include/torch/csrc/api/include" -I"$CUDA_HOME/include"
  -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
  -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -arch=sm_90
  -fdevice-syntax-only -Xcompiler -fsyntax-only -c -o /dev/null)

NVCC=""
if command -v nvcc >/dev/null 2>&1; then
  NVCC=$(command -v nvcc)
elif [ -x "$CUDA_HOME/bin/nvcc" ]; then
  NVCC="$CUDA_HOME/bin/nvcc"
elif [ "${SPECDEC_FORCE_CUDA:-0}" = "1" ]; then
  echo "[header_check] SPECDEC_FORCE_CUDA=1 but nvcc not found: the nvcc mode cannot run" >&2
  exit 1
else
  echo "[header_check] nvcc not found: the nvcc mode (csrc/cuda, csrc/core under the real CUDA toolchain) is skipped"
fi

# The modes of each header, from its place in csrc/.
modes_of() {
  case "$1" in
    simt/*) echo simt ;;
    cuda/launch_cuda.h) echo nvcc ;;  # the real-CUDA launch backend: no SIMT form
    cuda/torch_backend.h) echo host ;;  # the op adapters' CUDA backend: torch side, no kernels
    cuda/*) echo simt nvcc ;;
    core/*) echo host core17 nvcc ;;
    *.cuh) echo simt nvcc ;;
    *) echo host ;;
  esac
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The jobs, one line each: index mode header (relative to csrc/), in a fixed order.
n_headers=0
n_jobs=0
: > "$WORK/jobs"
while IFS= read -r h; do
  n_headers=$((n_headers + 1))
  for m in $(modes_of "$h"); do
    if [ "$m" = nvcc ] && [ -z "$NVCC" ]; then continue; fi
    n_jobs=$((n_jobs + 1))
    echo "$n_jobs $m $h" >> "$WORK/jobs"
  done
done < <(cd csrc && find . \( -name '*.h' -o -name '*.cuh' \) -type f | sed 's|^\./||' | LC_ALL=C sort)

check_one() {  # index mode header: writes $WORK/<index>.fail (the error) when it does not compile
  local i=$1 mode=$2 h=$3 log="$WORK/$1.log" status=0
  case "$mode" in
    host)   printf '#include "%s"\n' "$h" | g++ "${COMMON_HOST[@]}" -x c++ - > "$log" 2>&1 || status=$? ;;
    core17) printf '#include "%s"\n' "$h" | g++ "${CORE17[@]}" -x c++ - > "$log" 2>&1 || status=$? ;;
    simt)   printf '#include "%s"\n' "$h" | g++ "${SIMT[@]}" -x c++ - > "$log" 2>&1 || status=$? ;;
    nvcc)
      printf '#include "%s"\n' "$h" > "$WORK/$i.cu"
      "$NVCC" "${NVCC_FLAGS[@]}" "$WORK/$i.cu" > "$log" 2>&1 || status=$? ;;
  esac
  if [ "$status" != 0 ]; then mv "$log" "$WORK/$i.fail"; fi
  return 0
}
export -f check_one
export WORK NVCC
# arrays do not export: hand them over as strings of shell words
COMMON_HOST_S=$(printf '%q ' "${COMMON_HOST[@]}")
CORE17_S=$(printf '%q ' "${CORE17[@]}")
SIMT_S=$(printf '%q ' "${SIMT[@]}")
NVCC_S=$(printf '%q ' "${NVCC_FLAGS[@]}")
export COMMON_HOST_S CORE17_S SIMT_S NVCC_S

start=$SECONDS
xargs -P "${HEADER_CHECK_JOBS:-2}" -L 1 bash -c '
  eval "COMMON_HOST=($COMMON_HOST_S)"; eval "CORE17=($CORE17_S)"; eval "SIMT=($SIMT_S)"; eval "NVCC_FLAGS=($NVCC_S)"
  check_one "$@"' _ < "$WORK/jobs"

failed=()
while read -r i m h; do
  [ -f "$WORK/$i.fail" ] && failed+=("$i $m $h")
done < "$WORK/jobs"

if [ ${#failed[@]} -gt 0 ]; then
  read -r i m h <<< "${failed[0]}"
  echo "[header_check] FAIL: csrc/$h does not compile on its own ($m mode):"
  head -n 40 "$WORK/$i.fail"
  if [ ${#failed[@]} -gt 1 ]; then
    echo "[header_check] all ${#failed[@]} failures (header, mode):"
    for f in "${failed[@]}"; do read -r i m h <<< "$f"; echo "  csrc/$h ($m)"; done
  fi
  exit 1
fi
echo "[header_check] all $n_headers headers under csrc/ compile on their own ($n_jobs compiles: host, core17, simt${NVCC:+, nvcc}; $((SECONDS - start)) s)"
