"""tree_attention_mask / tree_attention_mask_bool / tree_positions against a plain Python
construction from parents, chain-shaped trees against spec_attention_mask, SDPA over a
tree equal to SDPA over each branch as a sequence, and the argument errors."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn.functional as F

from helpers import DEVICES
from specdec_ext import (TreeNodes, spec_attention_mask, spec_attention_mask_bool, tree_attention_mask,
                         tree_attention_mask_bool, tree_positions)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TREES = [
    [-1],
    [-1, 0, 0, 0, 1, 1, 2, 4],          # a root with 3 children, uneven below
    [-1, 0, 1, 2, 3],                   # a chain
    [-1, 0, 0, 1, 1, 2, 2, 3, 3, 4],    # binary, BFS
    [-1, 0, 1, 1, 0, 4, 2, 6, 6, 8],    # not BFS: parents only precede children
]


def ancestors_py(parents, n):
    """n and its ancestors, by walking up (the plain construction)."""
    out = {n}
    while parents[n] >= 0:
        n = parents[n]
        out.add(n)
    return out


def ref_bool(past, parents_rows, kv_len):
    """[B, 1, N, kv_len] from per-row parents lists, one key at a time."""
    N = len(parents_rows[0])
    out = torch.zeros(len(past), 1, N, kv_len, dtype=torch.bool)
    for b, (p, par) in enumerate(zip(past, parents_rows)):
        for n in range(N):
            anc = ancestors_py(par, n)
            for j in range(kv_len):
                out[b, 0, n, j] = j < p or (j - p) in anc
    return out


def ref_positions(past, parents_rows):
    return torch.tensor([[p + len(ancestors_py(par, n)) - 1 for n in range(len(par))]
                         for p, par in zip(past, parents_rows)], dtype=torch.int64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("parents", TREES)
def test_shared_tree_matches_python(device, parents):
    past = [0, 4, 2]
    kv_len = max(past) + len(parents) + 2   # two spare keys: masked for every row
    got = tree_attention_mask_bool(torch.tensor(past, device=device), torch.tensor(parents, device=device), kv_len)
    assert got.shape == (3, 1, len(parents), kv_len) and got.device.type == device
    assert torch.equal(got.cpu(), ref_bool(past, [parents] * 3, kv_len))
    pos = tree_positions(torch.tensor(past, device=device), parents)
    assert pos.dtype == torch.int64 and torch.equal(pos.cpu(), ref_positions(past, [parents] * 3))
    for dtype in DTYPES:
        add = tree_attention_mask(past, parents, kv_len, dtype, device=device)
        assert add.dtype == dtype and torch.isfinite(add).all()
        assert torch.equal((add == 0).cpu(), got.cpu())
        assert set(add.unique().tolist()) <= {0.0, torch.finfo(dtype).min}


@pytest.mark.parametrize("device", DEVICES)
def test_per_row_parents(device):
    rows = [[-1, 0, 0, 1, 2, 2], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 0, 0], [-1, 0, 1, 1, 0, 4]]
    past = [3, 0, 7, 1]
    kv_len = 13
    par = torch.tensor(rows, device=device)
    got = tree_attention_mask_bool(torch.tensor(past, device=device), par, kv_len)
    assert torch.equal(got.cpu(), ref_bool(past, rows, kv_len))
    assert torch.equal(tree_positions(past, rows).cpu(), ref_positions(past, rows))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_chain_equals_spec_attention_mask(device, n):
    chain = [-1] + list(range(n - 1))
    past = torch.tensor([0, 5, 2, -3], device=device)   # -3: an unused slot (fully visible rows)
    kv_len = 5 + n + 1
    assert torch.equal(tree_attention_mask_bool(past, chain, kv_len), spec_attention_mask_bool(past, n, kv_len))
    for dtype in DTYPES:
        assert torch.equal(tree_attention_mask(past, chain, kv_len, dtype), spec_attention_mask(past, n, kv_len, dtype))
    assert torch.equal(tree_positions(past, chain), past.view(-1, 1) + torch.arange(n, device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_over_a_tree_equals_each_branch_causal(device):
    """Each node's attention output over [prefix, tree] with the tree mask equals causal
    attention over the sequence prefix + its root-to-node path."""
    gen = torch.Generator().manual_seed(0)
    parents = [-1, 0, 0, 1, 1, 2, 3]
    B, H, D, past = 2, 2, 8, [4, 1]
    N, kv_len = len(parents), max(past) + len(parents)
    k = torch.randn(B, H, kv_len, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, kv_len, D, generator=gen, dtype=torch.float64)
    q = torch.randn(B, H, N, D, generator=gen, dtype=torch.float64)
    mask = tree_attention_mask(past, parents, kv_len, torch.float64)
    out = F.scaled_dot_product_attention(q.to(device), k.to(device), v.to(device), attn_mask=mask.to(device)).cpu()
    for b, p in enumerate(past):
        for n in range(N):
            keys = list(range(p)) + sorted(p + m for m in ancestors_py(parents, n))
            ref = F.scaled_dot_product_attention(q[b:b + 1, :, n:n + 1], k[b:b + 1, :, keys], v[b:b + 1, :, keys])
            torch.testing.assert_close(out[b:b + 1, :, n:n + 1], ref)


def test_tree_nodes_step_inputs_slice_the_whole_tree():
    """A level fed on its own (start > 0, the root already cached) sees what the same nodes
    see in the whole tree's mask."""
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 2])
    base = torch.tensor([5, 2])             # the root's slot in each row
    full = tree_attention_mask(base, parents, 5 + 7, torch.float32)
    full_pos = tree_positions(base, parents)
    lengths = base + 3                       # nodes 0..2 already cached
    pos, mask = TreeNodes(parents, start=3).step_inputs(lengths, 4, int(lengths.max()) + 4, torch.float32)
    assert torch.equal(pos, full_pos[:, 3:]) and torch.equal(mask, full[:, :, 3:])
    with pytest.raises(ValueError, match="parents covers 7 nodes"):
        TreeNodes(parents, start=3).step_inputs(lengths, 5, 20, torch.float32)


