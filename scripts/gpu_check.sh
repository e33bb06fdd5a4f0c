#!/usr/bin/env bash
# The ONE prepared GPU check: on a machine with a GPU and its own torch (no network),
# build specdec_ext with the CUDA kernels, read the SASS, run the CUDA tests, the
# sanitizers on small calls, the benchmarks (eager + CUDA-graph device time, warm and
# cold caches, % of the HBM floor) and one ncu reading, and write logs, JSON and a
# markdown summary to OUTDIR. Every step has its own time limit (a hung step cannot eat
# the others' time); meant to finish in < 8 minutes on an H200:
#   bash scripts/gpu_check.sh "$OUT"
#   PREFLIGHT_ONLY=1 bash scripts/gpu_check.sh OUTDIR     (the tool checks only: runs anywhere)
# time limits (s): preflight 30 (8 + 12 + 2 + 3 + 5), build 130, sass 15, tests 120 + 15, sanitizers 2 x 25,
# bench verify 80, bench filters 30, bench filtered 10, bench kv 20, bench e2e 55, ncu 25, targets 10, report 10 (600 s if every
# step ran to its limit; expected well under 8 minutes: the build is ~1.5 min, the CUDA tests ~1 min)
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: scripts/gpu_check.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
PY=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-16} SPECDEC_FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} PYTHONUNBUFFERED=1
log() { echo "[gpu_check $(date +%T)] $*" | tee -a "$OUTDIR/summary.txt"; }

# ---- preflight: what is here (each probe under a time limit; a missing optional tool skips its step)
tool() {  # tool NAME PATH...: first executable candidate, or empty
  local name=$1; shift
  for c in "$@"; do [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }; done
  command -v "$name" 2>/dev/null || true
}
CUDA_BIN=${CUDA_HOME:-/usr/local/cuda}/bin
TRITON_BIN=$(timeout 8 "$PY" -c "import os, triton; print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin'))" 2>/dev/null)
NVCC=$(tool nvcc "$CUDA_BIN/nvcc")
CUOBJDUMP=$(tool cuobjdump "$TRITON_BIN/cuobjdump" "$CUDA_BIN/cuobjdump")
SANITIZER=$(tool compute-sanitizer "$CUDA_BIN/compute-sanitizer")
NCU=$(tool ncu "$CUDA_BIN/ncu")
# one torch import for the GPU test and the environment line: "1|0 torch X cuda Y gpu NAME"
TORCH_INFO=$(timeout 12 "$PY" -c "import torch; ok = torch.cuda.is_available(); print(int(ok), 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', ok and torch.cuda.get_device_name())" 2>&1 | tail -1)
{
  echo "python: $(timeout 2 "$PY" --version 2>&1)"
  echo "${TORCH_INFO#* }"
  echo "nvcc: ${NVCC:-MISSING} $( [ -n "$NVCC" ] && timeout 3 "$NVCC" --version | tail -1)"
  echo "cuobjdump: ${CUOBJDUMP:-MISSING}"
  echo "compute-sanitizer: ${SANITIZER:-MISSING}"
  echo "ncu: ${NCU:-MISSING}"
  timeout 5 nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 || echo "nvidia-smi: MISSING"
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"
GPU_OK=${TORCH_INFO%% *}
log "preflight: gpu=${GPU_OK:-0} nvcc=${NVCC:+yes} cuobjdump=${CUOBJDUMP:+yes} sanitizer=${SANITIZER:+yes} ncu=${NCU:+yes}"
[ -n "${PREFLIGHT_ONLY:-}" ] && exit 0
[ "${GPU_OK:-0}" = 1 ] || { log "NO GPU VISIBLE: stop"; exit 1; }
[ -n "$NVCC" ] || { log "NO NVCC: cannot build the CUDA kernels"; exit 1; }
[ -n "$CUOBJDUMP" ] && export PATH="$(dirname "$CUOBJDUMP"):$PATH"

log "build"
timeout 130 "$PY" -m pip install --no-build-isolation --no-deps -e . > "$OUTDIR/build.log" 2>&1 \
  || { log "BUILD FAILED (see build.log)"; tail -40 "$OUTDIR/build.log"; exit 1; }
log "build warnings: $(grep -c -i 'warning' "$OUTDIR/build.log")"

log "sass (static: registers, spills, blocks/SM, load widths)"
timeout 15 "$PY" -m specdec_ext.bench sass --json "$OUTDIR/sass.json" > "$OUTDIR/sass.txt" 2>&1
log "sass exit $?"

log "CUDA tests (-m cuda) + test_sass"
# no -x: one failing CUDA test must not hide the others; every test has its own time limit
timeout 120 "$PY" -m pytest python_tests -q -m cuda -p no:cacheprovider -o faulthandler_timeout=60 -rfs \
  > "$OUTDIR/pytest_cuda.log" 2>&1
log "pytest (cuda) exit $? : $(tail -1 "$OUTDIR/pytest_cuda.log")"
timeout 15 "$PY" -m pytest python_tests/test_sass.py -q -p no:cacheprovider -rs > "$OUTDIR/pytest_sass.log" 2>&1
log "pytest (sass) exit $? : $(tail -1 "$OUTDIR/pytest_sass.log")"

if [ -n "$SANITIZER" ]; then
  for t in memcheck racecheck; do
    log "compute-sanitizer $t (small verify / sample / KV calls, both launch paths)"
    timeout 25 "$SANITIZER" --tool "$t" --error-exitcode 9 "$PY" scripts/sanitize_small.py > "$OUTDIR/sanitize_$t.log" 2>&1
    log "sanitize $t exit $? : $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/sanitize_$t.log")"
  done
