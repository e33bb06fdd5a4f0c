"""Closed-form distributions of speculative sampling and a chi-square test.

Everything here is float64 and independent of the package's kernels.
"""
import numpy as np
import torch
from scipy import stats

# Significance of every goodness-of-fit test in this suite. Seeds are fixed, so a
# test either always passes or always fails; 1e-3 keeps a correct kernel's chance
# of a false alarm per test at 0.1%.
ALPHA = 1e-3


def softmax64(logits: torch.Tensor, temperature: float) -> np.ndarray:
    """logits [..., V] (any float dtype, as stored) -> float64 probabilities."""
    x = logits.detach().cpu().double()
    if temperature == 0:
        out = torch.zeros_like(x)
        out.scatter_(-1, x.argmax(-1, keepdim=True), 1.0)
        return out.numpy()
    return torch.softmax(x / temperature, dim=-1).numpy()


def verify_joint(p: np.ndarray, q: np.ndarray | None, draft: np.ndarray) -> np.ndarray:
    """Exact P(num_accepted = k, emitted token = t) for one row.

    p [K+1, V] target probabilities, q [K, V] draft probabilities (None = one-hot at
    the drafts), draft [K] ids. Returns [K+1, V]; row k is the distribution of the
    token emitted at position k given that k drafts were accepted.
    """
    K1, V = p.shape
    K = K1 - 1
    if q is None:
        q = np.zeros((K, V))
        q[np.arange(K), draft] = 1.0
    out = np.zeros((K1, V))
    reach = 1.0
    for k in range(K):
        x = draft[k]
        # accept iff u * q(x) < p(x), u ~ U(0,1)
        a = min(1.0, p[k, x] / q[k, x]) if q[k, x] > 0 else float(p[k, x] > 0)
        resid = np.maximum(p[k] - q[k], 0.0)
        resid = resid / resid.sum() if resid.sum() > 0 else p[k]
        out[k] = reach * (1.0 - a) * resid
        reach *= a
    out[K] = reach * p[K]
    return out


def chi_square_pvalue(counts: np.ndarray, expected_probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < min_expected
    are merged into one cell (and a cell with zero probability but observations
    fails outright)."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    n = counts.sum()
    assert n > 0
    impossible = (probs <= 0) & (counts > 0)
    if impossible.any():
        return 0.0
    exp = probs / probs.sum() * n
    big = exp >= min_expected
    obs_cells = list(counts[big])
    exp_cells = list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        obs_cells.append(counts[~big].sum())
        exp_cells.append(exp[~big].sum())
    if len(obs_cells) < 2:
        return 1.0
    obs_cells, exp_cells = np.array(obs_cells), np.array(exp_cells)
    chi2 = ((obs_cells - exp_cells) ** 2 / exp_cells).sum()
    return float(stats.chi2.sf(chi2, df=len(obs_cells) - 1))


def joint_counts(tokens: torch.Tensor, num_accepted: torch.Tensor, K: int, V: int) -> np.ndarray:
    """Histogram [K+1, V] of (num_accepted, emitted token) over rows."""
    n = num_accepted.cpu().long()
    t = tokens.cpu().long().gather(1, n.view(-1, 1)).view(-1)
    assert (t >= 0).all() and (t < V).all()
    return torch.bincount(n * V + t, minlength=(K + 1) * V).view(K + 1, V).numpy()


def filtered_softmax64(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                       min_p: float = 0.0) -> np.ndarray:
    """The filtered law p' of logits [..., V] in float64, by sorting (independent of the
    kernels' radix passes), in Hugging Face generate's warper order:

    top-k keeps the tokens whose logit is >= the k-th largest (ties kept); top-p, on the
    renormalised top-k survivors, keeps v iff the mass of survivors with a strictly
    higher logit is < top_p; min-p keeps v iff p(v) >= min_p * max p. Renormalised.
    Temperature 0 is the argmax (filters do not apply)."""
    if temperature == 0:
        return softmax64(logits, 0)
    x = logits.detach().cpu().double()
    p = torch.softmax(x / temperature, dim=-1)
    keep = torch.ones_like(p, dtype=torch.bool)
    V = x.shape[-1]
    if 0 < top_k < V:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        keep &= x >= kth
    if top_p < 1.0:
        pk = torch.where(keep, p, torch.zeros_like(p))
        pk = pk / pk.sum(-1, keepdim=True)
        # mass of survivors with a strictly higher logit than v
        higher = (x.unsqueeze(-2) > x.unsqueeze(-1)) & keep.unsqueeze(-2)  # [..., v, u]: l_u > l_v
        above = (higher.double() * pk.unsqueeze(-2)).sum(-1)
        keep &= above < top_p
    if min_p > 0.0:
        keep &= p >= min_p * p.max(-1, keepdim=True).values
    out = torch.where(keep, p, torch.zeros_like(p))
    return (out / out.sum(-1, keepdim=True)).numpy()


def sequence_law(next_probs, prompt, n: int, V: int) -> np.ndarray:
    """Exact law of the first ``n`` generated tokens, flat over V^n (index t1 V^(n-1) + ... + tn).

    next_probs(contexts) -> [len(contexts), V] float64: the target's next-token law after each
    context (a list of token lists: the prompt then the tokens so far), e.g. a bigram table's
    row of the last token or a model's filtered softmax. The chain rule over every prefix of
    positive probability (so a top-k law needs only k + k^2 + ... contexts)."""
    law = {(): 1.0}
    for _ in range(n):
        prefixes = list(law)
        p = np.asarray(next_probs([list(prompt) + list(s) for s in prefixes]), dtype=np.float64)
        law = {s + (int(x),): law[s] * row[x] for s, row in zip(prefixes, p.reshape(len(prefixes), V))
               for x in np.flatnonzero(row > 0)}
    flat = np.zeros(V ** n)
    for s, prob in law.items():
        flat[int(np.ravel_multi_index(s, (V,) * n))] = prob
    return flat


def sequence_counts(generated, n: int, V: int) -> np.ndarray:
    """Counts over V^n of each row's first ``n`` generated tokens (rows of ``generated`` hold >= n)."""
    gen = torch.tensor([g[:n] for g in generated], dtype=torch.int64)
    assert gen.shape[1] == n, "a row stopped before n tokens"
    flat = torch.zeros(gen.shape[0], dtype=torch.int64)
    for i in range(n):
        flat = flat * V + gen[:, i]
    return torch.bincount(flat, minlength=V ** n).numpy()
