"""The CUDA sampling kernels (verify, sample; filters, ragged K, coupled mode, invalid rows,
launch and load paths) through the ``gpu`` fixture: in the SIMT emulation on every machine
(each call under three random schedules, results bit-identical across them), and on a GPU
where there is one. Shapes are chosen to reach every path of the kernels: a greedy row
followed by a sampled row in one block, several chunks per row, V not a multiple of the
128-token tile and V below one tile, more rows than blocks (the emulated device has 4
resident blocks), unaligned rows (scalar loads), fp32 / fp16 / bf16. The emulated sizes
are smaller (``gpu.size``): every CUDA thread is a fiber there."""
import numpy as np
import pytest
import torch

import specdec_ext
from helpers import draft_inputs
from stats_reference import (ALPHA, chi_square_pvalue, filtered_softmax64, joint_counts, softmax64,
                             verify_joint)

#: the fewest rows a CPU / CUDA agreement check compares: with fewer, the mismatch allowance
#: below would be a large share of the batch (a fake kernel emitting token + 1 passed the old
#: checks of 1 to 3 rows with 2 allowed)
MIN_ROWS = 16


def max_mismatched_rows(rows: int) -> int:
    """Rows of ``rows`` compared that may differ between the CPU and CUDA kernels: one in 32,
    at least one.

    Both draw the same Philox numbers, but float sums are taken in different orders (and
    exp / log round differently), so a decision that is a near-tie (a ratio test u * q * s
    within rounding of e, two race keys within rounding of each other: order 1e-6 per
    decision) can flip. Only near-ties: a real divergence shows up in a large share of the
    rows (a fake kernel emitting token + 1, zeros in probs_out or reordered tree paths
    fails). The allowance is for near-ties on a GPU or a platform whose exp / log round
    differently; these fixed seeds pass within it in the SIMT emulation.
    """
    return max(1, rows // 32)


def assert_rows_agree(cpu, dev, what="tokens", varied=True):
    """The CPU and device results (dim 0 = rows) differ in at most max_mismatched_rows rows,
    over at least MIN_ROWS rows; ``varied``: the CPU result is not one value everywhere
    (something was compared: not all -1; tokens, paths. num_accepted may be 0 everywhere
    where drafts are rarely accepted: varied=False)."""
    cpu, dev = cpu.cpu(), dev.cpu()
    rows = cpu.shape[0]
    assert cpu.shape == dev.shape, (what, cpu.shape, dev.shape)
    assert rows >= MIN_ROWS, f"{what}: {rows} rows compared, fewer than MIN_ROWS = {MIN_ROWS}"
    assert not varied or cpu.unique().numel() > 1, f"{what}: the CPU result is {cpu.flatten()[0].item()} everywhere"
    n = _mismatches(cpu, dev)
    assert n <= max_mismatched_rows(rows), f"{what}: {n} of {rows} rows differ"


DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _temps(B, seed, greedy_every=5):
    """Temperatures in [0.3, 1.8) with greedy rows (0) at 1, 1 + greedy_every, ...: row 0 (the
    only one at B = 1) is sampled, and a greedy row is followed by sampled rows in the same
    block (stage 3: 8 rows per block; stage 2: rows 1 and 5 share a block of the 4)."""
    t = 0.3 + 1.5 * torch.rand(B, generator=torch.Generator().manual_seed(seed))
    t[1::greedy_every] = 0.0
    return t


def _mismatches(a, b):
    """Number of rows (dim 0) where a and b differ anywhere."""
    a, b = a.cpu(), b.cpu()
    return int((a != b).reshape(a.shape[0], -1).any(1).sum().item())


def _misaligned_copy(t):
    """The same values in a view whose data pointer is NOT 16-byte aligned."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    assert view.data_ptr() % 16 != 0
    return view


# ---- agreement with the CPU kernels ---------------------------------------------------

# (B, K, V) on a GPU / emulated, and the emulated device (None: the default 4 resident
# blocks): long rows in several chunks each (the emulated 64 blocks over 16 rows: 4 chunks
# of 1280 tokens per row; on a GPU, its own grid over 16 rows of 128256), many rows,
# ragged vocabularies (V % 128 != 0, V < 128), K = 0. At least MIN_ROWS rows everywhere.
SHAPES = [((16, 5, 128256), (16, 5, 5000), dict(sms=16, blocks_per_sm=4)), ((64, 3, 32000), (16, 3, 5000), None),
          ((500, 4, 1000), (40, 4, 1000), None), ((64, 0, 151936), (16, 0, 9000), None),
          ((33, 2, 301), (33, 2, 301), None), ((16, 3, 100), (16, 3, 100), None)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_cpu_and_cuda_kernels_agree(gpu, shape, dtype):
    """Same Philox numbers on both: tokens and num_accepted agree except where float
    rounding flips a near-tie (max_mismatched_rows); the same validity everywhere."""
    B, K, V = gpu.size(*shape[:2])
    L, D, Q = draft_inputs(B, K, V, dtype, seed=B + K)
    temps = _temps(B, seed=1)
    with gpu.emulated_device(**(shape[2] or {})):
        cpu = specdec_ext.verify(L, D, Q, temps, seed=77, offset=5)
        dev = gpu.verify(*gpu.to(L, D, Q, temps), seed=77, offset=5)
        s_cpu = specdec_ext.sample(L[:, 0], temps, seed=3)
        s_dev = gpu.sample(*gpu.to(L[:, 0], temps), seed=3)
    assert bool(cpu.valid.all()) and torch.equal(cpu.valid, dev.valid.cpu())
    assert_rows_agree(cpu.tokens, dev.tokens)
    if K > 0:
        assert_rows_agree(cpu.num_accepted, dev.num_accepted, "num_accepted", varied=False)
    assert_rows_agree(s_cpu, s_dev, "sample")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_rows_agree_at_a_large_vocabulary(gpu, dtype):
    """SAMPLED rows only (no greedy row) at a large V, verify with dense q and with one-hot
    drafts, and sample with probs_out: at most max_mismatched_rows rows differ; probs_out
    matches the CPU's to float rounding; the tokens are draws, not argmaxes."""
    B, K, V = gpu.size((256, 2, 128256), (16, 2, 20000))
    L, D, Q = draft_inputs(B, K, V, dtype, seed=11)
    temps = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(2))
    Ld, Dd, Qd, Td = gpu.to(L, D, Q, temps)
    for q_cpu, q_dev in ((Q, Qd), (None, None)):
        cpu = specdec_ext.verify(L, D, q_cpu, temps, seed=123, offset=9)
        dev = gpu.verify(Ld, Dd, q_dev, Td, seed=123, offset=9)
        assert bool(cpu.valid.all()) and torch.equal(cpu.valid, dev.valid.cpu())
        assert_rows_agree(cpu.tokens, dev.tokens)
        assert_rows_agree(cpu.num_accepted, dev.num_accepted, "num_accepted", varied=False)
        j = cpu.num_accepted
        last = cpu.tokens.gather(1, j.unsqueeze(1)).squeeze(1)
        assert (last != L[torch.arange(B), j].float().argmax(-1)).any()
    p_cpu = torch.empty(B, V)
    p_dev = torch.empty(B, V, device=gpu.device)
    s_cpu = specdec_ext.sample(L[:, 0], temps, seed=5, probs_out=p_cpu)
    s_dev = gpu.sample(Ld[:, 0], Td, seed=5, probs_out=p_dev)
    assert_rows_agree(s_cpu, s_dev, "sample")
    torch.testing.assert_close(p_dev.cpu(), p_cpu, rtol=1e-4, atol=1e-7)


