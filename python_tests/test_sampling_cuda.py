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


# ---- filters (top-k / top-p / min-p), per-row num_drafts, coupled mode ----

#: the device the CUDA side of the tests below runs on (a module constant so the test
#: logic can be dry-run with both sides on the CPU)
GPU = "cuda"


def _to(device, *ts):
    return [None if t is None else t.to(device) for t in ts]


def _filters(form, B, seed):
    """Filter kwargs: "scalar" = one value for every row (all three filters);
    "rows" = [B] tensors mixing off values (top_k 0, top_p 1, min_p 0) with live ones."""
    if form == "scalar":
        return dict(top_k=50, top_p=0.9, min_p=0.02)
    g = torch.Generator().manual_seed(seed)
    top_k = torch.randint(1, 200, (B,), generator=g)
    top_k[::3] = 0
    top_p = 0.5 + 0.5 * torch.rand(B, generator=g)
    top_p[1::3] = 1.0
    min_p = 0.1 * torch.rand(B, generator=g)
    min_p[2::4] = 0.0
    return dict(top_k=top_k, top_p=top_p, min_p=min_p)


def _filters_on(f, device):
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in f.items()}


def _support_mismatches(a, b):
    """Rows whose filtered support (probability above 1e-20) differs: the cutoff itself."""
    a, b = a.cpu() > 1e-20, b.cpu() > 1e-20
    return int((a != b).any(1).sum().item())


