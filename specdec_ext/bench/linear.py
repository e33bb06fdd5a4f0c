"""python -m specdec_ext.bench linear: skinny_linear (plain and packed weights) vs F.linear on a model's weights.

What a verification pass does to its linear layers: M = B * (K + 1) rows through every weight
of the model in turn. For each M in ``--rows`` one *pass* calls every linear weight of the
bundled target (or of a random Llama-shaped stack, ``--hidden``) once, in the model's order, so
each call streams a weight that the previous ones pushed out of the core's caches, as in a
forward. Methods:

* ``F.linear``: torch's path (MKL / BLAS: a GEMV for one row, a GEMM above);
* ``skinny_linear``: ``torch.ops.specdec.skinny_linear`` on the ``nn.Linear`` weight as it is
  (every weight row read once per call, each output finished by a horizontal sum);
* ``skinny_packed``: the same op on the weight packed by ``pack_linear_weight`` (the reference
  model's layout: outputs vectorised, no horizontal sum). A weight whose row count is not a
  multiple of 16 stays unpacked here, as in the model.

Rounds interleave every (M, method) pair, so a slow spell of a shared machine hits them alike;
times are medians over rounds. Columns: ms per pass, the pass over the one-row pass of the
same method (what a K + 1-token verification costs in matmuls over a one-token step), and
F.linear over the method. ``--json PATH`` writes the rows with the machine's load.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Dict, List

import torch
import torch.nn.functional as F

import specdec_ext  # noqa: F401  (registers torch.ops.specdec.*)

from .._cli import OneLineParser, int_in, output_path
from .report import measuring, print_table
from .timing import busiest, machine_load, warn_if_busy

_op = torch.ops.specdec.skinny_linear
#: name -> (prepare the weight once, call it on x)
METHODS = {"F.linear": (lambda w: w, F.linear), "skinny_linear": (lambda w: w, _op),
           "skinny_packed": (lambda w: specdec_ext.pack_linear_weight(w) if w.shape[0] % 16 == 0 else w, _op)}


def model_weights(hidden: int, layers: int) -> List[torch.Tensor]:
    """The linear weights of one forward, in order: the bundled target's (hidden 0), else a
    Llama-shaped stack of ``layers`` layers (qkv, o, gate_up, down; lm_head of 32000)."""
    if hidden == 0:
        from .. import bundled

        target, _ = bundled.load_pair()
        return [p.detach() for n, p in target.named_parameters() if p.dim() == 2 and "embed" not in n] + \
            [target.lm_head.weight.detach()]
    g = torch.Generator().manual_seed(0)
    inter = 8 * hidden // 3 // 64 * 64
    shapes = [(3 * hidden, hidden), (hidden, hidden), (2 * inter, hidden), (hidden, inter)] * layers
    return [torch.randn(s, generator=g) * 0.02 for s in shapes + [(32000, hidden)]]


def run(weights: List[torch.Tensor], rows: List[int], rounds: int) -> List[Dict]:
    inputs = {m: [torch.randn(m, w.shape[1]) for w in weights] for m in rows}
    times = {(m, name): [] for m in rows for name in METHODS}
    prepared = {name: [prep(w) for w in weights] for name, (prep, _) in METHODS.items()}
    with torch.no_grad():
        for name, (_, fn) in METHODS.items():  # warm up (first-call allocations)
            for x, w in zip(inputs[rows[0]], prepared[name]):
                fn(x, w)
        for _ in range(rounds):
            for m in rows:
                for name, (_, fn) in METHODS.items():
                    ws = prepared[name]
                    t0 = time.perf_counter()
                    for x, w in zip(inputs[m], ws):
                        fn(x, w)
                    times[(m, name)].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    load = machine_load()
    out = []
    for m in rows:
        for name in METHODS:
            out.append(dict(rows=m, method=name, weights=len(weights), params=sum(w.numel() for w in weights),
                            seconds=med[(m, name)], vs_one_row=med[(m, name)] / med[(rows[0], name)],
                            f_linear_over_this=med[(m, "F.linear")] / med[(m, name)], **load))
    return out


HEADER = f"{'M':>3} {'method':14} | {'ms/pass':>8} {'vs M=' + 'first':>10} {'F.linear/this':>13}"


def format_row(r: Dict) -> str:
    return (f"{r['rows']:>3} {r['method']:14} | {r['seconds'] * 1e3:8.3f} {r['vs_one_row']:10.2f} "
            f"{r['f_linear_over_this']:13.2f}")


def main(argv: List[str]) -> None:
    p = OneLineParser(prog="python -m specdec_ext.bench linear", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int_in(1), nargs="+", default=[1, 2, 3, 5, 9, 17],
                   help="M: rows per call (the first is the baseline of the 'vs' column; default 1 2 3 5 9 17)")
    p.add_argument("--hidden", type=int_in(0), default=0,
                   help="0 (default): the bundled target's weights; else a random Llama-shaped stack of this width")
    p.add_argument("--layers", type=int_in(1), default=4, help="layers of the random stack (default 4)")
    p.add_argument("--rounds", type=int_in(1), default=100, help="interleaved rounds (default 100)")
    p.add_argument("--threads", type=int_in(1), default=None, help="torch.set_num_threads")
    p.add_argument("--json", metavar="PATH", type=output_path, help="write the rows as JSON")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    weights = model_weights(args.hidden, args.layers)
    with measuring():
        rows = run(weights, args.rows, args.rounds)
    warn_if_busy(busiest(rows))
    print(f"{len(weights)} weights, {sum(w.numel() for w in weights) / 1e6:.2f}M parameters (float32), "
          f"{torch.get_num_threads()} threads; medians of {args.rounds} interleaved rounds")
    print_table(HEADER.replace("first", str(args.rows[0])), [], [format_row(r) for r in rows])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(benchmark="linear", hidden=args.hidden, layers=args.layers, machine=machine_load(),
                           rows=rows), f, indent=1)
