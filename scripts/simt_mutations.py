"""Proof of power of the emulated test suite: each deliberate bug below, planted in a copy
of csrc/, must make the emulated CUDA tests fail.

    python scripts/simt_mutations.py            # all mutations; exit 1 if one survives
    python scripts/simt_mutations.py -k block   # only those whose name contains "block"

For each mutation: copy csrc/ to a temporary tree, apply the one-line change (the pattern
must occur exactly once), build the SIMT emulator from that tree (SPECDEC_SIMT_SOURCE,
specdec_ext.testing.simt) and run TESTS against it. A mutation is caught when the tests
fail; a build error or no failure fails this script.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: the emulated tests run against each mutant (a quick, broad subset; -x stops at the first failure)
TESTS = ["python_tests/test_sampling_gpu.py", "-m", "simt and not law", "-x", "-q", "-rf", "-p", "no:cacheprovider",
         "-k", "agree or invalid or greedy or documented_formula"]
#: the vocabulary-parallel steps' tests (identity on aligned shards, the ratio boundary, the law)
SHARD_TESTS = ["python_tests/test_distributed_gpu.py", "-m", "simt", "-x", "-q", "-rf", "-p", "no:cacheprovider",
               "-k", "identical or boundary or law"]
#: block verification's tests (agreement with the CPU kernel: dense / one-hot drafts, filters, ragged rows)
BLOCK_TESTS = ["python_tests/test_verify_block_gpu.py", "-m", "simt and not law", "-x", "-q", "-rf", "-p",
               "no:cacheprovider", "-k", "agree"]
#: the block law test (its power check is the unweighted residual's law): the agreement tests'
#: rows rarely stop at a tau > 0 with w_tau < 1, where the two residuals differ
BLOCK_LAW_TESTS = ["python_tests/test_verify_block_gpu.py", "-m", "simt", "-x", "-q", "-rf", "-p",
                   "no:cacheprovider", "-k", "law"]

# (name, file, original text, mutated text, tests)
MUTATIONS = [
    ("removed __syncthreads (block_reduce: scratch written, then read by every thread)",
     "csrc/cuda/block_reduce.cuh",
     "  if (lane == 0) scratch[warp] = v;\n  __syncthreads();\n",
     "  if (lane == 0) scratch[warp] = v;\n", TESTS),
    ("loop bound widened by one (merge_stat_blocks reads one stat block past the row)",
     "csrc/cuda/row_stats.cuh",
     "tree.push(warp_tree(k < nblk ? blocks[k]",
     "tree.push(warp_tree(k <= nblk ? blocks[k]", TESTS),
    ("wrong shuffle offset (warp_sum: the tile sums of the coarse race)",
     "csrc/cuda/race.cuh",
     "for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);",
     "for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m >> 1);", TESTS),
    ("descending butterfly (warp_tree: the stat blocks merge in another tree than the tiles' dyadic tree, "
     "which a shard's cover rebuilds)",
     "csrc/cuda/tile_stats.cuh",
     "for (int mask = 1; mask < 32; mask <<= 1) v = merge(v, v.shfl(mask));",
     "for (int mask = 16; mask > 0; mask >>= 1) v = merge(v, v.shfl(mask));", SHARD_TESTS),
    ("a part that starts inside a tile keyed by the tile's exponential (shard_race: split tiles' parts "
     "share one Exp(1))",
     "csrc/cuda/shard_kernels.cuh",
     "const float E = start == t * kRaceTile ?",
     "const float E = true ?", SHARD_TESTS),
    ("block verification's correction from the token-wise residual max(0, p - q) instead of the weighted "
     "max(0, w_tau p - q) (block_verify_row: the race at tau)",
     "csrc/cuda/block_kernels.cuh",
     "scale = tau < n ? stop.w : 1.0f;",
     "scale = 1.0f;", BLOCK_LAW_TESTS),
    ("block weights not clamped at 1 (block_weight_next: w * p / q > 1 kept, core/block_verify.h in the "
     "emulated kernels only)",
     "csrc/core/block_verify.h",
     "  if (wp >= q_x) return 1.0f;\n",
     "", BLOCK_TESTS),
]


def run_mutant(name: str, rel: str, old: str, new: str, tests: list) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="simt-mutant-") as tmp:
        shutil.copytree(ROOT / "csrc", pathlib.Path(tmp) / "csrc")
        path = pathlib.Path(tmp) / rel
        text = path.read_text()
        if text.count(old) != 1:
            return False, f"pattern found {text.count(old)} times in {rel} (the source changed: update MUTATIONS)"
        path.write_text(text.replace(old, new))
        env = dict(os.environ, SPECDEC_SIMT_SOURCE=tmp, SPECDEC_SIMT_BUILD="opt")
        proc = subprocess.run([sys.executable, "-m", "pytest", *tests], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        out = proc.stdout + proc.stderr
        if "Error building extension" in out:
            return False, "the mutant did not build:\n" + out[-3000:]
        first = [ln.split()[1] for ln in out.splitlines() if ln.startswith("FAILED ")]
        if proc.returncode == 0:
            return False, "NOT caught: every test passed"
        if proc.returncode != 1 or not first:  # 5: no test selected; a crash: not a verdict
            return False, f"no verdict (pytest exit {proc.returncode}):\n" + out[-3000:]
        return True, "caught by " + first[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", dest="select", default="", help="run only the mutations whose name contains this")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if args.select in m[0]]
    if not chosen:
        print(f"no mutation name contains {args.select!r}")
        return 1
    ok = True
    for name, rel, old, new, tests in chosen:
        t0 = time.time()
        caught, msg = run_mutant(name, rel, old, new, tests)
        ok &= caught
        print(f"[{'ok' if caught else 'FAIL'}] {name}: {msg} ({time.time() - t0:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
