"""python -m specdec_ext.bench kv: KV-cache append and gather throughput.

For each device, B in {1, 32}, H = 8, D = 128, S in {1, 6}, fp16 / bf16:

* append (contiguous cache [B, H, max_len, D], ragged lengths): ``kv_append_`` vs the same
  write with plain PyTorch advanced indexing vs a plain ``copy_`` of the same bytes into a
  contiguous buffer (the bandwidth ceiling for that many bytes);
  paged append: ``paged_kv_append_`` vs ``index_copy_`` on the flattened slots vs ``copy_``.
* gather (paged cache [num_blocks, 16, H, D] -> [B, H, context, D]): ``paged_kv_gather``
  (fresh outputs: on CPU page faults on the new memory dominate) and ``paged_kv_gather_into_``
  (reused buffers) vs ``index_select`` + permute + zero-fill in PyTorch vs ``copy_`` of the
  same bytes into a reused buffer.

GB/s counts the bytes the operation writes (keys + values; a copy reads as many). Times are
medians (CUDA events on a GPU). ``--json PATH`` writes every row, each with the 1-minute load
average and core count while it was timed (``load_1min``, ``cpu_count``; a warning on stderr
when the load exceeded the cores).
"""
from __future__ import annotations

import argparse
import json
from typing import Dict, List

import torch

import specdec_ext  # noqa: F401  (registers torch.ops.specdec.*)

from .._cli import OneLineParser, float_in, int_in, output_path
from .report import measuring, print_table
from .timing import busiest, machine_load, time_call, warn_if_busy

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
H, D = 8, 128