def test_greedy_rows_are_exact(gpu):
    """T = 0 rows: accept iff the draft is the argmax (first index of the max), correction /
    bonus = argmax; ties broken towards the first index."""
    B, K, V = 40, 3, 700
    g = torch.Generator().manual_seed(0)
    L = torch.randint(-3, 4, (B, K + 1, V), generator=g).float()  # many exact ties
    amax = L.argmax(-1)
    D = amax[:, :K].clone()
    flip = torch.rand(B, K, generator=g) < 0.3
    D[flip] = (D[flip] + 1) % V
    res = gpu.verify(*gpu.to(L, D), None, 0.0, seed=1)
    for b in range(B):
        n = 0
        while n < K and D[b, n] == amax[b, n]:
            n += 1
        assert int(res.num_accepted[b]) == n
        assert res.tokens[b, :n + 1].tolist() == D[b, :n].tolist() + [int(amax[b, n])]
        assert bool((res.tokens[b, n + 1:] == -1).all())


# ---- the documented softmax formula for logits more than FLT_MAX apart ------------------

def _huge_rows():
    """Rows whose logits lie more than FLT_MAX apart, at T = 3e38, and their law: exp((x -
    max) / T) is exp(-inf) = 0 where x - max overflows (only one side of the gap huge, or
    both; V > 1024: the huge logits in different stat blocks)."""
    inf = float("inf")
    rows = torch.full((4, 2000), -inf)
    rows[0, [0, 4, 5]] = torch.tensor([3e38, 0.0, -3e38])   # both ends >= 2^127
    rows[1, [0, 4, 5]] = torch.tensor([1e38, 0.0, -3e38])   # only the low end
    rows[2, [0, 4, 5]] = torch.tensor([3e38, 0.0, -1e38])   # only the max
    rows[3, [1500, 7, 1100]] = torch.tensor([3e38, 0.0, -3e38])  # across stat blocks
    e = lambda d: float(np.exp(d))  # noqa: E731
    law = torch.zeros(4, 2000, dtype=torch.float64)
    for r, (hi, mid, lo) in enumerate([(0, 4, 5), (0, 4, 5), (0, 4, 5), (1500, 7, 1100)]):
        top = rows[r, hi].double().item()
        w = {hi: 1.0, mid: e((0.0 - top) / 3e38)}
        if rows[r, lo].double().item() - top >= -3.4028234663852886e38:  # x - max does not overflow
            w[lo] = e((rows[r, lo].double().item() - top) / 3e38)
        for k, v in w.items():
            law[r, k] = v / sum(w.values())
    return rows, law