@pytest.mark.parametrize("form", ["scalar", "rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,K,V", [(48, 3, 1000), (12, 2, 128256), (33, 2, 301)])
def test_cpu_cuda_agree_filtered_cuda(B, K, V, dtype, form):
    """Filtered verify (dense q, one-hot drafts) and sample (+ probs_out): the cutoff
    kernel finds the CPU's cutoff (same probs_out support), and rows agree up to
    MAX_MISMATCHED_ROWS. V = 301 takes the scalar load path."""
    L, D, Q = _inputs(B, K, V, dtype, seed=3 * B + K)
    temps = 0.4 + torch.rand(B, generator=torch.Generator().manual_seed(4))
    temps[::7] = 0.0  # greedy rows: filters do not apply
    f = _filters(form, B, seed=V)
    fg = _filters_on(f, GPU)
    Lg, Dg, Qg, Tg = _to(GPU, L, D, Q, temps)
    for q_cpu, q_gpu in ((Q, Qg), (None, None)):
        cpu = specdec_ext.verify(L, D, q_cpu, temps, seed=21, offset=4, **f)
        gpu = specdec_ext.verify(Lg, Dg, q_gpu, Tg, seed=21, offset=4, **fg)
        assert bool(cpu.valid.all()) and torch.equal(cpu.valid, gpu.valid.cpu())
        assert _mismatches(cpu.tokens, gpu.tokens) <= MAX_MISMATCHED_ROWS
        assert _mismatches(cpu.num_accepted, gpu.num_accepted) <= MAX_MISMATCHED_ROWS
    p_cpu = torch.empty(B, V)
    p_gpu = torch.empty(B, V, device=GPU)
    s_cpu = specdec_ext.sample(L[:, 0], temps, seed=8, offset=2, probs_out=p_cpu, **f)
    s_gpu = specdec_ext.sample(Lg[:, 0], Tg, seed=8, offset=2, probs_out=p_gpu, **fg)
    assert _mismatches(s_cpu, s_gpu) <= MAX_MISMATCHED_ROWS
    assert _support_mismatches(p_cpu, p_gpu) <= MAX_MISMATCHED_ROWS
    same = (p_cpu > 1e-20) == (p_gpu.cpu() > 1e-20)
    rows = same.all(1)
    torch.testing.assert_close(p_gpu.cpu()[rows], p_cpu[rows], rtol=1e-4, atol=1e-7)
    # the filters really cut: a sampled row with top-k = 50 keeps 50 tokens (continuous logits: no ties)
    if form == "scalar" and V > 50:
        kept = (p_gpu.cpu() > 0).sum(1)
        assert bool((kept[temps > 0] <= 50).all())


def test_filter_cutoff_semantics_cuda():
    """Each filter alone on CUDA, checked against its definition on the same logits."""
    B, V = 16, 5000
    g = torch.Generator().manual_seed(0)
    L = (torch.randn(B, V, generator=g) * 3).to(GPU)
    T = torch.full((B,), 0.8, device=GPU)
    p = torch.empty(B, V, device=GPU)
    specdec_ext.sample(L, T, seed=1, top_k=37, probs_out=p)
    assert bool(((p > 0).sum(1) == 37).all())
    kth = L.topk(37, dim=1).values[:, -1:]
    assert torch.equal(p > 0, L >= kth)
    specdec_ext.sample(L, T, seed=1, min_p=0.1, probs_out=p)
    full = torch.softmax(L / 0.8, dim=1)
    keep = full >= 0.1 * full.max(1, keepdim=True).values
    assert int(((p > 0) != keep).sum()) <= 2  # exp rounding exactly at the 0.1 boundary
    specdec_ext.sample(L, T, seed=1, top_p=0.7, probs_out=p)
    srt, idx = full.sort(1, descending=True)
    above = srt.cumsum(1) - srt  # mass strictly above each token (continuous logits: no ties)
    keep = torch.zeros_like(keep).scatter_(1, idx, above < 0.7)
    assert int(((p > 0) != keep).any(1).sum()) <= 2  # float cumsum vs 2^-40 fixed point at the boundary
    torch.testing.assert_close(p.sum(1), torch.ones(B, device=GPU))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filtered", [False, True])
def test_ragged_num_drafts_cuda(dtype, filtered):
    """Per-row num_drafts on CUDA: agrees with the CPU; positions after n_b are never
    read (NaN there changes nothing) and their tokens are -1."""
    B, K, V = 64, 4, 32000
    L, D, Q = _inputs(B, K, V, dtype, seed=7)
    n = torch.randint(0, K + 1, (B,), generator=torch.Generator().manual_seed(3))
    n[:5] = torch.tensor([0, K, 1, 0, K])
    for b in range(B):  # garbage after n_b: never read
        L[b, int(n[b]) + 1:, :7] = float("nan")
    temps = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(5))
    temps[3::6] = 0.0
    f = dict(top_k=100, top_p=0.95) if filtered else {}
    Lg, Dg, Qg, Tg, ng = _to(GPU, L, D, Q, temps, n)
    for q_cpu, q_gpu in ((Q, Qg), (None, None)):
        cpu = specdec_ext.verify(L, D, q_cpu, temps, num_drafts=n, seed=5, offset=1, **f)
        gpu = specdec_ext.verify(Lg, Dg, q_gpu, Tg, num_drafts=ng, seed=5, offset=1, **f)
        assert bool(gpu.valid.all()) and bool(cpu.valid.all())
        assert _mismatches(cpu.tokens, gpu.tokens) <= MAX_MISMATCHED_ROWS
        acc = gpu.num_accepted.cpu()
        assert bool((acc <= n).all())
        pos = torch.arange(K + 1).expand(B, -1)
        assert bool((gpu.tokens.cpu()[pos > acc.unsqueeze(1)] == -1).all())
        assert bool((gpu.tokens.cpu()[pos <= acc.unsqueeze(1)] >= 0).all())
    # n_b = 0 is plain sampling from position 0: the bonus race of verify on p_0
    zero = torch.zeros(B, dtype=torch.int64, device=GPU)
    res = specdec_ext.verify(Lg, Dg, Qg, Tg, num_drafts=zero, seed=5, **f)
    assert bool((res.num_accepted == 0).all()) and bool((res.tokens[:, 1:] == -1).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,K,V", [(24, 3, 1000), (6, 4, 128256), (9, 2, 301)])
def test_coupled_contract_cuda(B, K, V, dtype):
    """Coupled verify on CUDA: the token at verified position i of row b is exactly
    sample(target_logits[:, i], ..., seed=seed, offset=offset + i)[b] on CUDA (filters,
    ragged num_drafts, greedy rows); drafts equal to those samples are all accepted;
    agreement with the CPU's coupled verify."""
    L, D, _ = _inputs(B, K, V, dtype, seed=B + V)
    temps = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(6))
    temps[2::5] = 0.0
    n = torch.randint(0, K + 1, (B,), generator=torch.Generator().manual_seed(8))
    f = dict(top_k=torch.randint(0, 60, (B,)), top_p=0.9, min_p=0.01)
    Lg, Dg, Tg, ng = _to(GPU, L, D, temps, n)
    fg = _filters_on(f, GPU)
    seed, offset = 1234, 17
    y = torch.stack([specdec_ext.sample(Lg[:, i], Tg, seed=seed, offset=offset + i, **fg) for i in range(K + 1)], 1)
    # half the rows draft exactly the target's samples: all n_b drafts accepted, bonus = y[b, n_b]
    Dm = Dg.clone()
    Dm[::2] = y[::2, :K]
    for drafts in (Dg, Dm):
        res = specdec_ext.verify(Lg, drafts, None, Tg, num_drafts=ng, seed=seed, offset=offset, mode="coupled", **fg)
        assert bool(res.valid.all())
        for b in range(B):
            j, nb = int(res.num_accepted[b]), int(n[b])
            assert j <= nb
            assert torch.equal(res.tokens[b, :j + 1], y[b, :j + 1]), b
            assert bool((res.tokens[b, j + 1:] == -1).all())
            assert j == nb or int(drafts[b, j]) != int(y[b, j])
        assert bool((res.num_accepted[::2] == ng[::2]).all()) or drafts is Dg
        cpu = specdec_ext.verify(L, drafts.cpu(), None, temps, num_drafts=n, seed=seed, offset=offset,
                                 mode="coupled", **f)
        assert torch.equal(cpu.valid, res.valid.cpu())
        assert _mismatches(cpu.tokens, res.tokens) <= MAX_MISMATCHED_ROWS
    # draft_probs is not read in coupled mode (and its dtype does not matter)
    Q = torch.full((B, K, V), float("nan"), dtype=torch.float16, device=GPU)
    with_q = specdec_ext.verify(Lg, Dm, Q, Tg, num_drafts=ng, seed=seed, offset=offset, mode="coupled", **fg)
    without = specdec_ext.verify(Lg, Dm, None, Tg, num_drafts=ng, seed=seed, offset=offset, mode="coupled", **fg)
    assert torch.equal(with_q.tokens, without.tokens) and bool(with_q.valid.all())


