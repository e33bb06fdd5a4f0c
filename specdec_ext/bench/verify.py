"""python -m specdec_ext.bench verify: the fused verify op side by side with

* torch   : a plain-PyTorch implementation of the same math, batched, no host
            syncs (softmax -> gather -> ratio test -> residual -> multinomial)
* compile : the same function under torch.compile (what Inductor gives for free)
* flashinfer (when importable, CUDA): softmax + chain_speculative_sampling

Inputs: target logits ~ 2 * N(0, 1); the draft distribution is a perturbed copy of
the target's (so acceptance is realistic, ~0.6-0.8; the measured mean is printed);
drafts are sampled from it. GB/s counts target logits + draft probs read once.

Columns: `fused` is the eager time per call (CUDA events around one call, launch
overhead included); on CUDA `graph` is the device time per call by CUDA-graph replay of
20 calls; `%floor` is the HBM floor (the minimal bytes, logits read once + the q rows, at
the measured copy bandwidth; on CPU at the measured memcpy bandwidth) over the fused time
(graph time on CUDA); `torch/fused`, `compile/fused` and `fi/fused` are the time of the
column to their left (torch, compile, flashinfer) over the fused time, i.e. how many times
faster the fused op is. The table is printed when every row is measured. Every row
records the 1-minute load average and core count (`load_1min`, `cpu_count`; a warning when
the load exceeded the cores). `--cold` adds cold-cache figures: before every timed call a buffer
bigger than the last-level cache (64 MiB on CPU, 256 MiB on a GPU) is streamed through the
caches, as when the op is interleaved with other work; both warm and cold are reported.
`--sample` adds rows of the sample op (B in {1, 64}, V = 128256; `--B` / `--V` replace
them) against softmax +
multinomial in PyTorch (eager and compiled) and FlashInfer's sampling_from_logits.
`--filters` adds verify rows with top-p 0.9 and with top-k 50 (B in {1, 8, 64}, K = 5,
V = 128256; op column `v:p.9` / `v:k50`), against a vLLM-style sort-based filter in plain
PyTorch followed by the PyTorch verify (and its torch.compile); q is the draft law under
the same filter in both. The unfiltered rows of the same run show the no-filter path.
"""
import argparse
import contextlib
import os
import sys

import torch

import specdec_ext

from .._cli import OneLineParser, int_in, output_path
from . import verify_tree
from .report import measuring, print_table
from .timing import (busiest, cache_flusher, copy_bandwidth, machine_load, time_call, time_graph, warn_if_busy,
                     write_rows_json)

FULL = dict(B=[1, 8, 64], K=[1, 5, 8], V=[32000, 128256, 151936], dtype=["fp32", "bf16"])
QUICK = dict(B=[1, 8], K=[5], V=[128256], dtype=["fp32", "bf16"])
SAMPLE = dict(B=[1, 64], V=[128256])
FILTERED = dict(B=[1, 8, 64], K=[5], V=[128256], filters=[dict(top_p=0.9), dict(top_k=50)])
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def torch_verify(target_logits, draft_ids, draft_probs, temperature: float):
    """Plain PyTorch speculative verification (the baseline), no host sync.

    target_logits [B, K+1, V], draft_ids [B, K] int64, draft_probs [B, K, V] -> tokens [B, K+1]
    """
    B, K1, V = target_logits.shape
    K = K1 - 1
    p = torch.softmax(target_logits.float() / temperature, dim=-1)
    q = draft_probs.float()
    p_d = p[:, :K].gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)
    q_d = q.gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1)
    u = torch.rand(B, K, device=p.device)
    accepted = (u * q_d < p_d).long().cumprod(dim=1)
    n = accepted.sum(dim=1)
    residual = torch.cat([(p[:, :K] - q).clamp_min(0), p[:, K:]], dim=1)
    rows = torch.arange(B, device=p.device)
    dist = residual[rows, n]
    dist = torch.where(dist.sum(-1, keepdim=True) > 0, dist, p[rows, n])
    token = torch.multinomial(dist, 1).squeeze(-1)
    pos = torch.arange(K1, device=p.device)
    padded = torch.cat([draft_ids, draft_ids.new_full((B, 1), -1)], dim=1)
    tokens = torch.where(pos < n.unsqueeze(1), padded, torch.full_like(padded, -1))
    return tokens.scatter(1, n.unsqueeze(1), token.unsqueeze(1)), n


