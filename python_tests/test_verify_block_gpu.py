"""The CUDA kernel of verify(mode="block") (csrc/cuda/block_kernels.cuh) through the ``gpu``
fixture: in the SIMT emulation on every machine (each call under three random schedules,
bit-identical across them), and on a GPU where there is one. Both kernels draw the same Philox
numbers, so the CUDA rows equal the CPU kernel's but for near-ties (max_mismatched_rows). Shapes
reach every path of the kernel: more rows than resident blocks (grid-stride), V from below one
race tile to several stat blocks (9000: 71 tiles), V not a multiple of the tile, unaligned rows
(scalar loads), fp32 / fp16 / bf16, dense and one-hot drafts, filters (the filter_cutoff_kernel
pass first), per-row temperature with greedy rows, ragged num_drafts, invalid rows from device
values; the law by chi-square against the closed form of test_verify_block."""
import pytest
import torch

import specdec_ext
from helpers import draft_inputs
from stats_reference import filtered_softmax64, softmax64
from test_sampling_gpu import _misaligned_copy, _temps, assert_rows_agree
from test_verify_block import _check_law, _telling_drafts, block_joint

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (B, K, V) on a GPU / emulated: at least MIN_ROWS (test_sampling_gpu) rows everywhere; V below
# one 128-token tile, V % 128 != 0, V over several stat blocks; K = 0 (the bonus race only)
SHAPES = [((64, 5, 128256), (16, 4, 9000)), ((128, 3, 32000), (16, 3, 2000)), ((33, 2, 301), (33, 2, 301)),
          ((16, 4, 100), (16, 4, 100)), ((16, 0, 5000), (16, 0, 700))]


def _block(verify, L, D, Q, T, **kw):
    return verify(L, D, Q, T, mode="block", **kw)


def _agree(cpu, dev):
    assert torch.equal(cpu.valid, dev.valid.cpu())
    assert_rows_agree(cpu.tokens, dev.tokens)
    if cpu.tokens.shape[1] > 1:
        assert_rows_agree(cpu.num_accepted, dev.num_accepted, "num_accepted", varied=False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0])))
