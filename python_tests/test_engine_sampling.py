"""The engine's production sampling (issue 9, part 4): top-k / top-p / min-p filters and
per-row seeds in generate(), coupled verification (the text equals target-only sampling with
the same seed, whatever K, the draft, adaptive K or the batch), per-row K (verify's
``num_drafts``), the CLI flags, and bad values refused before anything runs."""
import numpy as np
import pytest
import torch

import cli_runner
from helpers import assert_cache_matches_prefill, draws, near_copy, ragged_prompts, reference_model, tiny_llama
import specdec_ext
from specdec_ext import SpecDecMetrics, SpeculativeEngine
from specdec_ext.engine import phases
from specdec_ext.engine.adaptive_k import StepCosts
from specdec_ext.models.base import SpecModel
from stats_reference import ALPHA, chi_square_pvalue, sequence_counts, sequence_law
from table_models import BigramModel

transformers = pytest.importorskip("transformers")

V = 97
ROW_SEEDS = torch.tensor([11, 22, 33])       # per-row seeds of the ragged batch
FILTERS = dict(temperature=1.0, top_p=0.9)   # the coupled tests' sampling law
CHEAP_DRAFT = StepCosts(draft_guess=0.05, target_guess=1.0, frozen=True)


@pytest.fixture(scope="module")
def llamas():
    """HF tiny Llamas: the target, a near copy (good draft) and an unrelated one (bad draft)."""
    target = tiny_llama(64, 2, seed=1)
    return dict(target=target, good=near_copy(target, 1e-3, seed=2), bad=tiny_llama(32, 1, seed=9))


def _wrap(model, impl):
    """The HF model as is (the engine wraps it), or the package's reference model."""
    return model if impl == "hf" else reference_model(model)


def _coupled(target, draft, k, adaptive, ids, mask, seed, max_new, **sampling):
    eng = SpeculativeEngine(target, draft, k=k, adaptive_k=adaptive, verify_mode="coupled", step_costs=CHEAP_DRAFT)
    return eng.generate(ids, max_new, attention_mask=mask, seed=seed, **sampling)


# ---------------------------------------------------------------- coupled mode
@pytest.fixture(scope="module")
def target_only(llamas):
    """impl -> (ragged batch output, B = 1 output) of target-only coupled sampling (k = 0)."""
    ids, mask = ragged_prompts()
    out = {}
    for impl in ("hf", "reference"):
        t = _wrap(llamas["target"], impl)
        out[impl] = (_coupled(t, None, 0, False, ids, mask, ROW_SEEDS, 16, **FILTERS).generated,
                     _coupled(t, None, 0, False, ids[:1], None, 5, 24, **FILTERS).generated)
    return out


def test_target_only_coupled_is_plain_sampling_keyed_by_position(llamas, target_only):
    """k = 0 in coupled mode is the documented loop: the token at absolute position P of
    row b is sample(logits, seed=seed[b], offset=P), each row alone (not its batch)."""
    ids, mask = ragged_prompts()
    model = llamas["target"]
    for b in range(3):
        seq = ids[b][mask[b].bool()].tolist()
        for _ in range(16):
            logits = model(torch.tensor([seq])).logits[:, -1]
            seq.append(int(specdec_ext.sample(logits, 1.0, top_p=0.9, seed=ROW_SEEDS[b:b + 1], offset=len(seq))))
        assert target_only["hf"][0][b] == seq[-16:]
    assert target_only["reference"] == target_only["hf"]


@pytest.mark.parametrize("impl", ["hf", "reference"])
def test_plain_decoding_is_one_text_in_both_modes(llamas, target_only, impl):
    """k = 0 (no drafts) in exact mode draws the same position-keyed samples as in coupled mode:
    "target-only sampling with this seed" is one text, equal to the hand-written sample loop
    (test above) and to coupled speculation at any K (tests below); ragged batch with per-row
    seeds and B = 1 with an int seed."""
    t = _wrap(llamas["target"], impl)
    ids, mask = ragged_prompts()
    exact = SpeculativeEngine(t, None, k=0, adaptive_k=False)  # verify_mode="exact", the default
    assert exact.generate(ids, 16, attention_mask=mask, seed=ROW_SEEDS, **FILTERS).generated == target_only[impl][0]
    assert exact.generate(ids[:1], 24, seed=5, **FILTERS).generated == target_only[impl][1]


