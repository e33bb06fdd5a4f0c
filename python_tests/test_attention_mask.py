"""spec_attention_mask / spec_attention_mask_bool, alone and with SDPA over a KV cache."""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from specdec_ext import KVCache, PagedKVCache, kv_append_, spec_attention_mask, spec_attention_mask_bool

cuda = pytest.mark.cuda
from helpers import DEVICES  # noqa: E402
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def ref_bool(past, q_len, kv_len):
    out = torch.zeros(len(past), 1, q_len, kv_len, dtype=torch.bool)
    for b, p in enumerate(past):
        for i in range(q_len):
            for j in range(kv_len):
                out[b, 0, i, j] = j <= p + i
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("past", [0, 1, 3, 10])
@pytest.mark.parametrize("q_len", range(1, 7))
def test_equal_lengths_is_causal_lower_right(device, past, q_len):
    kv_len = past + q_len
    expected = causal_lower_right(q_len, kv_len)._materialize(torch.device(device))
    past_lens = torch.full((3,), past, dtype=torch.int32, device=device)
    got = spec_attention_mask_bool(past_lens, q_len, kv_len)
    assert got.shape == (3, 1, q_len, kv_len) and got.device.type == device
    assert torch.equal(got, expected.expand(3, 1, q_len, kv_len))
    for dtype in DTYPES:
        add = spec_attention_mask(past_lens, q_len, kv_len, dtype)
        assert add.dtype == dtype
        assert torch.equal(add == 0, expected.expand(3, 1, q_len, kv_len))
        assert torch.equal(add != 0, ~expected.expand(3, 1, q_len, kv_len))


