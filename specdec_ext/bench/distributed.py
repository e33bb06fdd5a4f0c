"""python -m specdec_ext.bench distributed: vocabulary-parallel verify against gather-then-verify.

P ranks (gloo, one CPU thread each, spawned on this machine) each hold [B, K+1, V / P] logits
(K = 5 drafts, the argmax of each position, so most are accepted; temperature 0.8). Per call:

* ours:   ``specdec_ext.distributed.verify`` on the local shard (the fused kernel's local
  stages and four all-gathers of O(B * (K+1)) values);
* gather: ``all_gather`` of the local logits, then ``specdec_ext.verify`` on [B, K+1, V]
  (what vLLM / SGLang / a plain engine do today).

Columns: the median time per call on rank 0 (each rank makes the same fixed number of calls,
so the collectives line up), the bytes each rank hands to the collectives per call, and the
ratios gather / ours of each (``gather/ours`` after the times, ``bytes g/o`` after the bytes),
printed when every row is measured. On this CPU with gloo over loopback the wire is memory: on a real
interconnect the byte column is what scales. ``--backend nccl``: one GPU per rank (needs P
GPUs), CUDA tensors and the CUDA kernels, times taken after a device synchronize.

    python -m specdec_ext.bench distributed [--quick] [--world P] [--backend gloo|nccl] [--json PATH]
"""
import argparse
import statistics
import sys
import time
from typing import Dict, List

import torch
import torch.distributed as dist

import specdec_ext
from specdec_ext import distributed as sd
from specdec_ext.distributed.launch import run_ranks

from .._cli import OneLineParser, int_in, output_path
from .report import measuring, print_table
from .timing import machine_load, warn_if_busy, write_rows_json

FULL = dict(B=[1, 8, 32], V=[32000, 128256])
QUICK = dict(B=[1, 8], V=[32000])
K_DRAFTS, T, REPS = 5, 0.8, 15
HEADER = (f"{'P':>2}{'B':>5}{'V':>8}  {'ours ms':>9}  {'gather ms':>9}  {'gather/ours':>11}  {'ours bytes':>11}  "
          f"{'gather bytes':>12}  {'bytes g/o':>9}")
LEGEND = ("gather/ours = gather ms / ours ms (> 1: ours is faster); bytes g/o = gather bytes / ours bytes "
          "(per rank and call)")


def format_row(r: dict) -> str:
    """One table line (HEADER's columns) of a rank_rows row."""
    return (f"{r['P']:>2}{r['B']:>5}{r['V']:>8}  {r['fused_s'] * 1e3:>9.3f}  {r['gather_s'] * 1e3:>9.3f}  "
            f"{r['speedup']:>10.2f}x  {r['bytes']:>11}  {r['gather_bytes']:>12}  {r['bytes_ratio']:>8.0f}x")


def _median_seconds(fn, reps: int, sync) -> float:
    """Median of ``reps`` timed calls after 2 warm-ups; every rank runs the same count."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def rank_rows(rank: int, world: int, grid: Dict[str, list], reps: int, device: str = "cpu") -> List[dict]:
    dev = torch.device(f"cuda:{rank}" if device == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for V in grid["V"]:
        bounds = sd.even_bounds(V, world)
        s, e = bounds[rank], bounds[rank + 1]
        for B in grid["B"]:
            g = torch.Generator().manual_seed(B + V)
            logits = torch.randn(B, K_DRAFTS + 1, V, generator=g) * 3
            drafts = logits[:, :K_DRAFTS].argmax(-1).to(dev)
            local = logits[..., s:e].contiguous().to(dev)

            def ours():
                return sd.verify(local, drafts, None, T, vocab_start=s, vocab_size=V, seed=1)

            def gather():
                parts = [torch.empty(B, K_DRAFTS + 1, bounds[r + 1] - bounds[r], device=dev) for r in range(world)]
                dist.all_gather(parts, local)
                return specdec_ext.verify(torch.cat(parts, -1), drafts, None, T, seed=1)

            assert torch.equal(ours().tokens, gather().tokens)  # the same tokens (128-aligned shards)
            with sd.count_bytes() as c:
                ours()
            t_ours, t_gather = _median_seconds(ours, reps, sync), _median_seconds(gather, reps, sync)
            gather_bytes = local.numel() * local.element_size()
            row = dict(op="verify", device=device, P=world, B=B, K=K_DRAFTS, V=V, fused_s=t_ours, gather_s=t_gather,
                       speedup=t_gather / t_ours, bytes=c.bytes, collectives=c.calls, gather_bytes=gather_bytes,
                       bytes_ratio=gather_bytes / c.bytes)
            row.update(machine_load())
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = OneLineParser(prog="python -m specdec_ext.bench distributed", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"a small grid {QUICK} (default {FULL})")
    ap.add_argument("--world", type=int_in(1), default=2, help="ranks (processes), default 2")
    ap.add_argument("--reps", type=int_in(1), default=REPS, help=f"timed calls per row and rank (default {REPS})")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo",
                    help="gloo: CPU tensors; nccl: CUDA tensors, rank r on GPU r (needs --world GPUs)")
    ap.add_argument("--json", metavar="PATH", type=output_path, help="write the rows as JSON (with the machine's load)")
    args = ap.parse_args(argv)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if args.backend == "nccl" and (args.world < 2 or gpus < args.world):
        print(f"--backend nccl needs --world >= 2 GPUs, one per rank; this machine has {gpus}", file=sys.stderr)
        return 2
    warn_if_busy(machine_load())
    device = "cuda" if args.backend == "nccl" else "cpu"
    with measuring():  # third-party warnings are held back until here, before the table
        rows = run_ranks(rank_rows, args.world, QUICK if args.quick else FULL, args.reps, device, timeout_s=300,
                         backend=args.backend)[0]
    print_table(HEADER, [LEGEND], [format_row(r) for r in rows])
    if args.json:
        write_rows_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
