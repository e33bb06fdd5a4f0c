"""The CUDA kernel of verify_tree through the ``gpu`` fixture: in the SIMT emulation on every
machine (each call under three random schedules, bit-identical across them), and on a GPU
where there is one. Shapes reach every path of the kernel: more rows than resident blocks
(grid-stride, the block's residual buffers reused), V not a multiple of the 128-token tile
and V below one tile, unaligned rows (scalar loads), fp32 / fp16 / bf16, filters (the
filter_cutoff_kernel pass first), sampled and deterministic children, greedy rows, several
rejected children at one node (the residual buffers swapped), invalid rows from device
values."""
import pytest
import torch

import specdec_ext
from stats_reference import ALPHA
from test_sampling_gpu import _misaligned_copy, assert_rows_agree
from test_verify_tree import residual_of_mass_zero_case, tree_law_pvalue
from tree_cases import bfs_parents, draw_trees, table

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _random_trees(B, V, branching, dtype, seed, sampled=True):
    """Random trees over a random target: node logits i.i.d. (not a table: fast at large V),
    children from a random draft law (sampled) or its top tokens."""
    parents = bfs_parents(branching)
    N = len(parents)
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, N, V, generator=g) * 2).to(dtype)
    q = torch.softmax(logits.float() * 0.8 + torch.randn(B, N, V, generator=g), -1)
    ids = torch.zeros(B, N, dtype=torch.long)
    for c in range(1, N):
        src = q[:, parents[c]]
        ids[:, c] = torch.multinomial(src, 1, generator=g)[:, 0] if sampled else src.argmax(-1)
    return logits, ids, parents, (q.to(dtype) if sampled else None)


def _temps(B, seed):
    t = 0.5 + torch.rand(B, generator=torch.Generator().manual_seed(seed))
    t[1::5] = 0.0
    return t


# (B, V, branching) on a GPU / emulated: at least MIN_ROWS (test_sampling_gpu) rows
SHAPES = [((64, 32000, (4, 2, 2)), (16, 700, (3, 2))), ((16, 128256, (2, 2)), (16, 1500, (2, 2))),
          ((33, 301, (3, 1, 1)), (16, 301, (3, 1, 1))), ((16, 100, (4, 2)), (16, 100, (4, 2)))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "topk"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[0][:2])))
def test_cpu_and_cuda_kernels_agree(gpu, shape, dtype, sampled):
    """Same Philox numbers on both: rows agree except where float rounding flips a decision
    (test_sampling_gpu.max_mismatched_rows): tokens, paths and num_accepted; the same
    validity everywhere."""
    B, V, branching = gpu.size(*shape)
    L, I, parents, Q = _random_trees(B, V, branching, dtype, seed=B + V, sampled=sampled)
    temps = _temps(B, seed=2)
    cpu = specdec_ext.verify_tree(L, I, parents, Q, temps, seed=77, offset=5)
    dev = gpu.verify_tree(*gpu.to(L, I), parents, gpu.to(Q), gpu.to(temps), seed=77, offset=5)
    assert_rows_agree(cpu.tokens, dev.tokens)
    assert_rows_agree(cpu.path, dev.path, "path")
    assert_rows_agree(cpu.num_accepted, dev.num_accepted, "num_accepted", varied=False)
    assert torch.equal(cpu.valid, dev.valid.cpu())
    assert bool(dev.valid.all())


@pytest.mark.parametrize("filt", [dict(top_k=5), dict(top_p=0.6), dict(min_p=0.1), dict(top_k=8, top_p=0.9)], ids=str)
def test_filtered_calls_agree_with_the_cpu(gpu, filt):
    B, V, branching = gpu.size((32, 5000, (4, 2)), (16, 500, (3, 2)))
    L, I, parents, _ = _random_trees(B, V, branching, torch.float32, seed=3, sampled=False)
    temps = _temps(B, seed=4)
    cpu = specdec_ext.verify_tree(L, I, parents, None, temps, seed=1, **filt)
    dev = gpu.verify_tree(*gpu.to(L, I), parents, None, gpu.to(temps), seed=1, **filt)
    assert_rows_agree(cpu.tokens, dev.tokens)
    assert_rows_agree(cpu.path, dev.path, "path")
    assert torch.equal(cpu.valid, dev.valid.cpu())


def test_greedy_rows_are_exact(gpu):
    """T = 0 everywhere: no random number, no float sum: tokens and paths bit-equal to the CPU's,
    on trees whose candidates often hold the argmax."""
    V, branching = 7, (3, 2, 2)
    B = gpu.size(64, 16)
    target = table(V, 3, 2.0, 1)
    tb = draw_trees(target, target, branching, B, 1.0, sampled=False, seed=2)
    cpu = specdec_ext.verify_tree(tb.logits, tb.ids, tb.parents, None, 0.0)
    dev = gpu.verify_tree(*gpu.to(tb.logits, tb.ids), tb.parents, None, 0.0)
    assert torch.equal(cpu.tokens, dev.tokens.cpu()) and torch.equal(cpu.path, dev.path.cpu())
    assert int(cpu.num_accepted.max()) > 0


