"""Every flag of ``python -m specdec_ext.generate`` and of each ``python -m specdec_ext.bench``
command, given a bad value, is refused with ONE line on stderr and exit code 2, before any model
loads or any benchmark runs (no traceback).

The flag lists are read from each command's ``--help``, so a new flag without an entry in
``BAD`` fails ``test_every_flag_has_a_bad_value``. The calls run in this process (the commands'
``main``), with the loading / timing functions replaced by ones that fail the test.
"""
from __future__ import annotations

import json
import re

import pytest

from specdec_ext import bundled, generate
from specdec_ext.bench import __main__ as bench_main
from specdec_ext.bench import distributed, e2e, filtered, kv, sass, verify

NO_DIR = "/nonexistent-specdec-dir/out.json"

#: command -> flag -> the argv of one bad call (generate: after "--prompt x" unless it names a prompt)
BAD = {
    "generate": {
        "--target": ["--target", "/nonexistent-specdec-dir"],
        "--draft": ["--draft", "TARGET"],
        "--prompt": ["--prompt", ""],
        "--prompt-ids": ["--prompt-ids", "-1"],
        "--prompt-file": ["--prompt-file", "/nonexistent-specdec-dir/prompts.txt"],
        "--max-new-tokens": ["--max-new-tokens", "0"],
        "--no-baseline": ["--no-baseline=1"],
        "--rounds": ["--rounds", "0"],
        "--k": ["--k", "-1"],
        "--adaptive": ["--adaptive", "fast"],
        "--fixed-k": ["--fixed-k", "--adaptive", "threshold"],
        "--drafter": ["--drafter", "oracle"],
        "--draft-head": ["--draft-head", "/nonexistent-specdec-dir"],
        "--head-branches": ["--head-branches", "0"],
        "--tree": ["--tree", "0"],
        "--tree-mode": ["--tree-mode", "all"],
        "--suffix-tree": ["--suffix-tree"],
        "--max-ngram": ["--max-ngram", "0"],
        "--datastore": ["--datastore", "/nonexistent-specdec-dir/corpus.u16"],
        "--temperature": ["--temperature", "1e-50"],
        "--top-k": ["--top-k", "-1"],
        "--top-p": ["--top-p", "0"],
        "--min-p": ["--min-p", "1"],
        "--coupled": ["--coupled=1"],
        "--verify": ["--verify", "tokens"],
        "--seed": ["--seed", "18446744073709551616"],
        "--eos-id": ["--eos-id", "-1"],
        "--ignore-eos": ["--ignore-eos=1"],
        "--device": ["--device", "foo"],
        "--dtype": ["--dtype", "float64"],
        "--hf": ["--hf=1"],
        "--compile": ["--compile=1"],
        "--metrics-port": ["--metrics-port", "70000"],
        "--no-progress": ["--no-progress=1"],
    },
    "verify": {
        "--device": ["--device", "tpu"], "--quick": ["--quick=1"], "--no-compile": ["--no-compile=1"],
        "--B": ["--B", "0"], "--K": ["--K", "-1"], "--V": ["--V", "0"], "--dtype": ["--dtype", "fp64"],
        "--json": ["--json", NO_DIR], "--cold": ["--cold=1"], "--sample": ["--sample=1"],
        "--sample-only": ["--sample-only=1"], "--filters": ["--filters=1"], "--filters-only": ["--filters-only=1"],
        "--tree": ["--tree=1"], "--tree-only": ["--tree-only=1"],
    },
    "filtered": {"--quick": ["--quick=1"], "--device": ["--device", "tpu"], "--json": ["--json", NO_DIR]},
    "kv": {
        "--device": ["--device", "tpu"], "--json": ["--json", NO_DIR], "--max-len": ["--max-len", "0"],
        "--context": ["--context", "0"], "--min-seconds": ["--min-seconds", "0"], "--batch": ["--batch", "0"],
        "--seq": ["--seq", "0"], "--dtype": ["--dtype", "fp64"], "--threads": ["--threads", "0"],
    },
    "e2e": {
        "--device": ["--device", "tpu"], "--k": ["--k", "-1"], "--batch": ["--batch", "0"],
        "--temperature": ["--temperature", "-1"], "--max-new-tokens": ["--max-new-tokens", "0"],
        "--prompts": ["--prompts", "0"], "--repeats": ["--repeats", "0"], "--json": ["--json", NO_DIR],
        "--datastore": ["--datastore", "/nonexistent-specdec-dir/corpus.u16"],
        "--plot": ["--plot", NO_DIR], "--no-progress": ["--no-progress=1"], "--compile": ["--compile=1"],
        "--hf": ["--hf=1"], "--hf-k": ["--hf-k", "0"], "--only-hf": ["--only-hf=1"], "--tree": ["--tree", "0"],
        "--no-tree": ["--no-tree=1"], "--no-block": ["--no-block=1"],
    },
    "distributed": {
        "--quick": ["--quick=1"], "--world": ["--world", "0"], "--reps": ["--reps", "0"],
        "--backend": ["--backend", "mpi"], "--json": ["--json", NO_DIR],
    },
    "sass": {"--lib": ["--lib", "/nonexistent-specdec-dir/_C.so"], "--arch": ["--arch", "90"],
             "--json": ["--json", NO_DIR]},
}

