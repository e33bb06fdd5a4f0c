"""Vocabulary-parallel verify / sample (specdec_ext.distributed, csrc/core/shard_math.h).

In one process: the stages of torch.ops.specdec.verify_shard run for every shard give verify's
tokens bit for bit on shards aligned to the 128-token race tile (random calls, hypothesis), and
the law of verify / sample on unaligned shards (chi-square). Over torch.distributed (gloo, 2-4
spawned processes): the same identity through specdec_ext.distributed, every rank refusing a bad
or inconsistent call (never a hang), and the bytes handed to the collectives."""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cli_runner
import specdec_ext
from helpers import draws
from shard_cases import OPS, random_case, rank_suite, simulate
from specdec_ext.distributed import VocabParallelModel, VocabShard, even_bounds
from specdec_ext.distributed.launch import run_ranks
from specdec_ext.models import SpecModel
from specdec_ext.ops._args import filter_args
from specdec_ext.ops.shard import shard_steps
from stats_reference import ALPHA, chi_square_pvalue, filtered_softmax64, softmax64, verify_joint


def _assert_same(ref, results, what):
    for r, got in enumerate(results):
        for name in ("tokens", "num_accepted", "valid"):
            assert torch.equal(getattr(got, name), getattr(ref, name)), (
                f"{what}, rank {r}: {name} {getattr(got, name).tolist()} != {getattr(ref, name).tolist()}")


# ---------------------------------------------------------------- one process, every shard
ALIGNED = [[0, 1000], [0, 128, 1000], [0, 384, 512, 1000], [0, 256, 768, 896, 1000], [0, 896, 1000]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["exact", "coupled"])
def test_stages_give_verify_tokens_on_aligned_shards(dtype, mode):
    g = torch.Generator().manual_seed(11)
    for c in range(draws(40, 12)):
        x = random_case(g, 1000, dtype)
        bounds = ALIGNED[c % len(ALIGNED)]
        for q in (None, x["q"]) if mode == "exact" else (None,):
            ref = specdec_ext.verify(x["logits"], x["ids"], q, x["T"], seed=x["seed"], offset=x["offset"],
                                     num_drafts=x["num_drafts"], mode=mode)
            got = simulate(x["logits"], x["ids"], q, x["T"], x["seed"], x["offset"], bounds, x["num_drafts"],
                           coupled=mode == "coupled")
            _assert_same(ref, got, f"case {c}, bounds {bounds}, dense q {q is not None}")


def test_stages_give_sample_tokens_on_aligned_shards():
    g = torch.Generator().manual_seed(12)
    for c in range(draws(20, 6)):
        logits = torch.randn(32, 1, 2000, generator=g) * 4
        T = [0.0, 0.5, 1.0, 1.7][c % 4]
        ref = specdec_ext.sample(logits[:, 0], T, seed=c, offset=3)
        got = simulate(logits, torch.empty(32, 0, dtype=torch.int64), None, T, c, 3, [0, 640, 1152, 2000],
                       coupled=True)
        for r in got:
            assert torch.equal(r.tokens[:, 0], ref), f"case {c}, T = {T}"