def test_cpu_and_cuda_kernels_agree(gpu, shape, dtype):
    """Dense q near p, per-row temperatures with greedy rows: tokens and num_accepted agree but
    for near-ties; the same validity (every row valid)."""
    B, K, V = gpu.size(*shape)
    L, D, Q = draft_inputs(B, K, V, dtype, seed=B + K + V)
    temps = _temps(B, seed=3)
    cpu = _block(specdec_ext.verify, L, D, Q, temps, seed=41, offset=2)
    dev = _block(gpu.verify, *gpu.to(L, D, Q, temps), seed=41, offset=2)
    assert bool(cpu.valid.all())
    _agree(cpu, dev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampled_rows_agree_with_dense_and_one_hot_drafts(gpu, dtype):
    """Sampled rows only, drafts from a q close to p at T = 1 (so several drafts are accepted and
    the weights are neither 0 nor 1): dense q, and one-hot drafts (draft_probs None); with dense q
    some rows accept every draft and some not all (the weighted walk and its stop are exercised)."""
    B, K, V = gpu.size((128, 4, 32000), (16, 4, 1500))
    g = torch.Generator().manual_seed(5)
    L = (torch.randn(B, K + 1, V, generator=g) * 1.5).to(dtype)
    Q = torch.softmax(L[:, :K].float() + 0.3 * torch.randn(B, K, V, generator=g), -1)
    D = torch.multinomial(Q.view(-1, V), 1, generator=g).view(B, K)
    temps = torch.ones(B)
    for q in (Q.to(dtype), None):
        cpu = _block(specdec_ext.verify, L, D, q, temps, seed=8)
        dev = _block(gpu.verify, *gpu.to(L, D, q, temps), seed=8)
        assert bool(cpu.valid.all())
        _agree(cpu, dev)
        if q is not None:  # one-hot drafts drawn from q are rarely p's: accepted with chance p(x)
            assert int(cpu.num_accepted.max()) > 0 and int(cpu.num_accepted.min()) < K


@pytest.mark.parametrize("filt", [dict(top_k=20), dict(top_p=0.8), dict(min_p=0.05), dict(top_k=50, top_p=0.9)],
                         ids=str)
def test_filtered_calls_agree_with_the_cpu(gpu, filt):
    """Filters: the CUDA cutoffs (filter_cutoff_kernel, one per (row, position)) and the
    filtered laws of the walk and the race agree with the CPU kernel's."""
    B, K, V = gpu.size((64, 3, 20000), (16, 3, 1200))
    L, D, Q = draft_inputs(B, K, V, torch.float32, seed=17)
    temps = _temps(B, seed=4)
    cpu = _block(specdec_ext.verify, L, D, Q, temps, seed=2, **filt)
    dev = _block(gpu.verify, *gpu.to(L, D, Q, temps), seed=2, **filt)
    assert bool(cpu.valid.all())
    _agree(cpu, dev)


def test_ragged_num_drafts_agree_with_the_cpu(gpu):
    """num_drafts in [0, K] per row (device tensor): row b tests n_b drafts, its bonus at n_b,
    -1 after; the CPU kernel's rows but for near-ties."""
    B, K, V = gpu.size((64, 5, 10000), (20, 5, 600))
    L, D, Q = draft_inputs(B, K, V, torch.float16, seed=23)
    temps = _temps(B, seed=6)
    nd = torch.arange(B) % (K + 1)
    cpu = _block(specdec_ext.verify, L, D, Q, temps, seed=5, num_drafts=nd)
    dev = _block(gpu.verify, *gpu.to(L, D, Q, temps), seed=5, num_drafts=gpu.to(nd))
    assert bool(cpu.valid.all())
    _agree(cpu, dev)
    for b in range(B):
        assert bool((dev.tokens[b, int(nd[b]) + 1:].cpu() == -1).all())


def test_greedy_rows_are_exact(gpu):
    """T = 0 everywhere: no random number, no float sum: the tokens are bit-equal to the CPU's
    (and to token-wise verify's), on drafts that often hold the argmax."""
    B, K, V = gpu.size((64, 4, 3000), (16, 4, 300))
    L, D, Q = draft_inputs(B, K, V, torch.bfloat16, seed=29)
    D = L[:, :K].float().argmax(-1)
    D[::3, 1] = (D[::3, 1] + 1) % V
    cpu = _block(specdec_ext.verify, L, D, Q, 0.0, seed=1)
    dev = _block(gpu.verify, *gpu.to(L, D, Q), 0.0, seed=1)
    assert torch.equal(cpu.tokens, dev.tokens.cpu()) and torch.equal(cpu.num_accepted, dev.num_accepted.cpu())
    assert torch.equal(cpu.tokens, specdec_ext.verify(L, D, Q, 0.0, seed=1).tokens)
    assert int(cpu.num_accepted.max()) == K and int(cpu.num_accepted.min()) < K


def test_invalid_rows_from_device_values(gpu):
    """On a device, NaN / +inf logits at a tested position, all -inf at position 0, a bad q
    entry read by the residual mass or the race, a draft id outside [0, V), a bad per-row
    temperature, top_k or num_drafts make THAT row invalid (-1 everywhere, 0 accepted); NaN
    after the row's num_drafts is not read; the other rows are unchanged."""
    B, K, V = 12, 3, 200
    L, D, Q = draft_inputs(B, K, V, torch.float32, seed=31)
    temps = torch.full((B,), 0.9)
    nd = torch.full((B,), K)
    top_k = torch.zeros(B, dtype=torch.int64)
    base = _block(gpu.verify, *gpu.to(L, D, Q, temps), seed=3, num_drafts=gpu.to(nd), top_k=gpu.to(top_k))
    assert bool(base.valid.all())
    L[0, 2, 7] = float("nan")
    L[1, 0, 9] = float("inf")
    L[2, 0] = float("-inf")
    Q[3, 0, 4] = float("nan")  # position 0's q row: read by the race at tau = 0, or the stop's
    Q[3, 1:, 4] = float("nan")  # ... and by the residual masses / races of later positions
    D[4, 1] = V
    temps[5] = -1.0
    top_k[6] = -2
    nd[7] = K + 1
    nd[8] = 1
    L[8, 3, 5] = float("nan")  # after num_drafts[8] + 1 positions: never read
    out = _block(gpu.verify, *gpu.to(L, D, Q, temps), seed=3, num_drafts=gpu.to(nd), top_k=gpu.to(top_k))
    valid = out.valid.cpu().tolist()
    assert valid[:8] == [False] * 8 and all(valid[8:]), valid
    assert bool((out.tokens[:8].cpu() == -1).all()) and bool((out.num_accepted[:8].cpu() == 0).all())
    assert torch.equal(out.tokens[9:].cpu(), base.tokens[9:].cpu())


def test_vector_and_scalar_loads_are_identical(gpu):
    """The same rows through 16-byte vector loads and scalar loads (unaligned copy, and
    SPECDEC_CUDA_LOADS=scalar) give bit-identical results."""
    B, K, V = gpu.size((32, 3, 4096), (16, 3, 512))
    L, D, Q = draft_inputs(B, K, V, torch.float32, seed=37)
    temps = _temps(B, seed=7)
    args = dict(seed=2, offset=1)
    vec = _block(gpu.verify, *gpu.to(L, D, Q, temps), **args)
    mis = _block(gpu.verify, _misaligned_copy(gpu.to(L)), gpu.to(D), _misaligned_copy(gpu.to(Q)), gpu.to(temps),
                 **args)
    with gpu.options(loads="scalar"):
        sca = _block(gpu.verify, *gpu.to(L, D, Q, temps), **args)
    for r in (mis, sca):
        assert torch.equal(vec.tokens.cpu(), r.tokens.cpu()) and torch.equal(vec.num_accepted.cpu(),
                                                                             r.num_accepted.cpu())


@pytest.mark.simt
@pytest.mark.parametrize("device", [dict(sms=1, blocks_per_sm=1), dict(sms=8, blocks_per_sm=3)], ids=str)
def test_results_do_not_depend_on_the_emulated_device(device):
    """One block running every row, or more blocks than rows: the same bits."""
    from backends import SimtBackend

    gpu = SimtBackend(("1",))
    L, D, Q = draft_inputs(11, 3, 300, torch.bfloat16, seed=8)
    ref = _block(gpu.verify, L, D, Q, 0.8, seed=4)
    with gpu.options(**device):
        out = _block(gpu.verify, L, D, Q, 0.8, seed=4)
    assert torch.equal(ref.tokens, out.tokens) and torch.equal(ref.num_accepted, out.num_accepted)


@pytest.mark.law
@pytest.mark.parametrize("case", ["dense_v6", "filtered_v300"])
def test_verify_block_law(gpu, case):
    """(tau, emitted token) of one row repeated, on the CUDA kernel: the closed form
    (test_verify_block.block_joint, float64) at ALPHA, and the power check on the same samples
    (the law with token-wise verification's UNWEIGHTED residual at the stop is rejected).
    dense_v6: K = 3 fixed drafts that tell the two laws apart, T = 1. filtered_v300: top-k 40 +
    top-p 0.9 at V = 300, the mass on four tokens in three race tiles, T = 0.9."""
    K = 3
    rows = gpu.size(60000, 3000)
    if case == "dense_v6":
        V, T, filt = 6, 1.0, {}
        # seed and q's noise chosen for a large noncentrality of the planted law (0.53 per row):
        # the emulation's 3000 rows reject it
        g = torch.Generator().manual_seed(5)
        logits = torch.randn(K + 1, V, generator=g) * 1.5
        q = torch.softmax(logits[:K] + 1.5 * torch.randn(K, V, generator=g), -1)
        p, qd = softmax64(logits, T), q.double().numpy()
        candidates = range(V)
    else:
        V, T, filt = 300, 0.9, dict(top_k=40, top_p=0.9)
        g = torch.Generator().manual_seed(12)
        logits = torch.randn(K + 1, V, generator=g)
        candidates = [5, 140, 270, 290]
        logits[:, candidates] += torch.rand(K + 1, 4, generator=g) * 2 + 3
        p = torch.stack([torch.from_numpy(filtered_softmax64(logits[i], T, **filt)) for i in range(K + 1)]).numpy()
        qd = torch.softmax(logits[:K] / T + 0.8 * torch.randn(K, V, generator=g), -1).double().numpy() * (p[:K] > 0)
        qd /= qd.sum(1, keepdims=True)
        q = torch.from_numpy(qd).float()
    draft = _telling_drafts(p, qd, candidates, K)
    verify = gpu.one_schedule().verify
    out = verify(*gpu.to(logits.expand(rows, K + 1, V), draft.expand(rows, K), q.expand(rows, K, V)), T, seed=19,
                 mode="block", **filt)
    assert bool(out.valid.all())
    _check_law(out, block_joint(p, qd, draft.numpy()), K, V, power_law=block_joint(p, qd, draft.numpy(), weighted=False))
