"""Filter cases that sit exactly on a boundary, where a wrong comparison (<= for <, > for >=),
a greedy shortcut or a skipped tile changes the result, so that such a change in
csrc/core/filter_math.h or the kernels fails a test here (the scalar reference shares the
cutoff function, so these compare with float64 sort-based oracles instead:
stats_reference.filtered_softmax64, or a value worked out by hand). Each case runs on the
CPU kernels (``device``) and on the CUDA kernels (``gpu``: emulated everywhere)."""
import numpy as np
import pytest
import torch

import specdec_ext
from helpers import draws
from stats_reference import ALPHA, chi_square_pvalue, filtered_softmax64

# dyadic probabilities: their logs round-trip through exp((l - max) / 1) exactly in float32,
# so the boundary masses below are exact
DYADIC = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])


def _rows(t, n):
    return t.unsqueeze(0).expand(n, *t.shape).contiguous()


def _ops(backend):
    """(sample, verify, to) of a device name (public ops) or a gpu fixture."""
    if isinstance(backend, str):
        return specdec_ext.sample, specdec_ext.verify, lambda t: None if t is None else t.to(backend)
    return backend.sample, backend.verify, lambda t: backend.to(t)


def top_p_mass_on_the_boundary(backend, n):
    """sample(log([.5, .25, .25]), T = 1, top_p = 0.5) is always token 0, as in Hugging Face:
    tokens 1 and 2 have exactly 0.5 of strictly higher mass, which is not < 0.5."""
    sample, _, to = _ops(backend)
    tokens = sample(to(_rows(torch.tensor([0.5, 0.25, 0.25]).log(), n)), 1.0, top_p=0.5, seed=3).cpu()
    assert tokens.tolist() == [0] * n


# (filter, the kept tokens of DYADIC worked out by hand, exact tie): exp(l - max) is exactly 1,
# .5, .25, .125, .125, so the mass above each token is exact; on an exact tie (a mass or a
# probability equal to the filter value) the float64 oracle, fed float32 logs, cannot decide
DYADIC_CASES = [
    (dict(top_p=0.5), [0], True),           # token 1: 0.5 above, not < 0.5
    (dict(top_p=0.5001), [0, 1], False),
    (dict(top_p=0.75), [0, 1], True),
    (dict(top_p=0.875), [0, 1, 2], True),   # tokens 3, 4 (tied): 0.875 above each
    (dict(top_p=0.8751), [0, 1, 2, 3, 4], False),  # neither of 3, 4 is strictly above the other
    (dict(min_p=0.125), [0, 1, 2, 3, 4], True),  # p(v) == min_p * max p: kept
    (dict(min_p=float(np.nextafter(np.float32(0.125), np.float32(1.0)))), [0, 1, 2], True),
    (dict(min_p=0.25), [0, 1, 2], True),
    (dict(top_k=2, top_p=0.6), [0], False),  # top-p on the renormalised top-k: 2/3 above token 1
    (dict(top_k=3), [0, 1, 2], False),
    (dict(top_k=4), [0, 1, 2, 3, 4], False),  # the 4th largest ties the 5th: both kept
]


def dyadic_cutoffs(backend):
    """probs_out's support at exact mass boundaries equals the hand-worked kept set (which the
    float64 sort-based oracle agrees with away from exact ties)."""
    sample, _, to = _ops(backend)
    logits = DYADIC.log()
    for filt, kept, _ in DYADIC_CASES:
        probs = to(torch.full((1, 5), -1.0))
        sample(to(logits[None]), 1.0, seed=1, probs_out=probs, **filt)
        assert [v for v in range(5) if float(probs[0, v]) > 0] == kept, filt


def test_the_hand_worked_boundaries_agree_with_the_oracle():
    """Where no exact tie decides, the float64 sort-based oracle gives the hand-worked sets."""
    for filt, kept, tie in DYADIC_CASES:
        if not tie:
            oracle = filtered_softmax64(DYADIC.double().log()[None], 1.0, **filt)[0] > 0
            assert [v for v in range(5) if oracle[v]] == kept, filt


