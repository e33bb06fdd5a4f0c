"""specdec_ext.compat.vllm: the rejection sampler with vLLM v1's shape.

The cases of vLLM's own tests (tests/v1/sample/test_rejection_sampler.py in
vllm-project/vllm: greedy matches and mismatches, deterministic-when-seeded, the
approximates-the-target test, top-k / top-p masks) re-expressed through the shim as our own
tests, called as vLLM's tests call its sampler: ``RejectionSampler(Mock(spec=Sampler))``
whose mock returns the bonus tokens, metadata from ``SpecDecodeMetadata.make_dummy`` with
``target_logits_indices = arange(rows)`` and an empty ``bonus_logits_indices``, logits with
the draft rows only, ``rs(metadata, draft_probs=..., logits=..., sampling_metadata=...)``.
The expected tokens are vLLM's facts, the code is ours. The greedy cases also run through
vLLM <= 0.11's runner call (target rows gathered, bonus sampled outside) and through this
package's own form (the bonus drawn by verify from the bonus logits row).
Plus: vLLM's model runner calls by release (its dummy sampler runs, its ``_sample``), the
constructor / forward / ``SpecDecodeMetadata`` signatures of each release and the refusal of
others, chi-square laws of the emitted tokens (ALPHA of stats_reference, fixed seeds, cells
with expected count >= 5), equality with a direct ``specdec_ext.verify(..., num_drafts=)``
call, the "off" values and greedy rule, min_p on verified tokens, invalid rows, argument
errors (a shape that disagrees with the metadata is a ValueError naming the argument and
leaves nothing changed), and one op call with no host sync.
"""
import contextlib
from unittest.mock import Mock

import numpy as np
import pytest
import torch

import specdec_ext
from helpers import CountingOps, draws
import specdec_ext.ops.sampling as sampling_ops
from specdec_ext.compat.vllm import (PLACEHOLDER_TOKEN_ID, LogprobsTensors, RejectionSampler, SamplerOutput,
                                     SamplingMetadata, SpecDecodeMetadata)
from stats_reference import ALPHA, chi_square_pvalue, filtered_softmax64, verify_joint

P = PLACEHOLDER_TOKEN_ID


def _greedy_logits(spec_tokens, output_tokens, V=100):
    """Logits [num_tokens + B, V] in the runner's layout (request i's draft rows, then its
    bonus row) whose argmax at request i's position j is output_tokens[i][j]; the last entry
    of output_tokens[i] is its bonus row's argmax."""
    rows = []
    for spec, out in zip(spec_tokens, output_tokens):
        assert len(out) == len(spec) + 1
        for t in out:
            row = torch.full((V,), -100.0)
            row[t] = 100.0
            rows.append(row)
    return torch.stack(rows)


def _greedy_meta(B, flavour):
    """Every way vLLM says "greedy": all_greedy (temperature None), or per-row temperature 0
    (its input batch), -1 (older GREEDY_TEMPERATURE) or below _SAMPLING_EPS = 1e-5."""
    if flavour == "all_greedy":
        return SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    value = {"temperature_0": 0.0, "temperature_minus_1": -1.0, "temperature_below_eps": 9e-6}[flavour]
    return SamplingMetadata(temperature=torch.full((B,), value), all_greedy=False, all_random=False)


GREEDY_FLAVOURS = ["all_greedy", "temperature_0", "temperature_minus_1", "temperature_below_eps"]


# ------------------------------------------------------------ vLLM's calls, as its tests and runner make them
class Sampler(torch.nn.Module):
    """A stand-in for vLLM's v1 ``Sampler`` with its constructor and forward keywords: the
    bonus is each row's argmax, [B, 1] int32 as vLLM's; it records each call."""

    def __init__(self, logprobs_mode="raw_logprobs"):
        super().__init__()
        self.logprobs_mode = logprobs_mode
        self.calls = []

    def forward(self, logits, sampling_metadata, predict_bonus_token=False, logprobs_mode_override=None):
        self.calls.append(dict(logits=logits.clone(), sampling_metadata=sampling_metadata,
                               predict_bonus_token=predict_bonus_token))
        return SamplerOutput(sampled_token_ids=logits.argmax(-1, keepdim=True).to(torch.int32))


def vllm_rejection_sampler():
    """vLLM's test fixture: ``RejectionSampler(Mock(spec=Sampler))``, the mock's
    logprobs_mode set to raw_logprobs."""
    mock_sampler = Mock(spec=Sampler)
    mock_sampler.logprobs_mode = "raw_logprobs"
    return RejectionSampler(mock_sampler)


def mock_bonus(rs, bonus_token_ids):
    """vLLM's ``mock_sampler_output``: the mocked sampler returns these bonus tokens."""
    rs.sampler.return_value = SamplerOutput(sampled_token_ids=bonus_token_ids, logprobs_tensors=None)


def vllm_metadata(spec_tokens, logits):
    """vLLM's ``create_spec_decode_metadata``: make_dummy, then every logits row is a target
    row and the bonus indices are empty (the bonus is mocked)."""
    md = SpecDecodeMetadata.make_dummy(spec_tokens, device=logits.device)
    md.target_logits_indices = torch.arange(logits.shape[0])
    md.bonus_logits_indices = torch.empty(0, dtype=torch.int32)
    return md


def _draft_row_logits(output_tokens, V=100):
    """vLLM's ``create_logits_tensor``: only the draft rows (every token but the bonus)."""
    rows = [t for out in output_tokens for t in out[:-1]]
    logits = torch.full((len(rows), V), -100.0)
    logits[torch.arange(len(rows)), torch.tensor(rows, dtype=torch.int64)] = 100.0
    return logits


GREEDY_WAYS = ["vllm_0_12_mocked_sampler", "vllm_0_11_runner", "native"]


def _greedy_call(way, spec, out, sm):
    """Case (spec, out) through one of the three calls; returns sampled_token_ids."""
    if way == "vllm_0_12_mocked_sampler":
        rs = vllm_rejection_sampler()
        logits = _draft_row_logits(out)
        md = vllm_metadata(spec, logits)
        mock_bonus(rs, torch.tensor([o[-1] for o in out], device=logits.device))
        res = rs(md, draft_probs=None, logits=logits, sampling_metadata=sm)
        assert isinstance(res, SamplerOutput) and res.logprobs_tensors is None and res.valid.all()
        return res.sampled_token_ids
    md = SpecDecodeMetadata.from_draft_token_ids(spec)
    logits = _greedy_logits(spec, out)
    if way == "vllm_0_11_runner":
        # its _sample: the bonus sampled from logits[bonus_logits_indices] ([B, 1] int32), the
        # target rows gathered, then rejection_sampler(metadata, None, target_logits, bonus, sm)
        bonus = logits[md.bonus_logits_indices.long()].argmax(-1, keepdim=True).to(torch.int32)
        res = RejectionSampler()(md, None, logits[md.target_logits_indices.long()], bonus, sm)
        assert isinstance(res, torch.Tensor)
        return res
    res = RejectionSampler()(md, None, logits, sm)
    assert isinstance(res, SamplerOutput) and res.logprobs_tensors is None and res.valid.all()
    return res.sampled_token_ids

# (spec_tokens, output_tokens = the target's argmax per position + the bonus, expected): vLLM's cases
GREEDY_CASES = {
    "perfect_match": ([[1, 2, 3]], [[1, 2, 3, 4]], [[1, 2, 3, 4]]),
    "early_mismatch": ([[1, 2, 3]], [[1, 5, 3, 4]], [[1, 5, P, P]]),
    "multiple_sequences": ([[1, 2], [3]], [[1, 2, 5], [3, 4]], [[1, 2, 5], [3, 4, P]]),
    "single_token_sequence": ([[1]], [[1, 2]], [[1, 2]]),
    "empty_sequence": ([[]], [[5]], [[5]]),
    "multiple_mismatches": ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7, 6], [4, 8, 6, 9]], [[1, 2, 7, P], [4, 8, P, P]]),
    "param_perfect_match_with_bonus": ([[1, 2]], [[1, 2, 3]], [[1, 2, 3]]),
    "param_first_mismatch": ([[1]], [[2, 3]], [[2, P]]),
    "param_mixed_matches": ([[1, 2], [3, 4]], [[1, 5, 6], [3, 4, 7]], [[1, 5, P], [3, 4, 7]]),
}


@pytest.mark.parametrize("way", GREEDY_WAYS)
@pytest.mark.parametrize("flavour", GREEDY_FLAVOURS)
@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_cases(case, flavour, way):
    spec, out, expected = GREEDY_CASES[case]
    got = _greedy_call(way, spec, out, _greedy_meta(len(spec), flavour))
    assert got.dtype == torch.int32
    assert got.tolist() == expected


def test_greedy_ignores_draft_probs_and_filters():
    """Greedy rows are the argmax whatever q and the filters say (vLLM: argmax of the target)."""
    spec, out, expected = GREEDY_CASES["multiple_mismatches"]
    md = SpecDecodeMetadata.from_draft_token_ids(spec)
    q = torch.softmax(torch.randn(6, 100, generator=torch.Generator().manual_seed(0)), -1)
    sm = SamplingMetadata(temperature=torch.zeros(2), all_greedy=False, all_random=False,
                          top_k=torch.tensor([1, 3]), top_p=torch.tensor([0.1, 0.5]), min_p=torch.tensor([0.9, 0.5]))
    assert RejectionSampler()(md, q, _greedy_logits(spec, out), sm).sampled_token_ids.tolist() == expected


