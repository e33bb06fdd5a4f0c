"""Smoke tests of the benchmarks users run (tiny sizes): each command runs end to end,
prints its table and writes JSON that benchmarks/check_targets.py reads. No timing is
asserted (speed targets live in benchmarks/, not in tests)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import cli_runner
from specdec_ext.bench import e2e as bench_e2e
from specdec_ext.bench import verify as bench_verify
from specdec_ext.bench import verify_tree as bench_verify_tree
from specdec_ext.bench.__main__ import main as bench_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _check_targets(path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "check_targets.py"), path],
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_bench_verify_smoke(tmp_path, capsys):
    path = str(tmp_path / "verify.json")
    assert bench_main(["verify", "--device", "cpu", "--no-compile", "--B", "1", "8", "--K", "5", "--V", "128256",
                       "--dtype", "fp32", "--json", path]) == 0
    rows = json.load(open(path))["rows"]
    assert [(r["B"], r["K"], r["V"]) for r in rows] == [(1, 5, 128256), (8, 5, 128256)]
    assert all(r["fused_s"] > 0 and r["torch_s"] > 0 and 0 <= r["accept_rate"] <= 1 for r in rows)
    assert "fused" in capsys.readouterr().out
    assert "B=8 K=5 V=128256 fp32: fused >= 10x plain PyTorch" in _check_targets(path)


def test_bench_verify_filters_smoke(tmp_path, capsys):
    path = str(tmp_path / "filters.json")
    assert bench_main(["verify", "--device", "cpu", "--no-compile", "--filters-only", "--B", "8", "--K", "5",
                       "--V", "128256", "--json", path]) == 0
    rows = json.load(open(path))["rows"]
    assert [r["op"] for r in rows] == ["v:p.9", "v:k50"]
    assert all(r["fused_s"] > 0 and r["torch_s"] > 0 for r in rows)
    assert "v:p.9" in capsys.readouterr().out
    assert "CPU filtered verify (v:k50) B=8 K=5 V=128256" in _check_targets(path)


def test_torch_filter_baseline_matches_the_filtered_law():
    """The sort-based baseline keeps what the fused filters keep (distinct logits)."""
    from specdec_ext.bench.verify import torch_filter
    from stats_reference import filtered_softmax64
    x = torch.randn(4, 300, dtype=torch.float64).float()
    for filt in (dict(top_k=7), dict(top_p=0.8), dict(top_k=20, top_p=0.5)):
        kept = torch.isfinite(torch_filter(x, **filt))
        assert torch.equal(kept, torch.from_numpy(filtered_softmax64(x, 1.0, **filt) > 0)), filt


def test_bench_filtered_smoke(tmp_path, capsys):
    from specdec_ext.bench import filtered
    path = str(tmp_path / "filtered.json")
    assert bench_main(["filtered", "--device", "cpu", "--quick", "--json", path]) == 0
    rows = json.load(open(path))["rows"]
    assert {r["op"] for r in rows} == {"filtered_probs", "logprobs", "verify+logprobs"}
    assert all(r["verify_s"] > 0 and 0 <= r["alpha"] <= 1 for r in rows if r["op"] == "verify+logprobs")
    assert all(r["fused_s"] > 0 and r["torch_s"] > 0 and r["load_1min"] is not None for r in rows)
    assert "filtered_probs" in capsys.readouterr().out
    # the baseline computes the same law as the op it is timed against
    x = torch.randn(3, 500) * 3
    torch.testing.assert_close(filtered.torch_filtered_probs(x),
                               torch.ops.specdec.filtered_probs(x, torch.tensor(filtered.T), torch.tensor(filtered.TOP_K),
                                                                torch.tensor(filtered.TOP_P), None, False),
                               atol=1e-6, rtol=1e-4)


def test_bench_distributed_smoke(tmp_path, capsys):
    path = str(tmp_path / "distributed.json")
    assert bench_main(["distributed", "--quick", "--reps", "2", "--json", path]) == 0
    rows = json.load(open(path))["rows"]
    assert [(r["P"], r["B"], r["V"]) for r in rows] == [(2, 1, 32000), (2, 8, 32000)]
    assert all(r["collectives"] == 4 and r["fused_s"] > 0 and r["gather_s"] > 0 for r in rows)
    # every rank sends O(B (K+1)) values, the gather its [B, K+1, V / P] float32 logits
    assert all(r["bytes"] < r["gather_bytes"] / 100 for r in rows)
    assert "gather ms" in capsys.readouterr().out
    assert bench_main(["distributed", "--backend", "nccl"]) == 2


def test_bench_kv_smoke(tmp_path, capsys):
    """One (B, S) and one gather: every op with each of its implementations, once, printed."""
    path = str(tmp_path / "kv.json")
    assert not bench_main(["kv", "--device", "cpu", "--max-len", "64", "--context", "16", "--min-seconds", "0.001",
                           "--batch", "2", "--seq", "3", "--dtype", "bf16", "--json", path])
    rows = json.load(open(path))["rows"]
    assert sorted((r["op"], r["impl"]) for r in rows) == sorted([
        ("append", "kv_append_"), ("append", "torch indexing"), ("append", "copy_"),
        ("paged_append", "paged_kv_append_"), ("paged_append", "torch index_copy_"),
        ("gather", "paged_kv_gather"), ("gather", "paged_kv_gather_into_"), ("gather", "torch index_select"),
        ("gather", "copy_")])
    assert all(r["B"] == 2 and r["dtype"] == "bfloat16" and r["S"] == (16 if r["op"] == "gather" else 3)
               for r in rows)
    assert all(r["seconds"] > 0 and r["gbps"] > 0 for r in rows)
    lines = capsys.readouterr().out.splitlines()
    assert "GB/s" in lines[0] and len(lines) == 1 + len(rows)


def test_bench_e2e_smoke(tmp_path, capsys):
    """Every method's row, the pred(r) column, the tree lines, --plot's PNG, check_targets."""
    pytest.importorskip("transformers")
    path, png = str(tmp_path / "e2e.json"), tmp_path / "e2e.png"
    assert bench_main(["e2e", "--device", "cpu", "--k", "2", "--batch", "1", "--temperature", "0",
                       "--max-new-tokens", "6", "--prompts", "1", "--no-progress", "--repeats", "2",
                       "--json", path, "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    rows = json.load(open(path))["rows"]
    methods = {r["method"] for r in rows}
    assert {"target-only", "engine", "engine adaptive", "engine budget", "engine ngram", "engine hybrid", "engine head",
            "engine head chain", "engine suffix", "engine suffix tree", "HF generate", "HF assisted",
            "HF prompt lookup", "engine block", "engine adaptive block"} <= methods
    engine = [r for r in rows if r["method"] == "engine"][0]
    block = [r for r in rows if r["method"] == "engine block"][0]
    assert block["tokens_per_step_se"] >= 0 and engine["tokens_per_step_se"] >= 0
    assert block["k"] == 2 and block["tokens"] == 6  # greedy: one-hot drafts, the same law as token-wise
    assert engine["tokens"] == 6 and engine["speedup"] > 0 and 0 <= engine["bookkeeping"] < 1
    assert engine["rounds"] == 2 and engine["target_ratio"] > 0 and engine["predicted_r"] > 0
    out = capsys.readouterr().out.splitlines()
    printed = [line for line in out if line.startswith("cpu ") and " engine " in line]
    assert printed and printed[0].rstrip().endswith(f"{engine['predicted_r']:.2f}x")  # the pred(r) column
    tree = [line for line in out if " vs chain K=3: " in line]  # the default --tree 4 2 2 against K = 3
    assert len(tree) == 2 and all("(tree/chain x" in line and "tokens/s tree/chain x" in line for line in tree)
    suffix = [line for line in out if line.startswith("cpu ") and ": proposal " in line]
    assert len(suffix) == 5 and all("% of the step time" in line for line in suffix)
    assert all("tokens per target pass" in line for line in suffix if "suffix" in line)
    blocks = [line for line in out if " vs token-wise: " in line]
    assert len(blocks) == 2 and all("(block/token x" in line for line in blocks)
    judged = _check_targets(path)
    assert "median of 2 round(s)" in judged
    assert "engine block K=2: block tokens per target pass >= token-wise" in judged


def test_bench_e2e_block_summary_pairs_rows_by_method_and_k():
    """Each block row is compared with the token-wise row of its own K and policy (not
    another K's), and check_targets judges block tokens per pass below token-wise NOT MET."""
    import importlib.util

    base = dict(device="cpu", batch=1, temperature=1.0)
    rows = [dict(base, method="engine", k=2, tokens_per_step=2.0, tok_s=100.0),
            dict(base, method="engine", k=4, tokens_per_step=2.5, tok_s=110.0, tokens_per_step_se=0.04),
            dict(base, method="engine block", k=2, tokens_per_step=2.1, tok_s=101.0),
            dict(base, method="engine block", k=4, tokens_per_step=2.4, tok_s=80.0, tokens_per_step_se=0.04),
            dict(base, method="engine adaptive", k="<=4", tokens_per_step=2.2, tok_s=120.0),
            dict(base, method="engine adaptive block", k="<=4", tokens_per_step=2.3, tok_s=119.0)]
    lines = bench_e2e.block_summary(rows)
    assert lines[0].startswith("cpu   1 1.0 engine block K=2 vs token-wise: 2.100 vs 2.000 tokens per target pass")
    assert "engine block K=4 vs token-wise: 2.400 vs 2.500" in lines[1] and "difference -0.100 +- 0.057 s.e." in lines[1]
    assert "s.e." not in lines[0]  # no spread recorded for that pair
    assert "engine adaptive block K=<=4 vs token-wise: 2.300 vs 2.200" in lines[2] and len(lines) == 3
    spec = importlib.util.spec_from_file_location("check_targets", os.path.join(ROOT, "benchmarks", "check_targets.py"))
    ct = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ct)
    judged = {name: ok for name, ok, _ in ct.block_targets(rows, "cpu", 1.0)}
    assert judged["cpu T=1.0 B=1 engine block K=2: block tokens per target pass >= token-wise"]
    assert not judged["cpu T=1.0 B=1 engine block K=4: block tokens per target pass >= token-wise"]
    assert not judged["cpu T=1.0 B=1 engine block K=4: block tokens/s >= 0.9x token-wise"]
    assert judged["cpu T=1.0 B=1 engine block K=4: block tokens per target pass not below token-wise by more than 2 s.e."]
    assert judged["cpu T=1.0 B=1 engine adaptive block K=<=4: block tokens/s >= 0.9x token-wise"]