def test_softmax_sum_is_the_documented_formula_for_huge_logit_gaps(gpu):
    """exp((x - max) / T) with x - max overflowing float is exp(-inf) = 0 (core/verify_math.h).
    At T = 3e38 the kernels' per-lane sums, rescaled when merged, used to count such a
    logit: probs summed to 0.91 and verify flipped acceptance on some rows."""
    inf = float("inf")
    rows, law = _huge_rows()
    p = torch.full(rows.shape, -1.0, device=gpu.device)
    gpu.sample(gpu.to(rows), 3e38, seed=1, probs_out=p)
    torch.testing.assert_close(p.cpu().double(), law, rtol=1e-6, atol=1e-12)
    gpu.sample(gpu.to(rows), 3e38, seed=1, probs_out=p, top_k=2)  # filtered: the low end is cut anyway
    top2 = law.clone()
    top2[:, :] = 0
    for r in range(4):
        keep = rows[r].topk(2).indices
        top2[r, keep] = law[r, keep] / law[r, keep].sum()
    torch.testing.assert_close(p.cpu().double(), top2, rtol=1e-6, atol=1e-12)
    row = torch.tensor([[3e38, -inf, -inf, -inf, 0.0, -3e38, -inf, -inf]])
    B = 256
    L = row.expand(B, 2, 8).contiguous()
    D = torch.full((B, 1), 4)
    dev = gpu.verify(*gpu.to(L, D), None, 3e38, seed=5)
    ref = torch.ops.specdec.verify_reference(L, D, None, torch.tensor(3e38), torch.tensor(5), torch.tensor(0))
    assert torch.equal(dev.tokens.cpu(), ref[0]) and torch.equal(dev.num_accepted.cpu(), ref[1])


# ---- invalid rows ------------------------------------------------------------------------

def test_invalid_rows(gpu):
    L, D, Q = draft_inputs(5, 2, 300, torch.float32, seed=0)
    L[1, 2, 7] = float("nan")
    D[2, 0] = 300
    L[3, 0] = float("-inf")
    Q[4, 0, D[4, 0]] = float("nan")  # a bad draft probability at a tested draft
    res = gpu.verify(*gpu.to(L, D, Q), 1.0, seed=1)
    assert res.valid.tolist() == [True, False, False, False, False]
    assert bool((res.tokens[1:] == -1).all()) and bool((res.num_accepted[1:] == 0).all())
    p = torch.full((4, 300), -1.0, device=gpu.device)
    L0 = L[:4, 0].clone()
    L0[2, 5] = float("inf")
    s = gpu.sample(gpu.to(L0), 1.0, seed=2, probs_out=p)
    assert s.tolist()[2:] == [-1, -1] and bool((s[:2] >= 0).all())
    assert bool((p[2:] == 0).all()) and bool(((p[:2].sum(1) - 1).abs() < 1e-5).all())


def test_invalid_rows_from_device_values(gpu):
    """Bad filter values / num_drafts in per-row DEVICE tensors make only their rows invalid
    (no host check, no sync): verify (exact and coupled) and sample (token -1, probs_out 0)."""
    B, K, V = 8, 3, 500
    L, D, Q = gpu.to(*draft_inputs(B, K, V, torch.float32, seed=4))
    top_k = gpu.to(torch.tensor([5, -1, 0, 0, 0, 0, 0, 3]))
    top_p = gpu.to(torch.tensor([1.0, 1.0, 0.0, 1.5, 1.0, 1.0, 0.9, float("nan")]))
    min_p = gpu.to(torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, -0.5, 0.0, 0.0]))
    bad = torch.tensor([False, True, True, True, True, True, False, True])
    for mode in ("exact", "coupled"):
        res = gpu.verify(L, D, Q, 0.8, seed=2, top_k=top_k, top_p=top_p, min_p=min_p, mode=mode)
        assert res.valid.cpu().tolist() == (~bad).tolist()
        assert bool((res.tokens.cpu()[bad] == -1).all()) and bool((res.num_accepted.cpu()[bad] == 0).all())
    probs = torch.full((B, V), -1.0, device=gpu.device)
    s = gpu.sample(L[:, 0], 0.8, seed=2, top_k=top_k, top_p=top_p, min_p=min_p, probs_out=probs)
    assert (s.cpu() == -1).tolist() == bad.tolist()
    assert bool((probs.cpu()[bad] == 0).all())
    assert bool((probs.cpu()[~bad].sum(1) - 1).abs().max() < 1e-4)
    temps = gpu.to(torch.tensor([0.8, -1.0, float("nan"), 0.0, float("inf"), 1.0, 1e-45, 0.5]))
    t_bad = [False, True, True, False, True, False, True, False]
    assert gpu.verify(L, D, Q, temps, seed=2).valid.cpu().tolist() == [not x for x in t_bad]
    n = gpu.to(torch.tensor([0, -1, K + 1, K, 2, 1 << 40, 1, -(1 << 40)]))
    n_bad = [False, True, True, False, False, True, False, True]
    for mode in ("exact", "coupled"):
        for q in (Q, None):
            res = gpu.verify(L, D, q, 0.8, seed=2, num_drafts=n, mode=mode)
            assert res.valid.cpu().tolist() == [not x for x in n_bad], mode
            assert bool((res.tokens.cpu()[torch.tensor(n_bad)] == -1).all())