def test_runner_layout_example():
    """vLLM's GPU model runner comment: num_draft_tokens [3, 0, 2, 0, 1] give
    target_logits_indices [0, 1, 2, 5, 6, 9] and bonus_logits_indices [3, 4, 7, 8, 10]."""
    md = SpecDecodeMetadata.from_draft_token_ids([[11, 12, 13], [], [14, 15], [], [16]])
    assert md.num_draft_tokens == [3, 0, 2, 0, 1] and md.max_spec_len == 3
    assert md.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert md.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert md.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert md.draft_token_ids.dtype == torch.int32 and md.draft_token_ids.tolist() == [11, 12, 13, 14, 15, 16]


def test_logits_rows_are_read_through_the_indices():
    """The sampler reads logits only through target / bonus_logits_indices: any row order
    (here shuffled, with unused rows) gives the same tokens."""
    spec = [[1, 2, 3], [], [4, 5], [6]]
    out = [[1, 2, 9, 7], [8], [4, 5, 3], [2, 6]]
    md = SpecDecodeMetadata.from_draft_token_ids(spec)
    logits = _greedy_logits(spec, out)
    expected = RejectionSampler()(md, None, logits, _greedy_meta(4, "all_greedy")).sampled_token_ids
    assert expected.tolist() == [[1, 2, 9, P], [8, P, P, P], [4, 5, 3, P], [2, P, P, P]]
    n = logits.shape[0]
    perm = torch.randperm(n + 5, generator=torch.Generator().manual_seed(1))  # new row r holds old row perm[r]
    shuffled = torch.randn(n + 5, logits.shape[1])
    where = torch.empty(n + 5, dtype=torch.int64)
    where[perm] = torch.arange(n + 5)
    keep = perm < n
    shuffled[keep] = logits[perm[keep]]
    md.target_logits_indices = where[md.target_logits_indices.long()].to(torch.int32)
    md.bonus_logits_indices = where[md.bonus_logits_indices.long()]  # int64 indices are fine too
    got = RejectionSampler()(md, None, shuffled, _greedy_meta(4, "all_greedy")).sampled_token_ids
    assert torch.equal(got, expected)


def test_max_spec_len_may_exceed_the_longest_draft():
    """A fixed output width (e.g. for a captured graph): extra columns are placeholders."""
    spec, out, expected = GREEDY_CASES["multiple_sequences"]
    md = SpecDecodeMetadata.from_draft_token_ids(spec)
    md.max_spec_len = 4
    got = RejectionSampler()(md, None, _greedy_logits(spec, out), _greedy_meta(2, "temperature_0"))
    assert got.sampled_token_ids.tolist() == [row + [P] * 2 for row in expected]
    md = SpecDecodeMetadata.from_draft_token_ids([[], []])
    md.max_spec_len = 2
    got = RejectionSampler()(md, None, _greedy_logits([[], []], [[3], [4]]), _greedy_meta(2, "all_greedy"))
    assert got.sampled_token_ids.tolist() == [[3, P, P], [4, P, P]]


# ------------------------------------------------------------ vLLM's signatures, release by release
def _dummy_sampling_metadata(num_reqs, V):
    """vLLM's _dummy_sampler_run metadata: temperature 0.5, top_p 0.9, top_k V - 1."""
    full = lambda v: torch.full((num_reqs,), v)  # noqa: E731
    return SamplingMetadata(temperature=full(0.5), all_greedy=False, all_random=False, top_p=full(0.9),
                            top_k=full(V - 1), generators={}, max_num_logprobs=None)


def test_vllm_0_11_dummy_sampler_run():
    """vLLM <= 0.11's profiling call: RejectionSampler(), make_dummy([[0]] * num_reqs),
    target_logits [num_tokens, V], bonus_token_ids zeros [num_reqs] int32, the 5 arguments
    positionally; the result is the [B, max_spec_len + 1] int32 tensor."""
    num_reqs, V = 5, 40
    md = SpecDecodeMetadata.make_dummy([[0] for _ in range(num_reqs)], torch.device("cpu"))
    torch.manual_seed(0)
    target_logits = torch.randn(num_reqs, V)
    bonus_token_ids = torch.zeros(num_reqs, dtype=torch.int32)
    out = RejectionSampler()(md, None, target_logits, bonus_token_ids, _dummy_sampling_metadata(num_reqs, V))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.int32 and out.shape == (num_reqs, 2)
    assert ((out[:, 0] >= 0) & (out[:, 0] < V)).all()
    accepted = out[:, 0] == 0  # the draft is token 0: then the bonus (0) follows, else the placeholder
    assert torch.equal(out[:, 1], torch.where(accepted, 0, P).to(torch.int32))


@pytest.mark.parametrize("ctor", ["0.12: (sampler)", "0.20: (sampler, spec_config, device)",
                                  "0.20: keywords"])
def test_vllm_0_12_dummy_sampler_run(ctor):
    """vLLM >= 0.12's profiling call on each release's constructor: make_dummy (every index
    0), logits [num_tokens + num_reqs, V], forward(metadata, None, logits, sm) positionally;
    the sampler is called for the bonus as vLLM calls it."""
    num_reqs, V = 4, 30
    sampler = Sampler()
    rs = {"0.12: (sampler)": lambda: RejectionSampler(sampler),
          "0.20: (sampler, spec_config, device)": lambda: RejectionSampler(sampler, None, torch.device("cpu")),
          "0.20: keywords": lambda: RejectionSampler(sampler, spec_config=object(), device="cpu")}[ctor]()
    md = SpecDecodeMetadata.make_dummy([[0] for _ in range(num_reqs)], torch.device("cpu"))
    torch.manual_seed(1)
    logits = torch.randn(2 * num_reqs, V)
    out = rs(md, None, logits, _dummy_sampling_metadata(num_reqs, V))
    assert isinstance(out, SamplerOutput) and out.sampled_token_ids.shape == (num_reqs, 2)
    assert out.valid.all()
    (call,) = sampler.calls
    assert torch.equal(call["logits"], logits[[0] * num_reqs]) and call["predict_bonus_token"] is True
    bonus = int(logits[0].argmax())  # every request's bonus row is row 0
    emitted_bonus = out.sampled_token_ids[:, 0] == 0
    assert torch.equal(out.sampled_token_ids[emitted_bonus, 1], torch.full((int(emitted_bonus.sum()),), bonus,
                                                                          dtype=torch.int32))


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_vllm_runner_sample_with_a_sampler_equals_the_native_bonus(mode):
    """vLLM >= 0.12's runner (_sample): rejection_sampler(metadata, None | draft_probs,
    logits [num_tokens + B, V], sm) with a real sampler. The sampler gets
    logits[bonus_logits_indices] and a sampling metadata without logprobs; a greedy batch
    (the stand-in's argmax bonus = verify's) gives the tokens AND the LogprobsTensors of the
    native call (the bonus position's logprobs are its logits row's); the logprobs mode is
    the sampler's."""
    md, q, logits = _random_step(8, 3, 40, seed=13, ragged=True)
    tgt = md.target_logits_indices.long()
    md.draft_token_ids = logits[tgt].argmax(-1).to(torch.int32)  # every draft is accepted ...
    md.draft_token_ids[::3] = (md.draft_token_ids[::3] + 1) % 40  # ... but these
    B = 8
    sm = SamplingMetadata(temperature=torch.zeros(B), all_greedy=False, all_random=False, max_num_logprobs=3)
    sampler = Sampler(logprobs_mode=mode)
    rs = RejectionSampler(sampler)
    assert rs.logprobs_mode == mode
    got = rs(md, q, logits, sm)
    want = RejectionSampler(logprobs_mode=mode)(md, q, logits, sm)
    assert torch.equal(got.sampled_token_ids, want.sampled_token_ids) and got.valid.all()
    n = torch.tensor(md.num_draft_tokens)
    emitted = (got.sampled_token_ids != P).sum(1)
    assert (emitted == n + 1).any() and (emitted < n + 1).any()  # bonus emitted in some rows, not all
    for name in LogprobsTensors._fields:
        torch.testing.assert_close(getattr(got.logprobs_tensors, name), getattr(want.logprobs_tensors, name),
                                   atol=0, rtol=0, equal_nan=True, msg=name)
    (call,) = sampler.calls
    assert torch.equal(call["logits"], logits[md.bonus_logits_indices.long()])
    assert call["sampling_metadata"].max_num_logprobs is None and sm.max_num_logprobs == 3
    assert call["predict_bonus_token"] is True


@pytest.mark.parametrize("way", ["vllm_0_11", "vllm_0_12_mocked_sampler"])
def test_external_bonus_equals_a_one_hot_bonus_row(way):
    """A bonus token from outside (vLLM <= 0.11's bonus_token_ids, or the sampler's) in a
    random batch with filters gives exactly the native call's tokens on logits whose bonus
    rows are one-hot at those tokens (same seeds): the drafts are tested against the same
    rows, and the bonus is emitted exactly when every draft is accepted."""
    md, q, logits, seeds = _seeded_step(B=12, K=3, V=30, seed=8)
    B = 12
    g = torch.Generator().manual_seed(3)
    bonus = torch.randint(0, 30, (B, 1), generator=g)
    sm = SamplingMetadata(temperature=torch.rand(B, generator=g) + 0.5, all_greedy=False, all_random=True,
                          top_k=torch.tensor([0, 7, 30] * 4), top_p=torch.full((B,), 0.95))
    one_hot = logits.clone()
    rows = md.bonus_logits_indices.long()
    one_hot[rows] = float("-inf")
    one_hot[rows, bonus.view(-1)] = 0.0
    want = RejectionSampler()(md, q, one_hot, sm, seed=seeds, offset=2).sampled_token_ids
    if way == "vllm_0_11":
        got = RejectionSampler()(md, q, logits[md.target_logits_indices.long()], bonus.to(torch.int32), sm,
                                 seed=seeds, offset=2)
    else:
        rs = vllm_rejection_sampler()
        mock_bonus(rs, bonus)
        got = rs(md, draft_probs=q, logits=logits, sampling_metadata=sm, seed=seeds, offset=2).sampled_token_ids
    assert torch.equal(got, want)
    n = torch.tensor(md.num_draft_tokens)
    full = (got != P).sum(1) == n + 1
    assert full.any()
    assert torch.equal(got[torch.arange(B), n][full].long(), bonus.view(-1)[full])