def test_invalid_rows_match_verify():
    """NaN / +inf at a used position (before or after the stop), all -inf positions, draft ids
    outside [0, V), bad draft probabilities, bad per-row temperature and num_drafts."""
    g = torch.Generator().manual_seed(3)
    B, K, V = 12, 3, 700
    logits = torch.randn(B, K + 1, V, generator=g) * 3
    ids = logits[:, :K].argmax(-1)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    logits[0, 1, 500] = float("nan")  # on shard 2, at a position the walk may pass
    logits[1, 3, 10] = float("inf")
    logits[2, 0] = -float("inf")  # no distribution at position 0
    logits[3, 2] = -float("inf")  # after the stop when a draft is rejected earlier
    ids[4, 1] = V + 3
    ids[5, 0] = -1
    q[6, 0, 600] = float("nan")  # a bad q entry in the rejected row (shard 2)
    q[7, 0, ids[7, 0]] = -1.0   # a bad q(x)
    logits[8, 2, 5] = float("nan")
    T = torch.full((B,), 0.8)
    T[9] = -1.0
    T[10] = float("nan")
    T[11] = 0.0
    n = torch.full((B,), K)
    n[8] = 1  # the NaN at position 2 is not used
    n[3] = 2
    for probs in (None, q):
        for mode in ("exact", "coupled"):
            ref = specdec_ext.verify(logits, ids, probs, T, seed=5, offset=1, num_drafts=n, mode=mode)
            got = simulate(logits, ids, probs, T, 5, 1, [0, 256, 512, V], n, coupled=mode == "coupled")
            _assert_same(ref, got, f"probs {probs is not None}, {mode}")
            assert not ref.valid[[0, 1, 2, 4, 5, 9, 10]].any() and ref.valid[8]


FILTERS = [dict(top_k=20), dict(top_p=0.8), dict(min_p=0.05), dict(top_k=50, top_p=0.9),
           dict(top_k=7, top_p=0.95, min_p=0.02), dict(top_p=0.5, min_p=0.1)]


@pytest.mark.parametrize("mode", ["exact", "coupled"])
def test_stages_with_filters_give_verify_tokens_on_aligned_shards(mode):
    """top-k / top-p / min-p over the whole vocabulary: the radix passes' histograms summed over
    the shards give the single-device cutoffs, so the same tokens (scalar and per-row filters)."""
    g = torch.Generator().manual_seed(13)
    for c in range(draws(36, 12)):
        dtype = (torch.float32, torch.bfloat16)[c % 2]
        x = random_case(g, 1000, dtype)
        B = x["logits"].shape[0]
        filters = dict(FILTERS[c % len(FILTERS)])
        if c % 3 == 2:  # per-row values, some rows off
            filters = {name: torch.tensor([v if b % 2 else {"top_k": 0, "top_p": 1.0, "min_p": 0.0}[name]
                                           for b in range(B)], dtype=torch.int64 if name == "top_k" else torch.float32)
                       for name, v in filters.items()}
        bounds = ALIGNED[c % len(ALIGNED)]
        q = None
        if mode == "exact" and c % 2:  # dense q: the draft's own filtered law
            q = specdec_ext.filtered_probs(x["logits"][:, :-1].reshape(-1, 1000).float(), 1.0, top_k=40).view(
                B, -1, 1000)
        ref = specdec_ext.verify(x["logits"], x["ids"], q, x["T"], seed=x["seed"], offset=x["offset"],
                                 num_drafts=x["num_drafts"], mode=mode, **filters)
        got = simulate(x["logits"], x["ids"], q, x["T"], x["seed"], x["offset"], bounds, x["num_drafts"],
                       coupled=mode == "coupled", **filters)
        _assert_same(ref, got, f"case {c}, bounds {bounds}, filters {filters}")


def _fold_covers(covers, bounds):
    """The row sum from every shard's kSums cover, folded in core/tile_sum.h's tree (float32),
    written independently here: blocks of 2^L tiles merge with their left sibling as soon as
    both are complete, then the blocks left over add up from the right."""
    stack, nxt = [], 0
    for (s, e), cover in zip(zip(bounds[:-1], bounds[1:]), covers):
        parts = 0 if e <= s else (e - 1) // 128 - s // 128 + 1
        p, end = nxt, nxt + parts
        for value in cover:
            level = 0
            while (p >> level) & 1 == 0 and p + (2 << level) <= end:
                level += 1
            v, p = np.float32(value), p + (1 << level)
            while stack and stack[-1][0] == level and p % (2 << level) == 0:
                v, level = np.float32(stack.pop()[1] + v), level + 1
            stack.append((level, v))
        nxt = end
    total = stack[-1][1]
    for _, v in reversed(stack[:-1]):
        total = np.float32(v + total)
    return total