def test_coupled_per_row_seed_and_offset_cuda():
    """Per-row seed / offset tensors: row b's coupled tokens are sample's with seed[b], offset[b] + i."""
    B, K, V = 8, 3, 4096
    L, D, _ = _to(GPU, *_inputs(B, K, V, torch.float32, seed=9))
    seed = torch.arange(B, device=GPU) * 7 + 3
    offset = torch.arange(B, device=GPU) * 100
    res = specdec_ext.verify(L, D, None, 0.9, seed=seed, offset=offset, mode="coupled", top_p=0.8)
    for i in range(K + 1):
        y = specdec_ext.sample(L[:, i], 0.9, seed=seed, offset=offset + i, top_p=0.8)
        hit = res.num_accepted >= i
        assert torch.equal(res.tokens[hit, i], y[hit])


def test_invalid_rows_device_values_cuda():
    """Bad filter values / num_drafts in DEVICE tensors make only their rows invalid (no
    host check, no sync): verify (exact and coupled) and sample (token -1, probs_out 0)."""
    B, K, V = 8, 3, 500
    L, D, Q = _to(GPU, *_inputs(B, K, V, torch.float32, seed=4))
    top_k = torch.tensor([5, -1, 0, 0, 0, 0, 0, 3], device=GPU)
    top_p = torch.tensor([1.0, 1.0, 0.0, 1.5, 1.0, 1.0, 0.9, float("nan")], device=GPU)
    min_p = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, -0.5, 0.0, 0.0], device=GPU)
    bad = [False, True, True, True, True, True, False, True]
    for mode in ("exact", "coupled"):
        res = specdec_ext.verify(L, D, Q, 0.8, seed=2, top_k=top_k, top_p=top_p, min_p=min_p, mode=mode)
        assert res.valid.tolist() == [not x for x in bad]
        assert bool((res.tokens[torch.tensor(bad, device=GPU)] == -1).all())
        assert bool((res.num_accepted[torch.tensor(bad, device=GPU)] == 0).all())
    probs = torch.full((B, V), -1.0, device=GPU)
    s = specdec_ext.sample(L[:, 0], 0.8, seed=2, top_k=top_k, top_p=top_p, min_p=min_p, probs_out=probs)
    assert ((s == -1).tolist()) == bad
    assert bool((probs[torch.tensor(bad, device=GPU)] == 0).all())
    assert bool((probs[~torch.tensor(bad, device=GPU)].sum(1) - 1).abs().max() < 1e-4)
    n = torch.tensor([0, -1, K + 1, K, 2, 1 << 40, 1, -(1 << 40)], device=GPU)
    n_bad = [False, True, True, False, False, True, False, True]
    for mode in ("exact", "coupled"):
        for q in (Q, None):
            res = specdec_ext.verify(L, D, q, 0.8, seed=2, num_drafts=n, mode=mode)
            assert res.valid.tolist() == [not x for x in n_bad], mode
            assert bool((res.tokens[torch.tensor(n_bad, device=GPU)] == -1).all())


@pytest.mark.parametrize("path", ["cooperative", "stages"])
def test_filtered_and_coupled_launch_paths_identical_cuda(path, monkeypatch):
    """Cooperative and per-stage launches of the filtered / coupled calls give identical results."""
    B, K, V = 9, 3, 128256
    L, D, Q = _to(GPU, *_inputs(B, K, V, torch.bfloat16, seed=12))
    n = torch.tensor([3, 0, 1, 2, 3, 3, 0, 2, 1], device=GPU)
    T = torch.full((B,), 0.9, device=GPU)
    T[4] = 0.0

    def run():
        out = []
        for mode in ("exact", "coupled"):
            r = specdec_ext.verify(L, D, Q, T, seed=3, num_drafts=n, top_k=500, top_p=0.9, mode=mode)
            out += [r.tokens, r.num_accepted, r.valid]
        p = torch.empty(B, V, device=GPU)
        out += [specdec_ext.sample(L[:, 1], T, seed=4, min_p=0.05, top_k=1000, probs_out=p), p]
        torch.cuda.synchronize()
        return out

    monkeypatch.delenv("SPECDEC_CUDA_LAUNCH", raising=False)
    default = run()
    monkeypatch.setenv("SPECDEC_CUDA_LAUNCH", path)
    forced = run()
    for a, b in zip(default, forced):
        assert torch.equal(a, b)


def test_filters_num_drafts_coupled_no_host_sync_cuda():
    B, K, V = 4, 3, 2000
    L, D, Q = _to(GPU, *_inputs(B, K, V, torch.bfloat16, seed=13))
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
