"""Behaviour of specdec.verify / specdec.sample: reproducibility, batch invariance,
greedy and mixed rows, invalid rows, documented errors, opcheck, torch.compile."""
import os

import pytest
import torch

import specdec_ext


def _inputs(B=8, K=4, V=300, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + 1, V, generator=g).to(dtype)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1).to(dtype)
    draft = torch.multinomial(q.float().view(-1, V), 1, generator=g).view(B, K)
    return logits.to(device), draft.to(device), q.to(device)


# ---------------------------------------------------------------- randomness
def test_same_seed_and_offset_reproduce(device):
    L, D, Q = _inputs(device=device)
    a = specdec_ext.verify(L, D, Q, 1.0, seed=5, offset=3)
    b = specdec_ext.verify(L, D, Q, 1.0, seed=5, offset=3)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)
    t1 = specdec_ext.sample(L[:, 0], 1.0, seed=5, offset=3)
    assert torch.equal(t1, specdec_ext.sample(L[:, 0], 1.0, seed=5, offset=3))


def test_offset_and_seed_change_the_draws(device):
    L, D, Q = _inputs(B=64, device=device)
    base = specdec_ext.verify(L, D, Q, 1.0, seed=5, offset=0).tokens
    assert not torch.equal(base, specdec_ext.verify(L, D, Q, 1.0, seed=5, offset=1).tokens)
    assert not torch.equal(base, specdec_ext.verify(L, D, Q, 1.0, seed=6, offset=0).tokens)


def test_seed_none_uses_torch_default_generator(device):
    L, D, Q = _inputs(B=64, device=device)
    torch.manual_seed(1)
    a = specdec_ext.verify(L, D, Q, 1.0).tokens
    torch.manual_seed(1)
    b = specdec_ext.verify(L, D, Q, 1.0).tokens
    assert torch.equal(a, b)
    # The generator moved on: the next call draws a new seed (not a constant one).
    assert not torch.equal(a, specdec_ext.verify(L, D, Q, 1.0).tokens)


def test_int_seed_gives_rows_their_own_streams(device):
    V = 1000
    L = torch.zeros(64, V, device=device)  # uniform: identical rows
    tokens = specdec_ext.sample(L, 1.0, seed=3)
    assert tokens.unique().numel() > 50


def test_per_row_seed_batch_invariance(device):
    """With per-row seeds a row's result depends only on its own inputs, seed and offset."""
    B = 64
    L, D, Q = _inputs(B=B, K=3, V=2000, seed=1, device=device)
    seeds = torch.arange(100, 100 + B, device=device)
    offsets = torch.arange(B, device=device) * 11
    full = specdec_ext.verify(L, D, Q, 1.0, seed=seeds, offset=offsets)
    # Other rows replaced by different data, and the batch permuted.
    L2, D2, Q2 = _inputs(B=B, K=3, V=2000, seed=2, device=device)
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(0)).to(device)
    for b in [0, 17, 63]:
        alone = specdec_ext.verify(L[b:b + 1], D[b:b + 1], Q[b:b + 1], 1.0, seed=seeds[b:b + 1],
                                   offset=offsets[b:b + 1])
        assert torch.equal(alone.tokens[0], full.tokens[b])
        L2[b], D2[b], Q2[b] = L[b], D[b], Q[b]
        s2, o2 = seeds.clone(), offsets.clone()
        mixed = specdec_ext.verify(L2[perm], D2[perm], Q2[perm], 1.0, seed=s2[perm], offset=o2[perm])
        pos = (perm == b).nonzero().item()
        assert torch.equal(mixed.tokens[pos], full.tokens[b])
    t_full = specdec_ext.sample(L[:, 0], 0.7, seed=seeds, offset=offsets)
    t_one = specdec_ext.sample(L[5:6, 0], 0.7, seed=seeds[5:6], offset=offsets[5:6])
    assert t_one[0] == t_full[5]


