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

``--forward``: instead, the bundled target's whole decode forward (reference model, KV cache
of 64 tokens) at each S = ``--rows`` tokens, with its packed weight copies and without them
(``LlamaModel.pack_linears_``), interleaved; ms per forward and plain / packed.
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
from ..ops.linear import PANEL
from .report import measuring, print_table
from .timing import busiest, machine_load, warn_if_busy

_op = torch.ops.specdec.skinny_linear
#: name -> (prepare the weight once, call it on x)
METHODS = {"F.linear": (lambda w: w, F.linear), "skinny_linear": (lambda w: w, _op),
           "skinny_packed": (lambda w: specdec_ext.pack_linear_weight(w) if w.shape[0] % PANEL == 0 else w, _op)}


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


def run_forward(tokens: List[int], rounds: int) -> List[Dict]:
    """The bundled target's forward of S tokens after a 64-token prompt, packed and plain
    (the same model: its packed copies set aside for the plain runs), interleaved rounds."""
    from .. import bundled
    from ..models import LlamaSpecModel
    from ..models.cpu_linear import _PACKED

    target, _ = bundled.load_pair()
    model = LlamaSpecModel(target)
    model.reset(1, 64 + max(tokens))
    g = torch.Generator().manual_seed(0)
    keep = torch.zeros(1, dtype=torch.int64)
    with torch.no_grad():
        model.forward(torch.randint(0, target.vocab_size, (1, 64), generator=g))
        inputs = {s: torch.randint(0, target.vocab_size, (1, s), generator=g) for s in tokens}
        packed = {m: m.__dict__[_PACKED] for m in target.modules() if _PACKED in m.__dict__}
        times = {(s, kind): [] for s in tokens for kind in ("plain", "packed")}
        for r in range(rounds + 1):  # round 0 warms up
            for s in tokens:
                for kind in (("plain", "packed") if r % 2 else ("packed", "plain")):
                    for m, entry in packed.items():
                        if kind == "packed":
                            m.__dict__[_PACKED] = entry
                        else:
                            m.__dict__.pop(_PACKED, None)
                    t0 = time.perf_counter()
                    model.forward(inputs[s])
                    if r:
                        times[(s, kind)].append(time.perf_counter() - t0)
                    model.rollback(s, keep)
    load = machine_load()
    med = {k: statistics.median(v) for k, v in times.items()}
    return [dict(tokens=s, plain_seconds=med[(s, "plain")], packed_seconds=med[(s, "packed")],
                 plain_over_packed=med[(s, "plain")] / med[(s, "packed")], **load) for s in tokens]


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
    p.add_argument("--forward", action="store_true",
                   help="time the bundled target's whole forward at S = --rows tokens, packed vs plain linears")
    p.add_argument("--json", metavar="PATH", type=output_path, help="write the rows as JSON")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.forward:
        with measuring():
            rows = run_forward(args.rows, args.rounds)
        warn_if_busy(busiest(rows))
        print(f"the bundled target's decode forward, {torch.get_num_threads()} threads; medians of {args.rounds} "
              f"interleaved rounds")
        print_table(f"{'S':>3} | {'plain ms':>9} {'packed ms':>9} {'plain/packed':>12}", [],
                    [f"{r['tokens']:>3} | {r['plain_seconds'] * 1e3:9.3f} {r['packed_seconds'] * 1e3:9.3f} "
                     f"{r['plain_over_packed']:12.2f}" for r in rows])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(benchmark="linear_forward", machine=machine_load(), rows=rows), f, indent=1)
        return
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