@pytest.mark.parametrize("filters", [{}, dict(top_k=40), dict(top_p=0.7)], ids=["none", "top-k", "top-p"])
def test_shard_sums_fold_to_the_one_shard_bits(filters):
    """kSums covers of P aligned shards, folded, give the single shard's sum bit for bit, for
    every position (and the folding is not trivial: a plain left-to-right sum of the shards'
    values differs for some positions)."""
    g = torch.Generator().manual_seed(19)
    V = 128 * 37 + 5
    logits = torch.randn(8, 4, V, generator=g) * 4
    ids = torch.zeros(8, 3, dtype=torch.int64)
    t, sd_, o = torch.tensor(0.9), torch.tensor(1), torch.tensor(0)
    f = filter_args(filters.get("top_k"), filters.get("top_p"), None)

    def sums(bounds):
        args = [(logits[..., bounds[r]:bounds[r + 1]], ids, None, t, sd_, o, *f, None, False, bounds, r)
                for r in range(len(bounds) - 1)]
        steps = shard_steps(bounds, *(x is not None for x in f))
        gathered = []
        for stage in range(1, len(steps)):  # up to kSums
            gathered += [OPS.verify_shard(*a, stage, gathered) for a in args]
        covers = gathered[-(len(bounds) - 1):]
        return covers

    one = sums([0, V])[0]
    differs = 0
    for bounds in ([0, 128 * 5, V], [0, 128, 128 * 20, 128 * 33, V], [0, 128 * 36, V]):
        covers = sums(bounds)
        sizes = [_cover_len(bounds, r) for r in range(len(bounds) - 1)]
        for b in range(8):
            for i in range(4):
                whole = _fold_covers([one[b, i, :_cover_len([0, V], 0)].tolist()], [0, V])
                parts = [covers[r][b, i, :sizes[r]].tolist() for r in range(len(sizes))]
                assert _fold_covers(parts, bounds) == whole, (bounds, b, i)
                differs += np.float32(sum(np.float32(x) for p in parts for x in p)) != whole
    assert differs > 0


def _cover_len(bounds, r):
    first = sum(0 if e <= s else (e - 1) // 128 - s // 128 + 1 for s, e in zip(bounds[:r], bounds[1:r + 1]))
    n = (bounds[r + 1] - 1) // 128 - bounds[r] // 128 + 1
    count, p = 0, first
    while p < first + n:
        level = 0
        while (p >> level) & 1 == 0 and p + (2 << level) <= first + n:
            level += 1
        p, count = p + (1 << level), count + 1
    return count


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1.0, 0.7])
def test_topk_sum_is_the_dense_canonical_sum(dtype, T):
    """A top-k row's softmax sum comes from its survivors alone (their tiles' lane sums); it must
    be the bits of the dense tile-order sum over the row with every other logit at -inf (what a
    vocabulary shard computes): the processed logprob of every survivor is then bit-identical."""
    g = torch.Generator().manual_seed(17)
    V = 1000 + 37  # a partial last tile with a scalar tail
    logits = (torch.randn(6, 1, V, generator=g) * 3).to(dtype)
    logits[0, 0, -5:] = 20.0  # survivors in the tail
    t = torch.tensor(T)
    for k in (1, 5, 50, 300):
        kth = torch.topk(logits.float(), k, dim=-1).values[..., -1:]
        masked = torch.where(logits.float() >= kth, logits.float(), torch.tensor(-float("inf"))).to(dtype)
        tokens = logits.float().argmax(-1)
        a = OPS.logprobs(logits, tokens, t, torch.tensor(k), None, None, 0, True, False)[0]
        b = OPS.logprobs(masked, tokens, t, None, None, None, 0, True, False)[0]
        assert torch.equal(a, b), (k, a, b)