@given(data=st.data())
@settings(max_examples=200, deadline=None)
def test_one_row_inputs_equal_step_inputs(data):
    """The one-row fast path (kept per tree shape) gives step_inputs' positions and mask bit
    for bit, for any valid tree prefix, past length and dtype, twice in a row (the kept entry)."""
    N = data.draw(st.integers(1, 12))
    parents = [-1] + [data.draw(st.integers(0, n - 1)) for n in range(1, N)]
    S = data.draw(st.integers(1, N))
    past = data.draw(st.integers(0, 40))
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.float64]))
    tree = TreeNodes(torch.tensor([parents] if data.draw(st.booleans()) else parents))
    ref = tree.step_inputs(torch.tensor([past]), S, past + S, dtype)
    for _ in range(2):
        pos, mask = tree.one_row_inputs(past, S, dtype, torch.device("cpu"))
        assert pos.dtype == ref[0].dtype and torch.equal(pos, ref[0])
        assert mask.dtype == dtype and mask.shape == ref[1].shape and torch.equal(mask, ref[1])


def test_one_row_inputs_decline_what_they_do_not_cover():
    """None (the caller takes step_inputs) for several rows, a level fed on its own, and a
    broken tree (step_inputs then names the bad entry)."""
    cpu = torch.device("cpu")
    assert TreeNodes(torch.tensor([[-1, 0], [-1, 0]])).one_row_inputs(3, 2, torch.float32, cpu) is None
    assert TreeNodes(torch.tensor([-1, 0, 0]), start=1).one_row_inputs(3, 2, torch.float32, cpu) is None
    bad = TreeNodes(torch.tensor([-1, 2, 0]))
    assert bad.one_row_inputs(3, 3, torch.float32, cpu) is None
    with pytest.raises(ValueError, match=r"parents\[1\] = 2"):
        bad.step_inputs(torch.tensor([3]), 3, 6, torch.float32)


def test_compiles():
    fn = torch.compile(lambda past, par: tree_attention_mask(past, par, 12, torch.float32), backend="eager")
    past, par = torch.tensor([0, 3]), torch.tensor([-1, 0, 0, 1, 2])
    assert torch.equal(fn(past, par), tree_attention_mask(past, par, 12, torch.float32))


@pytest.mark.parametrize("parents,match", [
    ([0, 0, 1], r"parents\[0\] = 0 must be -1"),
    ([-1, 1], r"parents\[1\] = 1 must be in \[0, 1\)"),
    ([-1, 0, -1], r"parents\[2\] = -1 must be in \[0, 2\)"),
    ([[-1, 0, 1], [-1, 0, 3]], r"parents\[1, 2\] = 3 must be in \[0, 2\)"),
])
def test_bad_parents(parents, match):
    past = [0, 0]
    with pytest.raises(ValueError, match=match):
        tree_attention_mask_bool(past, parents, 8)
    with pytest.raises(ValueError, match=match):
        tree_positions(past, torch.tensor(parents))


def test_argument_errors():
    with pytest.raises(ValueError, match="non-empty"):
        tree_positions([0], [])
    with pytest.raises(ValueError, match=r"parents has 3 rows but past_lens has 2"):
        tree_positions([0, 1], [[-1, 0]] * 3)
    with pytest.raises(TypeError, match="integer tensor"):
        tree_positions([0], torch.tensor([-1.0, 0.0]))
    with pytest.raises(ValueError, match="kv_len=5 is too short"):
        tree_attention_mask_bool([2], [-1, 0, 0, 1], 5)
    with pytest.raises(TypeError, match="floating dtype"):
        tree_attention_mask([0], [-1, 0], 2, torch.int32)