def _bench_append(device: str, B: int, S: int, dtype: torch.dtype, max_len: int, min_s: float) -> List[Dict]:
    g = torch.Generator().manual_seed(0)
    kc = torch.zeros(B, H, max_len, D, dtype=dtype, device=device)
    vc = torch.zeros_like(kc)
    nk = torch.randn(B, H, S, D, generator=g).to(dtype).to(device)
    nv = torch.randn(B, H, S, D, generator=g).to(dtype).to(device)
    lengths = torch.randint(0, max_len - S + 1, (B,), generator=g).to(device)
    rows = torch.arange(B, device=device).view(B, 1)
    pos = lengths.view(B, 1) + torch.arange(S, device=device).view(1, S)
    nk_t, nv_t = nk.permute(0, 2, 1, 3), nv.permute(0, 2, 1, 3)  # [B, S, H, D]
    dst_k, dst_v = torch.empty_like(nk), torch.empty_like(nv)
    nbytes = 2 * nk.numel() * nk.element_size()

    def torch_index():
        kc[rows, :, pos] = nk_t
        vc[rows, :, pos] = nv_t

    def plain_copy():
        dst_k.copy_(nk)
        dst_v.copy_(nv)

    # paged: the same tokens through a slot mapping (block_size 16, each row its own blocks)
    bs = 16
    nblk = B * (-(-max_len // bs))
    pk = torch.zeros(nblk, bs, H, D, dtype=dtype, device=device)
    pv = torch.zeros_like(pk)
    slots = (rows * (nblk // B) * bs + pos).reshape(-1)
    tk, tv = nk_t.reshape(B * S, H, D), nv_t.reshape(B * S, H, D)

    def paged_index():
        pk.view(-1, H, D).index_copy_(0, slots, tk)
        pv.view(-1, H, D).index_copy_(0, slots, tv)

    cases = [
        ("append", "kv_append_", lambda: torch.ops.specdec.kv_append_(kc, vc, nk, nv, lengths, None)),
        ("append", "torch indexing", torch_index),
        ("append", "copy_", plain_copy),
        ("paged_append", "paged_kv_append_",
         lambda: torch.ops.specdec.paged_kv_append_(pk, pv, tk, tv, slots, None)),
        ("paged_append", "torch index_copy_", paged_index),
    ]
    return [dict(op=op, impl=impl, device=device, B=B, S=S, dtype=str(dtype).replace("torch.", ""),
                 bytes=nbytes, seconds=(t := time_call(fn, device, min_seconds=min_s)), gbps=nbytes / t / 1e9)
            for op, impl, fn in cases]


def _bench_gather(device: str, B: int, dtype: torch.dtype, context: int, min_s: float) -> List[Dict]:
    g = torch.Generator().manual_seed(1)
    bs = 16
    per_seq = -(-context // bs)
    nblk = B * per_seq + 7
    kc = torch.randn(nblk, bs, H, D, generator=g).to(dtype).to(device)
    vc = torch.randn(nblk, bs, H, D, generator=g).to(dtype).to(device)
    tables = torch.randperm(nblk, generator=g)[: B * per_seq].view(B, per_seq).to(torch.int32).to(device)
    lengths = torch.randint(context // 2, context + 1, (B,), generator=g)
    lengths[0] = context
    lengths = lengths.to(device)
    flat = tables.reshape(-1).long()
    keep = (torch.arange(per_seq * bs, device=device).view(1, -1) < lengths.view(B, 1))[:, :context]
    keep = keep.view(B, 1, context, 1)
    src_k, src_v = kc.view(-1)[: B * H * context * D], vc.view(-1)[: B * H * context * D]
    dst_k, dst_v = torch.empty_like(src_k), torch.empty_like(src_v)
    nbytes = 2 * B * H * context * D * kc.element_size()

    def torch_gather():
        out = []
        for c in (kc, vc):
            x = c.index_select(0, flat).view(B, per_seq * bs, H, D)[:, :context].permute(0, 2, 1, 3)
            out.append(torch.where(keep, x, torch.zeros((), dtype=c.dtype, device=device)))
        return out

    def plain_copy():
        dst_k.copy_(src_k)
        dst_v.copy_(src_v)

    out_k = torch.empty(B, H, context, D, dtype=dtype, device=device)
    out_v = torch.empty_like(out_k)
    cases = [
        ("gather", "paged_kv_gather",
         lambda: torch.ops.specdec.paged_kv_gather(kc, vc, tables, lengths, context)),
        ("gather", "paged_kv_gather_into_",
         lambda: torch.ops.specdec.paged_kv_gather_into_(kc, vc, tables, lengths, out_k, out_v)),
        ("gather", "torch index_select", torch_gather),
        ("gather", "copy_", plain_copy),
    ]
    return [dict(op=op, impl=impl, device=device, B=B, S=context, dtype=str(dtype).replace("torch.", ""),
                 bytes=nbytes, seconds=(t := time_call(fn, device, min_seconds=min_s)), gbps=nbytes / t / 1e9)
            for op, impl, fn in cases]


def run(devices: List[str], max_len: int, context: int, min_s: float, batches: List[int],
        seqs: List[int], dtypes: List[str]) -> List[Dict]:
    rows: List[Dict] = []
    for device in devices:
        for dname in dtypes:
            for B in batches:
                for S in seqs:
                    rows += _stamped(_bench_append(device, B, S, DTYPES[dname], max_len, min_s))
                rows += _stamped(_bench_gather(device, B, DTYPES[dname], context, min_s))
    return rows


def _stamped(rows: List[Dict]) -> List[Dict]:
    """``rows`` with the machine's load just after they were timed (machine_load())."""
    load = machine_load()
    return [dict(r, **load) for r in rows]


HEADER = f"{'device':6} {'op':12} {'dtype':8} {'B':>3} {'S|ctx':>5}  {'impl':22} {'us':>9} {'GB/s':>8}"


def format_row(r: Dict) -> str:
    """One table line (HEADER's columns); no ratio columns: compare the impl rows of an op."""
    return (f"{r['device']:6} {r['op']:12} {r['dtype']:8} {r['B']:>3} {r['S']:>5}  {r['impl']:22} "
            f"{r['seconds'] * 1e6:9.1f} {r['gbps']:8.2f}")


def main(argv: List[str]) -> None:
    p = OneLineParser(prog="python -m specdec_ext.bench kv", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                   help="all = cpu, plus cuda when available (default)")
    p.add_argument("--json", metavar="PATH", type=output_path, help="write the rows as JSON")
    p.add_argument("--max-len", type=int_in(1), default=2048, help="contiguous cache capacity (default 2048)")
    p.add_argument("--context", type=int_in(1), default=1024, help="tokens per row gathered (default 1024)")
    p.add_argument("--min-seconds", type=float_in(0, low_open=True), default=0.1,
                   help="time per measurement (default 0.1)")
    p.add_argument("--batch", type=int_in(1), nargs="+", default=[1, 32])
    p.add_argument("--seq", type=int_in(1), nargs="+", default=[1, 6], help="S: tokens appended per row")
    p.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["fp16", "bf16"])
    p.add_argument("--threads", type=int_in(1), default=None, help="torch.set_num_threads for the CPU rows")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device available")
    if args.device != "cpu" and torch.cuda.is_available() and not specdec_ext.has_cuda_kernels():
        p.error("this build of specdec_ext has no CUDA kernels")
    if any(s > args.max_len for s in args.seq):
        p.error(f"--seq values must be at most --max-len {args.max_len}, got {args.seq}")
    devices = {"cpu": ["cpu"], "cuda": ["cuda"],
               "all": ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])}[args.device]
    with measuring():  # third-party warnings are held back until here, before the table
        rows = run(devices, args.max_len, args.context, args.min_seconds, args.batch, args.seq, args.dtype)
    warn_if_busy(busiest(rows))  # before the table: nothing after it
    print_table(HEADER, [], [format_row(r) for r in rows])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(benchmark="kv", H=H, D=D, max_len=args.max_len, context=args.context,
                           machine=machine_load(), rows=rows), f, indent=1)