@pytest.mark.parametrize("device", DEVICES)
def test_ragged_rows(device):
    past = [0, 5, 2, 9]
    q_len, kv_len = 4, 13
    got = spec_attention_mask_bool(torch.tensor(past, device=device), q_len, kv_len)
    assert torch.equal(got.cpu(), ref_bool(past, q_len, kv_len))
    got_list = spec_attention_mask_bool(past, q_len, kv_len, device=device)
    assert torch.equal(got_list, got)
    # kv_len longer than every row needs: the extra keys are masked for everyone
    got = spec_attention_mask_bool(past, q_len, 20)
    assert torch.equal(got, ref_bool(past, q_len, 20)) and not got[..., 13:].any()


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_value_is_finite_min(dtype):
    add = spec_attention_mask([0, 3], 3, 6, dtype)
    assert torch.isfinite(add).all()
    assert set(add.unique().tolist()) == {0.0, torch.finfo(dtype).min}
    assert add[0, 0, 0, 1].item() == torch.finfo(dtype).min


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sdpa_no_nan_no_overflow(device, dtype):
    """Large negative scores + finfo.min round to -inf in half precision; the row still has
    a visible key, so no NaN. A negative past length (unused batch slot) would leave query
    rows with no key at all: they are made visible, so SDPA stays finite."""
    gen = torch.Generator().manual_seed(0)
    B, H, q_len, kv_len, D = 3, 2, 4, 9, 16
    q = (torch.randn(B, H, q_len, D, generator=gen) * 30).to(dtype).to(device)
    k = (torch.randn(B, H, kv_len, D, generator=gen) * 30).to(dtype).to(device)
    v = torch.randn(B, H, kv_len, D, generator=gen).to(dtype).to(device)
    past = torch.tensor([5, 0, -2], device=device)
    mask = spec_attention_mask(past, q_len, kv_len, dtype)
    assert torch.isfinite(mask).all()
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(out).all()
    bmask = spec_attention_mask_bool(past, q_len, kv_len)
    assert bmask[2, 0, :2].all()          # rows at positions -2, -1: made fully visible
    assert torch.equal(bmask[2, 0, 2:].cpu(), ref_bool([-2], q_len, kv_len)[0, 0, 2:])
    out_b = F.scaled_dot_product_attention(q, k, v, attn_mask=bmask)
    assert torch.isfinite(out_b).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_over_cache_equals_full_causal(device, dtype):
    """Ragged rows: prefix p_b in a KVCache-layout cache (stale garbage beyond each length),
    q_len new tokens appended with kv_append_, SDPA with the mask over the cache view ==
    causal SDPA over each row's full sequence."""
    gen = torch.Generator().manual_seed(1)
    fp32_tol = 1e-5 if device == "cpu" else 1e-4  # CUDA SDPA kernels vs the CPU reference
    tol = dict(rtol=fp32_tol, atol=fp32_tol) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    B, H, D, M, q_len = 4, 2, 8, 24, 5
    past = [3, 0, 11, 7]
    N = max(past) + q_len
    q_full = torch.randn(B, H, N, D, generator=gen, dtype=dtype)
    k_full = torch.randn(B, H, N, D, generator=gen, dtype=dtype)
    v_full = torch.randn(B, H, N, D, generator=gen, dtype=dtype)
    kc = (torch.randn(B, H, M, D, generator=gen, dtype=dtype) * 100)  # stale, finite
    vc = (torch.randn(B, H, M, D, generator=gen, dtype=dtype) * 100)
    q_new = torch.empty(B, H, q_len, D, dtype=dtype)
    k_new, v_new = torch.empty_like(q_new), torch.empty_like(q_new)
    for b, p in enumerate(past):
        kc[b, :, :p], vc[b, :, :p] = k_full[b, :, :p], v_full[b, :, :p]
        q_new[b], k_new[b], v_new[b] = q_full[b, :, p:p + q_len], k_full[b, :, p:p + q_len], v_full[b, :, p:p + q_len]
    kc, vc = kc.to(device), vc.to(device)
    lengths = torch.tensor(past, device=device)
    kv_append_(kc, vc, k_new.to(device), v_new.to(device), lengths)
    kv_len = max(past) + q_len
    mask = spec_attention_mask(lengths, q_len, kv_len, dtype)
    out = F.scaled_dot_product_attention(q_new.to(device), kc[:, :, :kv_len], vc[:, :, :kv_len], attn_mask=mask)
    for b, p in enumerate(past):
        n = p + q_len
        ref = F.scaled_dot_product_attention(q_full[b:b + 1, :, :n], k_full[b:b + 1, :, :n],
                                             v_full[b:b + 1, :, :n], is_causal=True)[0, :, p:]
        torch.testing.assert_close(out[b].cpu(), ref, **tol)
    # the boolean variant gives the same attention
    out_b = F.scaled_dot_product_attention(q_new.to(device), kc[:, :, :kv_len], vc[:, :, :kv_len],
                                           attn_mask=spec_attention_mask_bool(lengths, q_len, kv_len))
    torch.testing.assert_close(out_b, out, **tol)


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_kvcache_and_paged_cache_agree(device):
    """One speculative step through KVCache and PagedKVCache (gathered) gives the same
    attention output as the full causal computation."""
    gen = torch.Generator().manual_seed(2)
    B, H, D, prefix, S = 2, 2, 8, 6, 4
    x = torch.randn(3, B, H, prefix + S, D, generator=gen)
    q, k, v = (t.to(device) for t in x)
    cache = KVCache(1, B, H, D, 32, torch.float32, device)
    cache.append(0, k[:, :, :prefix], v[:, :, :prefix])
    cache.advance(prefix)
    mask = cache.attention_mask(S)
    keys, values = cache.append(0, k[:, :, prefix:], v[:, :, prefix:])
    out = F.scaled_dot_product_attention(q[:, :, prefix:], keys, values, attn_mask=mask)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)[:, :, prefix:]
    tol = dict(rtol=1e-5, atol=1e-5) if device == "cpu" else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out, ref, **tol)

    paged = PagedKVCache(1, 16, 4, H, D, torch.float32, device)
    seqs = ["a", "b"]
    slots = paged.allocate(seqs, prefix + S)
    paged.append(0, k.transpose(1, 2).reshape(B * (prefix + S), H, D),
                 v.transpose(1, 2).reshape(B * (prefix + S), H, D), slots)
    pk, pv = paged.gather(0, seqs)
    torch.testing.assert_close(pk, k, rtol=0, atol=0)
    out_p = F.scaled_dot_product_attention(q[:, :, prefix:], pk, pv,
                                           attn_mask=spec_attention_mask([prefix] * B, S, prefix + S,
                                                                         device=device))
    torch.testing.assert_close(out_p, ref, **tol)


def test_argument_errors():
    with pytest.raises(ValueError, match="q_len"):
        spec_attention_mask([0], -1, 4)
    with pytest.raises(TypeError, match="kv_len must be an int"):
        spec_attention_mask([0], 1, 2.5)
    with pytest.raises(TypeError, match=r"past_lens\[0\] must be an int"):
        spec_attention_mask_bool([1.5], 1, 4)
    with pytest.raises(ValueError, match="too short"):
        spec_attention_mask([3, 1], 2, 4)
    with pytest.raises(TypeError, match="floating dtype"):
        spec_attention_mask([0], 1, 4, torch.int32)
    with pytest.raises(TypeError, match="integer tensor"):
        spec_attention_mask(torch.tensor([0.0]), 1, 4)
    with pytest.raises(ValueError, match=r"\[B\] tensor"):
        spec_attention_mask(torch.tensor([[0]]), 1, 4)
    assert spec_attention_mask(2, 1, 3).shape == (1, 1, 1, 3)
