#!/usr/bin/env python3
"""The B=64 verify call that gpu_check.sh reads with ncu (dram throughput): B=64, K=5,
V=128256, fp32 logits and dense fp32 q, T=1; 3 calls (ncu skips the first 2).

    ncu --clock-control none -k regex:verify_kernel -s 2 -c 1 \\
        --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,gpu__time_duration.sum \\
        python scripts/ncu_verify.py
"""
import torch

import specdec_ext

B, K, V = 64, 5, 128256
g = torch.Generator(device="cuda").manual_seed(0)
logits = torch.randn(B, K + 1, V, device="cuda", generator=g) * 2
q = torch.softmax(logits[:, :K] + 0.5 * torch.randn(B, K, V, device="cuda", generator=g), -1)
ids = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
for _ in range(3):
    specdec_ext.verify(logits, ids, q, 1.0, seed=0)
torch.cuda.synchronize()
print(f"minimal bytes {logits.numel() * 4 + q.numel() * 4} (logits + q, read once)")