#: more bad values of generate's flags named by the issue (same rules as BAD)
MORE_GENERATE = [
    ["--seed", "-9223372036854775809"],
    ["--device", "meta"],
    ["--device", "cuda:99"],
    ["--temperature", "-1"],
]


@pytest.fixture
def nothing_runs(monkeypatch):
    """Loading a model or timing a benchmark fails the test (a refusal must come first)."""
    def ran(*a, **k):
        raise AssertionError("a model loaded or a benchmark ran: the bad value was not refused first")

    monkeypatch.setattr(generate, "_load", ran)
    for module, name in ((verify, "bench_device"), (filtered, "bench_rows"), (kv, "run"), (e2e, "bench_device"),
                         (distributed, "run_ranks"), (sass, "analyse")):
        monkeypatch.setattr(module, name, ran)


def _run(capsys, command, argv):
    """(exit code, stderr) of the command's main(argv) in this process."""
    try:
        rc = generate.main(argv) if command == "generate" else bench_main.main([command] + argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, err


def _flags(capsys, command):
    try:
        generate.main(["--help"]) if command == "generate" else bench_main.main([command, "--help"])
    except SystemExit:
        pass
    out, _ = capsys.readouterr()
    return sorted(set(re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", out)) - {"--help"})


@pytest.mark.parametrize("command", sorted(BAD))
def test_every_flag_has_a_bad_value(capsys, command):
    assert _flags(capsys, command) == sorted(BAD[command]), f"give every flag of {command} a bad value in BAD"


def _cases():
    for command, table in BAD.items():
        for flag, argv in table.items():
            yield pytest.param(command, argv, id=f"{command} {' '.join(argv)}")
    for argv in MORE_GENERATE:
        yield pytest.param("generate", argv, id=f"generate {' '.join(argv)}")


@pytest.mark.parametrize("command, argv", list(_cases()))
def test_bad_value_is_one_line_and_exit_2(capsys, nothing_runs, command, argv):
    argv = [bundled.pair_dir("target") if a == "TARGET" else a for a in argv]
    if command == "generate" and not {"--prompt", "--prompt-ids", "--prompt-file"} & set(argv):
        argv = ["--prompt", "x"] + argv
    rc, err = _run(capsys, command, argv)
    assert rc == 2, (rc, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def _checkpoint(tmp_path, name, config, weights=True):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if weights:
        (d / "model.safetensors").write_bytes(b"")  # never read: the refusal comes first
    return str(d)


def _llama_config(**change):
    with open(f"{bundled.pair_dir('target')}/config.json") as f:
        cfg = json.load(f)
    if "rope_scaling" in change and "rope_parameters" in cfg:  # newer configs hold the scaling there
        theta = cfg.pop("rope_parameters").get("rope_theta")
        cfg.update({} if theta is None else {"rope_theta": theta})
    cfg.update(change)
    return cfg


@pytest.mark.parametrize("case, config, weights, msg", [
    ("qwen2", dict(model_type="qwen2"), True, "only Llama checkpoints are supported"),
    ("yarn", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), True, "rope_scaling type 'yarn'"),
    ("no weights", {}, False, "no weights there"),
])
def test_unusable_checkpoints_are_refused_before_loading(capsys, nothing_runs, tmp_path, case, config, weights, msg):
    target = _checkpoint(tmp_path, "t", _llama_config(**config), weights)
    rc, err = _run(capsys, "generate", ["--target", target, "--prompt-ids", "1", "2"])
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    if case == "yarn":
        assert "supported: " in err  # names the rope types the reference model implements


def test_metrics_port_zero_prints_the_chosen_port(capsys):
    rc, err = _run(capsys, "generate", ["--prompt", "x", "--max-new-tokens", "2", "--metrics-port", "0",
                                        "--no-baseline", "--no-progress"])
    assert rc == 0, err
    lines = [line for line in err.splitlines() if line.startswith("metrics: ")]
    assert len(lines) == 1 and re.fullmatch(r"metrics: http://127\.0\.0\.1:\d+/metrics", lines[0]), err
    assert not lines[0].endswith(":0/metrics")


@pytest.mark.parametrize("argv, msg", [
    (["--tree", "100", "100", "100"], "one target pass scores its 1010101 nodes, but the target model holds 2048 "
                                      "positions and the prompt takes 1; use --tree 100 19 or smaller"),
    (["--k", "100000", "--fixed-k"], "--k 100000: a step scores K + 1 = 100001 positions, but the target model holds "
                                     "2048 and the prompt takes 1; use --k 2047 or less"),
    (["--k", "100000"], "use --k 2047 or less"),
])
def test_speculation_that_does_not_fit_is_refused_with_the_largest_that_fits(capsys, nothing_runs, argv, msg):
    """A tree or K one target pass cannot hold used to run silently cut (--tree 100 100 100 at depth 1)."""
    rc, err = _run(capsys, "generate", ["--prompt-ids", "5"] + argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, k", [
    ([], 16), (["--drafter", "suffix"], 16), (["--drafter", "suffix", "--suffix-tree"], 5),
    (["--drafter", "model"], 5), (["--drafter", "hybrid"], 16), (["--tree", "2", "2"], 5), (["--k", "3"], 3),
    (["--drafter", "head"], 16),
])
def test_default_k_is_16_for_drafts_from_the_text_and_5_with_a_draft_model(nothing_runs, argv, k):
    from specdec_ext import generate

    ap = generate.build_parser()
    args = ap.parse_args(["--prompt-ids", "5", "6"] + argv)
    generate.check_args(ap, args)
    assert args.k == k


@pytest.mark.parametrize("argv, drafter", [
    ([], "head"), (["--hf"], "ngram"), (["--compile"], "ngram"), (["--datastore", "README.md"], "ngram"),
    (["--target", "BUNDLED"], "ngram"), (["--target", "BUNDLED", "--draft-head", "HEAD"], "head"),
])
def test_default_drafter_is_the_head_where_one_runs(nothing_runs, argv, drafter):
    """The bundled pair's head on the reference model's eager steps; n-gram where it cannot
    run (--hf, --compile), next to --datastore, and for a --target without --draft-head."""
    from specdec_ext import bundled, generate

    argv = [{"BUNDLED": bundled.pair_dir("target"), "HEAD": bundled.pair_dir("head")}.get(a, a) for a in argv]
    ap = generate.build_parser()
    args = ap.parse_args(["--prompt-ids", "5", "6"] + argv)
    generate.check_args(ap, args)
    assert args.drafter == drafter


@pytest.mark.parametrize("argv, msg", [
    (["--drafter", "head", "--hf"], "--drafter head reads the target's hidden states"),
    (["--drafter", "head", "--compile"], "--drafter head runs the target's steps eager"),
    (["--drafter", "ngram", "--draft-head", "HEAD"], "--draft-head drafts for --drafter head, not --drafter ngram"),
    (["--drafter", "head", "--target", "BUNDLED"], "--drafter head with --target DIR needs --draft-head DIR"),
    (["--draft-head", "BUNDLED"], "is for hidden_size"),
    (["--drafter", "ngram", "--head-branches", "2"], "--head-branches shapes --drafter head's drafts; the drafter here is ngram"),
    (["--hf", "--head-branches", "2"], "--head-branches shapes --drafter head's drafts; the drafter here is ngram"),
    (["--coupled", "--head-branches", "2"], "--head-branches: coupled mode drafts chains"),
])
def test_head_arguments_are_refused_in_one_line(capsys, argv, msg):
    from specdec_ext import bundled

    argv = [{"BUNDLED": bundled.pair_dir("draft"), "HEAD": bundled.pair_dir("head")}.get(a, a) for a in argv]
    rc, err = _run(capsys, "generate", ["--prompt-ids", "5", "6", "--max-new-tokens", "2", "--no-baseline"] + argv)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_default_k_shrinks_to_fit_a_long_prompt_but_a_given_k_is_refused(capsys, nothing_runs):
    """The bundled target holds 2048 positions: next to a 2040-token prompt a pass holds 9, so
    the default K (16) becomes 8; an explicit --k 16 is refused with that advice."""
    from specdec_ext import generate

    ids = ["5"] * 2040
    ap = generate.build_parser()
    args = ap.parse_args(["--prompt-ids", *ids, "--max-new-tokens", "4"])
    generate.check_args(ap, args)
    assert args.k == 8
    rc, err = _run(capsys, "generate", ["--prompt-ids", *ids, "--max-new-tokens", "4", "--k", "16"])
    assert rc == 2 and "use --k 8 or less" in err, err