def test_check_targets_prompt_lookup_target():
    """Issue 32's peer target: the best model-free HF-model row (n-gram, datastore, suffix)
    against HF prompt lookup at 1.5x; a planted pair just below comes out NOT MET."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_targets", os.path.join(ROOT, "benchmarks", "check_targets.py"))
    ct = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ct)
    base = dict(device="cpu", batch=1, temperature=0.0)
    rows = [dict(base, method="HF prompt lookup", tok_s=100.0), dict(base, method="HF-model ngram", tok_s=140.0),
            dict(base, method="HF-model suffix", tok_s=149.0), dict(base, method="HF-model hybrid", tok_s=400.0)]
    [(name, ok, detail)] = ct.prompt_lookup_targets(rows, "cpu", 0.0)
    assert not ok and detail == "149 (HF-model suffix) vs 100 tok/s"  # hybrid uses the draft model: not counted
    rows.append(dict(base, method="HF-model ngram datastore", tok_s=150.0))
    [(name, ok, detail)] = ct.prompt_lookup_targets(rows, "cpu", 0.0)
    assert ok and "HF-model ngram datastore" in detail and "1.5x HF prompt lookup" in name


def test_bench_e2e_summary_takes_per_round_ratios():
    """Speedup, c and r are medians of per-round ratios against the same round's baseline
    (a slow round slows the baseline and the row alike), not ratios of medians; c and the
    pred(r) step are in units of the baseline's whole step t, of which its target phase is
    only a part."""
    from specdec_ext.bench.e2e import Config, summarize
    from specdec_ext.engine.adaptive_k import predicted_speedup

    def res(seconds, draft=None, target=None, alpha=None):
        return dict(tokens=100, seconds=seconds, tok_s=100 / seconds, alpha=alpha, tokens_per_step=2.0,
                    draft_s_per_token=draft, target_s_per_step=target, bookkeeping=0.02)

    # t per round: 0.01, 0.03, 0.01 s (round 2: a machine three times as slow); target phase 80% of it
    base = [res(1.0, target=0.008), res(3.0, target=0.024), res(1.0, target=0.008)]
    runs = [res(0.5, 0.002, 0.0096, 0.6), res(1.0, 0.006, 0.0288, 0.6), res(0.8, 0.0015, 0.0092, 0.6)]
    row = summarize("cpu", 1, 0.0, Config("engine", 4, lambda: None), runs, base)
    assert row["rounds"] == 3 and row["tok_s"] == pytest.approx(125)  # median of 200, 100, 125
    # per round 2.0, 3.0, 1.25 -> 2.0; the ratio of the medians would be 125 / 100 = 1.25
    assert row["speedup"] == pytest.approx(2.0)
    assert row["cost_ratio"] == pytest.approx(0.2)  # 0.2, 0.2, 0.15
    assert row["target_ratio"] == pytest.approx(1.2)  # 1.2, 1.2, 1.15
    step = 1.0 + (0.0096 - 0.008) / 0.01  # 1.16, 1.16, 1.12: the extra target time in units of t
    assert row["predicted"] == pytest.approx(predicted_speedup(0.6, 4, 0.2))
    assert row["predicted_r"] == pytest.approx(predicted_speedup(0.6, 4, 0.2, step))


def test_bench_e2e_hf_model_rows(tmp_path):
    pytest.importorskip("transformers")
    path = str(tmp_path / "e2e.json")
    assert bench_main(["e2e", "--device", "cpu", "--only-hf", "--hf-k", "2", "--batch", "1", "2",
                       "--temperature", "0", "--max-new-tokens", "5", "--prompts", "2", "--no-progress",
                       "--json", path]) == 0
    rows = json.load(open(path))["rows"]
    methods = {r["method"] for r in rows}
    assert {"target-only", "HF-model target-only", "HF-model engine", "HF-model adaptive", "HF-model hybrid",
            "HF-model per-row", "HF-model suffix", "HF generate", "HF assisted", "HF prompt lookup"} <= methods
    assert "engine" not in methods  # --only-hf
    for r in rows:
        if r["method"].startswith("HF-model"):
            assert r["tokens"] == 5 * 2 and r["speedup"] > 0
    assert "HF-model" in _check_targets(path)


# ---------------------------------------------------------------- flags, through the fork runner
TINY_VERIFY = ["-m", "specdec_ext.bench", "verify", "--device", "cpu", "--no-compile", "--quick",
               "--B", "1", "--K", "2", "--V", "1000", "--dtype", "fp32"]


def _after(lines, header):
    """The lines after the first line equal to ``header``."""
    return lines[lines.index(header) + 1:]


def test_bench_verify_sample_cold_tree(tmp_path):
    """--sample --cold --tree: verify and sample rows with their cold columns in one table,
    then the verify_tree table; every JSON row in one of them."""
    path = tmp_path / "v.json"
    r = cli_runner.run([*TINY_VERIFY, "--sample", "--cold", "--tree", "--json", path], cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.load(open(path))["rows"]
    assert [(x["op"], x["B"], x["V"]) for x in rows] == [("verify", 1, 1000), ("sample", 1, 1000),
                                                        ("verify_tree", 1, 32000)]  # tree: its QUICK grid
    assert all(x["fused_cold_s"] > 0 and x["torch_cold_s"] > 0 for x in rows[:2])
    lines = r.stdout.splitlines()
    chain = _after(lines, bench_verify.HEADER + bench_verify.COLD_HEADER)
    assert chain[:2] == [bench_verify.LEGEND, bench_verify.COLD_LEGEND]
    assert [line.split()[0] for line in chain[2:4]] == ["verify", "sample"]
    assert chain[2].count("||") == 1 and chain[2].rstrip().endswith("x")  # the cold columns filled
    tree = _after(lines, bench_verify_tree.HEADER)
    assert tree == [bench_verify_tree.LEGEND, bench_verify_tree.format_row(rows[2])]
    assert chain[4] == bench_verify_tree.HEADER  # the tree table follows the chain table


def test_bench_verify_sample_only_tree_only(tmp_path):
    """--sample-only --tree-only: no verify rows (no chain table for them), sample rows on the
    --B / --V grid, the verify_tree table."""
    path = tmp_path / "v.json"
    r = cli_runner.run([*TINY_VERIFY, "--sample-only", "--tree-only", "--json", path], cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.load(open(path))["rows"]
    assert [(x["op"], x["B"], x["V"]) for x in rows] == [("sample", 1, 1000), ("verify_tree", 1, 32000)]
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in _after(lines, bench_verify.HEADER)[1:3]] == ["sample", "op"]
    assert _after(lines, bench_verify_tree.HEADER)[1:] == [bench_verify_tree.format_row(rows[1])]


TINY_E2E = ["-m", "specdec_ext.bench", "e2e", "--device", "cpu", "--k", "1", "--batch", "1", "--temperature", "0",
            "--max-new-tokens", "4", "--prompts", "1", "--no-progress", "--no-tree"]


def test_bench_e2e_datastore(tmp_path):
    """--datastore adds the 'engine ngram datastore' row (n-gram with retrieval drafting);
    a missing corpus is a one-line error naming the flag."""
    corpus = tmp_path / "corpus.py"
    corpus.write_text("def f(x):\n    return x + 1\n" * 20)
    path = tmp_path / "e2e.json"
    r = cli_runner.run([*TINY_E2E, "--no-block", "--datastore", corpus, "--json", path], cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {x["method"]: x for x in json.load(open(path))["rows"]}
    assert rows["engine ngram datastore"]["tokens"] == 4 and rows["engine ngram datastore"]["speedup"] > 0
    r = cli_runner.run([*TINY_E2E, "--datastore", tmp_path / "missing.u16"], cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--datastore" in r.stderr and "no such file" in r.stderr


@pytest.mark.skipif(os.environ.get("SPECDEC_BENCH_COMPILE") != "1",
                    reason="opt-in (SPECDEC_BENCH_COMPILE=1): freezing and compiling the bundled target's decode "
                           "steps takes 35-50 s on 2 cores, more than the default suite can spend on one flag")
def test_bench_e2e_compile(tmp_path):
    """--compile adds the 'engine ngram compiled' row (the n-gram engine on compiled steps)."""
    path = tmp_path / "e2e.json"
    r = cli_runner.run([*TINY_E2E, "--compile", "--json", path], cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {x["method"]: x for x in json.load(open(path))["rows"]}
    compiled = rows["engine ngram compiled"]
    assert compiled["tokens"] == 4 and compiled["speedup"] > 0 and compiled["k"] == "<=1"
    printed = [line for line in r.stdout.splitlines() if " engine ngram compiled " in line]
    assert printed == [bench_e2e.format_row(compiled)]


# ---------------------------------------------------------------- nothing inside the tables
NOISY = """
import logging, os, sys, warnings
os.dup2(1, 2)  # stderr into stdout's file: one stream, in time order, as on a terminal
sys.stdout.reconfigure(line_buffering=True)
from specdec_ext.bench import verify
from specdec_ext.bench.__main__ import main
make_inputs = verify.make_inputs