@pytest.mark.skipif(not (os.uname().machine == "x86_64"), reason="AVX2 copy is x86 only")
def test_avx2_and_default_cpu_kernels_agree(monkeypatch):
    L, D, Q = _inputs(B=200, K=4, V=1500, seed=3)
    fast = specdec_ext.verify(L, D, Q, 0.8, seed=1)
    fast_s = specdec_ext.sample(L[:, 0], 0.8, seed=1)
    monkeypatch.setenv("SPECDEC_CPU_CAPABILITY", "default")
    slow = specdec_ext.verify(L, D, Q, 0.8, seed=1)
    slow_s = specdec_ext.sample(L[:, 0], 0.8, seed=1)
    same = (fast.tokens == slow.tokens).all(1).float().mean().item()
    assert same >= 0.99, same
    assert (fast_s == slow_s).float().mean().item() >= 0.99


# ---------------------------------------------------------------- greedy, mixed, K = 0, B = 0
def test_mixed_greedy_and_sampled_rows(device):
    B, K, V = 32, 3, 100
    L, _, Q = _inputs(B=B, K=K, V=V, seed=4, device=device)
    amax = L.argmax(-1)
    D = amax[:, :K].clone()  # greedy rows accept everything
    D[1::2] = torch.randint(0, V, (B // 2, K), generator=torch.Generator().manual_seed(5)).to(device)
    temps = torch.where(torch.arange(B, device=device) % 2 == 0, 0.0, 1.0)
    seeds = torch.arange(100, 100 + B, dtype=torch.int64)  # per row: a row's result is its own
    res = specdec_ext.verify(L, D, Q, temps, seed=seeds)
    g = torch.arange(B, device=device) % 2 == 0
    assert (res.num_accepted[g] == K).all()
    assert torch.equal(res.tokens[g], amax[g])
    assert res.valid.all()
    # each sampled row, run alone (a batch of one, no greedy neighbours), gives the same result
    assert (res.num_accepted[~g] < K).any()  # the sampled rows really were sampled
    for b in range(1, B, 2):
        alone = specdec_ext.verify(L[b:b + 1], D[b:b + 1], Q[b:b + 1], temps[b:b + 1], seed=seeds[b:b + 1])
        assert torch.equal(alone.tokens[0], res.tokens[b]) and alone.num_accepted[0] == res.num_accepted[b]


def test_k0_samples_one_token_from_target(device):
    L, _, _ = _inputs(B=4, K=0, V=50, device=device)
    D = torch.empty(4, 0, dtype=torch.int64, device=device)
    res = specdec_ext.verify(L, D, None, 1.0, seed=1)
    assert res.tokens.shape == (4, 1) and (res.num_accepted == 0).all() and res.valid.all()
    assert ((res.tokens >= 0) & (res.tokens < 50)).all()
    res = specdec_ext.verify(L, D, torch.empty(4, 0, 50, device=device), 0.0)
    assert torch.equal(res.tokens[:, 0], L[:, 0].argmax(-1))


def test_b0_returns_empty(device):
    L = torch.empty(0, 3, 10, device=device)
    res = specdec_ext.verify(L, torch.empty(0, 2, dtype=torch.int64, device=device))
    assert res.tokens.shape == (0, 3) and res.num_accepted.shape == (0,) and res.valid.shape == (0,)
    assert specdec_ext.sample(torch.empty(0, 10, device=device)).shape == (0,)


def test_masked_tokens_never_emitted(device):
    B, K, V = 512, 2, 64
    L, D, Q = _inputs(B=B, K=K, V=V, seed=6, device=device)
    L[:, :, V // 2:] = float("-inf")
    res = specdec_ext.verify(L, D, Q, 1.0, seed=3)
    assert res.valid.all()
    emitted = res.tokens.gather(1, res.num_accepted.view(-1, 1))
    assert (emitted < V // 2).all()
    t = specdec_ext.sample(L[:, 0], 1.0, seed=3)
    assert (t < V // 2).all() and (t >= 0).all()


def test_non_contiguous_inputs_match_contiguous(device):
    L, D, Q = _inputs(B=6, K=3, V=257, seed=7, device=device)
    Lt = L.transpose(0, 1).contiguous().transpose(0, 1)   # other outer strides
    Lv = L.transpose(1, 2).contiguous().transpose(1, 2)   # vocab stride != 1: copied
    Qv = Q.transpose(1, 2).contiguous().transpose(1, 2)
    ref = specdec_ext.verify(L, D, Q, 1.0, seed=9)
    for args in [(Lt, D, Q), (Lv, D, Qv), (L, D.t().contiguous().t(), Q)]:
        assert torch.equal(specdec_ext.verify(*args, 1.0, seed=9).tokens, ref.tokens)
    assert torch.equal(specdec_ext.verify(L, D.int(), Q, 1.0, seed=9).tokens, ref.tokens)


# ---------------------------------------------------------------- invalid rows
def test_invalid_rows_are_flagged_and_never_emit_ids(device):
    B, K, V = 8, 3, 40
    L, D, Q = _inputs(B=B, K=K, V=V, seed=8, device=device)
    L[1, 2, 5] = float("nan")
    L[2, 3, 0] = float("inf")          # bonus position: checked even if never reached
    D[3, 1] = V                         # out of range
    D[4, 0] = -1
    L[5, 0] = float("-inf")            # position 0 has no distribution
    Q[6, 0, D[6, 0]] = float("nan")    # q(x) read by the ratio test
    temps = torch.ones(B, device=device)
    temps[7] = -1.0                    # negative per-row temperature
    res = specdec_ext.verify(L, D, Q, temps, seed=1)
    assert res.valid.tolist() == [True] + [False] * 7
    # unusable temperatures: NaN, +inf, denormal (1/T overflows); logits / T overflowing is fine:
    # the kernels work with (l - max) / T, so finite logits always give a valid row
    temps = torch.tensor([1.0, float("nan"), float("inf"), 1e-45, 1e-30, 1.0, 1.0, 1.0], device=device)
    L2 = torch.randn(B, K + 1, V, device=device)
    L2[4] *= 1e10                      # T = 1e-30: l / T overflows, (l - max) / T does not
    _, _, Qc = _inputs(B=B, K=K, V=V, seed=9, device=device)
    res2 = specdec_ext.verify(L2, D.clamp(0, V - 1), Qc, temps, seed=1)
    assert res2.valid.tolist() == [True, False, False, False, True, True, True, True]
    assert (res.tokens[1:] == -1).all() and (res.num_accepted[1:] == 0).all()
    # a bad probability away from anything the op reads does not matter: documented
    Q2 = Q.clone()
    Q2[0, K - 1, (D[0, K - 1] + 1) % V] = float("nan")
    r0 = specdec_ext.verify(L[:1], D[:1], Q2[:1], 1.0, seed=1)
    assert r0.tokens.ge(-1).all() and r0.tokens.lt(V).all()


def test_sample_invalid_rows(device):
    L = torch.randn(3, 20, device=device)
    L[1, 4] = float("nan")
    L[2] = float("-inf")
    out = torch.full((3, 20), 7.0, device=device)
    t = specdec_ext.sample(L, 1.0, seed=1, probs_out=out)
    assert t[1] == -1 and t[2] == -1 and 0 <= t[0] < 20
    assert (out[1:] == 0).all()
    torch.testing.assert_close(out[0], torch.softmax(L[0], -1))


# ---------------------------------------------------------------- probs_out
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sample_probs_out_strided_slice(dtype, device):
    B, K, V = 4, 3, 333
    logits = torch.randn(B, V, device=device).to(dtype)
    draft_probs = torch.full((B, K, V), -5.0, device=device)
    temps = torch.tensor([0.0, 0.5, 1.0, 2.0], device=device)
    tok = specdec_ext.sample(logits, temps, seed=1, probs_out=draft_probs[:, 1])
    ref = torch.softmax(logits.float() / temps.clamp_min(1e-9).view(-1, 1), -1)
    ref[0] = 0
    ref[0, logits[0].float().argmax()] = 1
    torch.testing.assert_close(draft_probs[:, 1], ref, rtol=1e-5, atol=1e-6)
    assert (draft_probs[:, 0] == -5).all() and (draft_probs[:, 2] == -5).all()
    assert tok[0] == logits[0].float().argmax()


def _draft_loop(device):
    """The intended loop: K calls of sample writing draft_probs[:, i], then verify."""
    B, K, V = 16, 4, 200
    torch.manual_seed(0)
    draft_logits = torch.randn(B, K, V, device=device)
    target_logits = torch.randn(B, K + 1, V, device=device)
    draft_probs = torch.empty(B, K, V, device=device)
    ids = torch.empty(B, K, dtype=torch.int64, device=device)
    seed, offset = torch.tensor(3, device=device), torch.tensor(0, device=device)
    for i in range(K):
        ids[:, i] = specdec_ext.sample(draft_logits[:, i], 1.0, seed=seed, offset=offset + i,
                                       probs_out=draft_probs[:, i])
    res = specdec_ext.verify(target_logits, ids, draft_probs, 1.0, seed=seed, offset=offset + K)
    return res, ids, draft_probs


def test_draft_loop_feeds_verify(device):
    res, ids, draft_probs = _draft_loop(device)
    assert res.valid.all()
    assert (draft_probs.gather(2, ids.unsqueeze(-1)) > 0).all()


@pytest.mark.cuda
def test_draft_loop_feeds_verify_without_host_sync_cuda():
    """On CUDA the whole loop runs under sync-debug mode 'error': any host sync raises."""
    _draft_loop("cuda")  # warm-up: lazy init, workspace allocations
    torch.cuda.set_sync_debug_mode("error")
    try:
        res, _, _ = _draft_loop("cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert res.valid.all()


# ---------------------------------------------------------------- errors
BAD_VERIFY = [
    (lambda L, D, Q: (L[0], D, Q), {}, "target_logits must be \\[B, K\\+1, V\\]"),
    (lambda L, D, Q: (L, D[0], Q), {}, "draft_token_ids must be \\[B, K\\]"),
    (lambda L, D, Q: (L, D[:, :2], Q), {}, "draft_token_ids has K = 2"),
    (lambda L, D, Q: (L, D[:3], Q), {}, "draft_token_ids has batch size 3"),
    (lambda L, D, Q: (L, D, Q[:, :2]), {}, "draft_probs has K = 2"),
    (lambda L, D, Q: (L, D, Q[..., :10]), {}, "draft_probs has vocabulary size 10"),
    (lambda L, D, Q: (L, D, Q[0]), {}, "draft_probs must be \\[B, K, V\\]"),
    (lambda L, D, Q: (L.to(torch.int32), D, Q), {}, "target_logits must be float32, float16 or bfloat16"),
    (lambda L, D, Q: (L, D.float(), Q), {}, "draft_token_ids must be int64 or int32"),
    (lambda L, D, Q: (L, D, Q.to(torch.int32)), {}, "draft_probs must be float32, float16 or bfloat16"),
    (lambda L, D, Q: (L, D, Q), {"temperature": -0.5}, "temperature must be 0 \\(greedy\\) or a positive"),
    (lambda L, D, Q: (L, D, Q), {"temperature": torch.ones(3)}, "temperature must be a float or a tensor of shape"),
    (lambda L, D, Q: (L, D, Q), {"seed": torch.ones(3, dtype=torch.int64)}, "seed must be an int or a tensor of shape"),
    (lambda L, D, Q: (L, D, Q), {"offset": torch.ones(8)}, "offset must be an int or an int64 tensor"),
    (lambda L, D, Q: (L[:, :, :0], D, Q[..., :0]), {}, "vocabulary size V >= 1"),
]


@pytest.mark.parametrize("make,kwargs,msg", BAD_VERIFY)
def test_verify_bad_inputs(make, kwargs, msg):
    L, D, Q = _inputs(B=8, K=4, V=30)
    kwargs = dict(kwargs)
    temperature = kwargs.pop("temperature", 1.0)
    with pytest.raises((ValueError, TypeError), match=msg):
        specdec_ext.verify(*make(L, D, Q), temperature, **kwargs)


def test_bad_seed_types():
    L, D, Q = _inputs(B=2, K=1, V=10)
    with pytest.raises(TypeError, match="seed must be an int, got float"):
        specdec_ext.verify(L, D, Q, seed=1.5)
    with pytest.raises(TypeError, match="offset must be an int, got NoneType"):
        specdec_ext.verify(L, D, Q, offset=None)
    with pytest.raises(TypeError, match="temperature must be a float"):
        specdec_ext.sample(L[:, 0], "0.5")
    with pytest.raises(ValueError, match="temperature must be 0 \\(greedy\\) or a positive finite"):
        specdec_ext.sample(L[:, 0], float("nan"))
    with pytest.raises(ValueError, match="temperature must be 0 \\(greedy\\) or a positive finite"):
        specdec_ext.verify(L, D, Q, float("inf"))
    with pytest.raises(ValueError, match="its inverse overflows float32"):
        specdec_ext.verify(L, D, Q, 1e-39)
    with pytest.raises(ValueError, match="temperature must be >= 0 \\(0 = greedy\\), finite and with a finite inverse"):
        torch.ops.specdec.sample(L[:, 0], torch.tensor(1e-45), torch.tensor(1), torch.tensor(0), None)


@pytest.mark.cuda
def test_verify_device_mismatch_cuda():
    L, D, Q = _inputs(B=2, K=1, V=10)
    with pytest.raises(ValueError, match="draft_token_ids is on cpu but target_logits is on cuda"):
        specdec_ext.verify(L.cuda(), D, Q.cuda())
    with pytest.raises(ValueError, match="draft_probs is on cpu"):
        specdec_ext.verify(L.cuda(), D.cuda(), Q)


def test_sample_bad_inputs():
    x = torch.randn(4, 16)
    with pytest.raises(ValueError, match="logits must be \\[B, V\\]"):
        specdec_ext.sample(x[0])
    with pytest.raises(TypeError, match="probs_out must be float32"):
        specdec_ext.sample(x, probs_out=torch.empty(4, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="probs_out must be \\[B, V\\]"):
        specdec_ext.sample(x, probs_out=torch.empty(4, 15))
    bad = torch.empty(16, 4).t()
    before = bad.clone()
    with pytest.raises(ValueError, match="probs_out must have stride 1 along V"):
        specdec_ext.sample(x, probs_out=bad)
    assert torch.equal(bad.nan_to_num(0), before.nan_to_num(0))  # nothing written
    with pytest.raises(ValueError, match="probs_out rows must not overlap"):
        specdec_ext.sample(x, probs_out=torch.empty(16).expand(4, 16))


# ---------------------------------------------------------------- torch.library integration
def test_opcheck(device):
    L, D, Q = _inputs(B=3, K=2, V=50, device=device)
    t = torch.tensor(0.8)
    s = torch.tensor(3, dtype=torch.int64)
    o = torch.tensor(1, dtype=torch.int64)
    torch.library.opcheck(torch.ops.specdec.verify.default, (L, D, Q, t, s, o))
    torch.library.opcheck(torch.ops.specdec.verify.default, (L, D, None, torch.full((3,), 0.5, device=device),
                                                             torch.arange(3, device=device), o))
    out = torch.empty(3, 50, device=device)
    torch.library.opcheck(torch.ops.specdec.sample.default, (L[:, 0], t, s, o, out))
    torch.library.opcheck(torch.ops.specdec.sample.default, (L[:, 0], t, s, o, None))


def test_torch_compile_fullgraph(device):
    B, K, V = 4, 3, 64

    def step(draft_logits, target_logits):
        probs = torch.zeros(B, K, V, device=draft_logits.device)
        ids = []
        for i in range(K):
            ids.append(specdec_ext.sample(draft_logits[:, i], 1.0, seed=1, offset=i, probs_out=probs[:, i]))
        ids = torch.stack(ids, 1)
        return specdec_ext.verify(target_logits, ids, probs, 1.0, seed=1, offset=K)

    torch.manual_seed(0)
    dl = torch.randn(B, K, V, device=device)
    tl = torch.randn(B, K + 1, V, device=device)
    eager = step(dl, tl)
    compiled = torch.compile(step, fullgraph=True)(dl, tl)
    assert torch.equal(eager.tokens, compiled.tokens)
    assert torch.equal(eager.num_accepted, compiled.num_accepted)
