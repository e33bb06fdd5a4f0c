"""Every registered ``torch.ops.specdec`` op, in every output variant, compiled with the DEFAULT
torch.compile backend (Inductor, ``fullgraph=True``) gives the eager result bit for bit.

The op list is the registered one (``_no_outputs.op_names()``): an op without an entry in
``CALLS`` fails ``test_every_op_has_a_call``, so a new op cannot skip this test. The output
variants come from each op's schema: an optional mutable argument (``sample``'s ``probs_out``
and ``token_logprobs``, ``verify``'s ``token_logprobs``) is passed or left None in every
combination, so a new optional output is covered too. Compared: the returned tensors and every
mutated argument, with ``torch.equal`` (NaN where the eager call put NaN).

Catches (planted and seen failing): ``sample(..., probs_out=None)`` without the ``no_outputs``
overload (Inductor: "<built-in function getitem> is not an OpOverload").
"""
from __future__ import annotations

import itertools

import pytest
import torch

import specdec_ext  # noqa: F401  (registers the ops)
from specdec_ext.ops import _no_outputs

OPS = torch.ops.specdec
B, K, V = 3, 2, 300


def _row_values():
    return torch.tensor(0.8), torch.tensor(3), torch.tensor(1)


def _verify():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, K + 1, V, generator=g)
    ids = torch.randint(0, V, (B, K), generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    t, s, o = _row_values()
    return [logits, ids, q, t, s, o, torch.tensor(50), None, None, None, False, False,
            torch.empty(B, K + 1), True]


def _sample():
    g = torch.Generator().manual_seed(1)
    t, s, o = _row_values()
    return [torch.randn(B, V, generator=g), t, s, o, torch.empty(B, V), None, torch.tensor(0.9), None, False,
            torch.empty(B), False]


def _filtered():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(B, V, generator=g), torch.full((B,), 0.7), torch.tensor(20), None, torch.tensor(0.05), False]


def _softmax():
    return _filtered()[:2]


def _mask_logits():
    return _filtered()[:5]


def _logprobs():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, K + 1, V, generator=g)
    return [logits, torch.randint(0, V, (B, K + 1), generator=g), torch.tensor(0.8), None, None, None, 5, True,
            False]


def _verify_tree():
    g = torch.Generator().manual_seed(4)
    N = 4
    t, s, o = _row_values()
    return [torch.randn(B, N, V, generator=g), torch.randint(0, V, (B, N), generator=g),
            torch.tensor([-1, 0, 0, 1]), None, t, s, o, 2, None, None, None]


def _shard_args():
    g = torch.Generator().manual_seed(5)
    t, s, o = _row_values()
    return [torch.randn(B, K + 1, V, generator=g), torch.randint(0, V, (B, K), generator=g), None, t, s, o,
            None, None, None, None, False, [0, V], 0]


def _verify_shard():
    return _shard_args() + [1, []]


def _verify_shard_finish():
    args, gathered = _shard_args(), []
    for stage in range(1, int(OPS.verify_shard(*args, 0, [])[0]) + 1):
        gathered.append(OPS.verify_shard(*args, stage, list(gathered)))
    return args + [gathered]


def _kv_append():
    g = torch.Generator().manual_seed(6)
    H, M, D, S = 2, 8, 4, 2
    return [torch.randn(B, H, M, D, generator=g), torch.randn(B, H, M, D, generator=g),
            torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g), torch.tensor([0, 3, 6]),
            torch.zeros(B, dtype=torch.bool)]


def _kv_rollback():
    return [torch.tensor([5, 6, 7]), 3, torch.tensor([1, 3, 0]), torch.zeros(B, dtype=torch.bool)]


def _kv_compact():
    g = torch.Generator().manual_seed(7)
    H, M, D = 2, 8, 4
    return [torch.randn(B, H, M, D, generator=g), torch.randn(B, H, M, D, generator=g), torch.tensor([1, 2, 0]),
            torch.tensor([[0, 2, 3], [0, 1, -1], [0, 3, -1]]), torch.tensor([3, 2, 2]),
            torch.zeros(B, dtype=torch.bool)]


def _paged_cache(seed):
    g = torch.Generator().manual_seed(seed)
    NB, BS, H, D = 6, 4, 2, 4
    return torch.randn(NB, BS, H, D, generator=g), torch.randn(NB, BS, H, D, generator=g)


def _paged_kv_append():
    k, v = _paged_cache(8)
    g = torch.Generator().manual_seed(9)
    return [k, v, torch.randn(3, 2, 4, generator=g), torch.randn(3, 2, 4, generator=g), torch.tensor([5, -1, 17]),
            torch.zeros((), dtype=torch.bool)]


_TABLES = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)