@pytest.mark.parametrize("impl", ["hf", "reference"])
@pytest.mark.parametrize("which", ["good", "bad"])
@pytest.mark.parametrize("k,adaptive", [(1, False), (3, False), (5, False), (5, "cost")])
def test_coupled_output_equals_target_only_sampling(llamas, target_only, impl, which, k, adaptive):
    """T = 1, top-p 0.9: the engine's text is target-only sampling with the same seed,
    token for token, for a ragged batch (per-row seeds) and for B = 1 (an int seed)."""
    target, draft = _wrap(llamas["target"], impl), _wrap(llamas[which], impl)
    ids, mask = ragged_prompts()
    out = _coupled(target, draft, k, adaptive, ids, mask, ROW_SEEDS, 16, **FILTERS)
    assert out.generated == target_only[impl][0]
    one = _coupled(target, draft, k, adaptive, ids[:1], None, 5, 24, **FILTERS)
    assert one.generated == target_only[impl][1]
    accepted = sum(s.accepted for s in out.stats + one.stats)
    rejected = sum(s.rejections for s in out.stats + one.stats)
    if which == "good":
        assert accepted > rejected       # the shared noise makes a close draft agree
    else:
        assert rejected > 0              # the bad draft's mistakes were corrected


def test_coupled_with_per_row_laws_and_any_batch_makeup(llamas):
    """Per-row temperature and filters (a greedy row among them): coupled speculation with
    k = 3 equals target-only; with per-row seeds, each row alone gives the same text."""
    target, draft = reference_model(llamas["target"]), reference_model(llamas["good"])
    ids, mask = ragged_prompts()
    law = dict(temperature=torch.tensor([1.0, 0.0, 0.7]), top_k=torch.tensor([0, 5, 10]),
               top_p=torch.tensor([0.9, 1.0, 0.8]), min_p=torch.tensor([0.0, 0.0, 0.05]))
    base = _coupled(target, None, 0, False, ids, mask, ROW_SEEDS, 12, **law).generated
    assert _coupled(target, draft, 3, False, ids, mask, ROW_SEEDS, 12, **law).generated == base
    for b in range(3):
        row = ids[b][mask[b].bool()].view(1, -1)
        alone = _coupled(target, draft, 3, "cost", row, None, ROW_SEEDS[b:b + 1], 12,
                         **{n: v[b:b + 1] for n, v in law.items()})
        assert alone.generated[0] == base[b]


def test_exact_mode_text_depends_on_k(llamas):
    """Power check of the coupled tests: in exact mode the same seed gives another text at
    another K (so equality above is a property of coupled mode, not of the seeds)."""
    target, draft = reference_model(llamas["target"]), reference_model(llamas["good"])
    ids, mask = ragged_prompts()
    texts = [SpeculativeEngine(target, draft, k=k, adaptive_k=False).generate(
        ids, 16, attention_mask=mask, seed=ROW_SEEDS, **FILTERS).generated for k in (0, 3)]
    assert texts[0] != texts[1]


# ---------------------------------------------------------------- HF agreement
PROMPT = [5, 17, 42]
N = draws(20_000)


def _hf_law(model, temperature, top_k, top_p, n=3):
    """P(first n tokens) [V^n] of HF generate(do_sample=True, ...) after PROMPT: the softmax
    of HF's own warpers (temperature, top-k, top-p) applied in float64, chained over every
    prefix of positive probability."""
    warp = transformers.LogitsProcessorList([transformers.TemperatureLogitsWarper(temperature),
                                             transformers.TopKLogitsWarper(top_k),
                                             transformers.TopPLogitsWarper(top_p)])

    def next_probs(contexts):
        ids = torch.tensor(contexts)
        with torch.no_grad():
            return torch.softmax(warp(ids, model(ids).logits[:, -1].double()), -1).numpy()

    return sequence_law(next_probs, PROMPT, n, V)


def _pvalue(generated, law, n=3):
    return chi_square_pvalue(sequence_counts(generated, n, V), law)


@pytest.fixture(scope="module")
def hf_law(llamas):
    return _hf_law(llamas["target"], 0.8, 5, 0.9)


