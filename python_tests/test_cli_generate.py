"""python -m specdec_ext.generate, what a new user hits: the speedup from interleaved timed
rounds (median and spread), a prompt too long for the model refused in one line before any
run, --target without --draft under the n-gram drafter, --help with defaults and alpha
explained, --hf without transformers, and the machine's load in the summary."""
import sys
import types

import pytest
import torch

import cli_runner
from helpers import run_generate
from specdec_ext import SpeculativeEngine, bundled, generate

LONG = ["5"] * 2040  # the bundled pair holds 2048 positions


_main = run_generate  # (exit code, stdout, stderr) of generate.main(argv) in this process


@pytest.fixture
def count_runs(monkeypatch):
    """Counts SpeculativeEngine.generate calls: [(k_max, max_new_tokens)]."""
    calls = []
    real = SpeculativeEngine.generate

    def counted(self, input_ids, max_new_tokens, *a, **kw):
        calls.append((self.k_max, max_new_tokens))
        return real(self, input_ids, max_new_tokens, *a, **kw)

    monkeypatch.setattr(SpeculativeEngine, "generate", counted)
    return calls


# ---------------------------------------------------------------- timed rounds
def test_rounds_interleave_speculative_and_target_only_runs(capsys, count_runs):
    rc, out, err = _main(capsys, "--prompt", "def f(x):", "--max-new-tokens", "6", "--rounds", "3", "--no-progress")
    assert rc == 0, err
    # warm-ups (a 4-token run each), then 3 rounds alternating the order: S B, B S, S B
    kinds = ["S" if k > 0 else "B" for k, n in count_runs if n == 6]
    assert [n for _, n in count_runs[:2]] == [4, 4] and kinds == list("SBBSSB")
    summary = out.splitlines()[-1]
    assert summary.startswith("acceptance") and "6 tokens in" in summary
    assert "-> speedup " in summary and "x over 3 rounds)" in summary


def test_no_baseline_is_one_timed_run(capsys, count_runs):
    rc, out, err = _main(capsys, "--prompt", "def f(x):", "--max-new-tokens", "6", "--no-baseline", "--no-progress")
    assert rc == 0, err
    assert count_runs == [(count_runs[0][0], 4), (count_runs[0][0], 6)]  # warm-up + one timed run
    assert "speedup" not in out and "rounds" not in out


def test_speedup_is_the_median_of_per_round_ratios():
    t = generate.Timings(out=None, spec_s=[0.1, 0.2, 0.1], spec_tok_s=[100.0, 120.0, 110.0],
                         base_tok_s=[50.0, 100.0, 55.0])
    assert t.speedups() == [2.0, 1.2, 2.0]
    assert generate.speed_text(t, True) == " | target-only 55.0 tokens/s -> speedup 2.00x (1.20-2.00x over 3 rounds)"
    assert generate.speed_text(t, False) == ""
    none = generate.Timings(out=None, spec_s=[0.1], spec_tok_s=[0.0], base_tok_s=[0.0])
    assert generate.speed_text(none, True).endswith("speedup n/a (no tokens)")


