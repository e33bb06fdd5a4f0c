"""The engine and the CLI under a demanding user (issue: robustness, item 7): seeded runs
reproduce, misuse is refused up front with one clear error, capacity is exactly what a run
needs, bad model outputs name the model and the step."""
import socket

import pytest
import torch

import cli_runner
import specdec_ext
from helpers import draws
from specdec_ext import SpeculativeEngine, bundled
from specdec_ext.models import LlamaSpecModel
from table_models import BigramModel

V = 6


def _table(seed, scale=1.5):
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * scale


# ---------------------------------------------------------------- reproducibility
def test_seeded_runs_reproduce_with_the_default_adaptive_k_on_the_bundled_pair():
    """Fresh engines, default (cost-model) adaptive K, T = 1: the same seed gives the same
    text (K follows a frozen cost model, not timings), another seed another text."""
    target, draft = bundled.load_pair()
    ids = torch.tensor([bundled.load_tokenizer().encode("def fibonacci(n):").ids])
    runs = [SpeculativeEngine(target, draft).generate(ids, 48, temperature=1.0, seed=7) for _ in range(3)]
    assert all(r.generated == runs[0].generated for r in runs)
    assert all(r.stats[0].ks == runs[0].stats[0].ks for r in runs)
    other = SpeculativeEngine(target, draft).generate(ids, 48, temperature=1.0, seed=8)
    assert other.generated != runs[0].generated


def test_seeded_runs_reproduce_for_models_without_a_cost_hint():
    ids = torch.tensor([[1, 2], [3, 4]])
    outs = [SpeculativeEngine(BigramModel(_table(1)), BigramModel(_table(2)), k=4).generate(
        ids, 40, temperature=1.0, seed=3) for _ in range(2)]
    assert outs[0].generated == outs[1].generated and outs[0].stats[0].ks == outs[1].stats[0].ks


# ---------------------------------------------------------------- misuse
def test_the_same_wrapper_as_target_and_draft_is_refused():
    m = BigramModel(_table(1))
    with pytest.raises(ValueError, match="same SpecModel object"):
        SpeculativeEngine(m, m)


