"""python -m specdec_ext.bench verify: the fused verify op side by side with

* torch   : a plain-PyTorch implementation of the same math, batched, no host
            syncs (softmax -> gather -> ratio test -> residual -> multinomial)
* compile : the same function under torch.compile (what Inductor gives for free)
* flashinfer (when importable, CUDA): softmax + chain_speculative_sampling

Inputs: target logits ~ 2 * N(0, 1); the draft distribution is a perturbed copy of
the target's (so acceptance is realistic, ~0.6-0.8; the measured mean is printed);
drafts are sampled from it. GB/s counts target logits + draft probs read once.
"""
import argparse
import json
import sys

import torch

import specdec_ext

from .timing import copy_bandwidth, time_call

FULL = dict(B=[1, 8, 64], K=[1, 5, 8], V=[32000, 128256, 151936], dtype=["fp32", "bf16"])
QUICK = dict(B=[1, 8], K=[5], V=[128256], dtype=["fp32", "bf16"])
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


def make_inputs(B, K, V, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    logits = (torch.randn(B, K + 1, V, device=device, generator=g) * 2.0).to(dtype)
    noisy = logits[:, :K].float() + 0.5 * torch.randn(B, K, V, device=device, generator=g)
    q = torch.softmax(noisy, -1)
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


def bench_device(device, grid, with_compile, rows, on_row=lambda: None):
    compiled = torch.compile(torch_verify, dynamic=True) if with_compile else None
    peak = copy_bandwidth(device) if device == "cuda" else None
    for dt in grid["dtype"]:
        for B in grid["B"]:
            for K in grid["K"]:
                for V in grid["V"]:
                    logits, ids, q = make_inputs(B, K, V, DTYPES[dt], device)
                    nbytes = logits.numel() * logits.element_size() + q.numel() * q.element_size()
                    res = specdec_ext.verify(logits, ids, q, 1.0, seed=0)
                    alpha = (res.num_accepted.float().mean() / K).item()
                    t_fused = time_call(lambda: specdec_ext.verify(logits, ids, q, 1.0, seed=0), device)
                    t_torch = time_call(lambda: torch_verify(logits, ids, q, 1.0), device)
                    t_comp = None
                    if compiled is not None:
                        compiled(logits, ids, q, 1.0)  # compile outside the timing
                        t_comp = time_call(lambda: compiled(logits, ids, q, 1.0), device)
                    fi = flashinfer_fn(logits, ids, q) if device == "cuda" else None
                    t_fi = time_call(fi, device) if fi else None
                    rows.append(dict(device=device, dtype=dt, B=B, K=K, V=V, accept_rate=alpha,
                                     fused_s=t_fused, torch_s=t_torch, compile_s=t_comp, flashinfer_s=t_fi,
                                     fused_gbps=nbytes / t_fused / 1e9, copy_gbps=peak))
                    print_row(rows[-1])
                    on_row()
                    del logits, ids, q


HEADER = (f"{'dev':4} {'dtype':5} {'B':>3} {'K':>2} {'V':>6} {'alpha':>5} | {'fused':>9} {'GB/s':>7} | "
          f"{'torch':>9} {'x':>6} | {'compile':>9} {'x':>6} | {'flashinfer':>10} {'x':>6}")


def fmt_t(t):
    return "-" if t is None else (f"{t * 1e6:.1f}us" if t < 1e-3 else f"{t * 1e3:.2f}ms")


def print_row(r):
    def sp(t):
        return "-" if t is None else f"{t / r['fused_s']:.1f}x"
    print(f"{r['device']:4} {r['dtype']:5} {r['B']:>3} {r['K']:>2} {r['V']:>6} {r['accept_rate']:>5.2f} | "
          f"{fmt_t(r['fused_s']):>9} {r['fused_gbps']:>7.1f} | {fmt_t(r['torch_s']):>9} {sp(r['torch_s']):>6} | "
          f"{fmt_t(r['compile_s']):>9} {sp(r['compile_s']):>6} | {fmt_t(r['flashinfer_s']):>10} "
          f"{sp(r['flashinfer_s']):>6}", flush=True)


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m specdec_ext.bench verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    ap.add_argument("--quick", action="store_true", help=f"small grid {QUICK}")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--B", type=int, nargs="*"), ap.add_argument("--K", type=int, nargs="*")
    ap.add_argument("--V", type=int, nargs="*"), ap.add_argument("--dtype", nargs="*", choices=list(DTYPES))
    ap.add_argument("--json", metavar="PATH", help="write all rows as JSON (benchmarks/check_targets.py reads it)")
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
    print(f"torch {torch.__version__}, specdec_ext {specdec_ext.__version__}, threads {torch.get_num_threads()}")
    print(HEADER)
    rows = []

    def save():
        # rewritten after every row, so a run cut short by a time limit keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(rows=rows, torch=torch.__version__,
                               gpu=torch.cuda.get_device_name() if "cuda" in devices else None), f, indent=1)

    for d in devices:
        bench_device(d, grid, not args.no_compile, rows, on_row=save)
    save()
    return 0