def torch_filter(logits, top_k: int = 0, top_p: float = 1.0):
    """vLLM-style sort-based top-k / top-p in plain PyTorch (the filters' baseline).

    logits [..., V] -> float32 logits [..., V] with the filtered tokens at -inf: top-k keeps
    logits >= the k-th largest; top-p keeps a token when the mass sorted above it is < top_p.
    """
    x = logits.float()
    if top_k:
        x = x.masked_fill(x < x.topk(top_k, dim=-1).values[..., -1:], float("-inf"))
    if top_p < 1.0:
        srt, idx = x.sort(dim=-1, descending=True)
        probs = srt.softmax(dim=-1)
        srt = srt.masked_fill(probs.cumsum(dim=-1) - probs >= top_p, float("-inf"))
        x = torch.empty_like(x).scatter_(-1, idx, srt)
    return x


def torch_filtered_verify(target_logits, draft_ids, draft_probs, temperature: float, top_k: int = 0,
                          top_p: float = 1.0):
    """torch_filter on the target logits, then torch_verify: tokens [B, K+1]."""
    return torch_verify(torch_filter(target_logits, top_k, top_p), draft_ids, draft_probs, temperature)


def make_inputs(B, K, V, dtype, device, seed=0, filt=None):
    """logits [B, K+1, V], draft ids [B, K], draft law q [B, K, V] (a perturbed copy of the
    target's, under the filters ``filt`` when given)."""
    g = torch.Generator(device=device).manual_seed(seed)
    logits = (torch.randn(B, K + 1, V, device=device, generator=g) * 2.0).to(dtype)
    noisy = logits[:, :K].float() + 0.5 * torch.randn(B, K, V, device=device, generator=g)
    q = torch.softmax(torch_filter(noisy, **filt) if filt else noisy, -1)
    ids = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
    return logits, ids, q.to(dtype)


def flashinfer_fn(logits, ids, q):
    try:
        import flashinfer.sampling as fs
    except Exception:
        return None

    def run():
        tp = torch.softmax(logits.float(), -1)
        return fs.chain_speculative_sampling(q.float(), ids.int(), tp)

    try:
        run()
    except Exception as e:  # API differs between versions: report, do not guess
        print(f"  flashinfer column skipped: {e}", file=sys.stderr)
        return None
    return run


def torch_sample(logits, temperature: float):
    """Plain PyTorch sampling of one token per row (the baseline of the sample op)."""
    p = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(p, 1).squeeze(-1)


def flashinfer_sample_fn(logits):
    try:
        import flashinfer.sampling as fs
    except Exception:
        return None

    def run():
        return fs.sampling_from_logits(logits.float())

    try:
        run()
    except Exception as e:
        print(f"  flashinfer column skipped: {e}", file=sys.stderr)
        return None
    return run