@pytest.mark.parametrize("argv,msg", [
    (["--rounds", "0"], "argument --rounds: must be >= 1"),
    (["--rounds", "2", "--no-baseline"], "--no-baseline skips those"),
])
def test_bad_rounds_are_one_line(capsys, argv, msg):
    rc, _, err = _main(capsys, "--prompt", "x", *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- prompt length
def test_too_long_prompt_is_refused_before_loading(capsys, monkeypatch):
    monkeypatch.setattr(generate, "_load", lambda args: pytest.fail("a model was loaded"))
    rc, _, err = _main(capsys, "--prompt-ids", *LONG, "--max-new-tokens", "20")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert ("the prompt is 2040 tokens: with --max-new-tokens 20 the target model needs 2059 positions but holds "
            "2048; use --max-new-tokens 9 or less") in err
    rc, _, err = _main(capsys, "--prompt-ids", *(["5"] * 2049), "--max-new-tokens", "1")
    assert rc == 2 and "shorten the prompt to at most 2048 tokens" in err


def test_loaded_models_limits_are_checked_before_any_run(capsys, monkeypatch, count_runs):
    """Limits only the loaded model knows (a sliding window, say) are checked after loading,
    before the warm-up, with the user's --max-new-tokens (not the warm-up's 4)."""
    monkeypatch.setattr(generate, "_config_capacities", lambda args: [])  # skip the config-level check
    rc, _, err = _main(capsys, "--prompt-ids", *LONG, "--max-new-tokens", "20", "--no-progress")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--max-new-tokens 20" in err and "2059 positions" in err
    assert count_runs == []


def test_too_long_prompt_via_the_command_line():
    r = cli_runner.run(["-m", "specdec_ext.generate", "--prompt-ids", *LONG, "--max-new-tokens", "20"], timeout=300)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and "holds 2048" in r.stderr


# ---------------------------------------------------------------- --target / --draft
def test_target_alone_with_the_ngram_drafter(capsys, monkeypatch):
    loaded = []
    real = generate.load_model
    monkeypatch.setattr(generate, "load_model", lambda path, *a: loaded.append(path) or real(path, *a))
    target = bundled.pair_dir("target")
    rc, out, err = _main(capsys, "--target", target, "--drafter", "ngram", "--prompt", "def f(x):",
                         "--max-new-tokens", "5", "--no-baseline", "--no-progress")
    assert rc == 0, err
    assert loaded == [target]  # no draft model loaded
    assert " 5 tokens in" in out.splitlines()[-1]


@pytest.mark.parametrize("argv,msg", [
    (["--target", "T", "--drafter", "model"], "--drafter model needs --draft DIR"),
    (["--target", "T", "--drafter", "hybrid"], "--drafter hybrid needs --draft DIR"),
    (["--draft", "T"], "--draft needs --target"),
])
def test_pair_errors_are_one_line(capsys, argv, msg):
    argv = [bundled.pair_dir("target") if a == "T" else a for a in argv]
    rc, _, err = _main(capsys, "--prompt", "x", *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- help, --hf
def test_help_shows_defaults_and_explains_alpha(capsys):
    rc, out, _ = _main(capsys, "--help")
    assert rc == 0
    flat = " ".join(out.split())
    for text in ("tokens to generate at most (default: 128)", "(default: 3)",
                 "default 16 for --drafter head / ngram / hybrid / suffix chains (drafts from the text or the head cost no "
                 "model step), 5 otherwise",
                 "(default: float32)", "(default: 0)", "Leviathan", "alpha >= acceptance", "min-max over N rounds"):
        assert text in flat, text


def test_hf_without_transformers_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    rc, _, err = _main(capsys, "--prompt", "x", "--hf")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "--hf needs the transformers package" in err and "pip install 'specdec_ext[hf]'" in err


def test_the_hf_extra_exists():
    """The extra the error names is the one setup.py declares."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "setup.py")) as f:
        assert re.search(r'"hf":\s*\[\s*"transformers"', f.read())


# ---------------------------------------------------------------- load
@pytest.mark.parametrize("load,busy", [(dict(load_1min=9.0, cpu_count=2), True),
                                       (dict(load_1min=0.5, cpu_count=2), False)])
def test_summary_records_the_load_and_warns_when_busy(capsys, monkeypatch, load, busy):
    monkeypatch.setattr(generate, "machine_load", lambda: dict(load))
    rc, out, err = _main(capsys, "--prompt", "x", "--max-new-tokens", "3", "--no-baseline", "--no-progress")
    assert rc == 0, err
    assert out.splitlines()[-1].endswith(f"| load {load['load_1min']:.2f} on 2 cores")
    warned = f"warning: machine busy (load {load['load_1min']:.2f} > 2 cores)" in err
    assert warned == busy, err


def test_unknown_load_is_said(capsys, monkeypatch):
    monkeypatch.setattr(generate, "machine_load", lambda: dict(load_1min=None, cpu_count=4))
    rc, out, _ = _main(capsys, "--prompt", "x", "--max-new-tokens", "2", "--no-baseline", "--no-progress")
    assert rc == 0 and out.splitlines()[-1].endswith("| load n/a on 4 cores")


def test_time_rounds_order_without_models():
    """time_rounds alone: the run order and what is recorded, on stand-in engines."""
    order = []

    class Fake:
        def __init__(self, name, tokens):
            self.name, self.tokens = name, tokens

        def generate(self, ids, n, **kw):
            order.append(self.name)
            stats = types.SimpleNamespace(tokens_generated=self.tokens)
            return types.SimpleNamespace(stats=[stats], generated=[[0] * self.tokens])

    args = types.SimpleNamespace(max_new_tokens=4, temperature=0.0, seed=0, top_k=None, top_p=None, min_p=None)
    ids = torch.zeros(1, 1, dtype=torch.int64)
    t = generate.time_rounds(Fake("S", 4), Fake("B", 4), ids, args, None, 4)
    assert "".join(order) == "SBBSSBBS" and len(t.spec_s) == len(t.base_tok_s) == 4
    order.clear()
    t = generate.time_rounds(Fake("S", 4), None, ids, args, None, 4)
    assert order == ["S"] and t.base_tok_s == []


# ---------------------------------------------------------------- tree speculation
def test_tree_greedy_text_is_the_target_only_text(capsys):
    """--tree 3 2 drafts trees with the draft model; at T = 0 the text equals the chain run's
    (both equal target-only greedy decoding)."""
    args = ["--prompt", "def fibonacci(n):", "--max-new-tokens", "12", "--no-baseline", "--no-progress"]
    rc, tree_out, err = _main(capsys, *args, "--tree", "3", "2")
    assert rc == 0, err
    rc, chain_out, err = _main(capsys, *args, "--drafter", "model", "--k", "2")
    assert rc == 0, err
    assert tree_out.splitlines()[:-1] == chain_out.splitlines()[:-1]  # the text; the summary differs


@pytest.mark.parametrize("argv,msg", [
    (["--tree", "2", "--drafter", "ngram"], "--tree drafts its tree with the draft model"),
    (["--tree", "2", "--coupled"], "--tree verifies in exact mode only"),
    (["--tree", "0"], "must be >= 1, got 0"),
])
def test_tree_errors_are_one_line(capsys, argv, msg):
    rc, _, err = _main(capsys, "--prompt", "x", *argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- flags reach the engine
@pytest.fixture
def runs(monkeypatch):
    """Every SpeculativeEngine.generate call after it returns: (engine, keyword arguments,
    output); the speculative engine has k_max > 0, the target-only baseline k_max == 0."""
    calls = []
    real = SpeculativeEngine.generate

    def recorded(self, input_ids, max_new_tokens, *a, **kw):
        out = real(self, input_ids, max_new_tokens, *a, **kw)
        calls.append((self, kw, out))
        return out

    monkeypatch.setattr(SpeculativeEngine, "generate", recorded)
    return calls


PROMPT = ["--prompt-ids", "3", "17", "5", "3", "17", "5", "3", "--max-new-tokens", "10", "--no-progress"]


def test_eos_id_stops_the_text_at_that_token(capsys, runs):
    """--eos-id X: generation stops right after the first X (the id is passed to every timed
    run); without it (--ignore-eos) the same greedy text runs the whole budget."""
    rc, _, err = _main(capsys, *PROMPT, "--ignore-eos", "--rounds", "1")
    assert rc == 0, err
    full = runs[-1][2].generated[0]
    assert len(full) == 10 and all(kw["eos_token_id"] is None for _, kw, _ in runs[2:])
    eos = full[3]
    runs.clear()
    rc, _, err = _main(capsys, *PROMPT, "--eos-id", str(eos), "--rounds", "1")
    assert rc == 0, err
    timed = runs[2:]  # after the two warm-ups: one speculative and one target-only run
    assert len(timed) == 2 and all(kw["eos_token_id"] == eos for _, kw, _ in timed)
    stop = full.index(eos) + 1
    for _, _, out in timed:
        assert out.generated[0] == full[:stop], (out.generated[0], full)


def test_max_ngram_sets_the_longest_match(capsys, runs, monkeypatch):
    """--max-ngram N: every row's prompt-lookup index matches suffixes of at most N tokens."""
    import specdec_ext.engine.engine as engine_module

    made = []
    real = engine_module.NgramIndex
    monkeypatch.setattr(engine_module, "NgramIndex", lambda n: made.append(n) or real(n))
    for n in (1, 5):
        made.clear()
        rc, _, err = _main(capsys, *PROMPT, "--max-ngram", str(n), "--no-baseline")
        assert rc == 0, err
        assert made and set(made) == {n}
        assert {eng.max_ngram for eng, _, _ in runs if eng.k_max > 0} >= {n}


@pytest.mark.parametrize("mode", ["sampled", "topk"])
def test_tree_mode_reaches_the_engine_and_keeps_greedy_text(capsys, runs, mode):
    """--tree-mode sampled|topk: the engine drafts its trees that way; at T = 0 both give the
    target-only text (the timed speculative run against the timed baseline run)."""
    rc, _, err = _main(capsys, *PROMPT, "--tree", "2", "2", "--tree-mode", mode, "--rounds", "1")
    assert rc == 0, err
    spec = [(eng, out) for eng, _, out in runs[2:] if eng.k_max > 0]
    base = [out for eng, _, out in runs[2:] if eng.k_max == 0]
    assert len(spec) == 1 and len(base) == 1
    assert spec[0][0].tree_sampled == (mode == "sampled") and spec[0][0].tree is not None
    assert spec[0][1].generated[0] == base[0].generated[0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_dtype_loads_both_models_in_that_dtype(capsys, runs, monkeypatch, dtype):
    """--dtype bfloat16|float16: the target and the draft are loaded in it and the run emits its
    whole budget (--ignore-eos)."""
    loaded = []
    real = generate._load
    monkeypatch.setattr(generate, "_load", lambda args: loaded.append(real(args)) or loaded[-1])
    rc, out, err = _main(capsys, *PROMPT, "--dtype", dtype, "--drafter", "model", "--ignore-eos", "--no-baseline")
    assert rc == 0, err
    want = getattr(torch, dtype)
    (target, draft), = loaded
    for model in (target, draft):
        assert {p.dtype for p in model.parameters()} == {want}
    assert " 10 tokens in" in out.splitlines()[-1]


def test_device_cpu_places_the_models_there(capsys, monkeypatch):
    """--device cpu (the default without CUDA, here given explicitly): the models live there."""
    loaded = []
    real = generate._load
    monkeypatch.setattr(generate, "_load", lambda args: loaded.append((args.device, real(args))) or loaded[-1][1])
    rc, out, err = _main(capsys, *PROMPT, "--device", "cpu", "--drafter", "model", "--no-baseline")
    assert rc == 0, err
    (device, (target, draft)), = loaded
    assert device == "cpu"
    for model in (target, draft):
        assert {p.device.type for p in model.parameters()} == {"cpu"}
