#!/usr/bin/env bash
# Build a wheel and install it into a fresh venv that has torch, then use it from outside
# the repository (so the source folder cannot shadow the installed package):
#   bash scripts/wheel_check.sh [OUTDIR]      (default OUTDIR: build/wheel-check)
# The wheel is built with .venv's python and torch (pip wheel --no-build-isolation); the
# fresh venv sees .venv's packages (torch, numpy, ...) through a .pth line, not through
# site-packages of its own, so only the wheel is installed into it. The CUDA kernels are
# built when nvcc is found, exactly as pip install does (SPECDEC_CPU_ONLY=1: CPU kernels only);
# the objects of an earlier build of the same configuration in build/temp are reused.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-build/wheel-check}
rm -rf "$OUT"
mkdir -p "$OUT/dist"
OUT=$(cd "$OUT" && pwd)

# setup.py records the build in specdec_ext/_build_info.py: keep the in-place build's record
INFO=specdec_ext/_build_info.py
if [ -f "$INFO" ]; then cp "$INFO" "$OUT/_build_info.keep"; trap 'cp "$OUT/_build_info.keep" "$ROOT/$INFO"' EXIT; fi
echo "[wheel] building (MAX_JOBS=${MAX_JOBS:-2}, SPECDEC_CPU_ONLY=${SPECDEC_CPU_ONLY:-0})"
MAX_JOBS=${MAX_JOBS:-2} .venv/bin/python -m pip wheel -q --no-build-isolation --no-deps -w "$OUT/dist" . \
  > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
WHEEL=$(ls "$OUT"/dist/specdec_ext-*.whl)
echo "[wheel] $WHEEL"

python3 -m venv "$OUT/venv"
SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
NEW_SITE=$("$OUT/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$SITE" > "$NEW_SITE/specdec_deps_from_dotvenv.pth"  # torch & co. (.venv's .pth files are not run)
"$OUT/venv/bin/python" -m pip install -q --no-deps --no-index "$WHEEL"

cd "$OUT"  # not the repository root: the installed copy must be the one imported
"$OUT/venv/bin/python" - "$ROOT" <<'EOF'
import os
import sys

import torch

import specdec_ext

source = os.path.realpath(os.path.join(sys.argv[1], "specdec_ext"))
where = os.path.realpath(specdec_ext.__file__)
assert not where.startswith(source + os.sep), f"imported the source tree, not the wheel: {where}"
assert specdec_ext.__version__, "no __version__"
logits = torch.randn(4, 3, 500)
res = specdec_ext.verify(logits, torch.randint(0, 500, (4, 2)), None, 0.8, seed=1)
assert bool(res.valid.all()) and res.tokens.shape == (4, 3)
tree = specdec_ext.verify_tree(logits, torch.randint(0, 500, (4, 3)), [-1, 0, 0], None, 0.8, seed=1)
assert bool(tree.valid.all())
print(f"[wheel] import from {where}: verify and verify_tree run (CUDA kernels: {specdec_ext.has_cuda_kernels()})")
EOF
"$OUT/venv/bin/python" -m specdec_ext.info
echo "[wheel] OK"
