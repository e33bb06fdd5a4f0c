"""The draft head (drafter='head', specdec_ext.models.DraftHead): its fast decode path equals
the trained recurrence, the engine's output is target-only's (greedy, token for token) and
follows the target's law at T > 0 (chi-square), its drafts read the right hidden state (the
bundled head's drafts are accepted: a wrong feature makes them useless), and bad arguments
are refused before anything runs."""
import time

import pytest
import torch

from helpers import draws, ragged_prompts, reference_model, tiny_llama
from specdec_ext import SpeculativeEngine, bundled
from specdec_ext.engine import engine as engine_module
from specdec_ext.models import DraftHead, LlamaModel, LlamaSpecModel
from specdec_ext.models.base import SpecModel
from stats_reference import ALPHA, chi_square_pvalue, sequence_counts, sequence_law

transformers = pytest.importorskip("transformers")

V = 97
PROMPTS = ["import os\nimport sys\n", "class Stack:\n    def push(self, x):", "for i in range(10):\n"]


@pytest.fixture(scope="module")
def pair():
    target, _ = bundled.load_pair()
    return target, bundled.load_head(target)


@pytest.fixture(scope="module")
def tiny():
    """(HF tiny Llama, the reference float64 model over its weights, a random head over it)."""
    hf = tiny_llama(64, 2, seed=1)
    ref = reference_model(hf).model
    torch.manual_seed(5)
    head = DraftHead(ref, 32)
    with torch.no_grad():  # small weights: the head drafts about the target's last greedy token again
        for p in head.parameters():
            p.mul_(0.1)
    return hf, ref, head.eval()


def _batch(tok, prompts):
    ids = [tok.encode(p).ids for p in prompts]
    T = max(map(len, ids))
    batch, mask = torch.zeros(len(ids), T, dtype=torch.int64), torch.zeros(len(ids), T, dtype=torch.int64)
    for b, e in enumerate(ids):
        batch[b, T - len(e):], mask[b, T - len(e):] = torch.tensor(e), 1
    return batch, mask


def _count_tree_passes(eng):
    """A list that gets one entry per ``forward_tree`` call of the engine's target."""
    calls = []
    forward_tree = eng.target.forward_tree
    eng.target.forward_tree = lambda *a: (calls.append(1), forward_tree(*a))[1]
    return calls


# ---------------------------------------------------------------- the head itself
def _slow_chain(head, feats, tokens, k):
    """The recurrence as trained (:meth:`DraftHead.step` then :meth:`DraftHead.logits`), each
    draft the argmax over the head's draft vocabulary."""
    out, f, x = [], feats, tokens
    vocab = head.draft_vocab
    with torch.no_grad():
        for _ in range(k):
            f = head.step(f, x)
            logits = head.logits(f)
            x = logits.argmax(-1) if vocab is None else vocab[logits[:, vocab].argmax(-1)]
            out.append(x)
    return torch.stack(out, 1)


def test_bundled_head_loads_and_is_checksummed(pair):
    target, head = pair
    sums = bundled.verify_checksums()
    assert {"head/config.json", "head/head.safetensors", "head/training.json"} <= set(sums)
    assert head.target is target and head.hidden_size == target.config.hidden_size
    assert head.draft_vocab is not None and head.draft_vocab.numel() == 1024
    assert sum(p.numel() for p in head.parameters()) < 0.15 * sum(p.numel() for p in target.parameters())


@pytest.mark.parametrize("k", [0, 1, 4])
def test_fast_path_equals_the_trained_recurrence(pair, k):
    target, head = pair
    torch.manual_seed(0)
    feats = target.model.norm.weight * torch.randn(5, target.config.hidden_size)
    tokens = torch.randint(0, target.vocab_size, (5,))
    out = head.propose(feats, tokens, k)
    assert out.shape == (5, k) and out.dtype == torch.int64
    if k:
        assert torch.equal(out, _slow_chain(head, feats, tokens, k))


def _slow_branches(head, feats, tokens, k, branches):
    """:meth:`DraftHead.propose_branches` by the trained recurrence: branch j starts with the
    (j+1)-th best first draft over the draft vocabulary, then greedy."""
    vocab = head.draft_vocab
    with torch.no_grad():
        f = head.step(feats, tokens)
        logits = head.logits(f)
        firsts = logits.topk(branches, -1).indices if vocab is None else vocab[logits[:, vocab].topk(branches, -1).indices]
    out = []
    for j in range(branches):
        rest = _slow_chain(head, f, firsts[:, j], k - 1) if k > 1 else firsts[:, :0]
        out.append(torch.cat([firsts[:, j:j + 1], rest], 1))
    return torch.stack(out, 1)


