"""A batch whose generation reaches the model's position limit (the cache's capacity) finishes
every row exactly as target-only greedy decoding does: chains and trees, the HF path and the
reference model with a contiguous and a paged cache, ragged rows.

Catches (seen failing before the fix): ``CacheFullError: KVCache.append: rows [0] hold [256]
tokens; 1 more would exceed max_len=256`` when a row that already finished at the limit was
fed in the next step (2 rows of a 237-token prompt, max_new_tokens 20, max_positions 256)."""
from __future__ import annotations

import pytest
import torch

from helpers import near_copy, reference_model, tiny_llama
from specdec_ext import SpeculativeEngine

transformers = pytest.importorskip("transformers")

LIMIT = 256  # tiny_llama's max_position_embeddings


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(64, 2, seed=1)
    return target, near_copy(target, 1e-3, seed=2)


def _prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 97, (n,), generator=g).tolist() for n in lengths]


_GREEDY = {}


def _greedy(model, prompt, n):
    """Target-only greedy continuation of one row: the argmax of a full forward of the HF model
    over the sequence so far, token by token (no cache). HF generate is not the reference here:
    near the position limit it gave another continuation than its own full forwards."""
    key = (id(model), tuple(prompt), n)
    if key not in _GREEDY:
        seq = list(prompt)
        with torch.no_grad():
            for _ in range(n):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
        _GREEDY[key] = seq[len(prompt):]
    return _GREEDY[key]


def _batch(prompts):
    """Right-aligned (left-padded) ids and their attention mask."""
    T = max(map(len, prompts))
    ids = torch.zeros(len(prompts), T, dtype=torch.int64)
    mask = torch.zeros(len(prompts), T, dtype=torch.int64)
    for b, p in enumerate(prompts):
        ids[b, T - len(p):] = torch.tensor(p)
        mask[b, T - len(p):] = 1
    return ids, mask


@pytest.mark.parametrize("k", [3, 5])
def test_token_budget_caps_k(pair, k):
    """Far from the position limit the token budget caps K: a step drafts at most
    max_new_tokens - generated - 1 tokens (it emits up to K + 1). The target drafts for itself
    (every draft accepted), so each step's K is exactly min(k, that cap), and the cap binds at
    the last step (max_new_tokens = 7: K = 3 then 2; K = 5 then 0)."""
    target, _ = pair
    new = 7
    ids, mask = _batch(_prompts([5, 9], seed=4))
    eng = SpeculativeEngine(reference_model(target), reference_model(target), k=k, adaptive_k=False)
    out = eng.generate(ids, new, attention_mask=mask)
    for s in out.stats:
        done, want = 0, []
        for e in s.emitted:
            want.append(min(k, new - done - 1))
            done += e
        assert s.ks == want, (s.ks, s.emitted)
        assert done == new and want[-1] < k  # the budget cap bound


SPECS = [dict(k=3), dict(k=5), dict(tree=(3, 2)), dict(tree=(2,)), dict(tree=(2, 2, 2))]


@pytest.mark.parametrize("impl", ["hf", "contiguous", "paged"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s))
def test_rows_reaching_the_position_limit_finish_as_target_only(pair, impl, spec):
    target, draft = pair
    if impl == "hf" and "tree" in spec:
        pytest.skip("tree speculation runs on the reference model")
    new = 20
    prompts = _prompts([LIMIT - new + 1] * 2) + _prompts([LIMIT - new - 6, 100], seed=1)  # 2 rows end AT the limit
    ids, mask = _batch(prompts)
    wrap = (lambda m: m) if impl == "hf" else (lambda m: reference_model(m, cache=impl))
    out = SpeculativeEngine(wrap(target), wrap(draft), adaptive_k=False, **spec).generate(ids, new,
                                                                                          attention_mask=mask)
    for b, p in enumerate(prompts):
        assert out.generated[b] == _greedy(target, p, new), f"row {b}"
    assert sum(s.accepted for s in out.stats) > 0  # the drafts were used


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s))
def test_cap_binds_at_every_depth(pair, spec):
    """Prompts that leave every row 0, 1, 2, ... tokens of room below the limit, so the cache cap
    (not the token budget) cuts K / the tree depth at every step near the end."""
    target, draft = pair
    new = 12
    prompts = _prompts([LIMIT - new + 1 - r for r in range(4)], seed=3)
    ids, mask = _batch(prompts)
    eng = SpeculativeEngine(reference_model(target), reference_model(draft), adaptive_k=False, **spec)
    out = eng.generate(ids, new, attention_mask=mask)
    for b, p in enumerate(prompts):
        assert out.generated[b] == _greedy(target, p, new), f"row {b}"

