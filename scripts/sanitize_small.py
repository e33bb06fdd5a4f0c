#!/usr/bin/env python3
"""Small verify, sample and KV-cache calls for compute-sanitizer (memcheck / racecheck):
every dtype pair of verify at a size with a partial last stat block and a partial race
tile (V = 3000), an unaligned V (scalar loads), dense and one-hot q, greedy and sampled
rows, sample with probs_out, and the KV append / gather ops; each through the cooperative
launch and the per-stage launches (SPECDEC_CUDA_LAUNCH=stages).

    compute-sanitizer --tool memcheck python scripts/sanitize_small.py
    python scripts/sanitize_small.py --device cpu      (a dry run of the same calls)
"""
import os
import sys

import torch

import specdec_ext


def calls(dev):
    g = torch.Generator().manual_seed(0)
    for V in (3000, 1001):
        for dt in (torch.float32, torch.float16, torch.bfloat16):
            for qt in (torch.float32, torch.bfloat16):
                B, K = 3, 2
                L = (torch.randn(B, K + 1, V, generator=g) * 2).to(dt).to(dev)
                Q = torch.softmax(torch.randn(B, K, V, generator=g), -1).to(qt).to(dev)
                ids = torch.randint(0, V, (B, K), generator=g).to(dev)
                T = torch.tensor([0.0, 0.7, 1.3], device=dev)
                specdec_ext.verify(L, ids, Q, T, seed=1)
                specdec_ext.verify(L, ids, None, T, seed=2)
            probs = torch.empty(B, V, device=dev)
            specdec_ext.sample(L[:, 0], T, seed=3, probs_out=probs)
    # KV cache: contiguous append and paged append / gather (fp16, D = 128: 16-byte copies)
    B, H, D, S, max_len = 2, 2, 128, 3, 16
    kc = torch.zeros(B, H, max_len, D, dtype=torch.float16, device=dev)
    vc = torch.zeros_like(kc)
    nk = torch.randn(B, H, S, D, dtype=torch.float16, device=dev)
    lengths = torch.tensor([0, 5], device=dev)
    torch.ops.specdec.kv_append_(kc, vc, nk, nk.clone(), lengths)
    NB, BS = 6, 4
    pk = torch.zeros(NB, BS, H, D, dtype=torch.float16, device=dev)
    pv = torch.zeros_like(pk)
    tok = torch.randn(5, H, D, dtype=torch.float16, device=dev)
    slots = torch.tensor([0, 1, -1, 9, 17], device=dev)
    torch.ops.specdec.paged_kv_append_(pk, pv, tok, tok.clone(), slots)
    tables = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32, device=dev)
    torch.ops.specdec.paged_kv_gather(pk, pv, tables, torch.tensor([7, 12], device=dev), 12)
    if dev == "cuda":
        torch.cuda.synchronize()


def main():
    dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cuda"
    for path in ("cooperative", "stages") if dev == "cuda" else ("cpu",):
        if path == "stages":
            os.environ["SPECDEC_CUDA_LAUNCH"] = "stages"
        try:
            calls(dev)
        except Exception as e:
            print(f"sanitize_small ({path}): {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        print(f"sanitize_small ({path}): ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
