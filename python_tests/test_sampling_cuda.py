"""CUDA-only checks (skipped without a GPU): CPU/CUDA agreement, CUDA-graph capture
with an advancing device offset, no host sync inside the ops."""
import pytest
import torch

import specdec_ext

pytestmark = pytest.mark.cuda


def _inputs(B, K, V, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, K + 1, V, generator=g) * 2).to(dtype)
    q = torch.softmax(logits[:, :K].float() + 0.5 * torch.randn(B, K, V, generator=g), -1).to(dtype)
    ids = torch.multinomial(q.float().view(-1, V), 1, generator=g).view(B, K)
    return logits, ids, q


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,K,V", [(1, 5, 128256), (64, 3, 32000), (500, 4, 1000), (7, 0, 151936)])
def test_cpu_cuda_agree_cuda(B, K, V, dtype):
    """Same Philox numbers on both devices: rows agree except where float rounding
    flips a decision (>= 99% of rows)."""
    L, D, Q = _inputs(B, K, V, dtype, seed=B + K)
    temps = torch.rand(B, generator=torch.Generator().manual_seed(1)) * 1.5
    temps[::5] = 0.0  # some greedy rows
    cpu = specdec_ext.verify(L, D, Q, temps, seed=77, offset=5)
    gpu = specdec_ext.verify(L.cuda(), D.cuda(), Q.cuda(), temps.cuda(), seed=77, offset=5)
    agree = (cpu.tokens == gpu.tokens.cpu()).all(1).float().mean().item()
    assert agree >= 0.99, agree
    assert torch.equal(cpu.valid, gpu.valid.cpu())
    s_cpu = specdec_ext.sample(L[:, 0], temps, seed=3)
    s_gpu = specdec_ext.sample(L[:, 0].cuda(), temps.cuda(), seed=3)
    assert (s_cpu == s_gpu.cpu()).float().mean().item() >= 0.99


def test_invalid_rows_cuda():
    L, D, Q = _inputs(4, 2, 300, torch.float32, seed=0)
    L[1, 2, 7] = float("nan")
    D[2, 0] = 300
    L[3, 0] = float("-inf")
    res = specdec_ext.verify(L.cuda(), D.cuda(), Q.cuda(), 1.0, seed=1)
    assert res.valid.tolist() == [True, False, False, False]
    assert (res.tokens[1:] == -1).all()


def test_cuda_graph_replay_with_device_offset_cuda():
    B, K, V = 8, 4, 5000
    L, D, Q = [t.cuda() for t in _inputs(B, K, V, torch.float32, seed=2)]
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
    L, D, Q = [t.cuda() for t in _inputs(4, 3, 2000, torch.bfloat16, seed=3)]
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