def test_constructors_of_each_release():
    """RejectionSampler() (<= 0.11), (sampler) (0.12 - 0.15), (sampler, spec_config=None,
    device=None) (0.20 - 0.33), as vLLM's tests build it (Mock(spec=Sampler)); the logprobs
    mode is the sampler's unless given by keyword."""
    assert RejectionSampler().sampler is None and RejectionSampler().logprobs_mode == "raw_logprobs"
    mock_sampler = Mock(spec=Sampler)
    mock_sampler.logprobs_mode = "processed_logprobs"
    for rs in (RejectionSampler(mock_sampler), RejectionSampler(mock_sampler, None, None),
               RejectionSampler(mock_sampler, spec_config=None, device=torch.device("cpu"))):
        assert rs.sampler is mock_sampler and rs.logprobs_mode == "processed_logprobs"
    assert RejectionSampler(mock_sampler, logprobs_mode="raw_logprobs").logprobs_mode == "raw_logprobs"
    assert RejectionSampler(Mock(spec=Sampler)).logprobs_mode == "raw_logprobs"  # no mode on the mock: vLLM's default


CTOR_BAD = {  # name: (constructor call, error type, text the message holds)
    "v0_34_watermark_key": (lambda s: RejectionSampler(s, None, "cpu", watermark_key=3), TypeError,
                            r"0\.34.*RejectionSampler\(sampler, spec_config=None, device=None\)"),
    "four_positional": (lambda s: RejectionSampler(s, None, "cpu", 1), TypeError,
                        r"RejectionSampler\(sampler, spec_config=None, device=None\)"),
    "unknown_keyword": (lambda s: RejectionSampler(s, foo=1), TypeError, r"foo.*RejectionSampler\(sampler\)"),
    "old_positional_logprobs_mode": (lambda s: RejectionSampler("raw_logprobs"), TypeError,
                                     r"sampler.*logprobs_mode is keyword-only"),
    "sampler_not_callable": (lambda s: RejectionSampler(3), TypeError, r"sampler must be vLLM's Sampler"),
    "device_bad": (lambda s: RejectionSampler(s, None, 3), TypeError, "device"),
    "device_name": (lambda s: RejectionSampler(s, None, "nodevice"), ValueError, "device"),
    "logprobs_mode_logits": (lambda s: RejectionSampler(logprobs_mode="raw_logits"), ValueError, "logprobs_mode"),
    "sampler_logprobs_mode_logits": (lambda s: RejectionSampler(Sampler(logprobs_mode="processed_logits")),
                                     ValueError, "sampler.logprobs_mode"),
}


@pytest.mark.parametrize("name", list(CTOR_BAD))
def test_other_constructors_are_refused_naming_the_expected_ones(name):
    call, err, text = CTOR_BAD[name]
    with pytest.raises(err, match=text):
        call(Sampler())


FORWARD_BAD = {  # name: (call on (rs with a sampler, rs without, md, q, logits, sm)), text
    "mrv2_call": (lambda s, r, md, q, lg, sm: s(lg, object(), None), r"missing.*forward\(metadata, draft_probs, "
                  r"logits, sampling_metadata\).*0\.34"),
    "legacy_on_a_sampler": (lambda s, r, md, q, lg, sm: s(md, q, lg[:3], torch.zeros(2, dtype=torch.int32), sm),
                            r"built with a sampler.*forward\(metadata, draft_probs, logits, sampling_metadata\)"),
    "logits_with_bonus_token_ids": (lambda s, r, md, q, lg, sm: r(md, q, logits=lg, sampling_metadata=sm,
                                                                   bonus_token_ids=torch.zeros(2)),
                                    r"target_logits.*bonus_token_ids, sampling_metadata\)"),
    "six_positional": (lambda s, r, md, q, lg, sm: r(md, q, lg, torch.zeros(2), sm, 1), "positional"),
    "unknown_keyword": (lambda s, r, md, q, lg, sm: r(md, q, lg, sm, temperature=1.0), "temperature"),
}


@pytest.mark.parametrize("name", list(FORWARD_BAD))
def test_other_forward_calls_are_refused_naming_the_expected_signature(name):
    md, q, logits, sm = _good()
    mock_sampler = Mock(spec=Sampler)
    call, text = FORWARD_BAD[name]
    with pytest.raises(TypeError, match=text):
        call(RejectionSampler(mock_sampler), RejectionSampler(), md, q, logits, sm)
    assert not mock_sampler.called


# ------------------------------------------------------------ SpecDecodeMetadata as vLLM builds it
def _md_tensors():
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    # drafts [[7, 8], [], [9]]: the runner layout
    return dict(draft_token_ids=i32([7, 8, 9]), num_draft_tokens=[2, 0, 1], cu_num_draft_tokens=i32([2, 2, 3]),
                cu_num_sampled_tokens=i32([3, 4, 6]), target_logits_indices=i32([0, 1, 4]),
                bonus_logits_indices=i32([2, 3, 5]), logits_indices=i32([0, 1, 2, 3, 4, 5]))


def _assert_fields(md, fields):
    for name, value in fields.items():
        got = getattr(md, name)
        assert (got == value) if isinstance(value, list) else torch.equal(got, value), name
    assert md.max_spec_len == 2


def test_spec_decode_metadata_by_keyword_and_in_each_releases_order():
    """By keyword (cu_num_sampled_tokens derived when omitted, as vLLM derives it: the
    cumsum of num_draft_tokens + 1), 7 positional fields (vLLM >= 0.12's order), 6 (<= 0.11's,
    no cu_num_sampled_tokens: derived)."""
    f = _md_tensors()
    _assert_fields(SpecDecodeMetadata(**f), f)
    _assert_fields(SpecDecodeMetadata(*[f[k] for k in f]), f)
    md = SpecDecodeMetadata(**{k: v for k, v in f.items() if k != "cu_num_sampled_tokens"})
    _assert_fields(md, f)
    assert md.cu_num_sampled_tokens.dtype == torch.int32
    old_order = [f[k] for k in ("draft_token_ids", "num_draft_tokens", "cu_num_draft_tokens", "target_logits_indices",
                                "bonus_logits_indices", "logits_indices")]
    _assert_fields(SpecDecodeMetadata(*old_order), f)
    no_logits_indices = SpecDecodeMetadata(**{k: v for k, v in f.items() if k != "logits_indices"})
    assert no_logits_indices.logits_indices is None
    logits = torch.randn(6, 10)
    sm = SamplingMetadata(temperature=None, all_greedy=True, all_random=False)
    want = RejectionSampler()(SpecDecodeMetadata(**f), None, logits, sm).sampled_token_ids
    for built in (md, SpecDecodeMetadata(*old_order), no_logits_indices):
        assert torch.equal(RejectionSampler()(built, None, logits, sm).sampled_token_ids, want)


MD_BAD = {  # name: (args, kwargs given the fields, error type, text)
    "four_positional": (lambda f: ([f["draft_token_ids"], f["num_draft_tokens"], f["cu_num_draft_tokens"],
                                    f["target_logits_indices"]], {}), TypeError, r"4 positional.*vLLM <= 0\.11"),
    "unknown_field": (lambda f: ([], dict(f, max_spec_len=2)), TypeError, "max_spec_len"),
    "missing_field": (lambda f: ([], {k: v for k, v in f.items() if k != "bonus_logits_indices"}), TypeError,
                      "bonus_logits_indices"),
    "twice": (lambda f: ([f["draft_token_ids"]], f), TypeError, "draft_token_ids.*twice"),
    "num_draft_tokens_tensor": (lambda f: ([], dict(f, num_draft_tokens=torch.tensor([2, 0, 1]))), TypeError,
                                "num_draft_tokens"),
    "derive_from_bad_cu": (lambda f: ([], {k: (torch.tensor([2, 3]) if k == "cu_num_draft_tokens" else v)
                                           for k, v in f.items() if k != "cu_num_sampled_tokens"}), ValueError,
                           "cu_num_draft_tokens"),
}


@pytest.mark.parametrize("name", list(MD_BAD))
def test_spec_decode_metadata_refuses_other_calls(name):
    make, err, text = MD_BAD[name]
    args, kwargs = make(_md_tensors())
    with pytest.raises(err, match=text):
        SpecDecodeMetadata(*args, **kwargs)


def test_make_dummy_is_vllms():
    """vLLM's make_dummy(draft_token_ids, device): int32 drafts and cumsums (cu_num_sampled_tokens
    = cumsum(num_draft_tokens + 1)), every logits index 0 ([num_tokens], [B], [num_tokens + B])."""
    md = SpecDecodeMetadata.make_dummy([[1, 2, 3], [], [4, 5]], device=torch.device("cpu"))
    assert md.num_draft_tokens == [3, 0, 2] and md.max_spec_len == 3
    want = dict(draft_token_ids=[1, 2, 3, 4, 5], cu_num_draft_tokens=[3, 3, 5], cu_num_sampled_tokens=[4, 5, 8],
                target_logits_indices=[0] * 5, bonus_logits_indices=[0] * 3, logits_indices=[0] * 8)
    for name, value in want.items():
        t = getattr(md, name)
        assert t.dtype == torch.int32 and t.device.type == "cpu" and t.tolist() == value, name
    with pytest.raises(TypeError, match=r"draft_token_ids\[1\]\[0\]"):
        SpecDecodeMetadata.make_dummy([[1], [2.0]], "cpu")
    with pytest.raises(TypeError, match="draft_token_ids"):
        SpecDecodeMetadata.make_dummy(torch.tensor([[1]]), "cpu")


