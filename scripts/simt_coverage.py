"""Line coverage (gcov) of csrc/cuda under the emulated test suite.

The ``coverage`` build of the SIMT emulator (specdec_ext.testing.simt: -O2 --coverage)
counts the lines of the CUDA kernel source it runs. After a run of the emulated tests

    SPECDEC_SIMT_BUILD=coverage python -m pytest python_tests -m simt
    python scripts/simt_coverage.py --min 95

prints the executed / executable lines of every csrc/cuda file the emulator compiles and
fails when the kernel bodies (KERNEL_FILES) fall below --min percent. ``--reset`` deletes
the counters first (run it before the tests so the figure is that run's).
"""
from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: device primitives the kernels share (no op of their own in the op table)
SHARED_KERNEL_FILES = ("csrc/cuda/block_reduce.cuh", "csrc/cuda/filter_stage.cuh", "csrc/cuda/grid_loop.cuh",
                       "csrc/cuda/race.cuh", "csrc/cuda/row_stats.cuh", "csrc/cuda/tile_stats.cuh",
                       "csrc/cuda/token_decision.cuh", "csrc/cuda/token_load.cuh")


def kernel_files() -> tuple:
    """The files that hold kernel bodies (device code): each op's CUDA kernel file from the op
    table (specdec_ext.ops.registry), and the shared primitives; the rest of csrc/cuda is launch code."""
    from specdec_ext.ops import registry

    ops = {f"csrc/{op.cuda_file}" for op in registry.OPS.values() if op.cuda_file}
    return tuple(sorted(ops | set(SHARED_KERNEL_FILES)))


KERNEL_FILES = kernel_files()


def line_counts(build_dir: pathlib.Path) -> dict[str, dict[int, int]]:
    """{source file relative to the tree: {line: execution count}} over the objects of build_dir."""
    out: dict[str, dict[int, int]] = {}
    objs = sorted(build_dir.glob("*.o"))
    if not any(o.with_suffix(".gcda").exists() for o in objs):
        raise SystemExit(f"no coverage counters in {build_dir}: run the emulated tests with "
                         "SPECDEC_SIMT_BUILD=coverage first")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["gcov", "--json-format", "-o", str(build_dir)] + [str(o) for o in objs], cwd=tmp,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for path in pathlib.Path(tmp).glob("*.gcov.json.gz"):
            data = json.loads(gzip.decompress(path.read_bytes()))
            for f in data["files"]:
                name = pathlib.Path(f["file"])
                try:
                    rel = str((build_dir / name).resolve().relative_to(ROOT)) if not name.is_absolute() \
                        else str(name.resolve().relative_to(ROOT))
                except ValueError:
                    continue  # system and torch headers
                lines = out.setdefault(rel, {})
                for ln in f["lines"]:
                    lines[ln["line_number"]] = lines.get(ln["line_number"], 0) + ln["count"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=str(ROOT / "build" / "simt-coverage"))
    ap.add_argument("--min", type=float, default=95.0, help="minimum percent of kernel-body lines executed")
    ap.add_argument("--reset", action="store_true", help="delete the counters and exit")
    ap.add_argument("--missed", action="store_true", help="list the lines never executed")
    args = ap.parse_args()
    build_dir = pathlib.Path(args.build_dir)
    if args.reset:
        for g in build_dir.glob("*.gcda"):
            g.unlink()
        return 0
    counts = line_counts(build_dir)
    cuda = {f: c for f, c in counts.items() if f.startswith("csrc/cuda/")}
    print(f"{'file':<36} {'lines':>6} {'run':>6} {'cover':>7}")
    kern_total = kern_run = 0
    for f in sorted(cuda):
        total = len(cuda[f])
        run = sum(1 for n in cuda[f].values() if n > 0)
        print(f"{f:<36} {total:>6} {run:>6} {100.0 * run / max(total, 1):>6.1f}%")
        if f in KERNEL_FILES:
            kern_total += total
            kern_run += run
        if args.missed:
            missed = sorted(ln for ln, n in cuda[f].items() if n == 0)
            if missed:
                print("    never executed:", ", ".join(map(str, missed)))
    pct = 100.0 * kern_run / max(kern_total, 1)
    print(f"kernel bodies ({', '.join(pathlib.Path(k).name for k in KERNEL_FILES)}): "
          f"{kern_run} of {kern_total} lines = {pct:.1f}% (minimum {args.min:.0f}%)")
    missing = [k for k in KERNEL_FILES if k not in cuda]
    if missing:
        print(f"no coverage data for {missing}", file=sys.stderr)
        return 1
    return 0 if pct >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
