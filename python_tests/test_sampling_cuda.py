"""CUDA-only checks of the sampling ops (skipped without a GPU): CUDA-graph capture with an
advancing device offset, no host sync inside the ops. The kernels' test families (agreement
with the CPU, filters, ragged K, coupled mode, invalid rows, launch and load paths) are in
test_sampling_gpu.py, which runs them on the GPU and in the SIMT emulation."""
import pytest
import torch

import specdec_ext
from helpers import draft_inputs

pytestmark = pytest.mark.cuda


def _mismatches(a, b):
    """Number of rows (dim 0) where a and b differ anywhere."""
    a, b = a.cpu(), b.cpu()
    return int((a != b).reshape(a.shape[0], -1).any(1).sum().item())


def test_cuda_graph_replay_with_device_offset_cuda():
    B, K, V = 8, 4, 5000
    L, D, Q = [t.cuda() for t in draft_inputs(B, K, V, torch.float32, seed=2)]
    seed = torch.arange(B, device="cuda") + 1000
    offset = torch.zeros(B, dtype=torch.int64, device="cuda")
    static = {}

    def step():
        res = specdec_ext.verify(L, D, Q, 1.0, seed=seed, offset=offset)
        static["tokens"] = res.tokens

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm up (allocator, occupancy cache)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    outs = []
    for i in range(4):
        offset.fill_(i)
        graph.replay()
        torch.cuda.synchronize()
        eager = specdec_ext.verify(L, D, Q, 1.0, seed=seed, offset=offset).tokens
        assert torch.equal(static["tokens"], eager)
        outs.append(static["tokens"].clone())
    assert not all(torch.equal(outs[0], o) for o in outs[1:])  # fresh randomness per offset


def test_no_host_sync_cuda():
    L, D, Q = [t.cuda() for t in draft_inputs(4, 3, 2000, torch.bfloat16, seed=3)]
    seed = torch.arange(4, device="cuda")
    offset = torch.zeros((), dtype=torch.int64, device="cuda")
    temps = torch.full((4,), 0.9, device="cuda")
    probs = torch.empty(4, 3, 2000, device="cuda")
    specdec_ext.verify(L, D, Q, temps, seed=seed, offset=offset)  # warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        specdec_ext.sample(L[:, 0], temps, seed=seed, offset=offset, probs_out=probs[:, 0])
        specdec_ext.verify(L, D, Q, temps, seed=seed, offset=offset)
    finally:
        torch.cuda.set_sync_debug_mode("default")


#: the device the CUDA side of the tests below runs on (a module constant so the test
#: logic can be dry-run with both sides on the CPU)
GPU = "cuda"


def _to(device, *ts):
    return [None if t is None else t.to(device) for t in ts]


def test_filters_num_drafts_coupled_no_host_sync_cuda():
    B, K, V = 4, 3, 2000
    L, D, Q = _to(GPU, *draft_inputs(B, K, V, torch.bfloat16, seed=13))
    seed = torch.arange(B, device=GPU)
    offset = torch.zeros((), dtype=torch.int64, device=GPU)
    temps = torch.full((B,), 0.9, device=GPU)
    n = torch.tensor([3, 1, 0, 2], device=GPU)
    top_k = torch.tensor([0, 10, 50, 3], device=GPU)
    top_p = torch.full((B,), 0.9, device=GPU)
    min_p = torch.full((B,), 0.05, device=GPU)
    probs = torch.empty(B, K, V, device=GPU)
    kw = dict(seed=seed, offset=offset, top_k=top_k, top_p=top_p, min_p=min_p)
    specdec_ext.verify(L, D, Q, temps, num_drafts=n, **kw)  # warm up
    specdec_ext.verify(L, D, Q, temps, num_drafts=n, mode="coupled", **kw)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        specdec_ext.sample(L[:, 0], temps, probs_out=probs[:, 0], **kw)
        specdec_ext.verify(L, D, Q, temps, num_drafts=n, **kw)
        specdec_ext.verify(L, D, None, temps, num_drafts=n, mode="coupled", **kw)
        specdec_ext.verify(L, D, Q, temps, top_k=40, top_p=0.8, min_p=0.01, seed=seed, offset=offset)
    finally:
        torch.cuda.set_sync_debug_mode("default")