def _paged_kv_gather():
    k, v = _paged_cache(10)
    return [k, v, _TABLES, torch.tensor([3, 8, 5]), 8]


def _paged_kv_gather_into():
    k, v = _paged_cache(11)
    return [k, v, _TABLES, torch.tensor([3, 8, 5]), torch.empty(B, 2, 8, 4), torch.empty(B, 2, 8, 4)]


def _paged_kv_compact():
    k, v = _paged_cache(12)
    return [k, v, _TABLES, torch.tensor([1, 2, 0]), torch.tensor([[0, 2, 3], [0, 1, -1], [0, 3, -1]]),
            torch.tensor([3, 2, 2]), torch.zeros(B, dtype=torch.bool)]


def _skinny_linear():
    g = torch.Generator().manual_seed(17)
    return [torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g),
            torch.randn(3, 5, generator=g)]


#: op name -> a function giving one call's arguments (every optional output buffer passed)
CALLS = {
    "verify": _verify, "sample": _sample, "filtered_probs": _filtered, "mask_logits": _mask_logits, "softmax": _softmax,
    "logprobs": _logprobs, "verify_tree": _verify_tree, "verify_shard": _verify_shard,
    "verify_shard_finish": _verify_shard_finish,
    "verify_block": lambda: _verify()[:10] + [False],
    "verify_reference": lambda: _verify()[:12], "sample_reference": lambda: [a for i, a in enumerate(_sample()[:9])
                                                                               if i != 4],
    "kv_append_": _kv_append, "kv_rollback_": _kv_rollback, "kv_compact_": _kv_compact,
    "paged_kv_append_": _paged_kv_append, "paged_kv_gather": _paged_kv_gather,
    "paged_kv_gather_into_": _paged_kv_gather_into, "paged_kv_compact_": _paged_kv_compact,
    "skinny_linear": _skinny_linear,
}


def _optional_outputs(schema):
    """Indices of the optional mutable arguments (output buffers a call may leave None)."""
    return [i for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write and isinstance(a.type, torch.OptionalType)]


def _variants():
    for name in _no_outputs.op_names():
        if name not in CALLS:
            continue
        optional = _optional_outputs(getattr(OPS, name).default._schema)
        for keep in itertools.product((True, False), repeat=len(optional)):
            dropped = [i for i, k in zip(optional, keep) if not k]
            label = "+".join(getattr(OPS, name).default._schema.arguments[i].name for i, k in zip(optional, keep) if k)
            yield pytest.param(name, dropped, id=f"{name}[{label or 'no outputs' if optional else 'all'}]")


def test_every_op_has_a_call():
    assert sorted(CALLS) == _no_outputs.op_names(), "give every registered op an entry in CALLS"


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
            torch.nan_to_num(a, nan=7.5) if a.is_floating_point() else a,
            torch.nan_to_num(b, nan=7.5) if b.is_floating_point() else b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name, dropped", list(_variants()))
def test_compiles_with_inductor_bit_for_bit(name, dropped):
    def call():
        args = CALLS[name]()
        for i in dropped:
            args[i] = None
        return args

    op = getattr(OPS, name).default
    eager_args = call()
    eager = op(*eager_args)
    compiled_args = call()
    torch._dynamo.reset()
    got = torch.compile(lambda *a: op(*a), fullgraph=True)(*compiled_args)
    assert _same(eager, got), f"{name}: compiled result differs from eager"
    assert _same(eager_args, compiled_args), f"{name}: compiled call mutated its arguments differently"


@pytest.mark.parametrize("probs_out", [False, True])
@pytest.mark.parametrize("logprobs", [None, 0, 3])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_sample_wrapper_compiles_in_every_variant(probs_out, logprobs, temperature):
    """specdec_ext.sample as users call it: Python temperature / seed, tensor seed and offset,
    a filter; with and without probs_out and logprobs."""
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(13))

    def step(x, seed, offset):
        out = torch.zeros(4, 64) if probs_out else None
        res = specdec_ext.sample(x, temperature, seed=seed, offset=offset, top_k=10, probs_out=out, logprobs=logprobs)
        return res, out

    args = (x, torch.tensor(5), torch.tensor(2))
    eager = step(*args)
    torch._dynamo.reset()
    assert _same(eager, torch.compile(step, fullgraph=True)(*args))


@pytest.mark.parametrize("logprobs", [None, 0, 3])
def test_verify_wrapper_compiles_in_every_variant(logprobs):
    logits, ids, q = _verify()[:3]

    def step(logits, ids, q):
        return specdec_ext.verify(logits, ids, q, 0.8, seed=3, offset=1, top_p=0.9, logprobs=logprobs)

    eager = step(logits, ids, q)
    torch._dynamo.reset()
    assert _same(eager, torch.compile(step, fullgraph=True)(logits, ids, q))
