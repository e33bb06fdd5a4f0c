"""Vocabulary-parallel verify / sample on the CUDA kernels (the ``gpu`` fixture: emulated on
every machine, and on a GPU where there is one). verify_shard's steps run for every rank in one
process (shard_cases.simulate: the gather is a list, as test_distributed.py does for the CPU
kernels), and the tokens are compared with verify / sample of the SAME backend on the gathered
logits: identical when every shard bound is a multiple of 128 (the CUDA kernels' canonical
tile pairs, cuda/tile_stats.cuh), exact in law otherwise (chi-square below)."""
import pytest
import torch

import specdec_ext
from shard_cases import random_case, simulate
from stats_reference import ALPHA, chi_square_pvalue

TILE = 128


def _bounds(V, P, g, aligned=True):
    """P uneven contiguous shards of [0, V); interior bounds multiples of 128 when aligned."""
    unit = TILE if aligned else 1
    cuts = sorted(set(int(x) * unit for x in torch.randint(1, (V - 1) // unit + 1, (P - 1,), generator=g)))
    return [0] + [c for c in cuts if 0 < c < V] + [V]


def _same(ref, got):
    return all(torch.equal(getattr(ref, n).cpu(), getattr(got, n).cpu()) for n in ("tokens", "num_accepted", "valid"))


def test_shard_verify_tokens_identical_gpu(gpu):
    """Random calls mixing every kind of row (sampled / greedy, ragged num_drafts, dense and
    one-hot drafts, coupled mode, filters, fp32 / bf16 / fp16) on tile-aligned uneven shards:
    every rank's tokens are the backend's single-device verify, bit for bit."""
    g = torch.Generator().manual_seed(21)
    V = gpu.size(128256, 128 * 11 + 40)  # several stat blocks and a partial one
    for c in range(gpu.size(24, 8)):
        dtype = (torch.float32, torch.bfloat16, torch.float16)[c % 3]
        x = random_case(g, V, dtype)
        coupled = c % 4 == 3
        q = x["q"] if c % 2 == 0 and not coupled else None
        filters = ({}, dict(top_k=30, top_p=0.9), dict(min_p=0.05, top_p=0.8), dict(top_k=7))[c % 4 if c % 3 else 0]
        P = 2 + c % 3
        bounds = _bounds(V, P, g)
        args = [gpu.to(t) for t in (x["logits"], x["ids"], q, x["T"], x["num_drafts"], x["seed"])]
        logits, ids, qd, T, n, seed = args
        ref = gpu.verify(logits, ids, qd, T, seed=seed, offset=x["offset"], num_drafts=n,
                         mode="coupled" if coupled else "exact", **filters)
        tk = [None if filters.get(k) is None else torch.full((logits.shape[0],), filters[k]) for k in
              ("top_k", "top_p", "min_p")]
        tk = [None if t is None else gpu.to(t.to(torch.int64 if i == 0 else torch.float32)) for i, t in enumerate(tk)]
        got = simulate(logits, ids, qd, T, seed, torch.tensor(x["offset"]), bounds, num_drafts=n, coupled=coupled,
                       top_k=tk[0], top_p=tk[1], min_p=tk[2], ops=gpu)
        for r, res in enumerate(got):
            assert _same(ref, res), (f"case {c} ({dtype}, coupled={coupled}, dense={q is not None}, {filters}, "
                                     f"bounds {bounds}) rank {r}: {res.tokens.tolist()} != {ref.tokens.tolist()}")


def test_shard_sample_tokens_identical_gpu(gpu):
    """sample = coupled verify with K = 0: the backend's sample, bit for bit, aligned shards."""
    g = torch.Generator().manual_seed(22)
    V = gpu.size(50000, 128 * 9 + 7)
    for c, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        B = 5
        logits = gpu.to((torch.randn(B, V, generator=g) * 3).to(dtype))
        T = gpu.to(torch.tensor([0.7, 1.0, 0.0, 1.3, 0.5]))
        filters = ({}, dict(top_k=20), dict(top_p=0.8))[c]
        ref = gpu.sample(logits, T, seed=7 + c, offset=c, **filters)
        tk = {k: gpu.to(torch.full((B,), v, dtype=torch.int64 if k == "top_k" else torch.float32))
              for k, v in filters.items()}
        got = simulate(logits[:, None], gpu.to(torch.empty(B, 0, dtype=torch.int64)), None, T,
                       torch.tensor(7 + c), torch.tensor(c), _bounds(V, 3, g), coupled=True, ops=gpu, **tk)
        for res in got:
            assert torch.equal(res.tokens[:, 0].cpu(), ref.cpu()), (c, res.tokens[:, 0].tolist(), ref.tolist())


def test_shard_huge_logits_take_the_formula_gpu(gpu):
    """A finite logit with |l| >= 2^127 (the kHugeLogit path: sums against the row max, tile by
    tile in the same tree) on aligned shards: still the single-device tokens."""
    V = gpu.size(4096, 128 * 6)
    g = torch.Generator().manual_seed(23)
    logits = torch.randn(3, 2, V, generator=g)
    logits[0, :, 5] = 3e38
    logits[1, :, V - 3] = -3e38
    logits[2, 0, 200] = 2e38
    ids = torch.tensor([[5], [1], [200]])
    T = torch.tensor([4e37, 1.0, 3e37])
    args = gpu.to(logits, ids, T)
    ref = gpu.verify(*args[:2], None, args[2], seed=4)
    for bounds in ([0, TILE * 2, V], [0, TILE, TILE * 4, V]):
        for res in simulate(args[0], args[1], None, args[2], torch.tensor(4), torch.tensor(0), bounds, ops=gpu):
            assert _same(ref, res), (bounds, res.tokens.tolist(), ref.tokens.tolist())


@pytest.mark.law
def test_shard_law_unaligned_gpu(gpu):
    """Unaligned shards: parts that start inside a tile draw their own exponentials, so the
    tokens differ from one device's, but the law is the target's. Chi-square of the emitted
    token (sample: coupled, K = 0) against softmax(logits / T) over 8 tokens at ALPHA (the
    suite's test, merging cells of expected count < 5), on the CUDA kernels (one schedule per
    emulated call: the draws are the result)."""
    one = gpu.one_schedule()
    V = 8
    logits = torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0, -1.0, 1.5, 0.7]])
    T = 0.9
    n = gpu.size(4000, 300)
    B = 50
    counts = torch.zeros(V)
    bounds = [0, 3, 5, V]  # three ranks, every bound inside the one tile
    for s in range(n // B):
        x = one.to(logits.expand(B, V).contiguous())
        seeds = one.to(torch.arange(B, dtype=torch.int64) + 1000 * s)
        got = simulate(x[:, None], one.to(torch.empty(B, 0, dtype=torch.int64)), None,
                       one.to(torch.full((B,), T)), seeds, torch.tensor(s), bounds, coupled=True, ops=one)[0]
        counts += torch.bincount(got.tokens[:, 0].cpu(), minlength=V).float()
    p = torch.softmax(logits[0].double() / T, -1).numpy()
    pval = chi_square_pvalue(counts.numpy(), p)
    assert pval > ALPHA, (pval, counts.tolist())
    # the test can fail: the law of a combine that ignored the parts' row sums (each rank's part
    # drawn with chance 1/3, then a token within it) is rejected at this size
    wrong = p.copy()
    for a, b in zip(bounds[:-1], bounds[1:]):
        wrong[a:b] = p[a:b] / p[a:b].sum() / (len(bounds) - 1)
    assert chi_square_pvalue(counts.numpy(), wrong) < ALPHA, counts.tolist()


@pytest.mark.simt
def test_protocol_on_emulated_cuda_kernels():
    """specdec_ext.distributed.verify / sample over 2 gloo ranks with every step on the CUDA
    kernels (the SIMT emulation, swapped in for the protocol's op namespace; the header on an
    explicit host_group): the tokens are the emulated single-device verify / sample's, the same
    on both ranks, and the collectives move O(B * (K+1)) bytes."""
    from specdec_ext.distributed.launch import run_ranks
    from shard_cases import rank_simt_protocol

    V = TILE * 6 + 13
    out = run_ranks(rank_simt_protocol, 2, [0, TILE * 2, V], 6, 31, timeout_s=240)
    for bad, _, _ in out:
        assert not bad, bad
    for a, b in zip(out[0][1], out[1][1]):
        assert torch.equal(a, b)
    for calls, nbytes, shape, flags in out[0][2]:
        B, K1, _ = shape
        assert nbytes <= B * K1 * 8 * (3 + 2 * 6 + 2 + 7 + sum(flags) * 4 * 512) + 8 * 14


def _next_up(q: torch.Tensor) -> torch.Tensor:
    return (q.view(torch.int32) + 1).view(torch.float32)


def test_shard_sums_bit_exact_at_the_ratio_boundary_gpu(gpu):
    """Tokens alone would hide a last-bit difference in the row sums (a random ratio test
    almost never sits on it), so this test puts every row ON the boundary: per row, the largest
    float q(x) that the single-device ratio test u * q(x) * s < e accepts (a bisection over
    the float bits of q(x)); at it, and at the next float, the shards must decide the same, which
    they do only if their combined s is the single-device s bit for bit."""
    g = torch.Generator().manual_seed(24)
    B, V = 8, gpu.size(128 * 300 + 5, 128 * 20 + 5)  # several stat blocks: the block tree matters
    logits = torch.randn(B, 2, V, generator=g) * 2
    ids = torch.randint(0, V, (B, 1), generator=g)
    q = torch.full((B, 1, V), 1.0 / V)
    lo = torch.full((B,), 1e-30).view(torch.int32)  # accepted (q tiny)
    hi = torch.full((B,), 1e30).view(torch.int32)   # rejected

    def accepted(qx):
        qq = q.clone()
        qq[torch.arange(B), 0, ids[:, 0]] = qx
        res = gpu.verify(*gpu.to(logits, ids, qq), 1.0, seed=9, offset=3)
        return res.num_accepted.cpu() == 1, qq

    while bool((hi - lo > 1).any()):
        mid = lo + (hi - lo) // 2
        ok, _ = accepted(mid.view(torch.float32))
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    q_star = lo.view(torch.float32)
    for qx, want in ((q_star, True), (_next_up(q_star), False)):
        ok, qq = accepted(qx)
        assert bool((ok == want).all())
        ref = gpu.verify(*gpu.to(logits, ids, qq), 1.0, seed=9, offset=3)
        for bounds in ([0, 128 * 3, V], [0, 128, 128 * 9, V]):
            for res in simulate(*gpu.to(logits, ids, qq), gpu.to(torch.tensor(1.0)), torch.tensor(9),
                                torch.tensor(3), bounds, ops=gpu):
                assert _same(ref, res), (bounds, want, res.num_accepted.tolist(), ref.num_accepted.tolist())


@pytest.mark.cuda
def test_nccl_no_host_sync():
    """On GPUs: the protocol over NCCL (one rank per GPU, up to 2; a world of 1 on one GPU)
    runs every step without a host sync (set_sync_debug_mode("error")) and gives the
    single-device CUDA tokens."""
    from specdec_ext.distributed.launch import run_ranks
    from shard_cases import rank_nccl_no_sync

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    world = min(2, torch.cuda.device_count())
    V = 128 * 250 + 3
    bounds = [0, 128 * 100, V] if world == 2 else [0, V]
    assert all(run_ranks(rank_nccl_no_sync, world, V, bounds, timeout_s=120, backend="nccl"))