# ------------------------------------------------------------ random sampling
def _random_step(B, K, V, seed, ragged=False):
    """A random step in the runner layout: per-request drafts drawn from a draft law,
    draft_probs [num_tokens, V], logits [num_tokens + B, V]."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(0, K + 1, (B,), generator=g).tolist() if ragged else [K] * B
    num_tokens = sum(n)
    draft_probs = torch.softmax(torch.randn(num_tokens, V, generator=g), -1)
    flat = torch.multinomial(draft_probs, 1, generator=g).view(-1).tolist() if num_tokens else []
    spec, i = [], 0
    for k in n:
        spec.append(flat[i:i + k])
        i += k
    logits = torch.randn(num_tokens + B, V, generator=g) * 2
    return SpecDecodeMetadata.from_draft_token_ids(spec), draft_probs, logits


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
def test_deterministic_when_seeded(k, batch_size):
    """vLLM's fact, called as vLLM's test calls it (mocked bonus [B, 1] int64, draft rows
    only, n-gram drafts, target logits ~ U(0, 1)): requests with a generator (fresh, seeded
    the same way each time) give the same tokens on every repetition; unseeded ones (no
    generator) need not."""
    V, n_rep = 1000, 20
    g = torch.Generator().manual_seed(k * 10 + batch_size)
    target_logits = torch.rand(batch_size * k, V, generator=g)
    bonus_token_ids = torch.randint(0, V, (batch_size, 1), dtype=torch.int64, generator=g)
    draft_token_ids = torch.randint(0, V, (batch_size, k), dtype=torch.int64, generator=g)
    seeded = [i for i in range(batch_size) if i % 2 == 0]
    rs = vllm_rejection_sampler()
    results = []
    for _ in range(n_rep):
        gens = {i: torch.Generator().manual_seed(i) for i in seeded}
        sm = SamplingMetadata(temperature=torch.ones(batch_size), all_greedy=False, all_random=True, generators=gens)
        md = vllm_metadata(draft_token_ids.tolist(), target_logits)
        mock_bonus(rs, bonus_token_ids)
        results.append(rs(md, draft_probs=None, logits=target_logits, sampling_metadata=sm).sampled_token_ids)
    for r in results[1:]:
        assert torch.equal(r[seeded], results[0][seeded])
    unseeded = [i for i in range(batch_size) if i % 2]
    if unseeded:
        assert any(not torch.equal(r[unseeded], results[0][unseeded]) for r in results[1:])


def test_seeded_request_steps_and_batch_invariance():
    """A request's generator gives it its own stream: the same generator on the next step
    draws fresh numbers, a fresh generator with the same seed replays the sequence, and the
    tokens do not depend on the request's place in the batch or on the other requests."""
    B, K, V = 6, 3, 50
    md, q, logits = _random_step(B, K, V, seed=3)
    sm = lambda gens: SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True,  # noqa: E731
                                       generators=gens)
    rs = RejectionSampler()
    g = torch.Generator().manual_seed(1234)
    steps = [rs(md, q, logits, sm({2: g})).sampled_token_ids[2] for _ in range(8)]
    assert any(not torch.equal(s, steps[0]) for s in steps[1:])
    g2 = torch.Generator().manual_seed(1234)
    replay = [rs(md, q, logits, sm({2: g2})).sampled_token_ids[2] for _ in range(8)]
    assert all(torch.equal(a, b) for a, b in zip(steps, replay))
    # request 2 alone in a batch of one, at index 0, the others gone
    spec2 = md.draft_token_ids[6:9].tolist()
    md1 = SpecDecodeMetadata.from_draft_token_ids([spec2])
    logits1 = torch.cat([logits[8:11], logits[11:12]])
    g3 = torch.Generator().manual_seed(1234)
    alone = RejectionSampler()(md1, q[6:9], logits1, SamplingMetadata(
        temperature=torch.ones(1), all_greedy=False, all_random=True, generators={0: g3})).sampled_token_ids[0]
    assert torch.equal(alone, steps[0])


def _first_token_counts(res, V):
    first = res.sampled_token_ids[:, 0].long()
    assert (first >= 0).all()
    return torch.bincount(first, minlength=V).numpy()


@pytest.mark.law
def test_rejection_sampling_approximates_target_distribution():
    """vLLM's test (V = 10, K = 2, a random draft law and random target logits, every
    request the same; called as vLLM calls it: mocked bonus, draft rows only) as a
    chi-square test: the first emitted token of each request (an accepted draft or the
    recovered token) follows softmax(target logits) exactly. 20000 requests, fixed seeds,
    every cell's expected count >= 5, at stats_reference.ALPHA."""
    V, K, N = 10, 2, draws(20000)
    g = torch.Generator().manual_seed(7)
    q = torch.softmax(torch.rand(V, generator=g), -1)
    target = torch.rand(V, generator=g)
    drafts = torch.multinomial(q, N * K, replacement=True, generator=g).view(N, K).tolist()
    logits = target.expand(N * K, V).contiguous()
    rs = vllm_rejection_sampler()
    mock_bonus(rs, torch.zeros((N, 1), dtype=torch.int64))  # "bonus tokens not used but required"
    torch.manual_seed(11)  # unseeded requests draw their seeds from torch's default generator
    res = rs(vllm_metadata(drafts, logits), draft_probs=q.expand(N * K, V).contiguous(), logits=logits,
             sampling_metadata=SamplingMetadata(temperature=torch.ones(N), all_greedy=False, all_random=True))
    p = torch.softmax(target.double(), -1).numpy()
    assert (p * N >= 5).all()
    assert chi_square_pvalue(_first_token_counts(res, V), p) > ALPHA


def _joint_counts_per_group(tokens, group_of_row, n_of_group, V):
    """{group: histogram [n+1, V] of (accepted drafts, the last emitted token)}."""
    out = {}
    for gi, n in n_of_group.items():
        rows = tokens[group_of_row == gi].long()
        emitted = (rows != P).sum(1)
        assert (emitted >= 1).all() and (emitted <= n + 1).all()
        acc = emitted - 1
        last = rows.gather(1, acc.view(-1, 1)).view(-1)
        out[gi] = torch.bincount(acc * V + last, minlength=(n + 1) * V).view(n + 1, V).numpy()
    return out


@pytest.mark.law
def test_emitted_law_matches_the_filtered_target_law():
    """The shim's emitted law, request type by request type, against the closed form of
    speculative sampling on the FILTERED target law p' (stats_reference.verify_joint on
    filtered_softmax64): the joint law of (accepted drafts, emitted token) for three
    request types interleaved in one ragged batch (3, 1 and 0 drafts; vLLM-style per-request
    temperature, top_k (vLLM's "off" = V too), top_p, min_p). Chi-square per type, cells
    with expected count < 5 merged, at stats_reference.ALPHA, fixed seeds."""
    V, N = 12, draws(6000, 2000)
    g = torch.Generator().manual_seed(21)
    types = {  # n drafts, temperature, top_k, top_p, min_p
        0: (3, 0.8, 6, 1.0, 0.0),
        1: (1, 1.3, V, 0.85, 0.05),
        2: (0, 1.0, -1, 0.9, 0.1),
    }
    law, spec_of, q_of, logits_of = {}, {}, {}, {}
    for t, (n, T, k, tp, mp) in types.items():
        logits_of[t] = torch.randn(n + 1, V, generator=g) * 1.5
        q_of[t] = torch.softmax(torch.randn(n, V, generator=g), -1)
        spec_of[t] = [int(torch.multinomial(q_of[t][i], 1, generator=g)) for i in range(n)]
        p = filtered_softmax64(logits_of[t], T, top_k=k if 0 < k < V else 0, top_p=tp, min_p=mp)
        law[t] = verify_joint(p, q_of[t].double().numpy(), np.array(spec_of[t], dtype=np.int64))
    order = torch.arange(3 * N) % 3  # interleaved: the flat layout is ragged
    md = SpecDecodeMetadata.from_draft_token_ids([spec_of[int(t)] for t in order])
    logits = torch.cat([logits_of[int(t)] for t in order])
    q = torch.cat([q_of[int(t)] for t in order])
    col = lambda j, dtype: torch.tensor([types[int(t)][j] for t in order], dtype=dtype)  # noqa: E731
    sm = SamplingMetadata(temperature=col(1, torch.float32), all_greedy=False, all_random=True,
                          top_k=col(2, torch.int32), top_p=col(3, torch.float32), min_p=col(4, torch.float32))
    torch.manual_seed(5)
    res = RejectionSampler()(md, q, logits, sm)
    assert res.valid.all()
    counts = _joint_counts_per_group(res.sampled_token_ids, order, {t: types[t][0] for t in types}, V)
    for t in types:
        assert chi_square_pvalue(counts[t], law[t]) > ALPHA, f"request type {t}"