# ---- filters ----------------------------------------------------------------------------

def _filters(form, B, seed):
    """Filter kwargs: "scalar" = one value for every row (all three filters); "rows" = [B]
    tensors mixing off values (top_k 0, top_p 1, min_p 0) with live ones."""
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


def _on(gpu, f):
    return {k: (gpu.to(v) if isinstance(v, torch.Tensor) else v) for k, v in f.items()}


@pytest.mark.parametrize("form", ["scalar", "rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [((48, 3, 1000), (24, 3, 1000)), ((16, 2, 128256), (16, 2, 4000)),
                                   ((33, 2, 301), (33, 2, 301))], ids=lambda s: "x".join(map(str, s[0])))
def test_filtered_calls_agree_with_the_cpu(gpu, shape, dtype, form):
    """Filtered verify (dense q, one-hot drafts) and sample (+ probs_out): the cutoff kernel
    finds the CPU's cutoff (same probs_out support), and rows agree up to max_mismatched_rows:
    tokens, num_accepted, the probs_out support, and probs_out itself on the rows of equal
    support (all but max_mismatched_rows of them)."""
    B, K, V = gpu.size(*shape)
    L, D, Q = draft_inputs(B, K, V, dtype, seed=3 * B + K)
    temps = _temps(B, seed=4, greedy_every=7)  # greedy rows: filters do not apply
    f = _filters(form, B, seed=V)
    fd = _on(gpu, f)
    Ld, Dd, Qd, Td = gpu.to(L, D, Q, temps)
    for q_cpu, q_dev in ((Q, Qd), (None, None)):
        cpu = specdec_ext.verify(L, D, q_cpu, temps, seed=21, offset=4, **f)
        dev = gpu.verify(Ld, Dd, q_dev, Td, seed=21, offset=4, **fd)
        assert bool(cpu.valid.all()) and torch.equal(cpu.valid, dev.valid.cpu())
        assert_rows_agree(cpu.tokens, dev.tokens)
        assert_rows_agree(cpu.num_accepted, dev.num_accepted, "num_accepted", varied=False)
    p_cpu = torch.empty(B, V)
    p_dev = torch.empty(B, V, device=gpu.device)
    s_cpu = specdec_ext.sample(L[:, 0], temps, seed=8, offset=2, probs_out=p_cpu, **f)
    s_dev = gpu.sample(Ld[:, 0], Td, seed=8, offset=2, probs_out=p_dev, **fd)
    assert_rows_agree(s_cpu, s_dev, "sample")
    assert_rows_agree(p_cpu > 1e-20, p_dev > 1e-20, "probs_out support")
    rows = ((p_cpu > 1e-20) == (p_dev.cpu() > 1e-20)).all(1)
    assert int(rows.sum()) >= B - max_mismatched_rows(B)  # probs_out compared on almost every row
    torch.testing.assert_close(p_dev.cpu()[rows], p_cpu[rows], rtol=1e-4, atol=1e-7)
    if form == "scalar" and V > 50:  # the filters really cut (continuous logits: no ties)
        assert bool(((p_dev.cpu() > 0).sum(1)[temps > 0] <= 50).all())


def test_each_filter_against_its_definition(gpu):
    """Each filter alone, checked against its definition on the same logits."""
    B, V = gpu.size((16, 5000), (6, 3000))
    g = torch.Generator().manual_seed(0)
    L = gpu.to(torch.randn(B, V, generator=g) * 3)
    T = gpu.to(torch.full((B,), 0.8))
    p = torch.empty(B, V, device=gpu.device)
    gpu.sample(L, T, seed=1, top_k=37, probs_out=p)
    assert bool(((p > 0).sum(1) == 37).all())
    assert torch.equal(p > 0, L >= L.topk(37, dim=1).values[:, -1:])
    gpu.sample(L, T, seed=1, min_p=0.1, probs_out=p)
    full = torch.softmax(L / 0.8, dim=1)
    keep = full >= 0.1 * full.max(1, keepdim=True).values
    assert int(((p > 0) != keep).sum()) <= 2  # exp rounding exactly at the 0.1 boundary
    gpu.sample(L, T, seed=1, top_p=0.7, probs_out=p)
    srt, idx = full.sort(1, descending=True)
    above = srt.cumsum(1) - srt  # mass strictly above each token (continuous logits: no ties)
    keep = torch.zeros_like(keep).scatter_(1, idx, above < 0.7)
    assert int(((p > 0) != keep).any(1).sum()) <= 2  # float cumsum vs 2^-40 fixed point at the boundary
    torch.testing.assert_close(p.sum(1), torch.ones(B, device=gpu.device))