def test_hf_generate_samples_the_reference_law(llamas, hf_law):
    """The closed form below is HF generate's law: its own samples pass the test."""
    torch.manual_seed(0)
    ids = torch.tensor([PROMPT]).expand(N, -1)
    out = llamas["target"].generate(ids, do_sample=True, max_new_tokens=3, temperature=0.8, top_k=5, top_p=0.9,
                                    pad_token_id=0)
    assert _pvalue(out[:, len(PROMPT):].tolist(), hf_law) > ALPHA


@pytest.mark.parametrize("mode", ["exact", "coupled", "block"])
def test_first_three_tokens_follow_hf_generate_with_top_k_top_p(llamas, hf_law, mode):
    """The engine at T = 0.8, top_k = 5, top_p = 0.9 (20k rows, K = 3, a draft that is
    sometimes rejected, 4 new tokens so the first step drafts all 3): chi-square of the
    first three tokens against HF's law."""
    draft = reference_model(near_copy(llamas["target"], 0.05, seed=3))
    eng = SpeculativeEngine(reference_model(llamas["target"]), draft, k=3, adaptive_k=False, verify_mode=mode)
    out = eng.generate(torch.tensor([PROMPT]).expand(N, -1), 4, temperature=0.8, top_k=5, top_p=0.9, seed=17)
    assert {s.ks[0] for s in out.stats} == {3}, "the first step drafted 3 tokens in every row"
    assert _pvalue(out.generated, hf_law) > ALPHA
    acc = sum(s.accepted for s in out.stats) / sum(s.drafted for s in out.stats)
    assert 0.0 < acc < 1.0


def test_the_law_test_detects_unfiltered_sampling(llamas, hf_law):
    """Power check: the engine without the filters fails the same test."""
    eng = SpeculativeEngine(reference_model(llamas["target"]), reference_model(llamas["good"]), k=3,
                            adaptive_k=False)
    out = eng.generate(torch.tensor([PROMPT]).expand(N, -1), 4, temperature=0.8, seed=17)
    assert _pvalue(out.generated, hf_law) < ALPHA


# ---------------------------------------------------------------- per-row K
class RowMux(SpecModel):
    """A draft that answers row b with ``models[choice[b]]``. Every model runs the whole
    batch (so each keeps a full cache to check); row b's logits come from its own."""

    def __init__(self, models, choice):
        self.models, self.choice = models, torch.tensor(choice)
        self.vocab_size, self.device = models[0].vocab_size, models[0].device
        self.max_positions = models[0].max_positions

    def reset(self, batch_size, max_len):
        for m in self.models:
            m.reset(batch_size, max_len)

    def reserve(self, row_lengths):
        for m in self.models:
            m.reserve(row_lengths)

    def forward(self, input_ids):
        logits = torch.stack([m.forward(input_ids) for m in self.models])   # [M, B, S, V]
        return logits[self.choice, torch.arange(input_ids.shape[0])]

    def rollback(self, num_appended, num_kept):
        for m in self.models:
            m.rollback(num_appended, num_kept)