def test_invalid_rows_from_device_values(gpu):
    """On a device, a malformed parents row ([B, N] tensor), a tree deeper than ``depth``, a
    node token outside [0, V), NaN at an unvisited node, all -inf at the root, a bad draft
    probability and a bad per-row temperature make THAT row invalid (-1 everywhere); the last
    row, untouched, is unchanged."""
    B, V, branching = 9, 200, (2, 2)
    L, I, parents, Q = _random_trees(B, V, branching, torch.float32, seed=9)
    P = torch.tensor(parents).repeat(B, 1)
    temps = torch.full((B,), 0.9)
    base = gpu.verify_tree(*gpu.to(L, I, P, Q, temps), seed=3, depth=2)
    assert bool(base.valid.all())
    P[0, 3] = 5           # a parent that is not an earlier node
    P[1, 0] = 0           # a root that has a parent
    P[2, 6] = 3           # depth 3 > depth = 2
    I[3, 2] = V           # a token outside [0, V)
    L[4, -1, 7] = float("nan")
    L[5, 0] = float("-inf")
    Q[6, 0] = float("nan")  # the root's q row: read by the first child's test
    temps[7] = -1.0
    res = gpu.verify_tree(*gpu.to(L, I, P, Q, temps), seed=3, depth=2)
    assert res.valid.cpu().tolist() == [False] * 8 + [True]
    assert bool((res.tokens[:8].cpu() == -1).all()) and bool((res.path[:8].cpu() == -1).all())
    assert bool((res.num_accepted[:8].cpu() == 0).all())
    assert torch.equal(res.tokens[8].cpu(), base.tokens[8].cpu()) and torch.equal(res.path[8].cpu(), base.path[8].cpu())


def test_a_residual_of_mass_zero_leaves_r_as_it_was(gpu):
    """test_verify_tree's case: r == q after a rejection keeps r; the correction is p's token."""
    logits, ids, parents, q = residual_of_mass_zero_case(B=5)
    res = gpu.verify_tree(*gpu.to(logits, ids), parents, gpu.to(q), 1.0, seed=3)
    assert res.tokens.cpu().tolist() == [[5, -1]] * 5 and res.path.cpu().tolist() == [[0, -1]] * 5


def test_vector_and_scalar_loads_are_identical(gpu):
    """The same rows through 16-byte vector loads and scalar loads (unaligned copy, and
    SPECDEC_CUDA_LOADS=scalar) give bit-identical results."""
    B, V, branching = gpu.size((16, 4096, (3, 2)), (5, 512, (3, 2)))
    L, I, parents, Q = _random_trees(B, V, branching, torch.float32, seed=5)
    temps = _temps(B, seed=6)
    args = dict(seed=2, offset=1)
    vec = gpu.verify_tree(*gpu.to(L, I), parents, gpu.to(Q), gpu.to(temps), **args)
    mis = gpu.verify_tree(_misaligned_copy(gpu.to(L)), gpu.to(I), parents, gpu.to(Q), gpu.to(temps), **args)
    with gpu.options(loads="scalar"):
        sca = gpu.verify_tree(*gpu.to(L, I), parents, gpu.to(Q), gpu.to(temps), **args)
    for r in (mis, sca):
        assert torch.equal(vec.tokens.cpu(), r.tokens.cpu()) and torch.equal(vec.path.cpu(), r.path.cpu())


@pytest.mark.simt
@pytest.mark.parametrize("device", [dict(sms=1, blocks_per_sm=1), dict(sms=8, blocks_per_sm=3)], ids=str)
def test_results_do_not_depend_on_the_emulated_device(device):
    """One block running every row, or more blocks than rows: the same bits."""
    from backends import SimtBackend

    gpu = SimtBackend(("1",))
    L, I, parents, Q = _random_trees(11, 300, (3, 2), torch.bfloat16, seed=8)
    ref = gpu.verify_tree(L, I, parents, Q, 0.8, seed=4)
    with gpu.options(**device):
        out = gpu.verify_tree(L, I, parents, Q, 0.8, seed=4)
    assert torch.equal(ref.tokens, out.tokens) and torch.equal(ref.path, out.path)


@pytest.mark.law
@pytest.mark.parametrize("case", ["sampled_3x2", "repeated_candidates"])
def test_verify_tree_law(gpu, case):
    """Chi-square at ALPHA of the first two emitted tokens against the target's joint law
    (test_verify_tree.tree_law_pvalue), on the CUDA kernel. (Filtered laws: the CPU kernel's
    law tests, and the filtered calls' agreement with the CPU here.)"""
    n = gpu.size(40_000, 1500)
    assert tree_law_pvalue(gpu.one_schedule().verify_tree, n, case, seed=13, device=gpu.device) > ALPHA