def test_filter_boundary_ties_are_kept(gpu):
    """top-k keeps every token tied with the k-th largest logit; top-p keeps a token whose
    mass above is < p (here exactly at a tie)."""
    L = gpu.to(torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0] + [-1.0] * 200]))
    p = torch.empty(1, 206, device=gpu.device)
    gpu.sample(L, 1.0, seed=0, top_k=2, probs_out=p)
    assert (p[0] > 0).nonzero().flatten().tolist() == [0, 2, 3, 4]


# ---- per-row draft counts -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("filtered", [False, True])
def test_ragged_num_drafts(gpu, dtype, filtered):
    """Per-row num_drafts: agrees with the CPU; positions after n_b are never read (NaN there
    changes nothing) and their tokens are -1; n_b = 0 is sampling from position 0."""
    B, K, V = gpu.size((64, 4, 32000), (20, 4, 2000))
    L, D, Q = draft_inputs(B, K, V, dtype, seed=7)
    n = torch.randint(0, K + 1, (B,), generator=torch.Generator().manual_seed(3))
    n[:5] = torch.tensor([0, K, 1, 0, K])
    for b in range(B):  # garbage after n_b: never read
        L[b, int(n[b]) + 1:, :7] = float("nan")
    temps = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(5))
    temps[3::6] = 0.0
    f = dict(top_k=100, top_p=0.95) if filtered else {}
    Ld, Dd, Qd, Td, nd = gpu.to(L, D, Q, temps, n)
    for q_cpu, q_dev in ((Q, Qd), (None, None)):
        cpu = specdec_ext.verify(L, D, q_cpu, temps, num_drafts=n, seed=5, offset=1, **f)
        dev = gpu.verify(Ld, Dd, q_dev, Td, num_drafts=nd, seed=5, offset=1, **f)
        assert bool(dev.valid.all()) and bool(cpu.valid.all())
        assert_rows_agree(cpu.tokens, dev.tokens)
        acc = dev.num_accepted.cpu()
        assert bool((acc <= n).all())
        pos = torch.arange(K + 1).expand(B, -1)
        assert bool((dev.tokens.cpu()[pos > acc.unsqueeze(1)] == -1).all())
        assert bool((dev.tokens.cpu()[pos <= acc.unsqueeze(1)] >= 0).all())
    zero = gpu.to(torch.zeros(B, dtype=torch.int64))
    res = gpu.verify(Ld, Dd, Qd, Td, num_drafts=zero, seed=5, **f)
    assert bool((res.num_accepted == 0).all()) and bool((res.tokens[:, 1:] == -1).all())
    cpu0 = specdec_ext.verify(L, D, Q, temps, num_drafts=torch.zeros(B, dtype=torch.int64), seed=5, **f)
    assert_rows_agree(cpu0.tokens[:, 0], res.tokens[:, 0], "num_drafts = 0")


# ---- coupled mode ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [((24, 3, 1000), (16, 3, 1000)), ((16, 4, 128256), (16, 3, 3000)),
                                   ((16, 2, 301), (16, 2, 301))], ids=lambda s: "x".join(map(str, s[0])))
def test_coupled_contract(gpu, shape, dtype):
    """Coupled verify: the token at verified position i of row b is exactly
    sample(target_logits[:, i], ..., seed, offset + i)[b] on the same device (filters,
    ragged num_drafts, greedy rows); drafts equal to those samples are all accepted;
    agreement with the CPU's coupled verify; draft_probs is not read."""
    B, K, V = gpu.size(*shape)
    L, D, _ = draft_inputs(B, K, V, dtype, seed=B + V)
    temps = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(6))
    temps[2::5] = 0.0
    n = torch.randint(0, K + 1, (B,), generator=torch.Generator().manual_seed(8))
    f = dict(top_k=torch.randint(0, 60, (B,), generator=torch.Generator().manual_seed(9)), top_p=0.9, min_p=0.01)
    Ld, Dd, Td, nd = gpu.to(L, D, temps, n)
    fd = _on(gpu, f)
    seed, offset = 1234, 17
    y = torch.stack([gpu.sample(Ld[:, i], Td, seed=seed, offset=offset + i, **fd) for i in range(K + 1)], 1)
    Dm = Dd.clone()
    Dm[::2] = y[::2, :K]  # half the rows draft exactly the target's samples
    for drafts in (Dd, Dm):
        res = gpu.verify(Ld, drafts, None, Td, num_drafts=nd, seed=seed, offset=offset, mode="coupled", **fd)
        assert bool(res.valid.all())
        for b in range(B):
            j, nb = int(res.num_accepted[b]), int(n[b])
            assert j <= nb
            assert torch.equal(res.tokens[b, :j + 1], y[b, :j + 1]), b
            assert bool((res.tokens[b, j + 1:] == -1).all())
            assert j == nb or int(drafts[b, j]) != int(y[b, j])
        if drafts is Dm:
            assert bool((res.num_accepted[::2] == nd[::2]).all())
        cpu = specdec_ext.verify(L, drafts.cpu(), None, temps, num_drafts=n, seed=seed, offset=offset,
                                 mode="coupled", **f)
        assert torch.equal(cpu.valid, res.valid.cpu())
        assert_rows_agree(cpu.tokens, res.tokens, "coupled tokens")
    Q = torch.full((B, K, V), float("nan"), dtype=torch.float16, device=gpu.device)
    with_q = gpu.verify(Ld, Dm, Q, Td, num_drafts=nd, seed=seed, offset=offset, mode="coupled", **fd)
    without = gpu.verify(Ld, Dm, None, Td, num_drafts=nd, seed=seed, offset=offset, mode="coupled", **fd)
    assert torch.equal(with_q.tokens, without.tokens) and bool(with_q.valid.all())