@pytest.mark.law
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_emitted_law_across_vocabulary_tiles(temperature):
    """The shim's joint law of (accepted drafts, emitted token) at V = 300 (three of the
    kernels' 128-token race tiles) with top-k 60 + top-p 0.9 + min-p 0.01, 2 drafts per
    request, at two temperatures: against verify_joint on the filtered target law, cells with
    expected count < 5 merged, at stats_reference.ALPHA, fixed seeds."""
    V, n, N = 300, 2, draws(8000, 3000)
    g = torch.Generator().manual_seed(33)
    logits_row = torch.randn(n + 1, V, generator=g) * 2.0
    q_row = torch.softmax(torch.randn(n, V, generator=g) * 2.0, -1)
    spec = [int(torch.multinomial(q_row[i], 1, generator=g)) for i in range(n)]
    p = filtered_softmax64(logits_row, temperature, top_k=60, top_p=0.9, min_p=0.01)
    law = verify_joint(p, q_row.double().numpy(), np.array(spec, dtype=np.int64))
    md = SpecDecodeMetadata.from_draft_token_ids([spec] * N)
    full = lambda v, dtype: torch.full((N,), v, dtype=dtype)  # noqa: E731
    sm = SamplingMetadata(temperature=full(temperature, torch.float32), all_greedy=False, all_random=True,
                          top_k=full(60, torch.int32), top_p=full(0.9, torch.float32),
                          min_p=full(0.01, torch.float32))
    torch.manual_seed(6)
    res = RejectionSampler()(md, q_row.repeat(N, 1), logits_row.repeat(N, 1), sm)
    assert res.valid.all()
    counts = _joint_counts_per_group(res.sampled_token_ids, torch.zeros(N, dtype=torch.int64), {0: n}, V)[0]
    assert chi_square_pvalue(counts, law) > ALPHA


# ------------------------------------------------------------ top-k / top-p masks (vLLM's facts)
def _masked_case(target_logits, allowed, sm, B, K, V, seed):
    """vLLM's masked-logits check, called as its test calls it (draft rows only, a mocked
    bonus of zeros): every emitted token at a draft position (an accepted draft or the
    recovered token) is in the allowed set of that position's logits row."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.rand(B * K, V, generator=g), -1)
    drafts = torch.multinomial(q, 1, generator=g).view(B, K).tolist()
    rs = vllm_rejection_sampler()
    mock_bonus(rs, torch.zeros((B, 1), dtype=torch.int64))
    torch.manual_seed(seed)
    out = rs(vllm_metadata(drafts, target_logits), draft_probs=q, logits=target_logits,
             sampling_metadata=sm).sampled_token_ids
    out = out[:, :-1].reshape(-1).tolist()  # vLLM's test drops the bonus column
    assert any(t != P for t in out)
    for i, t in enumerate(out):
        if t != P:
            assert t in allowed[i], (i, t)


@pytest.mark.parametrize("top_k", [1, 5, 99])
def test_top_k(top_k):
    """vLLM's case: V = 100, 100 requests of 3 drafts; each row's top-k tokens get logit 0.1,
    the rest 0; only top-k tokens may come out, despite the small difference."""
    V, B, K = 100, 100, 3
    g = torch.Generator().manual_seed(top_k)
    rows = B * K
    idx = torch.stack([torch.randperm(V, generator=g)[:top_k] for _ in range(rows)])
    logits = torch.zeros(rows, V)
    logits.scatter_(1, idx, 0.1)
    sm = SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True,
                          top_k=torch.full((B,), top_k, dtype=torch.int64))
    _masked_case(logits, [set(r.tolist()) for r in idx], sm, B, K, V, seed=top_k)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p(top_p):
    """vLLM's case: random logits; the allowed tokens are those whose ascending cumulative
    probability (their own included) exceeds 1 - top_p, i.e. the mass strictly above them
    is below top_p."""
    V, B, K = 100, 100, 3
    g = torch.Generator().manual_seed(int(top_p * 100))
    logits = torch.randn(B * K, V, generator=g)
    srt, order = logits.double().sort(-1)
    csum = torch.softmax(srt, -1).cumsum(-1)
    keep = csum > 1 - top_p
    keep[:, -1] = True
    allowed = [set(order[i][keep[i]].tolist()) for i in range(logits.shape[0])]
    sm = SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True,
                          top_p=torch.full((B,), top_p))
    _masked_case(logits, allowed, sm, B, K, V, seed=int(top_p * 100))


def test_min_p_applies_to_verified_tokens():
    """vllm#42744: vLLM skips min_p at verified positions. Here a draft whose probability is
    below min_p * max p is never accepted (n-gram drafts: vLLM would accept it with
    probability p(x) > 0), and never comes out as a recovered or bonus token either."""
    V, B, K = 8, 400, 2
    row = torch.tensor([3.0, 2.5, 2.0, 0.0, -0.5, -1.0, -1.5, -2.0])  # p(3) / p(0) = e^-3 < 0.1
    md = SpecDecodeMetadata.from_draft_token_ids([[3, 3]] * B)
    logits = row.expand(B * (K + 1), V).contiguous()
    sm = SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True,
                          min_p=torch.full((B,), 0.1))
    torch.manual_seed(0)
    out = RejectionSampler()(md, None, logits, sm).sampled_token_ids
    emitted = out[out != P]
    assert emitted.numel() == B  # the first draft is always rejected: one token per request
    assert set(emitted.unique().tolist()) <= {0, 1, 2}  # p >= 0.1 * p(0): e^-0.5, e^-1 > 0.1 > e^-3
    sm.min_p = None  # without min_p, draft 3 (p ~ 2.5%) is accepted now and then
    torch.manual_seed(0)
    out = RejectionSampler()(md, None, logits, sm).sampled_token_ids
    assert (out[:, 0] == 3).any()


# ------------------------------------------------------------ vLLM's "off" values and greedy rule
def _seeded_step(B=16, K=3, V=64, seed=4):
    md, q, logits = _random_step(B, K, V, seed, ragged=True)
    seeds = torch.arange(1000, 1000 + B, dtype=torch.int64)
    return md, q, logits, seeds


@pytest.mark.parametrize("field,off", [("top_k", -1), ("top_k", 0), ("top_k", 64), ("top_k", 1000),
                                       ("top_p", 1.0), ("min_p", 0.0)])
def test_off_values_equal_no_filter(field, off):
    md, q, logits, seeds = _seeded_step()
    B = len(md.num_draft_tokens)
    base = SamplingMetadata(temperature=torch.full((B,), 0.9), all_greedy=False, all_random=True)
    want = RejectionSampler()(md, q, logits, base, seed=seeds, offset=3).sampled_token_ids
    dtype = torch.int64 if field == "top_k" else torch.float32
    setattr(base, field, torch.full((B,), off, dtype=dtype))
    got = RejectionSampler()(md, q, logits, base, seed=seeds, offset=3).sampled_token_ids
    assert torch.equal(got, want)


def test_temperature_below_eps_is_greedy_row_by_row():
    """Mixed batch: rows with temperature < 1e-5 (0, -1, 1e-6) equal an all-greedy run;
    the others are sampled (and differ from greedy somewhere)."""
    md, q, logits, seeds = _seeded_step(B=32, V=200)
    B = 32
    greedy = RejectionSampler()(md, q, logits, _greedy_meta(B, "all_greedy"), seed=seeds).sampled_token_ids
    temp = torch.tensor([[0.0, -1.0, 1e-6, 1.5][i % 4] for i in range(B)])
    mixed = RejectionSampler()(md, q, logits, SamplingMetadata(temperature=temp, all_greedy=False, all_random=False),
                               seed=seeds).sampled_token_ids
    g = temp < 1e-5
    assert torch.equal(mixed[g], greedy[g])
    assert not torch.equal(mixed[~g], greedy[~g])


def test_min_p_one_keeps_only_the_argmax():
    """vLLM allows min_p = 1 (keep the tokens tied with the max); read as the largest
    float32 below 1, it keeps the argmax of distinct logits: the greedy result."""
    md, q, logits, seeds = _seeded_step()
    B = len(md.num_draft_tokens)
    greedy = RejectionSampler()(md, q, logits, _greedy_meta(B, "all_greedy"), seed=seeds).sampled_token_ids
    sm = SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True, min_p=torch.ones(B))
    assert torch.equal(RejectionSampler()(md, q, logits, sm, seed=seeds).sampled_token_ids, greedy)


# ------------------------------------------------------------ equality with a direct verify call
def _pack_by_loops(md, q, logits):
    """The flat layout packed into verify's by plain loops (host reads allowed here)."""
    n = md.num_draft_tokens
    B, K, V = len(n), md.max_spec_len, logits.shape[1]
    cu = md.cu_num_draft_tokens.tolist()
    tgt, bon = md.target_logits_indices.tolist(), md.bonus_logits_indices.tolist()
    flat = md.draft_token_ids.tolist()
    L = torch.zeros(B, K + 1, V, dtype=logits.dtype)
    D = torch.zeros(B, K, dtype=torch.int64)
    Q = torch.zeros(B, K, V) if q is not None else None
    for b in range(B):
        s = cu[b] - n[b]
        for j in range(n[b]):
            L[b, j] = logits[tgt[s + j]]
            D[b, j] = flat[s + j]
            if Q is not None:
                Q[b, j] = q[s + j]
        L[b, n[b]] = logits[bon[b]]
    return L, D, Q, torch.tensor(n)


