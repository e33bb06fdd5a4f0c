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


#: rows allowed to differ between the CPU and CUDA kernels: both draw the same Philox
#: numbers, but float sums are taken in different orders, so a near-tie (a ratio test
#: u * q * s vs e, or two race keys) can flip. An explicit count, not a ratio.
MAX_MISMATCHED_ROWS = 2


def _mismatches(a, b):
    """Number of rows (dim 0) where a and b differ anywhere."""
    a, b = a.cpu(), b.cpu()
    return int((a != b).reshape(a.shape[0], -1).any(1).sum().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,K,V", [(1, 5, 128256), (64, 3, 32000), (500, 4, 1000), (7, 0, 151936), (33, 2, 301)])
def test_cpu_cuda_agree_cuda(B, K, V, dtype):
    """Same Philox numbers on both devices: rows agree except where float rounding
    flips a decision (at most MAX_MISMATCHED_ROWS rows). V = 301 takes the scalar
    (unaligned) load path of the CUDA kernels."""
    L, D, Q = _inputs(B, K, V, dtype, seed=B + K)
    temps = torch.rand(B, generator=torch.Generator().manual_seed(1)) * 1.5
    temps[::5] = 0.0  # some greedy rows
    cpu = specdec_ext.verify(L, D, Q, temps, seed=77, offset=5)
    gpu = specdec_ext.verify(L.cuda(), D.cuda(), Q.cuda(), temps.cuda(), seed=77, offset=5)
    assert _mismatches(cpu.tokens, gpu.tokens) <= MAX_MISMATCHED_ROWS
    assert torch.equal(cpu.valid, gpu.valid.cpu())
    s_cpu = specdec_ext.sample(L[:, 0], temps, seed=3)
    s_gpu = specdec_ext.sample(L[:, 0].cuda(), temps.cuda(), seed=3)
    assert _mismatches(s_cpu, s_gpu) <= MAX_MISMATCHED_ROWS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_cuda_agree_sampled_large_vocab_cuda(dtype):
    """256 SAMPLED rows (T > 0, no greedy row) at V = 128256, verify with dense q and
    with one-hot drafts, and sample with probs_out: at most MAX_MISMATCHED_ROWS of the
    256 rows may differ; probs_out matches the CPU's to float rounding."""
    B, K, V = 256, 2, 128256
    L, D, Q = _inputs(B, K, V, dtype, seed=11)
    temps = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(2))  # [0.5, 1.5): all sampled
    Lc, Dc, Qc, Tc = L.cuda(), D.cuda(), Q.cuda(), temps.cuda()
    for q_cpu, q_gpu in ((Q, Qc), (None, None)):
        cpu = specdec_ext.verify(L, D, q_cpu, temps, seed=123, offset=9)
        gpu = specdec_ext.verify(Lc, Dc, q_gpu, Tc, seed=123, offset=9)
        assert bool(cpu.valid.all()) and torch.equal(cpu.valid, gpu.valid.cpu())
        n = _mismatches(cpu.tokens, gpu.tokens)
        assert n <= MAX_MISMATCHED_ROWS, f"{n} of {B} rows differ (q={'dense' if q_cpu is not None else 'one-hot'})"
        # the tokens are sampled, not all argmaxes: the race really ran
        j = cpu.num_accepted
        last = cpu.tokens.gather(1, j.unsqueeze(1)).squeeze(1)
        assert (last != L[torch.arange(B), j].float().argmax(-1)).any()
    p_cpu = torch.empty(B, V)
    p_gpu = torch.empty(B, V, device="cuda")
    s_cpu = specdec_ext.sample(L[:, 0], temps, seed=5, probs_out=p_cpu)
    s_gpu = specdec_ext.sample(Lc[:, 0], Tc, seed=5, probs_out=p_gpu)
    assert _mismatches(s_cpu, s_gpu) <= MAX_MISMATCHED_ROWS
    torch.testing.assert_close(p_gpu.cpu(), p_cpu, rtol=1e-4, atol=1e-7)


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