def test_coupled_per_row_seed_and_offset(gpu):
    """Per-row seed / offset tensors: row b's coupled tokens are sample's with seed[b], offset[b] + i."""
    B, K, V = gpu.size((8, 3, 4096), (6, 3, 1500))
    L, D, _ = gpu.to(*draft_inputs(B, K, V, torch.float32, seed=9))
    seed = gpu.to(torch.arange(B) * 7 + 3)
    offset = gpu.to(torch.arange(B) * 100)
    res = gpu.verify(L, D, None, 0.9, seed=seed, offset=offset, mode="coupled", top_p=0.8)
    for i in range(K + 1):
        y = gpu.sample(L[:, i], 0.9, seed=seed, offset=offset + i, top_p=0.8)
        hit = res.num_accepted >= i
        assert torch.equal(res.tokens[hit, i], y[hit])


# ---- batch invariance -------------------------------------------------------------------

def test_rows_do_not_depend_on_the_batch(gpu):
    """With per-row seeds, a row's result is the same alone, in a batch, and in a reversed
    batch (stat blocks and race tiles are fixed in token space; the grid split is not)."""
    B, K, V = 10, 2, 2500
    L, D, Q = draft_inputs(B, K, V, torch.float32, seed=21)
    temps = _temps(B, seed=3, greedy_every=4)
    seeds = torch.arange(B) * 11 + 5
    Ld, Dd, Qd, Td, Sd = gpu.to(L, D, Q, temps, seeds)
    whole = gpu.verify(Ld, Dd, Qd, Td, seed=Sd, top_k=300)
    rev = torch.arange(B - 1, -1, -1, device=gpu.device)
    flipped = gpu.verify(Ld[rev], Dd[rev], Qd[rev], Td[rev], seed=Sd[rev], top_k=300)
    assert torch.equal(flipped.tokens[rev], whole.tokens)
    for b in (0, 1, 7):
        one = gpu.verify(Ld[b:b + 1], Dd[b:b + 1], Qd[b:b + 1], Td[b:b + 1], seed=Sd[b:b + 1], top_k=300)
        assert torch.equal(one.tokens[0], whole.tokens[b])
    s = gpu.sample(Ld[:, 1], Td, seed=Sd, min_p=0.05)
    assert torch.equal(gpu.sample(Ld[rev, 1], Td[rev], seed=Sd[rev], min_p=0.05)[rev], s)


# ---- launch and load paths --------------------------------------------------------------

def _all_outputs(gpu, L, D, Q, T, n):
    out = []
    for mode in ("exact", "coupled"):
        r = gpu.verify(L, D, Q, T, seed=3, num_drafts=n, top_k=500, top_p=0.9, mode=mode)
        out += [r.tokens, r.num_accepted, r.valid]
    r = gpu.verify(L, D, Q, T, seed=99, offset=3)
    out += [r.tokens, r.num_accepted, r.valid]
    p = torch.full((L.shape[0], L.shape[2]), -1.0, device=gpu.device)
    out += [gpu.sample(L[:, 1], T, seed=4, min_p=0.05, top_k=1000, probs_out=p), p]
    gpu.sync()
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [((9, 3, 128256), (3, 3, 10000)), ((64, 3, 32000), (20, 2, 700))],
                         ids=lambda s: "x".join(map(str, s[0])))
