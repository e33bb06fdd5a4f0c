"""python -m specdec_ext.bench filtered: the filter-only and logprobs ops against plain PyTorch.

Rows (per device, B, V; temperature 0.8, top_k 50, top_p 0.9):

* filtered_probs: ``specdec_ext.filtered_probs`` vs ``sample(..., probs_out=)`` (the same
  probabilities plus a draw: what a user had to call before) and plain PyTorch (softmax,
  top-k threshold, sort + cumsum top-p, renormalise; Hugging Face's warpers);
* logprobs: ``torch.ops.specdec.logprobs`` (token logprob, rank, top-5, raw law) for one
  emitted token per row vs plain PyTorch (log_softmax, gather, a count for the rank, topk).

The x columns divide the PyTorch (or sample) time by ours: above 1 means ours is faster.

    python -m specdec_ext.bench filtered [--quick] [--device cpu|cuda|all] [--json PATH]
"""
import argparse
import json
import sys
from typing import Dict, List, Sequence

import torch

import specdec_ext

from .timing import machine_load, time_call, warn_if_busy
from .verify import torch_filter

FULL = dict(B=[1, 8, 32], V=[32000, 128256])
QUICK = dict(B=[1, 8], V=[32000])
T, TOP_K, TOP_P, N_TOP = 0.8, 50, 0.9, 5
HEADER = f"{'op':<15}{'device':<7}{'B':>4}{'V':>8}  {'ours ms':>9}  {'torch ms':>9}  {'x torch':>7}  {'x sample':>8}"
LEGEND = ("x torch = plain PyTorch time / ours; x sample = sample(..., probs_out=) time / filtered_probs "
          "(the draw a probabilities-only caller no longer pays)")


def torch_filtered_probs(logits: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: softmax(l / T) after the sort-based top-k / top-p (bench.verify.torch_filter)."""
    return torch.softmax(torch_filter(logits.float() / T, TOP_K, TOP_P), -1)


def torch_logprobs(logits: torch.Tensor, tokens: torch.Tensor):
    """Plain PyTorch: the raw law's token logprob, rank and top-N_TOP."""
    lp = torch.log_softmax(logits.float(), -1)
    tok_lp = lp.gather(-1, tokens.view(-1, 1))
    rank = (lp >= tok_lp).sum(-1)
    top = torch.topk(lp, N_TOP, dim=-1)
    return tok_lp, rank, top.indices, top.values


def bench_rows(devices: Sequence[str], grid: Dict[str, list], print_row=print) -> List[dict]:
    rows = []
    for device in devices:
        for V in grid["V"]:
            for B in grid["B"]:
                g = torch.Generator().manual_seed(B + V)
                logits = (torch.randn(B, V, generator=g) * 3).to(device)
                probs = torch.empty(B, V, device=device)
                tokens = torch.randint(0, V, (B,), generator=g).to(device)

                def ours():
                    return specdec_ext.filtered_probs(logits, T, top_k=TOP_K, top_p=TOP_P)

                def with_draw():
                    return specdec_ext.sample(logits, T, top_k=TOP_K, top_p=TOP_P, seed=1, probs_out=probs)

                t_ours, t_sample = time_call(ours, device), time_call(with_draw, device)
                t_torch = time_call(lambda: torch_filtered_probs(logits), device)
                row = dict(op="filtered_probs", device=device, B=B, V=V, fused_s=t_ours, sample_s=t_sample,
                           torch_s=t_torch, speedup=t_torch / t_ours, vs_sample=t_sample / t_ours)
                row.update(machine_load())
                rows.append(row)
                print_row(f"{'filtered_probs':<15}{device:<7}{B:>4}{V:>8}  {t_ours * 1e3:>9.3f}  {t_torch * 1e3:>9.3f}"
                          f"  {row['speedup']:>6.1f}x  {row['vs_sample']:>7.2f}x")
                x3, tok2 = logits.unsqueeze(1), tokens.view(B, 1)
                one = torch.tensor(1.0)

                def ours_lp():
                    return torch.ops.specdec.logprobs(x3, tok2, one, None, None, None, N_TOP, False, False)

                t_lp = time_call(ours_lp, device)
                t_tlp = time_call(lambda: torch_logprobs(logits, tokens), device)
                row = dict(op="logprobs", device=device, B=B, V=V, fused_s=t_lp, torch_s=t_tlp, speedup=t_tlp / t_lp)
                row.update(machine_load())
                rows.append(row)
                print_row(f"{'logprobs':<15}{device:<7}{B:>4}{V:>8}  {t_lp * 1e3:>9.3f}  {t_tlp * 1e3:>9.3f}"
                          f"  {row['speedup']:>6.1f}x  {'':>8}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_ext.bench filtered", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"a small grid {QUICK} (default {FULL})")
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                    help="where to time (default: every device this build and machine have)")
    ap.add_argument("--json", metavar="PATH", help="write the rows as JSON (with the machine's load)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()
    if args.device == "cuda" and not cuda:
        print("no GPU or no CUDA kernels in this build", file=sys.stderr)
        return 2
    devices = {"cpu": ["cpu"], "cuda": ["cuda"], "all": ["cpu"] + (["cuda"] if cuda else [])}[args.device]
    warn_if_busy(machine_load())
    print(HEADER)
    print(LEGEND)
    rows = bench_rows(devices, QUICK if args.quick else FULL)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, torch=torch.__version__, machine=machine_load()), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