def noisy_inputs(*a, **k):  # third-party noise while measuring, of the three kinds seen
    warnings.warn("forced: this argument is deprecated", FutureWarning)
    logging.getLogger("torch.utils.cpp_extension").warning("No CUDA runtime is found, using CUDA_HOME='/x'")
    sys.stderr.write("Loading weights: 100%|##########| 56/56\\n")
    return make_inputs(*a, **k)

verify.make_inputs = noisy_inputs
sys.exit(main(sys.argv[1:]))
"""


def test_bench_tables_come_after_third_party_noise(tmp_path):
    """Warnings, log records and progress bars printed while measuring land before the
    table in a stream holding stdout and stderr (a terminal): after its header come only
    its legend and its rows; the warning and the log record are reported, once each."""
    script = tmp_path / "noisy.py"
    script.write_text(NOISY)
    r = cli_runner.run([script, *TINY_VERIFY[2:], "--B", "1", "2"], cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout
    lines = r.stdout.splitlines()
    table = _after(lines, bench_verify.HEADER)
    assert table[0] == bench_verify.LEGEND and len(table) == 3, r.stdout
    assert all(line.startswith("verify cpu  fp32") for line in table[1:]), r.stdout
    before = lines[:lines.index(bench_verify.HEADER)]
    assert sum("FutureWarning: forced: this argument is deprecated" in line for line in before) == 1
    assert sum("No CUDA runtime is found" in line for line in before) == 1
    assert any(line.startswith("Loading weights") for line in before)


def test_bench_linear_smoke(tmp_path, capsys):
    """Every method at each row count over a small random stack: rows, ratios, load, printed."""
    path = str(tmp_path / "linear.json")
    assert not bench_main(["linear", "--hidden", "64", "--layers", "1", "--rows", "1", "3", "--rounds", "2",
                           "--json", path])
    data = json.load(open(path))
    rows = data["rows"]
    methods = ["F.linear", "skinny_linear", "skinny_packed"]
    assert [(r["rows"], r["method"]) for r in rows] == [(m, name) for m in (1, 3) for name in methods]
    assert all(r["weights"] == 5 and r["seconds"] > 0 and "load_1min" in r for r in rows)
    assert [r["vs_one_row"] for r in rows[:3]] == [1.0, 1.0, 1.0]
    assert "ms/pass" in capsys.readouterr().out


def test_bench_linear_forward_smoke(tmp_path, capsys):
    """--forward: the bundled target's forward at each S, packed and plain: rows, load, printed."""
    path = str(tmp_path / "forward.json")
    assert not bench_main(["linear", "--forward", "--rows", "1", "3", "--rounds", "2", "--json", path])
    rows = json.load(open(path))["rows"]
    assert [r["tokens"] for r in rows] == [1, 3]
    assert all(r["plain_seconds"] > 0 and r["packed_seconds"] > 0 and "load_1min" in r for r in rows)
    assert "plain/packed" in capsys.readouterr().out