def tiny_temperature_is_not_greedy(backend, n):
    """T = 1e-7 with logits [1, nextafter(1, 0)]: (l1 - l0) / T = -0.596, so token 1 has
    probability e^-0.596 / (1 + e^-0.596) = 0.3553; treating a tiny T as greedy would always
    give token 0. Chi-square at ALPHA."""
    sample, _, to = _ops(backend)
    x = torch.tensor([1.0, float(np.nextafter(np.float32(1.0), np.float32(0.0)))])
    z = float(np.float32(np.float32(x[1]) - np.float32(x[0])) * np.float32(1e7))
    p1 = np.exp(z) / (1 + np.exp(z))
    assert abs(p1 - 0.3553) < 1e-3
    tokens = sample(to(_rows(x, n)), 1e-7, seed=5).cpu()
    assert chi_square_pvalue(np.bincount(tokens.numpy(), minlength=2), np.array([1 - p1, p1])) > ALPHA


def nan_in_q_outside_the_kept_set(backend):
    """V = 512, top_k = 5 with every survivor in the first 128-token tile, a dense q with a NaN
    at token 300 and a draft outside the kept set: the draft is rejected, the whole q row of
    the rejected position is read, so the row is invalid (as documented), even though no
    survivor lies in token 300's tile; the same row without the NaN is valid."""
    _, verify, to = _ops(backend)
    V = 512
    logits = torch.full((2, 2, V), -5.0)
    logits[:, :, :5] = torch.tensor([3.0, 2.5, 2.0, 1.5, 1.0])
    q = torch.full((2, 1, V), 1.0 / V)
    q[0, 0, 300] = float("nan")
    draft = torch.full((2, 1), 400)  # p'(400) = 0
    res = verify(to(logits), to(draft), to(q), 1.0, top_k=5, seed=2)
    assert res.valid.cpu().tolist() == [False, True]


@pytest.mark.parametrize("case", ["top_p", "dyadic", "tiny_t", "nan_q"])
def test_filter_boundaries_cpu(device, case):
    {"top_p": lambda: top_p_mass_on_the_boundary(device, 4000), "dyadic": lambda: dyadic_cutoffs(device),
     "tiny_t": lambda: tiny_temperature_is_not_greedy(device, draws(20_000)),
     "nan_q": lambda: nan_in_q_outside_the_kept_set(device)}[case]()


@pytest.mark.parametrize("case", ["top_p", "dyadic", "tiny_t", "nan_q"])
def test_filter_boundaries_gpu(gpu, case):
    one = gpu.one_schedule()
    {"top_p": lambda: top_p_mass_on_the_boundary(gpu, gpu.size(4000, 300)),
     "dyadic": lambda: dyadic_cutoffs(gpu),
     "tiny_t": lambda: tiny_temperature_is_not_greedy(one, gpu.size(20_000, 2000)),
     "nan_q": lambda: nan_in_q_outside_the_kept_set(gpu)}[case]()


def test_verify_keeps_ties_at_the_top_k_boundary(device):
    """Logits 3, 2, 2, 2, 1, 0 and top_k = 2: the three tied 2s survive; drafts sitting on a tied
    boundary token are tested against the filtered law (chi-square of (num_accepted, token)
    against the closed form with the sort-based p')."""
    from stats_reference import joint_counts, verify_joint

    n, T = draws(60_000), 1.0
    row = torch.tensor([1.0, 2.0, 3.0, 2.0, 0.0, 2.0]).log1p()
    logits = torch.stack([row, row.flip(0)])            # [K+1 = 2, V = 6]
    p = filtered_softmax64(logits, T, top_k=2)
    assert ((p > 0).sum(1) == 4).all()
    q = torch.tensor([[0.1, 0.3, 0.1, 0.4, 0.0, 0.1]])  # q' of the draft: a tied boundary token drawn
    draft = torch.tensor([3])
    res = specdec_ext.verify(_rows(logits, n).to(device), _rows(draft, n).to(device), _rows(q, n).to(device), T,
                             top_k=2, seed=4)
    assert 0.2 < res.num_accepted.float().mean().item() < 0.95  # the acceptance path is exercised
    expected = verify_joint(p, q.double().numpy(), draft.numpy())
    assert chi_square_pvalue(joint_counts(res.tokens.cpu(), res.num_accepted.cpu(), 1, 6), expected) > ALPHA