@contextlib.contextmanager
def launch_path(path):
    """SPECDEC_CUDA_LAUNCH for the calls inside (csrc/cuda/sampling_cuda.cu): "cooperative",
    "stages", or None = the default (cooperative eagerly, per-stage launches under capture)."""
    old = os.environ.get("SPECDEC_CUDA_LAUNCH")
    if path is None:
        os.environ.pop("SPECDEC_CUDA_LAUNCH", None)
    else:
        os.environ["SPECDEC_CUDA_LAUNCH"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SPECDEC_CUDA_LAUNCH", None)
        else:
            os.environ["SPECDEC_CUDA_LAUNCH"] = old


def _measure(device, fns, nbytes, peak, cold, flush):
    """Times of {name: fn or None}: eager (and cold), graph replay for the fused op on CUDA;
    on CUDA also the other launch path of each mode (JSON only: fused_stages_s = eager
    per-stage launches, fused_graph_coop_s = graph replay of the cooperative launch)."""
    out = {}
    for name, fn in fns.items():
        out[f"{name}_s"] = time_call(fn, device) if fn else None
        if cold:
            out[f"{name}_cold_s"] = time_call(fn, device, flush=flush, min_reps=5, max_reps=100) if fn else None
    out["fused_graph_s"] = time_graph(fns["fused"]) if device == "cuda" else None
    if device == "cuda":
        with launch_path("stages"):
            out["fused_stages_s"] = time_call(fns["fused"], device)
        with launch_path("cooperative"):
            out["fused_graph_coop_s"] = time_graph(fns["fused"])
    best = out["fused_graph_s"] or out["fused_s"]
    out["floor_bytes"] = nbytes
    out["floor_s"] = nbytes / (peak * 1e9) if peak else None
    out["pct_floor"] = 100.0 * out["floor_s"] / best if peak else None
    out["pct_floor_cold"] = 100.0 * out["floor_s"] / out["fused_cold_s"] if peak and cold else None
    out["fused_gbps"] = nbytes / out["fused_s"] / 1e9
    return out


def filter_label(filt):
    """Op column of a filtered verify row: v:p.9, v:k50."""
    if "top_p" in filt:
        return "v:p" + format(filt["top_p"], "g").lstrip("0")
    return f"v:k{filt['top_k']}"


def verify_row(device, dt, B, K, V, filt, baseline, compiled, peak, cold, flush):
    """One verify row: the fused op (with the filters ``filt``, {} = none) against
    ``baseline`` (torch_verify or torch_filtered_verify), its torch.compile ``compiled``
    and, unfiltered on CUDA, FlashInfer."""
    logits, ids, q = make_inputs(B, K, V, DTYPES[dt], device, filt=filt)
    # minimal bytes: every logit read once + the q rows
    nbytes = logits.numel() * logits.element_size() + q.numel() * q.element_size()
    res = specdec_ext.verify(logits, ids, q, 1.0, seed=0, **filt)
    alpha = (res.num_accepted.float().mean() / K).item()
    if compiled is not None:
        compiled(logits, ids, q, 1.0, **filt)  # compile outside the timing
    fns = dict(fused=lambda: specdec_ext.verify(logits, ids, q, 1.0, seed=0, **filt),
               torch=lambda: baseline(logits, ids, q, 1.0, **filt),
               compile=(lambda: compiled(logits, ids, q, 1.0, **filt)) if compiled else None,
               flashinfer=flashinfer_fn(logits, ids, q) if device == "cuda" and not filt else None)
    label = dict(op=filter_label(filt), filters=filt) if filt else dict(op="verify")
    return dict(**label, device=device, dtype=dt, B=B, K=K, V=V, accept_rate=alpha, copy_gbps=peak,
                **_measure(device, fns, nbytes, peak, cold, flush))


def bench_device(device, grid, with_compile, rows, on_row=lambda: None, cold=False, sample_grid=None,
                 filter_grid=None):
    """Every verify (and sample, filtered verify) row of one device, appended to ``rows``
    (dicts: the JSON rows); ``on_row()`` after each. Prints nothing: main prints the table."""
    compiled = torch.compile(torch_verify, dynamic=True) if with_compile else None
    compiled_sample = torch.compile(torch_sample, dynamic=True) if with_compile and sample_grid else None
    # the floor's bandwidth: device copy on a GPU (1 GiB), memcpy on the CPU (256 MiB: cheap)
    peak = copy_bandwidth(device) if device == "cuda" else copy_bandwidth(device, 256 << 20)
    flush = cache_flusher(device) if cold else None

    def add(row):
        row.update(machine_load())  # the load while it was timed (check_targets refuses busy rows)
        rows.append(row)
        on_row()

    for dt in grid["dtype"]:
        for B in grid["B"]:
            for K in grid["K"]:
                for V in grid["V"]:
                    add(verify_row(device, dt, B, K, V, {}, torch_verify, compiled, peak, cold, flush))
        for B in (sample_grid or {}).get("B", []):
            for V in sample_grid["V"]:
                logits = make_inputs(B, 1, V, DTYPES[dt], device)[0][:, 0].contiguous()
                nbytes = logits.numel() * logits.element_size()
                if compiled_sample is not None:
                    compiled_sample(logits, 1.0)
                fi = flashinfer_sample_fn(logits) if device == "cuda" else None
                fns = dict(fused=lambda: specdec_ext.sample(logits, 1.0, seed=0),
                           torch=lambda: torch_sample(logits, 1.0),
                           compile=(lambda: compiled_sample(logits, 1.0)) if compiled_sample else None,
                           flashinfer=fi)
                add(dict(op="sample", device=device, dtype=dt, B=B, K=None, V=V, accept_rate=None,
                         copy_gbps=peak, **_measure(device, fns, nbytes, peak, cold, flush)))
                del logits
    if filter_grid:  # filtered verify rows (FILTERED) against the sort-based PyTorch baseline
        compiled_filtered = torch.compile(torch_filtered_verify, dynamic=True) if with_compile else None
        for filt in filter_grid["filters"]:
            for B in filter_grid["B"]:
                for K in filter_grid["K"]:
                    for V in filter_grid["V"]:
                        add(verify_row(device, "fp32", B, K, V, filt, torch_filtered_verify, compiled_filtered,
                                       peak, cold, flush))


HEADER = (f"{'op':6} {'dev':4} {'dtype':5} {'B':>3} {'K':>2} {'V':>6} {'alpha':>5} | {'fused':>9} {'graph':>9} "
          f"{'GB/s':>7} {'%floor':>6} | {'torch':>9} {'torch/fused':>11} | {'compile':>9} {'compile/fused':>13} | "
          f"{'flashinfer':>10} {'fi/fused':>8}")
COLD_HEADER = f" || {'cold fused':>10} {'%floor':>6} {'cold torch':>10} {'torch/fused':>11}"
LEGEND = ("torch/fused, compile/fused, fi/fused = that column's time / the fused (eager) time: how many times "
          "faster the fused op is (> 1: fused wins); %floor = 100 x the HBM-floor time / the fused time "
          "(graph time on CUDA)")
COLD_LEGEND = "cold: the same with a cache flush before every call; its torch/fused = cold torch / cold fused"


def fmt_t(t):
    return "-" if t is None else (f"{t * 1e6:.1f}us" if t < 1e-3 else f"{t * 1e3:.2f}ms")


def format_row(r, cold=False) -> str:
    """One table line of a row dict (HEADER's columns; COLD_HEADER's too with ``cold``)."""
    def sp(t, ref="fused_s"):
        return "-" if t is None else f"{t / r[ref]:.1f}x"

    def pct(x):
        return "-" if x is None else f"{x:.0f}%"
    line = (f"{r.get('op', 'verify'):6} {r['device']:4} {r['dtype']:5} {r['B']:>3} {r['K'] if r['K'] is not None else '-':>2} "
            f"{r['V']:>6} {'-' if r['accept_rate'] is None else format(r['accept_rate'], '.2f'):>5} | "
            f"{fmt_t(r['fused_s']):>9} {fmt_t(r.get('fused_graph_s')):>9} {r['fused_gbps']:>7.1f} "
            f"{pct(r.get('pct_floor')):>6} | {fmt_t(r['torch_s']):>9} {sp(r['torch_s']):>11} | "
            f"{fmt_t(r['compile_s']):>9} {sp(r['compile_s']):>13} | {fmt_t(r['flashinfer_s']):>10} "
            f"{sp(r['flashinfer_s']):>8}")
    if cold:
        line += (f" || {fmt_t(r.get('fused_cold_s')):>10} {pct(r.get('pct_floor_cold')):>6} "
                 f"{fmt_t(r.get('torch_cold_s')):>10} {sp(r.get('torch_cold_s'), 'fused_cold_s'):>11}")
    return line


def main(argv):
    ap = OneLineParser(prog="python -m specdec_ext.bench verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    ap.add_argument("--quick", action="store_true", help=f"small grid {QUICK}")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--B", type=int_in(1), nargs="*"), ap.add_argument("--K", type=int_in(1), nargs="*")
    ap.add_argument("--V", type=int_in(1), nargs="*"), ap.add_argument("--dtype", nargs="*", choices=list(DTYPES))
    ap.add_argument("--json", metavar="PATH", type=output_path,
                    help="write all rows as JSON (benchmarks/check_targets.py reads it)")
    ap.add_argument("--cold", action="store_true",
                    help="also time with cold caches (a buffer > last-level cache streamed before every call)")
    ap.add_argument("--sample", action="store_true", help=f"add rows of the sample op {SAMPLE}")
    ap.add_argument("--sample-only", action="store_true", help="only the sample rows (no verify rows)")
    ap.add_argument("--filters", action="store_true", help=f"add filtered verify rows {FILTERED}")
    ap.add_argument("--filters-only", action="store_true", help="only the filtered verify rows")
    ap.add_argument("--tree", action="store_true",
                    help=f"add verify_tree rows vs the plain-PyTorch tree walk {verify_tree.FULL} (--quick: {verify_tree.QUICK})")
    ap.add_argument("--tree-only", action="store_true", help="only the verify_tree rows")
    args = ap.parse_args(argv)
    grid = dict(QUICK if args.quick else FULL)
    for k in ("B", "K", "V", "dtype"):
        if getattr(args, k):
            grid[k] = getattr(args, k)
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    if "cuda" in devices and not (torch.cuda.is_available() and specdec_ext.has_cuda_kernels()):
        print("cuda: no GPU or no CUDA kernels in this build: skipped", file=sys.stderr)
        devices.remove("cuda")
    torch.manual_seed(0)
    filter_grid = dict(FILTERED, **{k: getattr(args, k) for k in ("B", "K", "V") if getattr(args, k)})
    if args.sample_only or args.filters_only or args.tree_only:
        grid["B"] = []
    sample_grid = (dict(SAMPLE, **{k: getattr(args, k) for k in ("B", "V") if getattr(args, k)})
                   if (args.sample or args.sample_only) else None)
    rows, tree_rows = [], []

    def write():
        if args.json:
            write_rows_json(args.json, rows, gpu=torch.cuda.get_device_name() if "cuda" in devices else None)

    def save():
        write()  # rewritten after every row, so a run cut short by a time limit keeps what it measured

    with measuring():  # third-party warnings are held back until here, before the tables
        for d in devices:
            bench_device(d, grid, not args.no_compile, rows, on_row=save, cold=args.cold, sample_grid=sample_grid,
                         filter_grid=filter_grid if (args.filters or args.filters_only) else None)
        if args.tree or args.tree_only:
            for row in verify_tree.bench_rows(devices, verify_tree.QUICK if args.quick else verify_tree.FULL):
                tree_rows.append(dict(row, **machine_load()))
                rows.append(tree_rows[-1])
                save()
    write()
    warn_if_busy(busiest(rows))  # one line on stderr when any row was timed with more load than cores
    print(f"torch {torch.__version__}, specdec_ext {specdec_ext.__version__}, threads {torch.get_num_threads()}")
    chain = [r for r in rows if r["op"] != "verify_tree"]
    if chain or not tree_rows:
        print_table(HEADER + (COLD_HEADER if args.cold else ""), [LEGEND] + ([COLD_LEGEND] if args.cold else []),
                    [format_row(r, args.cold) for r in chain])
    if tree_rows:
        print_table(verify_tree.HEADER, [verify_tree.LEGEND], [verify_tree.format_row(r) for r in tree_rows])
    return 0