def test_stages_with_filters_give_sample_tokens():
    g = torch.Generator().manual_seed(14)
    for c in range(draws(18, 6)):
        logits = torch.randn(16, 1, 2000, generator=g) * 3
        filters = FILTERS[c % len(FILTERS)]
        ref = specdec_ext.sample(logits[:, 0], 0.9, seed=c, **filters)
        got = simulate(logits, torch.empty(16, 0, dtype=torch.int64), None, 0.9, c, 0, [0, 640, 1152, 2000],
                       coupled=True, **filters)
        for r in got:
            assert torch.equal(r.tokens[:, 0], ref), f"case {c}, {filters}"


def test_filtered_law_on_unaligned_shards():
    """sample with top-k + top-p + min-p on shards cut inside tiles: the filtered law p'
    (by sorting, stats_reference) at ALPHA, and a wrong law rejected."""
    V, N = 300, draws(20000, 20000)
    g = torch.Generator().manual_seed(31)
    row = torch.randn(1, 1, V, generator=g) * 0.7
    row[..., 30:70] += 1.0  # mass on both sides of the cuts at 50 and 133
    row[..., 120:145] += 1.0
    filters = dict(top_k=100, top_p=0.9, min_p=0.05)  # 82 survivors
    res = simulate(row.expand(N, -1, -1), torch.empty(N, 0, dtype=torch.int64), None, 1.0, 5, 0, [0, 50, 133, 300],
                   coupled=True, **filters)[0]
    counts = torch.bincount(res.tokens[:, 0], minlength=V).numpy()
    law = filtered_softmax64(row[0, 0], 1.0, **filters)
    assert chi_square_pvalue(counts, law) > ALPHA
    wrong = law.copy()
    wrong[:50] *= 1.3  # 30% more mass left of the cut at 50
    assert chi_square_pvalue(counts, wrong) < ALPHA


