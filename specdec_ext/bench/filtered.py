"""python -m specdec_ext.bench filtered: the filter-only and logprobs ops against plain PyTorch.

Rows (per device, B, V; temperature 0.8, top_k 50, top_p 0.9):

* filtered_probs: ``specdec_ext.filtered_probs`` vs ``sample(..., probs_out=)`` (the same
  probabilities plus a draw: what a user had to call before) and plain PyTorch (softmax,
  top-k threshold, sort + cumsum top-p, renormalise; Hugging Face's warpers);
* logprobs: ``torch.ops.specdec.logprobs`` (token logprob, rank, top-5, raw law) for one
  emitted token per row vs plain PyTorch (log_softmax, gather, a count for the rank, topk);
* verify+logprobs: ``verify(..., logprobs=0)`` (K = 5 drafts that are the argmax of each
  position, so most are accepted; raw law, written by the verify kernel from its own stats) vs
  plain ``verify`` followed by PyTorch's second pass (log_softmax over [B, K+1, V], gather),
  what a serving loop does without it; ``x verify`` is plain verify's time / ours (1.00x: the
  logprobs cost nothing). The raw law at T = 0.8 needs a second sum of exponentials (taken in
  the same pass); the JSON also holds the processed law's time (``fused_processed_s``), whose
  logprobs need no new sum.

The ratio columns (``torch/ours``, ``sample/ours``, ``verify/ours``) divide that time by ours:
above 1 means ours is faster. The table is printed when every row is measured.

    python -m specdec_ext.bench filtered [--quick] [--device cpu|cuda|all] [--json PATH]
"""
import argparse
import sys
from typing import Dict, List, Sequence

import torch

import specdec_ext

from .._cli import OneLineParser, output_path
from .report import measuring, print_table
from .timing import machine_load, time_call, warn_if_busy, write_rows_json
from .verify import torch_filter

FULL = dict(B=[1, 8, 32], V=[32000, 128256])
QUICK = dict(B=[1, 8], V=[32000])
T, TOP_K, TOP_P, N_TOP = 0.8, 50, 0.9, 5
K_DRAFTS = 5
HEADER = (f"{'op':<16}{'device':<7}{'B':>4}{'V':>8}  {'ours ms':>9}  {'torch ms':>9}  {'torch/ours':>10}  "
          f"{'sample/ours':>11}  {'verify/ours':>11}")
LEGEND = ("torch/ours = plain PyTorch time / ours (for verify+logprobs: verify + log_softmax + gather); "
          "sample/ours = sample(..., probs_out=) time / filtered_probs (the draw a probabilities-only caller "
          "no longer pays); verify/ours = plain verify / verify(logprobs=0) (the logprobs' price)")


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


def format_row(row: dict) -> str:
    """One table line (HEADER's columns) of a bench_rows row; '-' where a ratio does not apply."""
    def ratio(key):
        return f"{row[key]:>10.2f}x" if key in row else f"{'-':>11}"
    return (f"{row['op']:<16}{row['device']:<7}{row['B']:>4}{row['V']:>8}  {row['fused_s'] * 1e3:>9.3f}  "
            f"{row['torch_s'] * 1e3:>9.3f}  {row['speedup']:>9.1f}x  {ratio('vs_sample')}  {ratio('vs_verify')}")


def bench_rows(devices: Sequence[str], grid: Dict[str, list], on_row=lambda: None) -> List[dict]:
    """Every row (dicts: the JSON rows) over the devices and grid; ``on_row()`` after each.
    Prints nothing: main prints the table."""
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
                on_row()
                x3, tok2 = logits.unsqueeze(1), tokens.view(B, 1)
                one = torch.tensor(1.0)

                def ours_lp():
                    return torch.ops.specdec.logprobs(x3, tok2, one, None, None, None, N_TOP, False, False)

                t_lp = time_call(ours_lp, device)
                t_tlp = time_call(lambda: torch_logprobs(logits, tokens), device)
                row = dict(op="logprobs", device=device, B=B, V=V, fused_s=t_lp, torch_s=t_tlp, speedup=t_tlp / t_lp)
                row.update(machine_load())
                rows.append(row)
                on_row()
                rows.append(verify_logprobs_row(device, B, V))
                on_row()
    return rows


def verify_logprobs_row(device: str, B: int, V: int) -> dict:
    """verify(..., logprobs=0) against plain verify, and against plain verify + PyTorch's pass."""
    g = torch.Generator().manual_seed(B * 7 + V)
    logits = (torch.randn(B, K_DRAFTS + 1, V, generator=g) * 3).to(device)
    drafts = logits[:, :K_DRAFTS].argmax(-1)

    def ours():
        return specdec_ext.verify(logits, drafts, None, T, seed=1, logprobs=0)

    def ours_processed():
        return specdec_ext.verify(logits, drafts, None, T, seed=1, logprobs=0, logprobs_mode="processed")

    def plain():
        return specdec_ext.verify(logits, drafts, None, T, seed=1)

    def plain_then_torch():
        res = specdec_ext.verify(logits, drafts, None, T, seed=1)
        lp = torch.log_softmax(logits, -1).gather(-1, res.tokens.clamp(min=0).unsqueeze(-1))
        return res, lp

    t_ours, t_plain, t_torch = time_call(ours, device), time_call(plain, device), time_call(plain_then_torch, device)
    t_proc = time_call(ours_processed, device)
    row = dict(op="verify+logprobs", device=device, B=B, V=V, K=K_DRAFTS, fused_s=t_ours, verify_s=t_plain,
               torch_s=t_torch, speedup=t_torch / t_ours, vs_verify=t_plain / t_ours, fused_processed_s=t_proc,
               vs_verify_processed=t_plain / t_proc,
               alpha=float(ours()[0].num_accepted.float().mean()) / K_DRAFTS)
    row.update(machine_load())
    return row


def main(argv=None) -> int:
    ap = OneLineParser(prog="python -m specdec_ext.bench filtered", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"a small grid {QUICK} (default {FULL})")
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                    help="where to time (default: every device this build and machine have)")
    ap.add_argument("--json", metavar="PATH", type=output_path, help="write the rows as JSON (with the machine's load)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and specdec_ext.has_cuda_kernels()
    if args.device == "cuda" and not cuda:
        print("no GPU or no CUDA kernels in this build", file=sys.stderr)
        return 2
    devices = {"cpu": ["cpu"], "cuda": ["cuda"], "all": ["cpu"] + (["cuda"] if cuda else [])}[args.device]
    warn_if_busy(machine_load())
    with measuring():  # third-party warnings are held back until here, before the table
        rows = bench_rows(devices, QUICK if args.quick else FULL)
    if args.json:
        write_rows_json(args.json, rows)
    print_table(HEADER, [LEGEND], [format_row(r) for r in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
