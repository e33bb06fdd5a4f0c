"""The engine's pure host pieces: commit of a verified step, the RNG key layout, K
clipping. Plain lists in, plain values out: no model, no op."""
import pytest

from specdec_ext.engine.commit import RowCommit, commit_row, commit_step
from specdec_ext.engine.rng_keys import StepKeys

NO_EOS = frozenset()


def test_partial_acceptance_keeps_the_accepted_prefix():
    # K = 4, two drafts accepted, correction 9: emits [d1, d2, 9]
    c = commit_row([5, 6, 9, -1, -1], 2, 4, [3], num_generated=0, max_new_tokens=100, eos=NO_EOS)
    assert c == RowCommit(emitted=[5, 6, 9], accepted=2, tested=4, kept_target=3, kept_draft=1 + 2,
                          draft_pending=[9], done=False)


def test_full_acceptance_leaves_two_pending_tokens():
    # K = 3 all accepted + bonus 8: the draft never processed d3, so [d3, bonus] are pending
    c = commit_row([1, 2, 3, 8], 3, 3, [7], num_generated=0, max_new_tokens=100, eos=NO_EOS)
    assert c.emitted == [1, 2, 3, 8] and c.kept_target == 4
    assert c.kept_draft == 1 + 2 and c.draft_pending == [3, 8]


def test_k0_appends_to_pending():
    c = commit_row([4], 0, 0, [1, 2], num_generated=5, max_new_tokens=100, eos=NO_EOS)
    assert c.emitted == [4] and c.kept_target == 1 and c.kept_draft == 0 and c.draft_pending == [1, 2, 4]


def test_eos_cuts_and_finishes():
    c = commit_row([5, 0, 9, 7], 3, 3, [3], num_generated=0, max_new_tokens=100, eos=frozenset({0}))
    assert c.emitted == [5, 0] and c.done and c.kept_target == 2
    assert c.accepted == 3  # verify's count, before the cut (stats count what verify accepted)


def test_budget_cuts_and_finishes():
    c = commit_row([5, 6, 7, 8], 3, 3, [3], num_generated=8, max_new_tokens=10, eos=NO_EOS)
    assert c.emitted == [5, 6] and c.done and c.kept_target == 2 and c.kept_draft == 1 + 1
    assert c.draft_pending == [6]


def test_exactly_reaching_the_budget_is_done():
    c = commit_row([5, 6], 1, 1, [3], num_generated=8, max_new_tokens=10, eos=NO_EOS)
    assert c.emitted == [5, 6] and c.done


def test_commit_step_skips_finished_rows():
    rows = [[5, 6, 1], [7, -1, 0]]  # tokens [K+1 = 2], num_accepted (valid flags are not read)
    out = commit_step(rows, 1, [True, False], [[1], [2]], [0, 4], 10, NO_EOS)
    assert out[1] is None and out[0].emitted == [5, 6]


@pytest.mark.parametrize("k_max", [0, 1, 5])
def test_step_keys_never_reuse_an_offset(k_max):
    keys = StepKeys(k_max)
    draft = [keys.draft(s, i) for s in range(50) for i in range(k_max)]
    assert len(set(draft)) == len(draft)
    assert [keys.verify(s) for s in range(50)] == list(range(50))