@pytest.mark.parametrize("kwargs,exc,msg", [
    (dict(eos_token_id=torch.tensor(1)), TypeError, "eos_token_id must be an int"),
    (dict(eos_token_id=1.0), TypeError, "eos_token_id must be an int"),
    (dict(eos_token_id=V), ValueError, "eos_token_id must be an int in \\[0, 5\\]"),
    (dict(attention_mask=torch.tensor([[1, 2]])), ValueError, "attention_mask must hold only 0"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int"),
    (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int"),
    (dict(temperature=1e-39), ValueError, "temperature must be 0 \\(greedy\\) or positive"),
    (dict(temperature=torch.tensor([0.5, 1e-39])), ValueError, "temperature must be 0 \\(greedy\\) or positive"),
    (dict(temperature="1"), TypeError, "temperature must be a float"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
])
def test_bad_generate_arguments(kwargs, exc, msg):
    eng = SpeculativeEngine(BigramModel(_table(1)), BigramModel(_table(2)), k=2)
    args = dict(max_new_tokens=3)
    args.update(kwargs)
    ids = torch.tensor([[1, 2]])
    if "temperature" in kwargs and isinstance(kwargs["temperature"], torch.Tensor):
        ids = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(exc, match=msg):
        eng.generate(ids, **args)


@pytest.mark.parametrize("adaptive,exc", [(1, TypeError), (None, TypeError), ("sometimes", ValueError)])
def test_bad_adaptive_k(adaptive, exc):
    with pytest.raises(exc, match="adaptive_k must be"):
        SpeculativeEngine(BigramModel(_table(1)), BigramModel(_table(2)), adaptive_k=adaptive)


# ---------------------------------------------------------------- bad model output
class _NaNAfter(BigramModel):
    """A bigram model whose logits turn NaN once it has processed ``after`` tokens of a row."""

    def __init__(self, table, after):
        super().__init__(table)
        self.after = after

    def forward(self, input_ids):
        out = super().forward(input_ids)
        bad = (self._len >= self.after).view(-1, 1, 1)
        return torch.where(bad, torch.full_like(out, float("nan")), out)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_that_produces_nan_names_the_draft_and_the_step(temperature):
    eng = SpeculativeEngine(BigramModel(_table(1)), _NaNAfter(_table(2), after=4), k=3, adaptive_k=False)
    with pytest.raises(specdec_ext.ModelOutputError, match=r"the draft model .* row 0 at step \d+"):
        eng.generate(torch.tensor([[1, 2]]), 20, temperature=temperature, seed=1)


def test_a_target_that_produces_nan_names_the_target():
    eng = SpeculativeEngine(_NaNAfter(_table(1), after=5), BigramModel(_table(2)), k=2, adaptive_k=False)
    with pytest.raises(specdec_ext.ModelOutputError, match="the target model .* at step"):
        eng.generate(torch.tensor([[1, 2]]), 20, temperature=1.0, seed=1)


# ---------------------------------------------------------------- capacity
@pytest.mark.parametrize("k", [0, 5])
def test_capacity_is_what_the_request_needs(k):
    """A 64-position model serves prompt 62 + 2 new tokens (positions 0..62 are fed), as HF
    generate does; K is clipped to the room left. 62 + 4 is refused before any forward."""
    target, draft = BigramModel(_table(1)), BigramModel(_table(2))
    target.max_positions = draft.max_positions = 64
    eng = SpeculativeEngine(target, draft, k=k)
    ids = torch.randint(0, V, (1, 62), generator=torch.Generator().manual_seed(0))
    out = eng.generate(ids, 3, temperature=0.0)
    assert len(out.generated[0]) == 3
    target.calls = 0
    with pytest.raises(specdec_ext.CacheFullError, match="target model: .*65 positions exceed its capacity of 64"):
        eng.generate(ids, 4)
    assert target.calls == 0


def test_ragged_batch_with_finished_rows_stays_inside_the_caches():
    """Rows finishing early (EOS) or at the budget keep running in the batch; the caches
    (which assert on overflow) still hold every step."""
    t = _table(3)
    eng = SpeculativeEngine(BigramModel(t), BigramModel(t * 0.9), k=6, adaptive_k=False)
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [0, 0, 0, 0, 2, 3]])
    mask = torch.tensor([[1] * 6, [0, 0, 0, 0, 1, 1]])
    out = eng.generate(ids, 17, temperature=1.0, seed=5, attention_mask=mask, eos_token_id=4)
    for g in out.generated:  # each row stops at its first EOS, or at the budget without one
        assert 4 not in g[:-1] and (g[-1] == 4 or len(g) == 17) and len(g) <= 17
    assert any(len(g) < 17 for g in out.generated)  # a row did finish early: the case this test is about


def test_paged_cache_without_enough_blocks_fails_before_the_first_forward():
    target, draft = bundled.load_pair()
    small = LlamaSpecModel(target, "paged", block_size=4, num_blocks=6)
    eng = SpeculativeEngine(small, draft, k=3)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(specdec_ext.OutOfBlocksError, match="target model: the request needs"):
        eng.generate(ids, 40)
    assert small.lengths.tolist() == [0]  # nothing was fed
    out = eng.generate(ids, 10)  # fits in 6 blocks of 4 (3 + 10 - 1 + slack <= 24)
    assert len(out.generated[0]) == 10


# ---------------------------------------------------------------- CLI
def _cli(*args):
    r = cli_runner.run(["-m", "specdec_ext.generate", *args], timeout=300)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize("args,msg", [
    (["--prompt", "x", "--k", "-1"], "argument --k: must be >= 0"),
    (["--prompt", "x", "--temperature", "-1"], "argument --temperature: temperature must be 0"),
    (["--prompt", "x", "--temperature", "1e-39"], "inverse overflows"),
    (["--prompt-ids", "1", "99999"], "--prompt-ids: id 99999 is outside the vocabulary"),
    (["--target", "/nonexistent", "--draft", "/nonexistent", "--prompt-ids", "1"], "not a checkpoint directory"),
    (["--prompt", "x", "--max-new-tokens", "-3"], "argument --max-new-tokens: must be >= 1"),
])
def test_cli_bad_arguments_print_one_line(args, msg):
    rc, out, err = _cli(*args)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_cli_busy_metrics_port_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc, _, err = _cli("--prompt", "x", "--metrics-port", str(s.getsockname()[1]))
    assert rc == 2 and "cannot listen there" in err and len(err.strip().splitlines()) == 1


def test_cli_zero_new_tokens_is_refused():
    """--max-new-tokens 0 would time nothing (it printed 'speedup n/a'): refused in one line."""
    rc, out, err = _cli("--prompt", "x", "--max-new-tokens", "0", "--no-progress")
    assert rc == 2 and "argument --max-new-tokens: must be >= 1, got 0" in err and len(err.strip().splitlines()) == 1


def test_cli_stops_at_end_of_text():
    """The bundled pair's <|endoftext|> ends generation by default (here at T = 1 after the
    usual last lines of a module, where the target ends the file at once in most draws; 4
    seeds), and --ignore-eos runs to max_new_tokens (200; 40 in the quick tier)."""
    budget = draws(200, quick=40)
    args = ["--prompt", 'if __name__ == "__main__":\n    main()\n', "--temperature", "1", "--max-new-tokens",
            str(budget), "--no-baseline", "--no-progress"]
    counts = []
    for seed in range(4):
        rc, out, err = _cli(*args, "--seed", str(seed))
        assert rc == 0, err
        counts.append(int(out.strip().splitlines()[-1].split("|")[2].split()[0]))
    assert min(counts) < budget, counts
    rc, out, _ = _cli(*args, "--seed", str(counts.index(min(counts))), "--ignore-eos")
    assert f" {budget} tokens" in out


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid", "head"])
def test_cli_drafters_run(drafter):
    rc, out, err = _cli("--prompt", "def f(x):", "--max-new-tokens", "12", "--no-progress", "--drafter", drafter)
    assert rc == 0, err
    assert "12 tokens" in out and "speedup" in out
