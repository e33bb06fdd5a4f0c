"""Closed-form distributions of speculative sampling and a chi-square test.

Everything here is float64 and independent of the package's kernels. ALPHA, the level of
every chi-square check in the suite, is corrected (Bonferroni) for the number of checks, so
that a full run rejects a correct kernel with chance at most SUITE_FALSE_ALARM; the count is
kept honest by law_checks() (each test's checks, from its source) and its two guards: each
check counted against its test's law_checks() as it runs, and the suite's total against
N_LAW_CHECKS (test_sampling_exactness.py).
"""
import ast
import functools
import inspect
import os
import sys
import textwrap

import numpy as np
import torch
from scipy import stats

#: The chance that one full run of the suite (every collected item: CPU, CUDA and SIMT)
#: rejects a correct kernel in at least one chi-square check. Seeds are fixed, so a given
#: commit either always passes or always fails; but a change of random streams (a new seed
#: rule, a new kernel schedule) redraws every check at once, and then this is the chance
#: that a correct change turns the suite red.
SUITE_FALSE_ALARM = 0.01

#: An upper bound on the chi-square checks of one full run: the sum of law_checks() over
#: every collected test item (each parametrised case and device counted, the CUDA and SIMT
#: ones included; the power checks, which expect a rejection, counted too). Counted
#: 2026-12-03 by count_suite_law_checks(): 376 (320 before the laws over several tiles), so
#: 400 leaves room for a few new law tests; test_sampling_exactness.py fails, naming the
#: count, once the suite outgrows it. Tests that use another statistic (scipy directly) are
#: outside this count: use chi_square_pvalue.
N_LAW_CHECKS = 400

#: Significance of every chi-square check in this suite: Bonferroni, so that the union
#: bound keeps the whole run's false-alarm chance at SUITE_FALSE_ALARM.
ALPHA = SUITE_FALSE_ALARM / N_LAW_CHECKS


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
    _record_check()
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
        # mass of survivors with a strictly higher logit than v: the exclusive prefix sum in
        # descending logit order, taken at the first token of v's run of equal logits
        xs, order = torch.sort(x, dim=-1, descending=True, stable=True)
        ps = pk.gather(-1, order)
        exclusive = torch.cumsum(ps, -1) - ps
        pos = torch.arange(V).expand_as(xs)
        new_run = torch.ones_like(xs, dtype=torch.bool)
        new_run[..., 1:] = xs[..., 1:] != xs[..., :-1]
        run_start = torch.where(new_run, pos, torch.zeros_like(pos)).cummax(-1).values
        above = torch.empty_like(pk).scatter_(-1, order, exclusive.gather(-1, run_start))
        keep &= above < top_p
    if min_p > 0.0:
        keep &= p >= min_p * p.max(-1, keepdim=True).values
    out = torch.where(keep, p, torch.zeros_like(p))
    return (out / out.sum(-1, keepdim=True)).numpy()


#: the stride of tiled_logits' likely tokens: prime, so that they are distinct at any V it
#: does not divide, and they land in every 128-token tile of the vocabulary
TILE_STRIDE = 37


def tiled_logits(rows: int, V: int, seed: int, hot: int = 40, scale: float = 1.0) -> torch.Tensor:
    """Logits [rows, V] float32 (CPU) for filtered laws over a vocabulary of several 128-token
    tiles (the CUDA kernels' race tiles, the CPU's blocks): ``hot`` likely tokens at indices
    5 + TILE_STRIDE * j (mod V), so spread over every tile, with N(0, scale^2) logits (each
    row its own), the other tokens N(-6, 0.25) (a thin tail, about 1 % of the mass at T = 1).
    Each row's most likely token is its last likely token (the one in the highest tile).
    Top-k, top-p and min-p then keep a few tens of tokens, in many tiles, so a chi-square over
    V cells has the mass concentrated; a filter's threshold taken within one tile (or a
    survivor lost in a tile's compaction) changes the law."""
    assert V % TILE_STRIDE != 0 and hot <= V
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 0.5 - 6.0
    values = torch.randn(rows, hot, generator=g) * scale
    idx = hot_tokens(V, hot)
    last = int(idx.argmax())
    top = values.argmax(-1)
    swapped = values.gather(1, top[:, None])
    values.scatter_(1, top[:, None], values[:, last:last + 1].clone())
    values[:, last:last + 1] = swapped
    logits[:, idx] = values
    return logits