@settings(max_examples=draws(60, 15), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_aligned_shards_match_verify(data):
    """Hypothesis: shard layouts (aligned, uneven, 1-4 shards), extreme logit values, strides,
    filters (k up to past V, top-p / min-p near their ends)."""
    V = data.draw(st.integers(1, 1300), label="V")
    tiles = (V - 1) // 128
    cuts = sorted(data.draw(st.sets(st.integers(1, tiles), max_size=3), label="cuts")) if tiles else []
    bounds = [0] + [128 * c for c in cuts] + [V]
    B, K = data.draw(st.integers(1, 3), label="B"), data.draw(st.integers(0, 3), label="K")
    scale = data.draw(st.sampled_from([1e-3, 1.0, 30.0, 1e30]), label="scale")
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    base = torch.randn(B, K + 1, 2 * V, generator=g) * scale
    logits = base[..., ::2]  # a strided vocab dim (the op copies it)
    ids = torch.randint(0, V, (B, K), generator=g)
    if data.draw(st.booleans(), label="argmax drafts") and K:
        ids = logits[:, :K].argmax(-1)
    T = data.draw(st.sampled_from([0.0, 1e-4, 0.7, 1.0, 20.0]), label="T")
    mode = data.draw(st.sampled_from(["exact", "coupled"]), label="mode")
    filters = data.draw(st.fixed_dictionaries({}, optional=dict(
        top_k=st.integers(1, V + 2), top_p=st.sampled_from([0.05, 0.5, 0.95, 1.0]),
        min_p=st.sampled_from([0.0, 0.01, 0.3, 0.99]))), label="filters")
    ref = specdec_ext.verify(logits, ids, None, T, seed=9, offset=2, mode=mode, **filters)
    _assert_same(ref, simulate(logits, ids, None, T, 9, 2, bounds, coupled=mode == "coupled", **filters),
                 f"bounds {bounds}, filters {filters}")


def test_unaligned_shards_follow_the_law():
    """Shards cut inside race tiles: the emitted (num_accepted, token) of exact verify and the
    draw of sample follow the exact law (chi-square at ALPHA), and a wrong law is rejected."""
    V, K, N = 300, 2, draws(20000, 20000)
    bounds = [0, 50, 133, 300]  # three parts inside tiles 0 and 1
    g = torch.Generator().manual_seed(21)
    row = torch.randn(1, K + 1, V, generator=g) * 1.5
    row[..., 40:60] += 3.0  # mass on both sides of the cuts
    row[..., 125:140] += 3.0
    q = torch.softmax(row[:, :K] + torch.randn(1, K, V, generator=g), -1)
    draft = torch.tensor([[int(row[0, 0, 40:60].argmax()) + 40, 130]])
    logits, probs, ids = row.expand(N, -1, -1), q.expand(N, -1, -1), draft.expand(N, -1)
    res = simulate(logits, ids, probs, 0.9, 77, 0, bounds)[0]
    assert res.valid.all()
    joint = verify_joint(softmax64(row[0], 0.9), q[0].double().numpy(), draft[0].numpy())
    n = res.num_accepted
    counts = torch.bincount(n * V + res.tokens.gather(1, n.view(-1, 1)).view(-1), minlength=(K + 1) * V)
    assert chi_square_pvalue(counts.numpy(), joint) > ALPHA
    wrong = joint.copy()
    wrong[:, 40:50] *= 1.3  # 30% more mass on the left part of the split tile 0
    assert chi_square_pvalue(counts.numpy(), wrong) < ALPHA  # the test can fail
    tok = simulate(logits[:, :1], torch.empty(N, 0, dtype=torch.int64), None, 0.9, 78, 0, bounds, coupled=True)[0]
    p = softmax64(row[0, 0], 0.9)
    counts = torch.bincount(tok.tokens[:, 0], minlength=V).numpy()
    assert chi_square_pvalue(counts, p) > ALPHA
    wrong = p.copy()
    wrong[40:50] *= 1.3
    assert chi_square_pvalue(counts, wrong) < ALPHA


# ---------------------------------------------------------------- the ops' contract
def test_step_widths_match_the_op():
    logits = torch.randn(2, 2, 1000)
    ids = torch.zeros(2, 1, dtype=torch.int64)
    t, s, o = torch.tensor(1.0), torch.tensor(1), torch.tensor(0)
    for bounds in ([0, 1000], [0, 50, 133, 1000], [0, 128 * 3, 1000], [0, 1, 2, 1000]):
        for filters in ((None, None, None), (torch.tensor(5), torch.tensor(0.9), torch.tensor(0.1)),
                        (None, torch.tensor(0.5), None)):
            steps = shard_steps(bounds, *(f is not None for f in filters))
            args = [(logits[..., bounds[r]:bounds[r + 1]], ids, None, t, s, o, *filters, None, False, bounds, r)
                    for r in range(len(bounds) - 1)]
            assert int(OPS.verify_shard(*args[0], 0, [])[0]) == len(steps)
            gathered = []
            for stage, (_, width, dtype) in enumerate(steps, 1):
                outs = [OPS.verify_shard(*a, stage, gathered) for a in args]
                assert all(x.shape == (2, 2, width) and x.dtype == dtype for x in outs), (bounds, stage)
                gathered += outs


def test_opcheck():
    logits, ids = torch.randn(3, 3, 300), torch.randint(0, 300, (3, 2))
    t, s, o = torch.tensor(0.8), torch.tensor(3), torch.tensor(1)
    gathered = []
    for stage in (1, 2, 3):
        args = (logits, ids, None, t, s, o, None, None, None, None, False, [0, 300], 0, stage, list(gathered))
        torch.library.opcheck(OPS.verify_shard.default, args)
        gathered.append(OPS.verify_shard(*args))
    torch.library.opcheck(OPS.verify_shard_finish.default, (logits, ids, None, t, s, o, None, None, None, None,
                                                            False, [0, 300], 0, gathered))


@pytest.mark.parametrize("change, match", [
    (dict(shard_bounds=[0, 100, 100, 300]), "strictly increasing"),
    (dict(shard_bounds=[5, 300]), "start at 0"),
    (dict(shard_bounds=[0]), "P \\+ 1 >= 2"),
    (dict(rank=2), "rank must be in"),
    (dict(shard_bounds=[0, 100, 300], rank=1), "holds V = 300"),
    (dict(stage=5), "stage must be in"),
    (dict(stage=2), "gathered must hold"),
])
def test_op_refuses_bad_layout_arguments(change, match):
    a = dict(target_logits=torch.randn(2, 2, 300), draft_token_ids=torch.zeros(2, 1, dtype=torch.int64),
             draft_probs=None, temperature=torch.tensor(1.0), seed=torch.tensor(1), offset=torch.tensor(0),
             top_k=None, top_p=None, min_p=None, num_drafts=None, coupled=False, shard_bounds=[0, 300], rank=0,
             stage=1, gathered=[])
    a.update(change)
    with pytest.raises(ValueError, match=match):
        OPS.verify_shard(*a.values())


def test_op_refuses_bad_gathered_tensors():
    logits, ids = torch.randn(2, 2, 300), torch.zeros(2, 1, dtype=torch.int64)
    base = (logits, ids, None, torch.tensor(1.0), torch.tensor(1), torch.tensor(0), None, None, None, None, False,
            [0, 300], 0, 2)
    with pytest.raises(TypeError, match=r"gathered\[0\] \(step 1, rank 0\) must be float64, got Float"):
        OPS.verify_shard(*base, [torch.zeros(2, 2, 2, dtype=torch.float32)])
    with pytest.raises(ValueError, match=r"gathered\[0\] \(step 1, rank 0\) must be \[B, K\+1, 2\]"):
        OPS.verify_shard(*base, [torch.zeros(2, 3, 2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="contiguous"):
        OPS.verify_shard(*base, [torch.zeros(2, 2, 4, dtype=torch.float64)[..., ::2]])


# ---------------------------------------------------------------- over torch.distributed (gloo)
TWO, THREE, FOUR = [0, 384, 1000], [0, 128, 896, 1100], [0, 256, 512, 640, 2000]


@pytest.fixture(scope="module")
def ranks():
    """shard_cases.rank_suite on ONE spawn of 4 ranks (a spawn costs seconds): the results of
    every rank; the tests below read their parts."""
    return run_ranks(rank_suite, 4, {2: TWO, 3: THREE, 4: FOUR}, draws(16, 6), 5, timeout_s=90)


@pytest.mark.parametrize("P", [2, 3, 4], ids=["2 ranks", "3 ranks", "4 ranks"])
def test_distributed_matches_one_device(ranks, P):
    results = [r["identity"][P] for r in ranks[:P]]
    for r, (bad, _, _) in enumerate(results):
        assert not bad, f"rank {r}: " + "; ".join(bad[:5])
    for r in range(1, len(results)):  # every rank holds the same tokens
        assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[r][1]))


def test_distributed_moves_o_b_k_bytes(ranks):
    """A header, then one collective per step (3, plus the filters' radix passes); the bytes each
    rank hands over depend on B, K+1 and the cover size (log of the shard's tiles), never on V
    itself: a small fraction of gathering the logits."""
    counts = ranks[0]["identity"][2][2]
    assert any(any(flags) for *_, flags in counts) and any(not any(flags) for *_, flags in counts)
    for calls, nbytes, (B, K1, V), flags in counts:
        steps = shard_steps(TWO, *flags)
        assert calls == 1 + len(steps)
        # the header (13 int64), then every step's [B, K+1, width] (float64 or int64)
        assert nbytes == 13 * 8 + B * K1 * 8 * sum(w for _, w, _ in steps)
        if not any(flags):
            assert nbytes < 0.25 * B * K1 * V * 4  # gathering fp32 logits: B * K1 * V * 4 per rank
    assert shard_steps([0, 128 * 500, 128 * 1002])[-2][1] <= 2 * 10 + 4  # cover size grows as log2(tiles)


def test_distributed_refusals_reach_every_rank(ranks):
    out = [r["refusals"] for r in ranks[:2]]
    for r, cases in enumerate(out):
        by_name = {name: (kind, msg) for name, kind, msg in cases}
        assert by_name.pop("after") == (None, "True")
        for name, (kind, msg) in by_name.items():
            assert kind is not None, f"rank {r}: {name} did not raise"
            assert kind in ("ValueError", "TypeError"), (r, name, kind, msg)
        assert "tile [0, vocab_size" in by_name["overlap"][1]
        assert "batch sizes" in by_name["batch"][1]
        assert "the same on every rank" in by_name["drafts differ"][1]
        assert "the same on every rank" in by_name["seed differs"][1]
        assert "different ops (rank order): ['verify', 'sample']" in by_name["mixed ops"][1]
        assert "the same on every rank" in by_name["filters differ"][1]
        assert "top_p" in by_name["bad top_p"][1]
    assert "temperature" in out[0][0][2] or any("temperature" in m for n, k, m in out[0] if n.startswith("bad t"))
    assert any("rank(s) [0] refused" in m for n, k, m in out[1] if n.startswith("bad t"))
    assert any("rank(s) [1] refused" in m for n, k, m in out[0] if n == "negative vocab_start")


def test_distributed_in_a_subgroup(ranks):
    """A process group other than the world: group ranks, not global ranks, order the shards;
    the engine's shared seed comes from the group's first rank."""
    out = [r["subgroup"] for r in ranks[:3]]
    assert out[0] is None
    assert out[1][0] and out[2][0]
    assert out[1][1] == out[2][1]


# ---------------------------------------------------------------- the engine with a split LM head
EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "vocab_parallel.py")


