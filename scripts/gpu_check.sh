#!/usr/bin/env bash
# The ONE prepared GPU check: on a machine with a GPU and its own torch (no network),
# build specdec_ext with the CUDA kernels, run the CUDA tests and the benchmarks,
# and write logs + JSON to OUTDIR. Designed to finish in < 8 minutes on an H200:
#   bash scripts/gpu_check.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-16} SPECDEC_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
log() { echo "[gpu_check $(date +%T)] $*" | tee -a "$OUTDIR/summary.txt"; }

{ nvidia-smi; "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } \
  > "$OUTDIR/env.txt" 2>&1
log "build"
timeout 300 "$PY" -m pip install --no-build-isolation --no-deps -e . > "$OUTDIR/build.log" 2>&1 \
  || { log "BUILD FAILED (see build.log)"; tail -40 "$OUTDIR/build.log"; exit 1; }

log "CUDA tests"
# no -x: one failing CUDA test must not hide the others; every test has its own time limit
timeout 180 "$PY" -m pytest python_tests -q -m cuda -p no:cacheprovider -o faulthandler_timeout=60 -rf \
  > "$OUTDIR/pytest_cuda.log" 2>&1
log "pytest (cuda) exit $? : $(tail -1 "$OUTDIR/pytest_cuda.log")"

log "bench verify (cuda)"
timeout 200 "$PY" -m specdec_ext.bench verify --device cuda --json "$OUTDIR/bench_verify.json" \
  > "$OUTDIR/bench_verify.txt" 2>&1
log "bench verify exit $?"
log "bench kv (cuda)"
timeout 30 "$PY" -m specdec_ext.bench kv --device cuda --json "$OUTDIR/bench_kv.json" > "$OUTDIR/bench_kv.txt" 2>&1
log "bench kv exit $?"
log "bench e2e (cuda)"
timeout 60 "$PY" -m specdec_ext.bench e2e --device cuda --no-progress --max-new-tokens 64 \
  --json "$OUTDIR/bench_e2e.json" > "$OUTDIR/bench_e2e.txt" 2>&1
log "bench e2e exit $?"
"$PY" benchmarks/check_targets.py "$OUTDIR/bench_verify.json" "$OUTDIR/bench_e2e.json" > "$OUTDIR/targets.txt" 2>&1
log "targets: $(grep -c 'NOT MET' "$OUTDIR/targets.txt") not met (targets.txt)"
cat "$OUTDIR/summary.txt"