def hot_tokens(V: int, hot: int = 40) -> torch.Tensor:
    """The likely tokens [hot] int64 of tiled_logits."""
    return (torch.arange(hot) * TILE_STRIDE + 5) % V


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


# ---- the count behind ALPHA ---------------------------------------------------------------------

#: Test functions (and helpers) whose chi-square checks sit in a loop, where law_checks()
#: cannot count them from the source: "module.qualname" -> checks per call.
REPEATED_CHECKS = {
    "test_compat_vllm.test_emitted_law_matches_the_filtered_target_law": 3,   # 3 request types
    "test_sampling_gpu.test_coupled_and_ragged_laws": 4,                      # coupled + 3 draft counts
    "test_verify_block.test_law_filters_and_ragged_rows": 4,                  # 3 draft counts + 1 power
    "test_sampling_filters.test_per_row_filters_mix": 4,                      # 4 row groups
    "test_sampling_filters.test_power_unfiltered_q_with_filtered_drafts_is_detected": 2,  # right q, wrong q
    "test_sampling_filters.test_ragged_num_drafts_joint_law": 4,              # num_drafts 0..3
    "test_sampling_filters.test_ragged_rows_mix_greedy_one_hot_and_dense": 2,  # 2 draft counts
}

_SUITE_DIR = os.path.dirname(os.path.abspath(__file__))


class LawCountError(AssertionError):
    """The chi-square checks of a test do not match the count ALPHA is corrected for."""



def bigram_law_pvalue(generated, table: torch.Tensor, temperature: float, prompt, n: int = 3) -> float:
    """The chi-square p-value of the first n generated tokens of every row against the exact
    law of a bigram target (``table`` [V, V] logits, next-token law softmax(table[last] / T))
    after ``prompt``: the emitted-law check of the model-free drafters' tests."""
    V = table.shape[0]
    p = torch.softmax(table.double() / temperature, -1).numpy()
    law = sequence_law(lambda contexts: p[[c[-1] for c in contexts]], prompt, n, V)
    return chi_square_pvalue(sequence_counts(generated, n, V), law)

def _in_suite(fn) -> bool:
    try:
        return os.path.dirname(os.path.abspath(inspect.getsourcefile(fn))) == _SUITE_DIR
    except TypeError:  # a builtin, a C function
        return False


def _callee_checks(func: ast.expr, namespace: dict) -> int:
    """The checks of one call, from the called expression: a name of this suite's namespace,
    or an attribute of one of its modules (``stats_reference.chi_square_pvalue``)."""
    if isinstance(func, ast.Name):
        obj = namespace.get(func.id)
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        obj = getattr(namespace.get(func.value.id), func.attr, None)
    else:  # a method of a value (gpu.one_schedule().verify_tree): not a law helper
        return 0
    return law_checks(obj) if inspect.isfunction(obj) else 0