@pytest.mark.parametrize("k, branches", [(1, 2), (3, 2), (4, 3)])
def test_branches_equal_the_trained_recurrence(pair, k, branches):
    """Branch j starts with the head's (j+1)-th most likely first draft and goes on greedily;
    branch 0 is propose's chain; the first tokens are distinct."""
    target, head = pair
    torch.manual_seed(1)
    feats = target.model.norm.weight * torch.randn(4, target.config.hidden_size)
    tokens = torch.randint(0, target.vocab_size, (4,))
    out = head.propose_branches(feats, tokens, k, branches)
    assert out.shape == (4, branches, k) and out.dtype == torch.int64
    assert torch.equal(out, _slow_branches(head, feats, tokens, k, branches))
    assert torch.equal(out[:, 0], head.propose(feats, tokens, k))
    assert all(len(set(row)) == branches for row in out[:, :, 0].tolist())


def test_branches_refuse_bad_arguments(pair):
    target, head = pair
    feats, tokens = torch.zeros(2, target.config.hidden_size), torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"branches must be in \[1, 1024\]"):
        head.propose_branches(feats, tokens, 2, 0)
    with pytest.raises(ValueError, match=r"branches must be in \[1, 1024\]"):
        head.propose_branches(feats, tokens, 2, 1025)
    with pytest.raises(ValueError, match="k must be >= 1"):
        head.propose_branches(feats, tokens, 0, 2)


def test_fast_path_follows_a_weight_change(tiny):
    """The token table and packed copies are rebuilt after an in-place change of a weight."""
    _, ref, head = tiny
    head = DraftHead(ref, 32)
    head.load_state_dict(tiny[2].state_dict())
    feats, tokens = torch.randn(3, 64, dtype=torch.float64), torch.tensor([1, 2, 3])
    head.propose(feats, tokens, 2)
    with torch.no_grad():
        head.fc1.weight.mul_(-3.0)
    assert torch.equal(head.propose(feats, tokens, 3), _slow_chain(head, feats, tokens, 3))