@pytest.mark.parametrize("with_probs", [True, False])
def test_equals_a_direct_verify_call(with_probs):
    md, q, logits, seeds = _seeded_step(B=12, K=4, V=80, seed=9)
    q = q if with_probs else None
    B = 12
    g = torch.Generator().manual_seed(2)
    temp = torch.rand(B, generator=g) + 0.3
    temp[::5] = 0.0
    top_k = torch.tensor([0, 5, 80, -1] * 3)
    top_p = torch.tensor([1.0, 0.9, 0.7] * 4)
    min_p = torch.tensor([0.0, 0.05] * 6)
    offset = torch.arange(B, dtype=torch.int64) * 7
    sm = SamplingMetadata(temperature=temp, all_greedy=False, all_random=False, top_k=top_k, top_p=top_p, min_p=min_p)
    got = RejectionSampler()(md, q, logits, sm, seed=seeds, offset=offset)
    L, D, Q, nd = _pack_by_loops(md, q, logits)
    ref = specdec_ext.verify(L, D, Q, temp, top_k=torch.tensor([0, 5, 0, 0] * 3), top_p=top_p, min_p=min_p,
                             num_drafts=nd, seed=seeds, offset=offset)
    assert torch.equal(got.sampled_token_ids, ref.tokens.to(torch.int32))
    assert torch.equal(got.valid, ref.valid)


@pytest.mark.parametrize("n", [4, 0])
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_tensors_layout(mode, n):
    """max_num_logprobs = n: vLLM's LogprobsTensors, one row per (request, output position):
    column 0 the sampled token and its logprob, then verify's top-n, and the rank; the
    placeholder rows -1 / NaN; the values are verify(..., logprobs=n)'s on the packed inputs,
    and the raw law is log_softmax of the target logits."""
    md, q, logits, seeds = _seeded_step(B=6, K=3, V=50, seed=21)
    B, K1 = 6, md.max_spec_len + 1
    temp = torch.tensor([0.8, 0.0, 1.0, 1.2, 0.5, 1.0])
    top_k = torch.tensor([0, 5, 0, 10, 0, 0])
    sm = SamplingMetadata(temperature=temp, all_greedy=False, all_random=False, top_k=top_k, max_num_logprobs=n)
    out = RejectionSampler(logprobs_mode=mode)(md, q, logits, sm, seed=seeds, offset=3)
    t = out.logprobs_tensors
    assert t.logprob_token_ids.shape == (B * K1, n + 1) and t.logprob_token_ids.dtype == torch.int32
    assert t.logprobs.shape == (B * K1, n + 1) and t.logprobs.dtype == torch.float32
    assert t.selected_token_ranks.shape == (B * K1,)
    ids = out.sampled_token_ids.view(-1)
    assert torch.equal(t.logprob_token_ids[:, 0], ids)
    placeholder = ids == PLACEHOLDER_TOKEN_ID
    assert placeholder.any() and (~placeholder).any()
    assert torch.isnan(t.logprobs[placeholder]).all() and (t.selected_token_ranks[placeholder] == -1).all()
    L, D, Q, nd = _pack_by_loops(md, q, logits)
    ref, lp = specdec_ext.verify(L, D, Q, temp, top_k=top_k, num_drafts=nd, seed=seeds, offset=3, logprobs=n,
                                 logprobs_mode=mode.split("_")[0])
    assert torch.equal(ref.tokens.to(torch.int32).view(-1), ids)
    assert torch.equal(t.logprob_token_ids[:, 1:], lp.top_ids.reshape(B * K1, n).to(torch.int32))
    torch.testing.assert_close(t.logprobs, torch.cat([lp.token_logprobs.unsqueeze(-1), lp.top_logprobs], -1)
                               .view(-1, n + 1), atol=0, rtol=0, equal_nan=True)
    if mode == "raw_logprobs":
        full = torch.log_softmax(L.double(), -1).view(B * K1, -1)
        keep = ~placeholder
        want = full[keep].gather(1, ids[keep].long().view(-1, 1)).view(-1)
        torch.testing.assert_close(t.logprobs[keep, 0].double(), want, atol=1e-5, rtol=1e-5)
        flat = L.view(B * K1, -1)[keep]
        rank = (flat >= flat.gather(1, ids[keep].long().view(-1, 1))).sum(1)  # vLLM's selected_token_ranks
        assert torch.equal(t.selected_token_ranks[keep], rank)


def test_logprobs_mode_must_be_a_vllm_mode():
    with pytest.raises(ValueError, match="logprobs_mode"):
        RejectionSampler(logprobs_mode="raw_logits")


def test_generators_map_to_initial_seed_and_step_offset():
    """Without ``seed=``: a request with a generator draws as verify with seed =
    generator.initial_seed() and offset = the sampler's step count for that generator."""
    md, q, logits, _ = _seeded_step(B=4, K=2, V=40, seed=12)
    gens = {b: torch.Generator().manual_seed(500 + b) for b in range(4)}
    gens[3].manual_seed(2**64 - 5)  # a seed >= 2^63 is the same 64-bit pattern as an int64
    sm = SamplingMetadata(temperature=torch.ones(4), all_greedy=False, all_random=True, generators=gens)
    rs = RejectionSampler()
    L, D, Q, nd = _pack_by_loops(md, q, logits)
    seeds = torch.tensor([500, 501, 502, 2**64 - 5 - 2**64], dtype=torch.int64)
    for step in range(3):
        got = rs(md, q, logits, sm).sampled_token_ids
        ref = specdec_ext.verify(L, D, Q, 1.0, num_drafts=nd, seed=seeds, offset=step).tokens
        assert torch.equal(got, ref.to(torch.int32)), step


# ------------------------------------------------------------ invalid rows
def test_invalid_rows_are_all_placeholder():
    md, q, logits, seeds = _seeded_step(B=6, K=3, V=30, seed=2)
    B = 6
    sm = SamplingMetadata(temperature=torch.ones(B), all_greedy=False, all_random=True)
    clean = RejectionSampler()(md, q, logits, sm, seed=seeds)
    bad_logits = logits.clone()
    bad_logits[md.bonus_logits_indices[1]] = float("nan")  # request 1: a NaN in its bonus row
    md.draft_token_ids = md.draft_token_ids.clone()
    n = md.num_draft_tokens
    r = next(b for b in range(2, B) if n[b] > 0)
    md.draft_token_ids[sum(n[:r])] = 30 + 4  # request r: a draft id outside [0, V)
    got = RejectionSampler()(md, q, bad_logits, sm, seed=seeds)
    assert got.valid.tolist() == [b not in (1, r) for b in range(B)]
    assert (got.sampled_token_ids[1] == P).all() and (got.sampled_token_ids[r] == P).all()
    ok = got.valid
    assert torch.equal(got.sampled_token_ids[ok], clean.sampled_token_ids[ok])


# ------------------------------------------------------------ argument errors
def _good(generators=None):
    """A good call (both requests seeded by their generators, so a repeat is the same)."""
    md = SpecDecodeMetadata.from_draft_token_ids([[1, 2], [3]])
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 10, generator=g)
    q = torch.softmax(torch.randn(3, 10, generator=g), -1)
    if generators is None:
        generators = {0: torch.Generator().manual_seed(40), 1: torch.Generator().manual_seed(41)}
    sm = SamplingMetadata(temperature=torch.ones(2), all_greedy=False, all_random=True, generators=generators)
    return md, q, logits, sm


def _set(obj, **kw):
    for k, v in kw.items():
        setattr(obj, k, v)