def test_cooperative_and_per_stage_launches_are_identical(gpu, shape, dtype):
    """The cooperative launch and the per-stage launches run the same stage code, and
    results do not depend on the grid: bit-identical, filtered and coupled calls included."""
    B, K, V = gpu.size(*shape)
    L, D, Q = draft_inputs(B, K, V, dtype, seed=12)
    n = torch.randint(0, K + 1, (B,), generator=torch.Generator().manual_seed(1))
    args = gpu.to(L, D, Q, _temps(B, seed=2, greedy_every=4), n)
    with gpu.options(launch="cooperative"):
        coop = _all_outputs(gpu, *args)
    with gpu.options(launch="stages"):
        staged = _all_outputs(gpu, *args)
    for a, b in zip(coop, staged):
        assert torch.equal(a, b)
    assert bool((coop[-1] >= 0).all())  # every probs_out element written


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_vector_and_scalar_loads_are_identical(gpu, dtype):
    """16-byte vector loads and scalar loads give each lane the same tokens in the same
    order: bit-identical, forced (SPECDEC_CUDA_LOADS=scalar) or through a misaligned view."""
    B, K, V = gpu.size((16, 3, 128256), (6, 2, 4096))
    L, D, Q = draft_inputs(B, K, V, dtype, seed=5)
    n = torch.randint(0, K + 1, (B,), generator=torch.Generator().manual_seed(2))
    T = _temps(B, seed=6, greedy_every=3)
    Ld, Dd, Qd, Td, nd = gpu.to(L, D, Q, T, n)
    vector = _all_outputs(gpu, Ld, Dd, Qd, Td, nd)
    with gpu.options(loads="scalar"):
        forced = _all_outputs(gpu, Ld, Dd, Qd, Td, nd)
    misaligned = _all_outputs(gpu, _misaligned_copy(Ld), Dd, _misaligned_copy(Qd), Td, nd)
    for a, b, c in zip(vector, forced, misaligned):
        assert torch.equal(a, b) and torch.equal(a, c)


# ---- laws (chi-square) ---------------------------------------------------------------------
# Draws are the rows of one broadcast problem; the emulator runs each law call under ONE
# random schedule (gpu.one_schedule(): the draws are the result; every other test checks
# that results do not depend on the schedule) and with fewer draws (gpu.size);
# test_the_law_tests_have_power shows the emulated draw counts still reject a wrong law.

LAW = pytest.mark.law

def _expand(t, n):
    return t.unsqueeze(0).expand(n, *t.shape)


