"""python -m specdec_ext.generate --drafter suffix and --prompt-file: the prompts run one
after another in one engine per round (the global suffix index carries over), the whole
run's speedup is printed with its spread, and bad files are one-line errors naming the file
and line."""
import json

import pytest

from helpers import run_generate
from specdec_ext import SpeculativeEngine


_main = run_generate  # (exit code, stdout, stderr) of generate.main(argv) in this process


@pytest.fixture
def engines(monkeypatch):
    """[(engine id, drafter, max_new_tokens)] of every SpeculativeEngine.generate call."""
    calls = []
    real = SpeculativeEngine.generate

    def counted(self, input_ids, max_new_tokens, *a, **kw):
        calls.append((id(self), self.drafter, self.k_max, max_new_tokens))
        return real(self, input_ids, max_new_tokens, *a, **kw)

    monkeypatch.setattr(SpeculativeEngine, "generate", counted)
    return calls


def test_drafter_suffix_single_prompt(capsys):
    rc, out, err = _main(capsys, "--prompt", "def f(x):", "--drafter", "suffix", "--max-new-tokens", "6",
                         "--rounds", "1", "--no-progress")
    assert rc == 0, err
    assert out.splitlines()[-1].startswith("acceptance") and "-> speedup " in out


def test_single_prompt_rounds_do_not_draft_from_their_own_earlier_output(capsys, monkeypatch):
    """--prompt with --drafter suffix: the warm-up and every timed run of the same request
    start with an empty global index (else rounds 2.. draft from round 1's output of the same
    prompt and the speedup is that of a memorised request: 3.7x instead of 1.8x measured)."""
    seen = []
    real = SpeculativeEngine.generate

    def counted(self, *a, **kw):
        if self.suffix is not None:
            seen.append(len(self.suffix))
        return real(self, *a, **kw)

    monkeypatch.setattr(SpeculativeEngine, "generate", counted)
    rc, out, err = _main(capsys, "--prompt", "def f(x):", "--drafter", "suffix", "--max-new-tokens", "6",
                         "--rounds", "3", "--no-progress")
    assert rc == 0, err
    assert seen == [0, 0, 0, 0]  # warm-up + 3 timed runs, each with no cached output


@pytest.mark.parametrize("tree", [False, True])
def test_prompt_file_runs_every_prompt_in_one_engine(capsys, tmp_path, engines, tree):
    f = tmp_path / "p.jsonl"
    f.write_text('def f(x):\n\n{"prompt": "def g(x):\\n    return"}\ndef f(x):\n')
    args = ["--prompt-file", str(f), "--drafter", "suffix", "--max-new-tokens", "5", "--rounds", "2",
            "--no-progress"] + (["--suffix-tree"] if tree else [])
    rc, out, err = _main(capsys, *args)
    assert rc == 0, err
    lines = out.splitlines()
    assert [json.loads(x)["prompt"] for x in lines[:3]] == ["def f(x):", "def g(x):\n    return", "def f(x):"]
    summary = lines[-1]
    assert summary.startswith("3 prompts, one engine") and "15 tokens in" in summary
    assert "-> speedup " in summary and "x over 2 rounds)" in summary
    timed = [c for c in engines if c[3] == 5]
    spec = [c for c in timed if c[2] > 0]
    assert len(spec) == 6 and len(timed) == 12 and {c[1] for c in spec} == {"suffix"}
    # each round: ONE engine for its three prompts, a fresh one per round
    assert spec[0][0] == spec[1][0] == spec[2][0] and spec[3][0] == spec[4][0] == spec[5][0]


def test_third_prompt_drafts_from_the_first_ones_output(capsys, tmp_path, monkeypatch):
    """The third prompt repeats the first: its output is drafted from the global index."""
    seen = []
    real = SpeculativeEngine.generate

    def record(self, *a, **kw):
        out = real(self, *a, **kw)
        seen.append((self.k_max, out))
        return out

    monkeypatch.setattr(SpeculativeEngine, "generate", record)
    f = tmp_path / "p.txt"
    f.write_text("import os\nclass A:\nimport os\n")
    rc, out, err = _main(capsys, "--prompt-file", str(f), "--drafter", "suffix", "--max-new-tokens", "16",
                         "--no-baseline", "--fixed-k", "--no-progress")
    assert rc == 0, err
    timed = [o for k, o in seen if k > 0 and len(o.generated[0]) == 16]
    assert len(timed) == 3 and timed[2].generated == timed[0].generated
    assert timed[2].steps < timed[0].steps and timed[2].stats[0].accepted > timed[0].stats[0].accepted


@pytest.mark.parametrize("content,message", [
    ("", "no prompt in it"),
    ("\n  \n", "no prompt in it"),
    ('def f():\n{"prompt": 3}\n', 'line 2: a JSON line needs a non-empty string "prompt"'),
    ('ok\n\n{"prompt": "x"\n', "line 3: not valid JSON"),
])
def test_bad_prompt_files(capsys, tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    rc, out, err = _main(capsys, "--prompt-file", str(f), "--drafter", "suffix")
    assert rc == 2 and out == ""
    assert f"--prompt-file {f}" in err and message in err and len(err.strip().splitlines()) == 1


def test_unreadable_prompt_file_and_flag_errors(capsys, tmp_path):
    rc, _, err = _main(capsys, "--prompt-file", str(tmp_path / "missing.txt"))
    assert rc == 2 and "missing.txt: cannot read it" in err
    (tmp_path / "bin").write_bytes(b"\xff\xfe\x00")
    rc, _, err = _main(capsys, "--prompt-file", str(tmp_path / "bin"))
    assert rc == 2 and "bin: cannot read it" in err
    rc, _, err = _main(capsys, "--prompt", "x", "--suffix-tree")
    assert rc == 2 and "--suffix-tree shapes the suffix drafter's proposals: add --drafter suffix" in err
    rc, _, err = _main(capsys, "--prompt", "x", "--prompt-file", "f")
    assert rc == 2 and "not allowed with argument" in err