def test_engine_example_generates_the_same_text_on_2_ranks():
    """examples/vocab_parallel.py: the bundled reference Llama with its LM head split over 2 gloo
    ranks generates the single process's greedy and seeded text on every rank."""
    r = cli_runner.run([EXAMPLE, "--world", "2", "--max-new-tokens", "24", "--k", "3"], timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("same text") == 4 and "MISMATCH" not in r.stdout


def test_even_bounds_and_vocab_shard():
    assert even_bounds(4096, 2) == [0, 2048, 4096]
    assert even_bounds(300, 2) == [0, 128, 300]
    assert even_bounds(1000, 3) == [0, 256, 640, 1000]
    for V, P in ((1000, 3), (129, 2), (50000, 7)):
        b = even_bounds(V, P)
        assert b[0] == 0 and b[-1] == V and all(x % 128 == 0 for x in b[1:-1]) and all(x < y for x, y in zip(b, b[1:]))
    with pytest.raises(ValueError, match="cannot split 200 tokens"):
        even_bounds(200, 3)
    assert VocabShard.even(1000, rank=1, world=3) == VocabShard(256, 640, 1000)
    with pytest.raises(ValueError, match="end"):
        VocabShard(10, 10, 100)


class _Fixed(SpecModel):
    """A SpecModel returning fixed logits (of the wrong width for the shard)."""
    vocab_size, device = 300, torch.device("cpu")

    def reset(self, batch_size, max_len):
        pass

    def forward(self, input_ids):
        return torch.zeros(*input_ids.shape, 300)

    def rollback(self, num_appended, num_kept):
        pass


def test_vocab_parallel_model_checks_its_logits_and_refuses_trees():
    model = VocabParallelModel(_Fixed(), VocabShard(0, 128, 300))
    assert model.vocab_size == 300 and model.vocab_shard.size == 128 and not model.supports_tree
    with pytest.raises(ValueError, match="holds 128"):
        model.forward(torch.zeros(1, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match="does not support tree speculation"):
        specdec_ext.SpeculativeEngine(model, _Fixed(), k=2, tree=[2, 2])
    with pytest.raises(TypeError, match="VocabShard"):
        VocabParallelModel(_Fixed(), (0, 128, 300))