@pytest.fixture
def verify_spy(monkeypatch):
    """Every num_drafts the engine passes to verify (None = K for every row)."""
    seen = []

    def spy(*args, **kwargs):
        nd = kwargs.get("num_drafts")
        seen.append(None if nd is None else nd.tolist())
        return specdec_ext.verify(*args, **kwargs)

    monkeypatch.setattr(phases, "verify", spy)
    return seen


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("temperature,mode", [(0.0, "exact"), (1.0, "exact"), (1.0, "coupled"), (1.0, "block")])
def test_rows_with_different_k(llamas, verify_spy, cache, temperature, mode):
    """Rows 0 and 2 draft with a near copy, row 1 with an unrelated model. Exact T = 1: each
    row's own K (adaptive, cheap draft) differs and verify gets a ragged num_drafts. Greedy
    and coupled rows (text independent of K) share one K and test every draft of the step;
    their text equals target-only. Every cache equals a fresh prefill afterwards."""
    hf = [llamas["good"], llamas["bad"]]
    subs = [reference_model(m, cache) for m in hf]
    target = reference_model(llamas["target"], cache)
    eng = SpeculativeEngine(target, RowMux(subs, [0, 1, 0]), k=4, adaptive_k="cost", step_costs=CHEAP_DRAFT,
                            verify_mode=mode)
    ids, mask = ragged_prompts()
    law = dict(temperature=temperature, top_k=20, top_p=0.95)
    out = eng.generate(ids, 40, attention_mask=mask, seed=ROW_SEEDS, **law)
    mean_k = [np.mean(s.ks) for s in out.stats]
    shared = temperature == 0.0 or mode == "coupled"
    if not shared:
        ragged = [nd for nd in verify_spy if nd is not None and nd[1] < min(nd[0], nd[2])]
        assert len(ragged) >= 3, verify_spy
        assert mean_k[1] < min(mean_k[0], mean_k[2]), mean_k   # the bad row drafts less
    else:  # one K per step for every row, apart from steps where a row's budget clips it
        steps = min(len(st.ks) for st in out.stats)
        unclipped = [i for i in range(steps) if all(40 - sum(st.emitted[:i]) - 1 >= 4 for st in out.stats)]
        assert len(unclipped) >= 5
        assert all(len({st.ks[i] for st in out.stats}) == 1 for i in unclipped), [st.ks for st in out.stats]
    if shared:
        plain = SpeculativeEngine(reference_model(llamas["target"]), None, k=0, verify_mode=mode)
        assert out.generated == plain.generate(ids, 40, attention_mask=mask, seed=ROW_SEEDS, **law).generated
    seqs = [ids[b][mask[b].bool()].tolist() + out.generated[b] for b in range(3)]
    assert_cache_matches_prefill(eng.target, llamas["target"], seqs, (1,))
    for sub, model in zip(subs, hf):   # pending: 1, 2 after a full acceptance, more after K = 0 steps
        assert_cache_matches_prefill(sub, model, seqs, range(1, 41))


def test_finished_rows_get_no_drafts_and_are_not_counted(verify_spy):
    """Row 0 emits EOS (0) at once, row 1 never: from then on verify tests no draft of
    row 0, and its stats and the metrics count only its one step."""
    nxt = [0, 0, 3, 4, 5, 2]
    table = torch.full((6, 6), -10.0)
    table[torch.arange(6), torch.tensor(nxt)] = 0.0
    target, draft = BigramModel(table), BigramModel(table)
    metrics = SpecDecMetrics()
    eng = SpeculativeEngine(target, draft, k=3, adaptive_k=False, metrics=metrics)
    out = eng.generate(torch.tensor([[1], [2]]), 13, eos_token_id=0)
    assert out.generated[0] == [0] and len(out.generated[1]) == 13
    assert verify_spy[0] is None and all(nd == [0, 3] for nd in verify_spy[1:-1]), verify_spy
    assert (out.stats[0].steps, out.stats[0].drafted) == (1, 3)
    drafted = metrics.registry.get_sample_value("speculative_tokens_drafted_total", {"engine": "default"})
    assert drafted == sum(s.drafted for s in out.stats)
    assert target.history(0) == [1]


def test_catch_up_pads_a_row_by_at_most_one_chunk():
    """Row 0 holds 4 tokens and has 1 pending, row 1 has 5 pending, 7 positions each: fed
    in chunks of 2, row 0 never exceeds 5 + 2 (one padded forward of width 5 would hold 9),
    and each row gets the logits of its last pending token."""
    t = torch.randn(6, 6)
    m = BigramModel(t)
    m.reset(2, 7)
    m.forward(torch.tensor([[1, 2, 3, 4], [1, 1, 1, 1]]))
    m.rollback(4, torch.tensor([4, 0]))
    logits = phases.catch_up(m, [[5], [1, 2, 3, 4, 0]], 2, lambda x: x)   # BigramModel asserts no overflow
    assert m.lengths.tolist() == [5, 5] and m.history(1) == [1, 2, 3, 4, 0]
    assert torch.equal(logits, t[[5, 0]])


