"""Smoke tests of the benchmarks users run (tiny sizes): each command runs end to end,
prints its table and writes JSON that benchmarks/check_targets.py reads. No timing is
asserted (speed targets live in benchmarks/, not in tests)."""
import json
import os
import subprocess
import sys

import pytest
import torch

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
    path = str(tmp_path / "kv.json")
    assert not bench_main(["kv", "--device", "cpu", "--max-len", "64", "--context", "16", "--min-seconds", "0.001",
                           "--batch", "2", "--seq", "3", "--dtype", "bf16", "--json", path])
    rows = json.load(open(path))["rows"]
    assert {r["op"] for r in rows} >= {"append", "gather"} or len(rows) >= 2
    assert all(r["seconds"] > 0 for r in rows)
    assert "GB/s" in capsys.readouterr().out


def test_bench_e2e_smoke(tmp_path, capsys):
    pytest.importorskip("transformers")
    path = str(tmp_path / "e2e.json")
    assert bench_main(["e2e", "--device", "cpu", "--k", "2", "--batch", "1", "--temperature", "0",
                       "--max-new-tokens", "6", "--prompts", "1", "--no-progress", "--repeats", "2",
                       "--json", path]) == 0
    rows = json.load(open(path))["rows"]
    methods = {r["method"] for r in rows}
    assert {"target-only", "engine", "engine adaptive", "engine ngram", "engine hybrid", "HF generate",
            "HF assisted", "HF prompt lookup"} <= methods
    engine = [r for r in rows if r["method"] == "engine"][0]
    assert engine["tokens"] == 6 and engine["speedup"] > 0 and 0 <= engine["bookkeeping"] < 1
    assert engine["rounds"] == 2 and engine["target_ratio"] > 0 and engine["predicted_r"] > 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("cpu ") and " engine " in line]
    assert printed and printed[0].rstrip().endswith(f"{engine['predicted_r']:.2f}x")  # the pred(r) column
    assert "median of 2 round(s)" in _check_targets(path)


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
            "HF-model per-row", "HF generate", "HF assisted"} <= methods
    assert "engine" not in methods  # --only-hf
    for r in rows:
        if r["method"].startswith("HF-model"):
            assert r["tokens"] == 5 * 2 and r["speedup"] > 0
    assert "HF-model" in _check_targets(path)


def test_bench_unknown_command():
    assert bench_main(["nope"]) == 2