BAD = {  # name: (how to break the good call, error type, text the message holds)
    "metadata_not_metadata": (lambda a: a.update(md={"draft_token_ids": 1}), TypeError, "metadata"),
    "draft_ids_float": (lambda a: _set(a["md"], draft_token_ids=torch.zeros(3)), TypeError,
                        "metadata.draft_token_ids"),
    "draft_ids_length": (lambda a: _set(a["md"], draft_token_ids=torch.zeros(4, dtype=torch.int32)), ValueError,
                         "metadata.draft_token_ids"),
    "draft_ids_2d": (lambda a: _set(a["md"], draft_token_ids=torch.zeros(1, 3, dtype=torch.int32)), ValueError,
                     "metadata.draft_token_ids"),
    "num_draft_tokens_tensor": (lambda a: _set(a["md"], num_draft_tokens=torch.tensor([2, 1])), TypeError,
                                "metadata.num_draft_tokens"),
    "num_draft_tokens_negative": (lambda a: _set(a["md"], num_draft_tokens=[4, -1]), ValueError,
                                  r"metadata.num_draft_tokens\[1\]"),
    "empty_batch": (lambda a: _set(a["md"], num_draft_tokens=[]), ValueError, "metadata.num_draft_tokens"),
    "max_spec_len_small": (lambda a: _set(a["md"], max_spec_len=1), ValueError, "metadata.max_spec_len"),
    "max_spec_len_float": (lambda a: _set(a["md"], max_spec_len=2.0), TypeError, "metadata.max_spec_len"),
    "cu_shape": (lambda a: _set(a["md"], cu_num_draft_tokens=torch.tensor([2, 3, 3])), ValueError,
                 "metadata.cu_num_draft_tokens"),
    "cu_sampled_shape": (lambda a: _set(a["md"], cu_num_sampled_tokens=torch.tensor([3])), ValueError,
                         "metadata.cu_num_sampled_tokens"),
    "cu_sampled_float": (lambda a: _set(a["md"], cu_num_sampled_tokens=torch.tensor([3.0, 5.0])), TypeError,
                         "metadata.cu_num_sampled_tokens"),
    "logits_indices_shape": (lambda a: _set(a["md"], logits_indices=torch.arange(4)), ValueError,
                             "metadata.logits_indices"),
    "bonus_idx_length": (lambda a: _set(a["md"], bonus_logits_indices=torch.tensor([2])), ValueError,
                         "metadata.bonus_logits_indices"),
    "logits_too_few_rows": (lambda a: a.update(logits=torch.randn(4, 10)), ValueError, r"logits has 4 rows.*3 \+ 2"),
    "logits_no_vocab": (lambda a: a.update(logits=torch.zeros(5, 0), q=torch.zeros(3, 0)), ValueError, "logits"),
    "draft_probs_rows": (lambda a: a.update(q=torch.rand(2, 10)), ValueError, "draft_probs"),
    "target_idx_length": (lambda a: _set(a["md"], target_logits_indices=torch.tensor([0, 1])), ValueError,
                          "metadata.target_logits_indices"),
    "bonus_idx_float": (lambda a: _set(a["md"], bonus_logits_indices=torch.tensor([2.0, 4.0])), TypeError,
                        "metadata.bonus_logits_indices"),
    "logits_not_tensor": (lambda a: a.update(logits=[[0.0] * 10] * 5), TypeError, "logits"),
    "logits_int": (lambda a: a.update(logits=torch.zeros(5, 10, dtype=torch.int64)), TypeError, "logits"),
    "logits_3d": (lambda a: a.update(logits=torch.zeros(1, 5, 10)), ValueError, "logits"),
    "draft_probs_shape": (lambda a: a.update(q=torch.rand(3, 11)), ValueError, "draft_probs"),
    "draft_probs_int": (lambda a: a.update(q=torch.ones(3, 10, dtype=torch.int32)), TypeError, "draft_probs"),
    "temperature_missing": (lambda a: _set(a["sm"], temperature=None), ValueError, "sampling_metadata.temperature"),
    "temperature_shape": (lambda a: _set(a["sm"], temperature=torch.ones(3)), ValueError,
                          "sampling_metadata.temperature"),
    "all_greedy_not_bool": (lambda a: _set(a["sm"], all_greedy=1), TypeError, "sampling_metadata.all_greedy"),
    "greedy_and_random": (lambda a: _set(a["sm"], all_greedy=True, all_random=True), ValueError, "all_random"),
    "top_k_float": (lambda a: _set(a["sm"], top_k=torch.tensor([1.0, 2.0])), TypeError, "sampling_metadata.top_k"),
    "top_p_int": (lambda a: _set(a["sm"], top_p=torch.tensor([1, 1])), TypeError, "sampling_metadata.top_p"),
    "top_p_value": (lambda a: _set(a["sm"], top_p=torch.tensor([0.0, 0.5])), ValueError, "top_p"),
    "min_p_shape": (lambda a: _set(a["sm"], min_p=torch.zeros(2, 1)), ValueError, "sampling_metadata.min_p"),
    "logprobs_negative": (lambda a: _set(a["sm"], max_num_logprobs=-1), ValueError, "max_num_logprobs"),
    "logprobs_too_many": (lambda a: _set(a["sm"], max_num_logprobs=129), ValueError, "max_num_logprobs"),
    "logprobs_float": (lambda a: _set(a["sm"], max_num_logprobs=2.0), TypeError, "max_num_logprobs"),
    "generators_not_dict": (lambda a: _set(a["sm"], generators=[torch.Generator()]), TypeError, "generators"),
    "generator_key_range": (lambda a: _set(a["sm"], generators={2: torch.Generator()}), ValueError, "generators"),
    "generator_value": (lambda a: _set(a["sm"], generators={0: 7}), TypeError, r"generators\[0\]"),
    "seed_dtype": (lambda a: a.update(seed=torch.tensor([1, 2], dtype=torch.int32)), TypeError, "seed"),
    "seed_shape": (lambda a: a.update(seed=torch.tensor([1, 2, 3])), ValueError, "seed"),
    "offset_without_seed": (lambda a: a.update(offset=3), ValueError, "offset"),
    "offset_float": (lambda a: a.update(seed=torch.tensor([1, 2]), offset=1.5), TypeError, "offset"),
}


def _assert_nothing_changed(rs, generators, fresh=RejectionSampler):
    """After a refused call, ``rs`` draws as a ``fresh()`` sampler: no request's step count moved."""
    want = fresh()(*_good({i: torch.Generator().manual_seed(g.initial_seed())
                           for i, g in generators.items()})).sampled_token_ids
    assert torch.equal(rs(*_good(generators)).sampled_token_ids, want)


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_raises_naming_the_argument(name):
    """Each bad input is refused naming it, and nothing changed: the generators' step counts
    stay (also where verify itself refuses a value, after the seeds were drawn)."""
    md, q, logits, sm = _good()
    generators = sm.generators
    args = dict(md=md, q=q, logits=logits, sm=sm)
    breaker, err, text = BAD[name]
    breaker(args)
    kw = {k: args[k] for k in ("seed", "offset") if k in args}
    rs = RejectionSampler()
    with pytest.raises(err, match=text):
        rs(args["md"], args["q"], args["logits"], args["sm"], **kw)
    _assert_nothing_changed(rs, generators)


def test_good_call_of_the_error_table_runs():
    md, q, logits, sm = _good()
    rs = RejectionSampler()
    first = rs(md, q, logits, sm).sampled_token_ids
    assert first.shape == (2, 3)
    second = [rs(md, q, logits, sm).sampled_token_ids for _ in range(6)]  # the step counts move on success
    assert any(not torch.equal(t, first) for t in second)


LEGACY_BAD = {  # vLLM <= 0.11's forward: (breaker of (target_logits, bonus_token_ids), error, text)
    "target_rows_from_the_full_logits": (lambda a: a.update(t=torch.randn(5, 10)), ValueError,
                                         r"target_logits must be \[num_tokens, vocab_size\] = \[3, 10\]"),
    "target_1d": (lambda a: a.update(t=torch.randn(30)), ValueError, "target_logits"),
    "bonus_shape": (lambda a: a.update(b=torch.zeros(2, 2, dtype=torch.int32)), ValueError,
                    r"bonus_token_ids must be \[batch_size\] or \[batch_size, 1\]"),
    "bonus_length": (lambda a: a.update(b=torch.zeros(3, 1, dtype=torch.int32)), ValueError, "bonus_token_ids"),
    "bonus_float": (lambda a: a.update(b=torch.zeros(2, 1)), TypeError, "bonus_token_ids"),
    "bonus_list": (lambda a: a.update(b=[1, 2]), TypeError, "bonus_token_ids"),
}


@pytest.mark.parametrize("name", list(LEGACY_BAD))
def test_legacy_forward_bad_input_raises_naming_the_argument(name):
    md, q, logits, sm = _good()
    generators = sm.generators
    args = dict(t=logits[md.target_logits_indices.long()], b=torch.zeros(2, 1, dtype=torch.int32))
    breaker, err, text = LEGACY_BAD[name]
    breaker(args)
    rs = RejectionSampler()
    with pytest.raises(err, match=text):
        rs(md, q, args["t"], args["b"], sm)
    _assert_nothing_changed(rs, generators)


SAMPLER_BAD = {  # with a (mocked) sampler: (breaker, mocked bonus, error, text)
    "too_few_rows_for_the_drafts": (lambda a: a.update(logits=torch.randn(2, 10)), torch.zeros(2), ValueError,
                                    r"logits has 2 rows.*3 \+ 0"),
    "sampler_output_length": (lambda a: None, torch.zeros(3, dtype=torch.int64), ValueError,
                              r"sampled_token_ids must be \[batch_size\].*given logits\[metadata.bonus_logits_indices"),
    "sampler_output_float": (lambda a: None, torch.zeros(2), TypeError, "sampled_token_ids"),
    "sampler_output_not_sampler_output": (lambda a: None, "not an output", TypeError, "SamplerOutput"),
    "logprobs_without_bonus_rows": (lambda a: _set(a["sm"], max_num_logprobs=2), torch.zeros(2, dtype=torch.int64),
                                    ValueError, r"metadata.bonus_logits_indices must be \[batch_size\]"),
    "draft_probs_rows": (lambda a: a.update(q=torch.rand(4, 10)), torch.zeros(2, dtype=torch.int64), ValueError,
                         "draft_probs"),
}


@pytest.mark.parametrize("name", list(SAMPLER_BAD))
def test_sampler_path_bad_input_raises_naming_the_argument(name):
    """vLLM's test layout (draft rows only, empty bonus indices, a mocked sampler): a shape
    that disagrees is refused naming it, before the sampler is called (a wrong sampler
    output, after), and the step counts stay."""
    md, q, logits, sm = _good()
    generators = sm.generators
    logits = logits[md.target_logits_indices.long()]
    args = dict(md=vllm_metadata([[1, 2], [3]], logits), q=q, logits=logits, sm=sm)
    breaker, bonus, err, text = SAMPLER_BAD[name]
    breaker(args)
    rs = vllm_rejection_sampler()
    if isinstance(bonus, torch.Tensor):
        mock_bonus(rs, bonus)
    else:
        rs.sampler.return_value = bonus
    with pytest.raises(err, match=text):
        rs(args["md"], draft_probs=args["q"], logits=args["logits"], sampling_metadata=args["sm"])
    assert rs.sampler.called == name.startswith("sampler_output")

    def fresh():
        other = vllm_rejection_sampler()
        mock_bonus(other, torch.tensor([4, 5]))
        return other

    mock_bonus(rs, torch.tensor([4, 5]))
    _assert_nothing_changed(rs, generators, fresh)