else
  log "compute-sanitizer missing: sanitizer step skipped"
fi

log "bench verify + sample (cuda): eager, graph replay, %floor, warm + cold"
timeout 80 "$PY" -m specdec_ext.bench verify --device cuda --B 1 8 64 --K 5 --V 128256 --dtype fp32 bf16 \
  --sample --cold --json "$OUTDIR/bench_verify.json" > "$OUTDIR/bench_verify.txt" 2>&1
log "bench verify exit $?"
log "bench verify --filters (cuda): top-p 0.9 / top-k 50 vs sort-based PyTorch"
timeout 30 "$PY" -m specdec_ext.bench verify --device cuda --filters-only --B 1 64 --K 5 --V 128256 \
  --json "$OUTDIR/bench_filters.json" > "$OUTDIR/bench_filters.txt" 2>&1
log "bench filters exit $?"
log "bench filtered (cuda): filtered_probs vs sample(probs_out=) and PyTorch warpers; logprobs"
timeout 10 "$PY" -m specdec_ext.bench filtered --device cuda --quick --json "$OUTDIR/bench_filtered.json" \
  > "$OUTDIR/bench_filtered.txt" 2>&1
log "bench filtered exit $?"
log "bench kv (cuda)"
timeout 20 "$PY" -m specdec_ext.bench kv --device cuda --json "$OUTDIR/bench_kv.json" > "$OUTDIR/bench_kv.txt" 2>&1
log "bench kv exit $?"
# issue 8's "measured speedup >= 90% of Leviathan's prediction at the best K, B = 1": the
# reference pair on the GPU, 2 interleaved rounds (per-round ratios, medians), HF's peers
log "bench e2e (cuda, batch 1, K 2 4, T 0 and 1, 2 rounds)"
timeout 55 "$PY" -m specdec_ext.bench e2e --device cuda --batch 1 --k 2 4 --max-new-tokens 48 --repeats 2 \
  --no-progress --json "$OUTDIR/bench_e2e.json" > "$OUTDIR/bench_e2e.txt" 2>&1
log "bench e2e exit $?"

if [ -n "$NCU" ]; then
  log "ncu: dram throughput of the B=64 verify"
  timeout 25 "$NCU" --clock-control none -k regex:verify_kernel -s 2 -c 1 \
    --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
    "$PY" scripts/ncu_verify.py > "$OUTDIR/ncu_verify.txt" 2>&1
  log "ncu exit $? : $(grep -m1 dram__throughput "$OUTDIR/ncu_verify.txt" | tr -s ' ')"
else
  log "ncu missing: skipped"
fi

timeout 10 "$PY" benchmarks/check_targets.py "$OUTDIR/bench_verify.json" "$OUTDIR/bench_e2e.json" > "$OUTDIR/targets.txt" 2>&1
log "targets: $(grep -c 'NOT MET' "$OUTDIR/targets.txt") not met (targets.txt)"

# markdown summary: the bench rows and the SASS table
timeout 10 "$PY" - "$OUTDIR" > "$OUTDIR/summary.md" 2>&1 <<'EOF'
import json, os, sys
out = sys.argv[1]
def t(x):
    return "-" if x is None else (f"{x * 1e6:.1f} µs" if x < 1e-3 else f"{x * 1e3:.2f} ms")
def p(x):
    return "-" if x is None else f"{x:.0f}%"
try:
    rows = json.load(open(os.path.join(out, "bench_verify.json")))["rows"]
    print("eager = cooperative launch, eager stages = per-stage launches; graph = replay of the default capture "
          "(per-stage launches), graph coop = replay of a captured cooperative launch\n")
    print("| op | dtype | B | K | V | eager | eager stages | graph | graph coop | %floor | cold | %floor cold "
          "| torch | compile | flashinfer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.get('op', 'verify')} | {r['dtype']} | {r['B']} | {r['K'] if r['K'] is not None else '-'} | {r['V']} | "
              f"{t(r['fused_s'])} | {t(r.get('fused_stages_s'))} | {t(r.get('fused_graph_s'))} | "
              f"{t(r.get('fused_graph_coop_s'))} | {p(r.get('pct_floor'))} | {t(r.get('fused_cold_s'))} | "
              f"{p(r.get('pct_floor_cold'))} | {t(r['torch_s'])} | {t(r['compile_s'])} | {t(r['flashinfer_s'])} |")
    print(f"\ncopy bandwidth {rows[0]['copy_gbps']:.0f} GB/s (floor = minimal bytes / this)\n")
except Exception as e:
    print(f"bench table unavailable: {e}\n")
try:
    sass = json.load(open(os.path.join(out, "sass.json")))
    print(f"SASS ({sass['model']})\n")
    print("| kernel | regs | stack | STL/LDL | blocks/SM | LDG.128 | LDG.64 | LDG<=32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sass["rows"]:
        if r["kind"] in ("verify", "sample"):
            print(f"| {r['name']} | {r['reg']} | {r['stack']} | {r['stl']}/{r['ldl']} | {r['blocks_per_sm']} | "
                  f"{r['ldg128']} | {r['ldg64']} | {r['ldg_narrow']} |")
except Exception as e:
    print(f"sass table unavailable: {e}")
try:
    lines = [l for l in open(os.path.join(out, "bench_e2e.txt")) if l.startswith(("dev ", "cuda "))]
    print("\nbench e2e (cuda, B = 1)\n\n```\n" + "".join(lines) + "```")
except Exception as e:
    print(f"e2e table unavailable: {e}")
EOF
log "summary.md written"
cat "$OUTDIR/summary.txt"