def test_propose_refuses_bad_arguments(pair):
    target, head = pair
    H = target.config.hidden_size
    with pytest.raises(ValueError, match="feats must be"):
        head.propose(torch.zeros(2, H + 1), torch.zeros(2, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="tokens must be"):
        head.propose(torch.zeros(2, H), torch.zeros(3, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="k must be"):
        head.propose(torch.zeros(2, H), torch.zeros(2, dtype=torch.int64), -1)
    with pytest.raises(TypeError, match="target must be"):
        DraftHead(torch.nn.Linear(2, 2), 8)


def test_a_head_for_another_model_is_refused(tmp_path, tiny):
    _, ref, head = tiny
    head.save_pretrained(str(tmp_path))
    target, _ = bundled.load_pair()
    with pytest.raises(ValueError, match="hidden_size 64 and vocabulary 97"):
        DraftHead.from_pretrained(str(tmp_path), target)
    again = DraftHead.from_pretrained(str(tmp_path), ref)
    feats, tokens = torch.randn(2, 64, dtype=torch.float64), torch.tensor([4, 9])
    assert torch.equal(again.propose(feats, tokens, 3), _slow_chain(again, feats, tokens, 3))


# ---------------------------------------------------------------- the engine
def test_bundled_greedy_equals_target_only_and_the_head_drafts(pair):
    """Greedy text equals target-only decoding (a ragged batch, one prompt of one token, so
    its row has no feature until its first step), and the head's drafts take steps off
    prompt lookup alone: at least 12% fewer target passes over these prompts (0.65 measured)."""
    target, head = pair
    tok = bundled.load_tokenizer()
    batch, mask = _batch(tok, PROMPTS + ["("])
    plain = SpeculativeEngine(target, None, k=0, adaptive_k=False).generate(batch, 48, attention_mask=mask)
    ngram = SpeculativeEngine(target, None, k=8, adaptive_k=False).generate(batch, 48, attention_mask=mask)
    out = SpeculativeEngine(target, None, k=8, adaptive_k=False, drafter="head", draft_head=head,
                            head_branches=1).generate(batch, 48, attention_mask=mask)
    assert out.generated == plain.generated == ngram.generated
    steps, steps_ngram = sum(s.steps for s in out.stats), sum(s.steps for s in ngram.stats)
    assert steps <= 0.88 * steps_ngram, (steps, steps_ngram)
    assert not target.keep_hidden and target.last_hidden is None  # switched off after the run


def test_head_trees_take_fewer_passes_than_head_chains(pair):
    """Greedy, one prompt at a time: the same text as target-only decoding, and two branches
    at the head's first draft take at least 5% fewer target passes than its chain over these
    prompts (79 -> 73 measured)."""
    target, head = pair
    tok = bundled.load_tokenizer()
    steps = {}
    for branches in (1, 2):
        steps[branches] = 0
        for prompt in ["def fibonacci(n):", PROMPTS[1], "("]:
            ids = torch.tensor([tok.encode(prompt).ids])
            plain = SpeculativeEngine(target, None, k=0).generate(ids, 64)
            out = SpeculativeEngine(target, None, k=16, drafter="head", draft_head=head,
                                    head_branches=branches).generate(ids, 64)
            assert out.generated == plain.generated, (branches, prompt)
            steps[branches] += out.steps
    assert steps[2] <= 0.95 * steps[1], steps


@pytest.mark.parametrize("branches", [1, 2])
def test_the_text_lookup_counts_as_drafting(pair, branches):
    """A head step looks up the row's text before it knows whether the head drafts: that
    lookup is timed in the draft phase, not in ``other`` (the bookkeeping). A lookup slowed
    by 20 ms must show in ``phase_s.draft`` on every step and not in ``phase_s.other``."""
    target, head = pair
    tok = bundled.load_tokenizer()
    ids = torch.tensor([tok.encode("def fibonacci(n):").ids])
    eng = SpeculativeEngine(target, None, k=16, drafter="head", draft_head=head, head_branches=branches)
    propose, delay = eng._propose, 0.02

    def slow_propose(run, head=True):
        time.sleep(delay)
        return propose(run, head=head)
    eng._propose = slow_propose
    out = eng.generate(ids, 24)
    assert out.phase_s.draft >= delay * out.steps, (out.phase_s, out.steps)
    assert out.phase_s.other < delay * out.steps / 2, (out.phase_s, out.steps)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_row_given_no_drafts_in_a_tree_step_tests_none(pair, monkeypatch, temperature):
    """A row whose K is 0 in a head-tree step (its policy's choice) is padded to the step's
    width; it tests no drafts (K 0 in its stats: counting the padding as a rejected draft
    would lower its acceptance estimate for nothing) and emits one token per step, while the
    other row drafts trees; greedy, the text is target-only's."""
    from specdec_ext.engine import run as run_module
    target, head = pair
    tok = bundled.load_tokenizer()
    batch, mask = _batch(tok, ["def fibonacci(n):", "class Stack:\n    def push(self, x):"])
    choose = run_module.Run.choose_ks

    def no_drafts_for_row_1(self, sources=None):
        ks = choose(self, sources)
        return [k if b != 1 else 0 for b, k in enumerate(ks)]
    monkeypatch.setattr(run_module.Run, "choose_ks", no_drafts_for_row_1)
    eng = SpeculativeEngine(target, None, k=8, drafter="head", draft_head=head)
    calls = _count_tree_passes(eng)
    out = eng.generate(batch, 24, attention_mask=mask, temperature=temperature, seed=1)
    assert calls, "the head drafted trees for row 0"
    assert set(out.stats[1].ks) == {0} and set(out.stats[1].emitted) == {1}
    if temperature == 0:
        plain = SpeculativeEngine(target, None, k=0).generate(batch, 24, attention_mask=mask)
        assert out.generated == plain.generated


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
@pytest.mark.parametrize("k", [1, 2, 16])
def test_head_trees_on_either_cache_give_target_only_text(pair, cache, k):
    """Head trees through a contiguous and a paged cache (compact, then rollback), a ragged
    batch, K as small as 1 (a tree then holds two one-node branches): target-only's text."""
    target, head = pair
    tok = bundled.load_tokenizer()
    batch, mask = _batch(tok, PROMPTS + ["("])
    plain = SpeculativeEngine(target, None, k=0).generate(batch, 40, attention_mask=mask)
    out = SpeculativeEngine(LlamaSpecModel(target, cache=cache), None, k=k, drafter="head",
                            draft_head=head).generate(batch, 40, attention_mask=mask)
    assert out.generated == plain.generated


@pytest.mark.parametrize("rows, trees", [(4, True), (5, False)])
def test_head_trees_run_for_small_batches_only(pair, rows, trees):
    """Up to HEAD_TREE_MAX_ROWS rows a step where the head drafts scores a tree; a larger batch
    drafts chains (a tree per row widens the whole batch's pass); the text is target-only's."""
    target, head = pair
    assert engine_module.HEAD_TREE_MAX_ROWS == 4
    tok = bundled.load_tokenizer()
    batch, mask = _batch(tok, (PROMPTS + ["(", "def f(x):"])[:rows])
    eng = SpeculativeEngine(target, None, k=8, drafter="head", draft_head=head)
    calls = _count_tree_passes(eng)
    out = eng.generate(batch, 24, attention_mask=mask)
    plain = SpeculativeEngine(target, None, k=0).generate(batch, 24, attention_mask=mask)
    assert out.generated == plain.generated
    assert bool(calls) == trees


def test_tree_steps_keep_the_emitted_path_and_its_feature(pair):
    """Head trees on the bundled pair (greedy, ragged batch, one row with a one-token prompt):
    after every step each row's cache holds exactly its text minus the newest token, and its
    head feature is the final hidden state of a fresh forward over that text (float32, to
    1e-4); some steps accept a path off the first branch (the cache entries move)."""
    target, head = pair
    tok = bundled.load_tokenizer()
    batch, mask = _batch(tok, PROMPTS + ["("])
    eng = SpeculativeEngine(target, None, k=8, adaptive_k=False, drafter="head", draft_head=head, head_branches=2)
    moved = []
    compact = eng.target.compact
    eng.target.compact = lambda *a: (moved.append(1), compact(*a))[1]
    run = eng._start(batch, 40, 0.0, 0, None, mask, dict(top_k=None, top_p=None, min_p=None))
    sync = engine_module.SyncDebug(False)
    fresh, _ = bundled.load_pair()
    fresh.keep_hidden = True
    checked = 0
    try:
        while any(run.active):
            eng._step(run, sync)
            lengths = eng.target.lengths.tolist()
            for b in range(batch.shape[0]):
                seq = run.prompts[b] + run.generated[b]
                if not run.active[b]:
                    continue
                assert lengths[b] == len(seq) - 1
                fresh(torch.tensor([seq[:-1]]))
                torch.testing.assert_close(run.head_feats[b], fresh.last_hidden[0, -1], rtol=1e-4, atol=1e-4)
                checked += 1
    finally:
        target.keep_hidden = False
        target.last_hidden = None
    assert checked >= 30 and moved, (checked, len(moved))


@pytest.mark.parametrize("branches", [1, 2])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_head_reads_the_hidden_state_that_produced_the_newest_token(tiny, temperature, branches):
    """After the prefill and after every step, each active row's head feature is the target's
    final hidden state at the position that produced the row's newest token: that of a fresh
    forward over the row's text minus that token (float64, to 1e-9). Ragged prompts, one of
    them a single token (no feature until its first step)."""
    hf, ref, head = tiny
    ids, mask = ragged_prompts(vocab=V, seed=4)
    ids[0, :-1], mask[0, :-1] = 0, 0  # row 0: a one-token prompt
    eng = SpeculativeEngine(LlamaSpecModel(ref), None, k=3, adaptive_k=False, drafter="head", draft_head=head,
                            head_branches=branches)
    run = eng._start(ids, 12, temperature, 7, None, mask, dict(top_k=None, top_p=None, min_p=None))
    sync = engine_module.SyncDebug(False)
    fresh_model = reference_model(hf).model  # the same weights; its forwards leave the engine's state alone
    fresh_model.keep_hidden = True
    checked = 0
    try:
        for step in range(6):
            for b in range(ids.shape[0]):
                seq = run.prompts[b] + run.generated[b]
                if not run.active[b] or len(seq) < 2:
                    assert len(seq) >= 2 or not run.head_ok[b]
                    continue
                assert run.head_ok[b]
                fresh_model(torch.tensor([seq[:-1]]))
                fresh = fresh_model.last_hidden[0, -1]
                torch.testing.assert_close(run.head_feats[b], fresh, rtol=1e-9, atol=1e-9)
                checked += 1
            eng._step(run, sync)
    finally:
        LlamaSpecModel(ref).keep_hidden_states(False)
    assert checked >= 12


@pytest.mark.parametrize("k, branches", [(1, 1), (3, 1), (1, 2), (3, 2), (3, 3)])
def test_tiny_greedy_equals_target_only(tiny, k, branches):
    hf, ref, head = tiny
    ids, mask = ragged_prompts(vocab=V, seed=4)
    plain = SpeculativeEngine(LlamaSpecModel(ref), None, k=0).generate(ids, 20, attention_mask=mask)
    out = SpeculativeEngine(LlamaSpecModel(ref), None, k=k, adaptive_k=False, drafter="head",
                            draft_head=head, head_branches=branches).generate(ids, 20, attention_mask=mask)
    assert out.generated == plain.generated


@pytest.mark.parametrize("mode, branches", [("exact", 1), ("block", 1), ("exact", 2), ("block", 3)])
def test_first_three_tokens_follow_the_target_exactly(tiny, mode, branches, monkeypatch):
    """T = 0.8, top_k = 5, 20k rows of a prompt without a repeated token, so the first step
    drafts K = 3 from the head (a chain, or a tree of ``branches`` branches through
    verify_tree): chi-square of the first three tokens (at ALPHA) against the target's
    filtered law chained in float64. Trees are drafted for at most HEAD_TREE_MAX_ROWS rows,
    so here that cap is lifted to the batch (a tree row's law does not depend on the batch),
    and the test checks that the trees were scored."""
    hf, ref, head = tiny
    prompt, n = [5, 17, 42], draws(20_000)

    def next_probs(contexts):
        with torch.no_grad():
            logits = hf(torch.tensor(contexts)).logits[:, -1].double() / 0.8
        kth = logits.topk(5, -1).values[:, -1:]
        return torch.softmax(logits.masked_fill(logits < kth, float("-inf")), -1).numpy()

    law = sequence_law(next_probs, prompt, 3, V)
    monkeypatch.setattr(engine_module, "HEAD_TREE_MAX_ROWS", n)
    eng = SpeculativeEngine(LlamaSpecModel(ref), None, k=3, adaptive_k=False, drafter="head", draft_head=head,
                            verify_mode=mode, head_branches=branches)
    calls = _count_tree_passes(eng)
    out = eng.generate(torch.tensor([prompt]).repeat(n, 1), 4, temperature=0.8, top_k=5, seed=3)
    assert bool(calls) == (branches > 1), "trees are scored exactly when the head branches"
    assert {s.ks[0] for s in out.stats} == {3}, "the first step drafted 3 head tokens in every row"
    acc = sum(s.accepted for s in out.stats) / max(1, sum(s.drafted for s in out.stats))
    assert 0.0 < acc < 1.0
    assert chi_square_pvalue(sequence_counts(out.generated, 3, V), law) > ALPHA


def test_engine_refuses_bad_head_arguments(pair, tiny):
    target, head = pair
    _, ref, tiny_head = tiny
    with pytest.raises(ValueError, match="needs draft_head"):
        SpeculativeEngine(target, None, drafter="head")
    with pytest.raises(ValueError, match="takes no draft model"):
        SpeculativeEngine(target, bundled.load_pair()[1], drafter="head", draft_head=head)
    with pytest.raises(ValueError, match="draft_head= drafts for drafter='head'"):
        SpeculativeEngine(target, None, draft_head=head)
    with pytest.raises(TypeError, match="draft_head must be"):
        SpeculativeEngine(target, None, drafter="head", draft_head=object())
    with pytest.raises(ValueError, match="another model"):
        SpeculativeEngine(target, None, drafter="head", draft_head=tiny_head)
    hf_target = bundled.load_pair(implementation="hf", check=False)[0]
    with pytest.raises(ValueError, match="does not expose"):
        SpeculativeEngine(hf_target, None, drafter="head", draft_head=head)
    with pytest.raises(ValueError, match="head_branches must be"):
        SpeculativeEngine(target, None, drafter="head", draft_head=head, head_branches=0)

    class NoTrees(LlamaSpecModel):
        forward_tree = SpecModel.forward_tree

    with pytest.raises(ValueError, match="head_branches=2 drafts trees, which NoTrees cannot score"):
        SpeculativeEngine(NoTrees(target), None, drafter="head", draft_head=head)
    assert SpeculativeEngine(NoTrees(target), None, drafter="head", draft_head=head, head_branches=1).head is head


def test_head_steps_do_not_feed_the_draft_model_cost(pair, monkeypatch):
    """The head (and its text lookup) is not the draft model: with a measured cost model
    (``step_costs`` not frozen) neither head-chain nor head-tree steps record a draft-model
    step time, which would price the model's drafts by the head's."""
    from specdec_ext.engine.adaptive_k import StepCosts
    target, head = pair
    tok = bundled.load_tokenizer()
    ids = torch.tensor([tok.encode("def fibonacci(n):").ids])
    recorded = []
    monkeypatch.setattr(StepCosts, "add_draft", lambda self, s: recorded.append(s))
    for branches in (1, 2):
        out = SpeculativeEngine(target, None, k=16, drafter="head", draft_head=head, head_branches=branches,
                                step_costs=StepCosts()).generate(ids, 24)
        assert out.draft_steps > 0
    assert recorded == []


def test_more_branches_than_draft_tokens_are_refused(tiny):
    """head_branches distinct first drafts need as many tokens in the head's draft vocabulary:
    refused at construction, and at generate when the vocabulary shrank since."""
    _, ref, head = tiny
    try:
        head.set_draft_vocab(torch.tensor([3, 4]))
        with pytest.raises(ValueError, match="head_branches=3 exceeds the head's draft vocabulary of 2 tokens"):
            SpeculativeEngine(LlamaSpecModel(ref), None, drafter="head", draft_head=head, head_branches=3)
        eng = SpeculativeEngine(LlamaSpecModel(ref), None, drafter="head", draft_head=head, head_branches=2)
        head.set_draft_vocab(torch.tensor([3]))
        with pytest.raises(ValueError, match="head_branches=2 exceeds the head's draft vocabulary of 1 tokens"):
            eng.generate(torch.tensor([[5, 17, 42]]), 4)
    finally:
        head.set_draft_vocab(None)


def test_hidden_states_are_released_after_a_failed_run(pair):
    target, head = pair
    eng = SpeculativeEngine(target, None, k=3, drafter="head", draft_head=head)
    with pytest.raises(ValueError):
        eng.generate(torch.tensor([[1, 2, 99999]]), 4)
    assert not target.keep_hidden
    eng.generate(torch.tensor([[1, 2, 3]]), 4)
    assert not target.keep_hidden and target.last_hidden is None


def test_head_drafts_per_row_without_a_match(pair):
    """Rows with a prompt-lookup match draft from the text, the others from the head
    (source 'head'), in one step."""
    target, head = pair
    eng = SpeculativeEngine(target, None, k=4, adaptive_k=False, drafter="head", draft_head=head)
    ids = torch.tensor([[7, 8, 9, 7], [10, 11, 12, 13]])  # row 0: "7" occurred before
    run = eng._start(ids, 8, 0.0, 0, None, None, dict(top_k=None, top_p=None, min_p=None))
    props, sources = eng._propose(run)
    target.keep_hidden = False
    assert props[0][:3] == [8, 9, 7] and sources[0].startswith("ngram")
    assert len(props[1]) == min(4, engine_module.HEAD_DRAFTS) and sources[1] == engine_module.HEAD_SOURCE


def test_coupled_mode_gives_target_only_sampling_with_head_drafts(pair):
    """verify_mode='coupled': the text at T = 1 equals target-only sampling with the same seed,
    token for token, with the head drafting (and in fewer target passes)."""
    target, head = pair
    tok = bundled.load_tokenizer()
    ids = torch.tensor([tok.encode(PROMPTS[1]).ids])
    ref = SpeculativeEngine(target, None, k=0, verify_mode="coupled").generate(ids, 40, temperature=1.0, seed=5)
    out = SpeculativeEngine(target, None, k=8, drafter="head", draft_head=head, verify_mode="coupled").generate(
        ids, 40, temperature=1.0, seed=5)
    assert out.generated == ref.generated
    assert out.steps < ref.steps
