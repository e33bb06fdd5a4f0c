"""python -m specdec_ext.bench and benchmarks/check_targets.py, what a user hits: the command
listing, the machine's load recorded in every benchmark JSON (with a warning when busy),
the legend of the `x` columns, and check_targets refusing to judge runs timed under load."""
import json
import os
import subprocess
import sys

import pytest

from specdec_ext.bench import kv as bench_kv
from specdec_ext.bench import timing
from specdec_ext.bench import verify as bench_verify
from specdec_ext.bench.__main__ import COMMANDS
from specdec_ext.bench.__main__ import main as bench_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "benchmarks", "check_targets.py")
BUSY = dict(load_1min=5.0, cpu_count=2)
IDLE = dict(load_1min=0.5, cpu_count=2)


# ---------------------------------------------------------------- the command listing
@pytest.mark.parametrize("argv,rc,problem", [([], 0, None), (["--help"], 0, None),
                                             (["nope"], 2, "unknown command 'nope'")])
def test_listing_names_every_command_and_what_it_compares(capsys, argv, rc, problem):
    """No command and --help list the commands on stdout (exit 0); an unknown one is an
    error with the same list on stderr (exit 2)."""
    assert bench_main(argv) == rc
    out, err = capsys.readouterr()
    text, other = (out, err) if rc == 0 else (err, out)
    assert other == ""
    assert text.count("usage: python -m specdec_ext.bench") == 1
    for name, (_, what) in COMMANDS.items():
        assert f"  {name}  " in text and what in text, name
    assert "plain PyTorch" in text and "torch.compile" in text and "Hugging Face generate" in text
    if problem:
        assert err.startswith(f"python -m specdec_ext.bench: error: {problem}")


# ---------------------------------------------------------------- load helpers
def test_machine_load_and_busy_reason():
    load = timing.machine_load()
    assert set(load) == {"load_1min", "cpu_count"} and load["cpu_count"] == os.cpu_count()
    assert load["load_1min"] is None or load["load_1min"] >= 0
    assert timing.busy_reason(BUSY) == "machine busy (load 5.00 > 2 cores)"
    assert timing.busy_reason(dict(load_1min=2.0, cpu_count=2)) is None  # equal: every core busy, none waiting
    assert timing.busy_reason(dict(load_1min=None, cpu_count=2)) is None
    assert timing.busiest([IDLE, BUSY, dict(load_1min=None, cpu_count=2)]) is BUSY
    assert timing.busiest([]) == {}


def test_bench_kv_records_the_load_and_warns(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_kv, "machine_load", lambda: dict(BUSY))
    path = str(tmp_path / "kv.json")
    assert not bench_main(["kv", "--device", "cpu", "--max-len", "32", "--context", "16", "--min-seconds", "0.001",
                           "--batch", "1", "--seq", "2", "--dtype", "bf16", "--json", path])
    data = json.load(open(path))
    assert data["machine"] == BUSY and all(r["load_1min"] == 5.0 and r["cpu_count"] == 2 for r in data["rows"])
    assert "warning: machine busy (load 5.00 > 2 cores)" in capsys.readouterr().err


def test_bench_verify_records_the_load_and_labels_x(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "verify.json")
    assert bench_main(["verify", "--device", "cpu", "--no-compile", "--B", "1", "--K", "2", "--V", "1000",
                       "--dtype", "fp32", "--json", path]) == 0
    out, err = capsys.readouterr()
    data = json.load(open(path))
    assert data["machine"]["cpu_count"] == os.cpu_count()
    assert all("load_1min" in r and r["cpu_count"] == os.cpu_count() for r in data["rows"])
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("op "))
    assert lines[header] == bench_verify.HEADER and lines[header + 1] == bench_verify.LEGEND
    for ratio in ("torch/fused", "compile/fused", "fi/fused"):  # each ratio column says what it divides
        assert ratio in bench_verify.HEADER and ratio in bench_verify.LEGEND
    assert ("warning: machine busy" in err) == (timing.busy_reason(timing.busiest(data["rows"])) is not None)


# ---------------------------------------------------------------- check_targets
def _verify_row(**load):
    """A verify row that meets the CPU 10x target."""
    return dict(op="verify", device="cpu", dtype="fp32", B=8, K=5, V=128256, fused_s=1e-3, torch_s=2e-2,
                compile_s=None, **load)


def _e2e_rows(**load):
    return [dict(device="cpu", batch=1, temperature=0.0, method="engine", k=4, speedup=1.5, predicted=1.6,
                 tok_s=100.0, rounds=3, **load)]


def _check(tmp_path, data):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    return subprocess.run([sys.executable, CHECK, str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("rows", [[_verify_row(**BUSY)], _e2e_rows(**BUSY)], ids=["verify", "e2e"])
def test_check_targets_refuses_a_busy_run(tmp_path, rows):
    out = _check(tmp_path, dict(rows=rows))
    assert "refused: machine busy (load 5.00 > 2 cores)" in out
    targets = [line for line in out.splitlines() if line.startswith("target")]
    assert targets and all(line.startswith("target REFUSED") for line in targets)
    assert " MET" not in out


def test_check_targets_refuses_when_only_the_file_record_is_busy(tmp_path):
    out = _check(tmp_path, dict(rows=[_verify_row(**IDLE)], machine=BUSY))
    assert "refused: machine busy" in out and "target MET" not in out


def test_check_targets_judges_an_idle_run(tmp_path):
    out = _check(tmp_path, dict(rows=[_verify_row(**IDLE)], machine=IDLE))
    assert "target MET     CPU B=8 K=5 V=128256 fp32: fused >= 10x plain PyTorch: 20.0x" in out
    assert "refused" not in out and "REFUSED" not in out and "load not recorded" not in out


def test_check_targets_judges_older_json_with_a_note(tmp_path):
    out = _check(tmp_path, dict(rows=[_verify_row()]))
    assert "load not recorded (older JSON): judged anyway" in out and "target MET" in out