_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@functools.lru_cache(maxsize=None)
def law_checks(fn) -> int:
    """The chi-square checks one call of the function ``fn`` makes, counted from its source:
    a call of chi_square_pvalue counts 1, a call of another function of this suite counts
    that function's checks (so helpers such as tree_law_pvalue count where they are used),
    both branches of an ``if`` count. A counted call inside a loop or comprehension needs
    the function's entry in REPEATED_CHECKS (raises LawCountError naming it otherwise)."""
    fn = inspect.unwrap(fn)
    if fn is chi_square_pvalue:
        return 1
    key = f"{fn.__module__}.{fn.__qualname__}"
    if key in REPEATED_CHECKS:
        return REPEATED_CHECKS[key]
    if not _in_suite(fn):
        return 0
    total = 0

    def visit(node, in_loop):
        nonlocal total
        if isinstance(node, ast.Call):
            n = _callee_checks(node.func, fn.__globals__)
            if n and in_loop:
                raise LawCountError(f"{key} makes chi-square checks in a loop: state how many a call makes "
                                    "in stats_reference.REPEATED_CHECKS")
            total += n
        for child in ast.iter_child_nodes(node):
            visit(child, in_loop or isinstance(node, _LOOPS))

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except SyntaxError:  # a lambda inside an expression (its source line is no statement): by the names it calls
        return sum(law_checks(obj) for obj in map(fn.__globals__.get, fn.__code__.co_names) if inspect.isfunction(obj))
    visit(tree, False)
    return total


def _item_function(nodeid: str):
    """The test function of a pytest node id (``path/test_x.py::Class::test_y[params]``),
    from the imported test module (this suite imports test modules by their base name)."""
    path, *names = nodeid.split("::")
    obj = sys.modules.get(os.path.splitext(os.path.basename(path))[0])
    for name in names:
        obj = getattr(obj, name.split("[", 1)[0], None)
    return obj


_CURRENT = {"nodeid": None, "checks": 0}


def _record_check():
    """Counts the chi-square checks of the running test (pytest's PYTEST_CURRENT_TEST) and
    fails the check that goes beyond law_checks() of the test's function: the count behind
    N_LAW_CHECKS is then wrong (a loop missing from REPEATED_CHECKS, or a stale entry)."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if current is None:
        return
    nodeid = current.rsplit(" (", 1)[0]
    if nodeid != _CURRENT["nodeid"]:
        _CURRENT.update(nodeid=nodeid, checks=0)
    _CURRENT["checks"] += 1
    fn = _item_function(nodeid)
    if fn is None:
        return
    allowed = law_checks(fn)
    if _CURRENT["checks"] > allowed:
        raise LawCountError(f"{nodeid} made {_CURRENT['checks']} chi-square checks, law_checks() counts {allowed} "
                            "for it: fix stats_reference.REPEATED_CHECKS (and N_LAW_CHECKS)")


def law_test_files() -> list:
    """This suite's test files that can make chi-square checks: those that import
    stats_reference, or import a module of the suite that does (transitively)."""
    names = [f[:-3] for f in sorted(os.listdir(_SUITE_DIR)) if f.endswith(".py")]
    text = {n: open(os.path.join(_SUITE_DIR, n + ".py")).read() for n in names}
    law = {"stats_reference"}
    grew = True
    while grew:
        grew = False
        for n in names:
            if n not in law and any(f"import {m}" in text[n] or f"from {m} import" in text[n] for m in law):
                law.add(n)
                grew = True
    return [os.path.join(_SUITE_DIR, n + ".py") for n in names if n in law and n.startswith("test_")]


def suite_law_checks(items) -> int:
    """Sum of law_checks() over collected pytest items (each parametrised case, each device)."""
    return sum(law_checks(item.function) for item in items if getattr(item, "function", None) is not None)


def count_suite_law_checks() -> int:
    """suite_law_checks() over every item of law_test_files(), collected by a nested pytest
    session in this process (the modules imported once serve both) without marker selection:
    the CUDA and SIMT items count too (a GPU machine runs them). Raises AssertionError when the
    collection fails."""
    import pytest

    class Count:
        total, error = None, None

        def pytest_collection_finish(self, session):
            try:
                Count.total = suite_law_checks(session.items)
            except LawCountError as e:  # a loop without its REPEATED_CHECKS entry: say which
                Count.error = e

    rc = pytest.main(["--collect-only", "-qq", "-p", "no:cacheprovider", "-p", "no:faulthandler", *law_test_files()],
                     plugins=[Count()])
    if Count.error is not None:
        raise Count.error
    assert rc == 0 and Count.total is not None, f"collecting the law tests failed (pytest exit code {rc})"
    return Count.total