@LAW
@pytest.mark.parametrize("case", ["dense", "one_hot", "disjoint", "bf16"])
def test_verify_law(gpu, case):
    """Pearson chi-square at ALPHA of (num_accepted, emitted token) against the closed form
    (stats_reference.verify_joint), draws = rows of one broadcast problem."""
    n = gpu.size(100_000, 1000)
    gpu = gpu.one_schedule()
    K, V, T = 2, 13, 1.0
    g = torch.Generator().manual_seed(17)
    logits = torch.randn(K + 1, V, generator=g) * 1.5
    q = torch.softmax(torch.randn(K, V, generator=g), -1)
    if case == "disjoint":
        logits[:, V // 2:] = float("-inf")
        q[:, :V // 2] = 0.0
        q = q / q.sum(-1, keepdim=True)
    if case == "bf16":
        logits = logits.bfloat16()
        q = q.bfloat16()
    draft = torch.multinomial(q.float(), 1, generator=g).view(K)
    Q = None if case == "one_hot" else q
    res = gpu.verify(gpu.to(_expand(logits, n)), gpu.to(_expand(draft, n)),
                     None if Q is None else gpu.to(_expand(Q, n)), T, seed=31, offset=2)
    assert bool(res.valid.all())
    expected = verify_joint(softmax64(logits, T), None if Q is None else Q.double().numpy(), draft.numpy())
    assert chi_square_pvalue(joint_counts(res.tokens.cpu(), res.num_accepted.cpu(), K, V), expected) > ALPHA


@LAW
@pytest.mark.parametrize("filt", [dict(top_k=4), dict(top_p=0.7), dict(min_p=0.15),
                                  dict(top_k=6, top_p=0.8, min_p=0.05)], ids=str)
def test_filtered_sample_and_verify_laws(gpu, filt):
    """Filtered sample and verify follow the filtered law p' (float64 sort-based reference),
    and probs_out is p'."""
    n = gpu.size(60_000, 1000)
    gpu = gpu.one_schedule()
    V, T = 17, 0.9
    g = torch.Generator().manual_seed(23)
    logits = torch.randn(2, V, generator=g) * 1.5
    p_f = filtered_softmax64(logits, T, **filt)
    probs = torch.empty(n, V, device=gpu.device)
    tokens = gpu.sample(gpu.to(_expand(logits[0], n)), T, seed=7, probs_out=probs, **filt).cpu()
    assert chi_square_pvalue(np.bincount(tokens.numpy(), minlength=V), p_f[0]) > ALPHA
    torch.testing.assert_close(probs[0].cpu().double(), torch.from_numpy(p_f[0]), rtol=1e-5, atol=1e-7)
    draft_law = torch.from_numpy(filtered_softmax64(torch.randn(1, V, generator=g) * 1.5, T, **filt)).float()
    draft = torch.multinomial(draft_law, 1, generator=g).view(1)
    res = gpu.verify(gpu.to(_expand(logits, n)), gpu.to(_expand(draft, n)), gpu.to(_expand(draft_law, n)), T,
                     seed=8, **filt)
    expected = verify_joint(p_f, draft_law.double().numpy(), draft.numpy())
    assert chi_square_pvalue(joint_counts(res.tokens.cpu(), res.num_accepted.cpu(), 1, V), expected) > ALPHA


@LAW
def test_coupled_and_ragged_laws(gpu):
    """Coupled mode emits the target's own law at every position; ragged rows (num_drafts
    0 / 1 / 2 mixed in one batch) each follow the joint law of their draft count."""
    n = gpu.size(60_000, 1000)
    gpu = gpu.one_schedule()
    K, V, T = 2, 11, 1.0
    g = torch.Generator().manual_seed(29)
    logits = torch.randn(K + 1, V, generator=g)
    draft = torch.randint(0, V, (K,), generator=g)
    res = gpu.verify(gpu.to(_expand(logits, n)), gpu.to(_expand(draft, n)), None, T, seed=9, mode="coupled")
    first = res.tokens[:, 0].cpu()
    assert chi_square_pvalue(np.bincount(first.numpy(), minlength=V), softmax64(logits[0], T)) > ALPHA
    nd = torch.arange(n) % 3
    res = gpu.verify(gpu.to(_expand(logits, n)), gpu.to(_expand(draft, n)), None, T, seed=4, num_drafts=gpu.to(nd))
    for k in range(3):
        sel = nd == k
        sub = res.tokens.cpu()[sel][:, :k + 1], res.num_accepted.cpu()[sel]
        expected = verify_joint(softmax64(logits[:k + 1], T), None, draft[:k].numpy())
        assert chi_square_pvalue(joint_counts(sub[0], sub[1], k, V), expected) > ALPHA


@LAW
def test_the_law_tests_have_power(gpu):
    """At the draw counts used here, the chi-square rejects a wrong law: the top-p = 0.9
    sample's draws (8.5% of the mass cut) against the UNfiltered law. Smaller errors need
    more draws than the emulated runs take (a 2.4-point shift of one token's probability is
    caught about 6% of the time at 1000 draws): the bit-exact CPU comparisons are the
    emulated suite's sharper check."""
    n = gpu.size(60_000, 1000)
    gpu = gpu.one_schedule()
    V, T = 17, 0.9
    logits = torch.randn(V, generator=torch.Generator().manual_seed(23)) * 1.5
    tokens = gpu.sample(gpu.to(_expand(logits, n)), T, seed=7, top_p=0.9).cpu()
    assert chi_square_pvalue(np.bincount(tokens.numpy(), minlength=V), softmax64(logits, T)) < ALPHA


# ---- the emulated device ------------------------------------------------------------------

DEVICES = [dict(sms=1, blocks_per_sm=1), dict(sms=8, blocks_per_sm=3), dict(cooperative=False),
           dict(cooperative="refuse"), dict(capturing=True), dict(sms=3, blocks_per_sm=1, launch="cooperative")]


@pytest.mark.simt
def test_results_do_not_depend_on_the_device():
    """Results do not depend on the grid, the chunking or the launch path: the emulated
    device with 1 to 24 resident blocks, without cooperative launches, refusing them (the
    launchers fall back to per-stage launches), inside an emulated capture. The launch
    counts show which path each device took."""
    import backends

    gpu = backends.make("simt")
    counts = torch.ops.specdec_simt.launch_counts
    B, K, V = 5, 3, 5000
    L, D, Q = draft_inputs(B, K, V, torch.bfloat16, seed=41)
    n = torch.tensor([3, 0, 2, 1, 3])
    args = (L, D, Q, _temps(B, seed=7, greedy_every=3), n)
    reference = _all_outputs(gpu, *args)
    # path taken: (cooperative launches ran, cooperative launches refused)
    expect = [(True, False), (True, False), (False, False), (False, True), (False, False), (True, False)]
    for device, (coop, refused) in zip(DEVICES, expect):
        before = counts()
        with gpu.options(**device):
            out = _all_outputs(gpu, *args)
        after = counts()
        assert (after[1] > before[1], after[2] > before[2]) == (coop, refused), device
        assert after[0] > before[0]  # the filter passes and the coupled decisions are ordinary launches
        for a, b in zip(reference, out):
            assert torch.equal(a, b), device


@pytest.mark.simt
def test_emulator_errors_reach_python(monkeypatch):
    """A bad emulator setting is an error from the op naming the variable, not a silent default."""
    from specdec_ext.testing import simt

    L = torch.randn(2, 300)
    for name, value in (("SPECDEC_SIMT_SCHEDULE", "sideways"), ("SPECDEC_SIMT_SMS", "0"),
                        ("SPECDEC_SIMT_BLOCKS_PER_SM", "two"), ("SPECDEC_SIMT_COOPERATIVE", "yes"),
                        ("SPECDEC_SIMT_CAPTURING", "maybe")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(RuntimeError, match=name):
                simt.sample(L, 1.0, seed=1)
