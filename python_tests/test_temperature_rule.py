"""ONE temperature rule for every dtype and every op that takes a temperature: 0 is greedy; a
value is usable iff it is positive and finite in float32 with a finite inverse there
(``specdec_ext._validate.valid_temperature``). A nonzero value that float32 rounds to 0 (a tiny
float64) is NOT greedy: it makes its row invalid in a [B] tensor and raises ``ValueError`` as a
Python number or a 0-dim CPU tensor.

Catches (seen failing before the fix): a [B] float64 temperature of 1e-50 turning its row greedy
(first argmax of a tied row) in sample / verify / verify_tree / verify_shard / filtered_probs.
"""
from __future__ import annotations

import pytest
import torch

import specdec_ext
from specdec_ext._validate import valid_temperature
from specdec_ext.ops._args import temperature_arg
from specdec_ext.testing import simt

import shard_cases

B, K, V = 4, 2, 40
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _tiny(dtype) -> float:
    """float64: 1e-50 (float32 rounds it to 0); else the dtype's smallest positive value (bit pattern 1)."""
    if dtype == torch.float64:
        return 1e-50
    return float(torch.tensor(1, dtype=torch.int16 if torch.finfo(dtype).bits == 16 else torch.int32).view(dtype))


def _temperatures(dtype):
    """[B]: row 0 the tiny value, row 1 0 (greedy), rows 2-3 0.7 (all in dtype)."""
    t = torch.tensor([0.0, 0.0, 0.7, 0.7], dtype=torch.float64)
    t[0] = _tiny(dtype)
    return t.to(dtype)


def _tied_logits(shape):
    """Logits whose argmax is tied between ids 3 and 7 (a greedy row picks 3, the first)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) - 5
    x[..., 3] = 4.0
    x[..., 7] = 4.0
    return x


def _row_valid(op, t):
    """[B] bool: whether each row of ``op`` (one of OPS) came back valid at temperatures ``t``."""
    return OPS[op](t)


def _sample(t, ns=specdec_ext):
    return ns.sample(_tied_logits((B, V)), t, seed=1) >= 0


def _verify(t, ns=specdec_ext):
    ids = torch.full((B, K), 3)
    return ns.verify(_tied_logits((B, K + 1, V)), ids, None, t, seed=1).valid


def _verify_tree(t, ns=specdec_ext):
    return ns.verify_tree(_tied_logits((B, 3, V)), torch.full((B, 3), 3), [-1, 0, 0], None, t, seed=1).valid


def _verify_shard(t):
    """verify_shard's steps on 2 shards, the temperature converted as specdec_ext.distributed does."""
    logits = _tied_logits((B, K + 1, V))
    results = shard_cases.simulate(logits, torch.full((B, K), 3), None, temperature_arg(t), 1, 0, [0, 24, V])
    return results[0].valid


def _filtered_probs(t, ns=specdec_ext):
    return ns.filtered_probs(_tied_logits((B, V)), t, top_k=5).sum(-1) > 0


def _mask_logits(t, ns=specdec_ext):
    return ~ns.mask_logits(_tied_logits((B, V)), t, top_p=0.9).isnan().all(-1)


OPS = {"sample": _sample, "verify": _verify, "verify_tree": _verify_tree, "verify_shard": _verify_shard,
       "filtered_probs": _filtered_probs, "mask_logits": _mask_logits}
SIMT_OPS = {"sample": _sample, "verify": _verify, "verify_tree": _verify_tree, "filtered_probs": _filtered_probs,
            "mask_logits": _mask_logits}


def _expected(t):
    return torch.tensor([valid_temperature(float(v)) for v in t])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(OPS))
def test_per_row_tensor_follows_the_rule(op, dtype):
    t = _temperatures(dtype)
    valid = _row_valid(op, t)
    assert torch.equal(valid, _expected(t)), (op, dtype, t.tolist(), valid.tolist())
    if dtype == torch.float64:
        assert not bool(valid[0]), f"{op}: a float64 temperature of 1e-50 must not turn greedy"


@pytest.mark.simt
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", sorted(SIMT_OPS))
def test_per_row_tensor_follows_the_rule_on_the_cuda_kernels(op, dtype):
    """The same rule through the CUDA launchers' argument handling (SIMT emulation)."""
    t = _temperatures(dtype)
    assert torch.equal(SIMT_OPS[op](t, simt), _expected(t)), (op, dtype)


@pytest.mark.parametrize("op", sorted(OPS))
def test_tiny_number_and_host_scalar_raise(op):
    for value in (1e-50, torch.tensor(1e-50, dtype=torch.float64), -1e-50):
        with pytest.raises(ValueError, match="temperature"):
            _row_valid(op, value)


@pytest.mark.parametrize("op", sorted(OPS))
def test_usable_values_still_work(op):
    """0 is greedy and 0.7 samples, as a number, a 0-dim tensor and a [B] tensor of each dtype."""
    for value in (0.0, 0.7, torch.tensor(0.7, dtype=torch.float64), torch.full((B,), 0.7, dtype=torch.float64)):
        assert bool(_row_valid(op, value).all()), (op, value)