def test_out_of_range_device_values_make_the_row_invalid():
    """Values in device tensors are not read on the host: an index past logits' rows (the
    target or bonus row of one request), or a cu_num_draft_tokens whose last request runs past
    draft_token_ids, makes only that request invalid (no IndexError, no device assert); the
    others are the clean call's."""
    md, q, logits, seeds = _seeded_step(B=6, K=3, V=30, seed=2)
    sm = SamplingMetadata(temperature=torch.ones(6), all_greedy=False, all_random=True)
    clean = RejectionSampler()(md, q, logits, sm, seed=seeds).sampled_token_ids
    n = md.num_draft_tokens
    r = next(b for b in range(6) if n[b] > 0)
    md.target_logits_indices = md.target_logits_indices.clone()
    md.target_logits_indices[sum(n[:r])] = logits.shape[0] + 7
    md.bonus_logits_indices = md.bonus_logits_indices.clone()
    md.bonus_logits_indices[r + 1] = -1
    md.cu_num_draft_tokens = md.cu_num_draft_tokens.clone()
    md.cu_num_draft_tokens[5] += 2
    got = RejectionSampler()(md, q, logits, sm, seed=seeds)
    bad = (r, r + 1, 5)
    assert got.valid.tolist() == [b not in bad for b in range(6)]
    assert (got.sampled_token_ids[list(bad)] == P).all()
    assert torch.equal(got.sampled_token_ids[got.valid], clean[got.valid])


def test_an_external_bonus_outside_the_vocabulary_invalidates_only_where_emitted():
    """vLLM <= 0.11's bonus_token_ids (and a sampler's) outside [0, V): the row is invalid
    where the bonus would be emitted (every draft accepted), valid where a draft was rejected."""
    for way in ("vllm_0_11", "vllm_0_12_mocked_sampler"):
        spec, out = [[1, 2, 3], [1, 2, 3]], [[1, 2, 3, 4], [1, 5, 3, 4]]  # perfect match / early mismatch
        bonus = torch.tensor([[100], [100]])  # V = 100
        sm = _greedy_meta(2, "all_greedy")
        logits = _draft_row_logits(out)
        if way == "vllm_0_11":
            res = RejectionSampler()(SpecDecodeMetadata.make_dummy(spec, "cpu"), None, logits, bonus, sm)
        else:
            rs = vllm_rejection_sampler()
            mock_bonus(rs, bonus)
            full = rs(vllm_metadata(spec, logits), draft_probs=None, logits=logits, sampling_metadata=sm)
            assert full.valid.tolist() == [False, True]
            res = full.sampled_token_ids
        assert res.tolist() == [[P] * 4, [1, 5, P, P]], way


# ------------------------------------------------------------ one op call, no host sync
def _busy_step():
    """A step with everything on: ragged drafts, draft probs, greedy and random rows, filters,
    generators for some requests."""
    md, q, logits = _random_step(8, 4, 50, seed=6, ragged=True)
    temp = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.2, 1.0, 0.9, 1.1])
    sm = SamplingMetadata(temperature=temp, all_greedy=False, all_random=False, top_k=torch.tensor([0, 5] * 4),
                          top_p=torch.full((8,), 0.9), min_p=torch.full((8,), 0.02),
                          generators={1: torch.Generator().manual_seed(3), 6: torch.Generator().manual_seed(4)})
    return md, q, logits, sm


BUSY_WAYS = ["native", "vllm_0_12_sampler", "vllm_0_11"]


def _busy_call(way, md, q, logits, sm):
    """The busy step through this package's form, a sampler (vLLM >= 0.12) or vLLM <= 0.11's
    forward; returns sampled_token_ids."""
    if way == "native":
        return RejectionSampler()(md, q, logits, sm).sampled_token_ids
    if way == "vllm_0_12_sampler":
        return RejectionSampler(Sampler())(md, q, logits, sm).sampled_token_ids
    bonus = logits[md.bonus_logits_indices.long()].argmax(-1, keepdim=True).to(torch.int32)
    return RejectionSampler()(md, q, logits[md.target_logits_indices.long()], bonus, sm)


@pytest.mark.parametrize("way", BUSY_WAYS)
def test_forward_makes_exactly_one_verify_call(monkeypatch, way):
    counter = CountingOps(sampling_ops._OPS)
    monkeypatch.setattr(sampling_ops, "_OPS", counter)
    md, q, logits, sm = _busy_step()
    _busy_call(way, md, q, logits, sm)
    assert counter.calls == {"verify": 1}


@contextlib.contextmanager
def _host_reads_forbidden(monkeypatch):
    """Inside the block, every Python-level way to read tensor data on the host (or to index
    with a boolean mask, whose output size depends on the data) raises."""
    def forbid(what):
        def f(*args, **kwargs):
            raise AssertionError(f"host read of tensor data: {what}")
        return f

    def mask_checked(real):
        def f(self, index, *rest):
            parts = index if isinstance(index, tuple) else (index,)
            if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                raise AssertionError("boolean-mask indexing (data-dependent output size)")
            return real(self, index, *rest)
        return f

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__",
                     "masked_select", "unique", "any", "all"):
            m.setattr(torch.Tensor, name, forbid(f"Tensor.{name}"))
        for name in ("nonzero", "masked_select", "unique", "argwhere"):
            m.setattr(torch, name, forbid(f"torch.{name}"))
        m.setattr(torch.Tensor, "__getitem__", mask_checked(torch.Tensor.__getitem__))
        m.setattr(torch.Tensor, "__setitem__", mask_checked(torch.Tensor.__setitem__))
        yield


@pytest.mark.parametrize("way", BUSY_WAYS)
def test_forward_reads_no_tensor_data_on_the_host(monkeypatch, way):
    """CPU stand-in for a sync check: forward (with generators, so its host-built seed path
    runs too; with a sampler, which is called; in vLLM <= 0.11's form) never reads tensor
    data in Python, nor masks with data-dependent sizes."""
    md, q, logits, sm = _busy_step()
    want = _busy_call(way, md, q, logits, _busy_step()[3])  # fresh generators, same seeds
    bonus = logits[md.bonus_logits_indices.long()].argmax(-1, keepdim=True).to(torch.int32)  # outside the block
    target = logits[md.target_logits_indices.long()]
    with _host_reads_forbidden(monkeypatch):
        if way == "vllm_0_11":
            got = RejectionSampler()(md, q, target, bonus, sm)
        else:
            got = _busy_call(way, md, q, logits, sm)
        with pytest.raises(AssertionError, match="host read"):  # the guard itself works
            got.sum().item()
    assert torch.equal(got[[1, 6]], want[[1, 6]])  # seeded requests: the same tokens as outside the block


@pytest.mark.cuda
def test_cuda_no_host_sync_and_graph_replay():
    """On a GPU: forward under torch.cuda.set_sync_debug_mode("error") (the generators path:
    CPU seeds copied without a sync), and a CUDA graph of forward with device seed / offset
    tensors that replays with fresh numbers and equals an eager call."""
    from helpers import capture_graph

    md_cpu, q, logits, sm = _busy_step()
    flat, spec, i = md_cpu.draft_token_ids.tolist(), [], 0
    for n in md_cpu.num_draft_tokens:
        spec.append(flat[i:i + n])
        i += n
    md = SpecDecodeMetadata.from_draft_token_ids(spec, device="cuda")
    q, logits = q.cuda(), logits.cuda()
    for f in ("temperature", "top_k", "top_p", "min_p"):
        setattr(sm, f, getattr(sm, f).cuda())
    rs = RejectionSampler()
    rs(md, q, logits, sm)  # warm-up (lazy initialisation may sync)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rs(md, q, logits, sm)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    seed = torch.arange(8, dtype=torch.int64, device="cuda") + 100
    offset = torch.zeros(8, dtype=torch.int64, device="cuda")
    out = {}

    def step():
        out["t"] = rs(md, q, logits, sm, seed=seed, offset=offset).sampled_token_ids

    graph = capture_graph(step)
    seen = []
    for i in range(4):
        offset.fill_(i)
        graph.replay()
        eager = rs(md, q, logits, sm, seed=seed, offset=offset).sampled_token_ids
        assert torch.equal(out["t"], eager)
        seen.append(out["t"].clone())
    assert any(not torch.equal(s, seen[0]) for s in seen[1:])


@pytest.mark.cuda
def test_cuda_vllm_calls():
    """On a GPU: vLLM's test call (metadata on the logits' device, then the CPU index
    tensors its test sets, a mocked sampler whose bonus is on the GPU) gives vLLM's greedy
    tokens; with device metadata, the sampler (0.12+), vLLM <= 0.11's and this package's calls
    give them too under torch.cuda.set_sync_debug_mode("error")."""
    spec, out, expected = GREEDY_CASES["multiple_mismatches"]
    sm = _greedy_meta(2, "all_greedy")
    logits = _draft_row_logits(out).cuda()
    md = SpecDecodeMetadata.make_dummy(spec, device=logits.device)
    md.target_logits_indices = torch.arange(logits.shape[0])
    md.bonus_logits_indices = torch.empty(0, dtype=torch.int32)
    rs = vllm_rejection_sampler()
    mock_bonus(rs, torch.tensor([o[-1] for o in out], device="cuda"))
    assert rs(md, draft_probs=None, logits=logits, sampling_metadata=sm).sampled_token_ids.tolist() == expected
    mdc = SpecDecodeMetadata.from_draft_token_ids(spec, device="cuda")
    full = _greedy_logits(spec, out).cuda()
    bonus = full[mdc.bonus_logits_indices.long()].argmax(-1, keepdim=True).to(torch.int32)
    target = full[mdc.target_logits_indices.long()]
    with_sampler = RejectionSampler(Sampler(), None, "cuda")
    calls = [lambda: with_sampler(mdc, None, full, sm).sampled_token_ids,
             lambda: RejectionSampler()(mdc, None, target, bonus, sm),
             lambda: RejectionSampler()(mdc, None, full, sm).sampled_token_ids]
    for call in calls:  # warm-up (lazy initialisation may sync)
        call()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = [call() for call in calls]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for g in got:
        assert g.tolist() == expected