# ---------------------------------------------------------------- bad values
@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(top_k=-1), ValueError, r"top_k must be an int >= 0"),
    (dict(top_k=2.5), TypeError, r"top_k must be an int"),
    (dict(top_p=0.0), ValueError, r"top_p must be a float in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be a float in \(0, 1\]"),
    (dict(top_p="0.9"), TypeError, r"top_p must be a float"),
    (dict(min_p=1.0), ValueError, r"min_p must be a float in \[0, 1\)"),
    (dict(top_p=torch.tensor([0.9])), ValueError, r"top_p must be a number or a tensor \[B\] = \[2\]"),
    (dict(top_k=torch.tensor([1.0, 2.0])), TypeError, r"top_k must be an integer tensor"),
    (dict(min_p=torch.tensor([0, 1])), TypeError, r"min_p must be a floating tensor"),
    (dict(top_p=torch.tensor([0.9, 0.0])), ValueError, r"top_p must be a float in \(0, 1\].*at row 1"),
    (dict(seed=1.5), TypeError, r"seed must be an int"),
    (dict(seed=torch.tensor([1, 2], dtype=torch.int32)), TypeError, r"seed must be None, an int or an int64"),
    (dict(seed=torch.tensor([1, 2, 3])), ValueError, r"seed must be an int or a tensor \[B\] = \[2\]"),
])
def test_bad_sampling_arguments_fail_before_any_forward(kwargs, exc, msg):
    t = torch.randn(6, 6)
    target, draft = BigramModel(t), BigramModel(t)
    with pytest.raises(exc, match=msg):
        SpeculativeEngine(target, draft, k=2).generate(torch.tensor([[1], [2]]), 5, temperature=1.0, **kwargs)
    assert target.calls == draft.calls == 0


@pytest.mark.parametrize("mode", ["fast", "", "Exact", 1])
def test_bad_verify_mode(mode):
    t = torch.randn(6, 6)
    with pytest.raises(ValueError, match=r"verify_mode must be one of \('exact', 'coupled', 'block'\)"):
        SpeculativeEngine(BigramModel(t), BigramModel(t), verify_mode=mode)


def test_default_verify_mode_is_block_for_chains_and_exact_for_trees():
    """verify_mode=None: block verification for chain speculation (same law, never fewer
    accepted drafts in expectation), token-wise where block has no rule (trees, suffix trees,
    a vocabulary-parallel target)."""
    from specdec_ext.engine import SuffixConfig
    from specdec_ext.engine.engine import default_verify_mode

    t = torch.randn(6, 6)
    assert SpeculativeEngine(BigramModel(t), BigramModel(t)).verify_mode == "block"
    assert SpeculativeEngine(BigramModel(t), None).verify_mode == "block"
    assert SpeculativeEngine(BigramModel(t), BigramModel(t), verify_mode="exact").verify_mode == "exact"
    assert default_verify_mode((2, 2), None, BigramModel(t)) == "exact"
    assert default_verify_mode(None, SuffixConfig(tree=True), BigramModel(t)) == "exact"
    assert default_verify_mode(None, SuffixConfig(), BigramModel(t)) == "block"

    class Sharded:
        vocab_shard = object()

    assert default_verify_mode(None, None, Sharded()) == "exact"


# ---------------------------------------------------------------- CLI
def _cli(*args):
    r = cli_runner.run(["-m", "specdec_ext.generate", *args], timeout=300)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("args,msg", [
    (["--top-k", "-1"], "argument --top-k: top_k must be an int >= 0"),
    (["--top-k", "1.5"], "argument --top-k: expected an integer, got '1.5'"),
    (["--top-p", "0"], "argument --top-p: top_p must be a float in (0, 1]"),
    (["--min-p", "1"], "argument --min-p: min_p must be a float in [0, 1)"),
    (["--min-p", "x"], "argument --min-p: expected a number, got 'x'"),
])
def test_cli_bad_filters_print_one_line(args, msg):
    rc, _, err = _cli("--prompt", "x", *args)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_cli_coupled_text_does_not_depend_on_k():
    common = ["--prompt", "def f(x):", "--max-new-tokens", "24", "--no-progress", "--no-baseline", "--drafter",
              "model", "--temperature", "1", "--top-k", "40", "--top-p", "0.9", "--coupled", "--seed", "3"]
    texts = []
    for extra in (["--k", "0", "--fixed-k"], ["--k", "4", "--fixed-k"], []):
        rc, out, err = _cli(*common, *extra)
        assert rc == 0, err
        texts.append(out.rsplit("\nacceptance", 1)[0])
    assert texts[0] == texts[1] == texts[2]
