"""Proof of power of the Python test suite (issue 35 item 8): each deliberate bug below,
planted in a copy of the package, must make the tests named with it fail.

    .venv/bin/python scripts/py_mutations.py            # all mutations; exit 1 if one survives
    .venv/bin/python scripts/py_mutations.py -k n-gram  # the mutations whose name contains "n-gram"
    .venv/bin/python scripts/py_mutations.py --list     # the bugs and their tests (patterns checked), nothing run

(the Python-side twin of scripts/simt_mutations.py, which plants bugs in the CUDA kernels;
run by scripts/long_check.sh, i.e. ``bash scripts/test.sh --long``).

For each mutation: copy specdec_ext/ (with its built extension, without bytecode caches) to
a temporary directory, replace the one exact text of the mutation in one .py file (it must
occur exactly once: a stale pattern fails this script loudly instead of planting nothing),
and run the named test files of python_tests/ against the copy: ``PYTHONPATH`` puts the copy
first and pytest runs from the temporary directory (not from the repository, whose
specdec_ext/ would shadow it); the run prints ``specdec_ext.__file__`` and the script
checks that it is the copy's. A mutation is caught when pytest reports a failed test (exit
1); every test passing, or no verdict (a collection error, no test selected), fails this
script. First, the same tests run once against an unmutated copy and must all pass (else a
test that fails anyway would "catch" every bug).

The tests run under SPECDEC_QUICK=1 (helpers.draws: the reduced counts of the chi-square
and fuzz runs; their seeds are fixed: the quick tier must catch every bug), with -x (a
mutant stops at its first failure).

Measured 2026-12-04 at commit 5fdc289 (2 shared cores, no GPU): 15 mutations and the
control run in 1m56s; 15 caught, every one at the quick counts.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYTEST = ["-x", "-q", "-rf", "-p", "no:cacheprovider", "-m", "not simt and not cuda"]

# (name, file in specdec_ext/, original text, mutated text, the tests: python_tests/ file names,
# optionally pytest options such as -k)
MUTATIONS = [
    ("engine: the target rolls back one entry too many after a chain step",
     "engine/engine.py",
     "drop_entries(self.target, [k + 1 - (c.kept_target if c else 0) for c in commits])",
     "drop_entries(self.target, [k + 2 - (c.kept_target if c else 0) for c in commits])",
     ["test_engine_llama.py"]),
    ("commit: the draft keeps the entry of its first rejected draft (off by one)",
     "engine/commit.py",
     "in_draft_cache = min(m - 1, k - 1)",
     "in_draft_cache = min(m, k - 1)",
     ["test_engine_commit.py", "test_engine_llama.py"]),
    ("K cap: a row may draft up to its whole remaining budget (the -1 for the correction token dropped)",
     "engine/run.py",
     "caps = {b: max(0, min(self.max_new_tokens - len(self.generated[b]) - 1, room))",
     "caps = {b: max(0, min(self.max_new_tokens - len(self.generated[b]), room))",
     ["test_engine_capacity.py"]),
    ("adaptive K: every own row chooses from the first active row's acceptance estimate, not its own",
     "engine/adaptive_k.py",
     "ks = {b: cap(b, self.policies[b].choose([a], costs)) for b, a in alphas.items()",
     "ks = {b: cap(b, self.policies[b].choose([alphas[min(alphas)]], costs)) for b, a in alphas.items()",
     ["test_adaptive_k.py"]),
    ("draft probs: every draft position gets position 0's law in draft_probs",
     "engine/phases.py",
     "                                 probs_out=None if probs is None else probs[:, i])\n",
     "                                 probs_out=None if probs is None else probs[:, i])\n"
     "        if probs is not None and i > 0:\n"
     "            probs[:, i] = probs[:, 0]\n",
     ["test_engine.py", "-k", "first_three_tokens"]),
    ("budget: a row may draft k_max + 1 tokens (the plan's bound off by one)",
     "engine/budget.py",
     "caps = {r: min(self.k_max, self.k_max if caps is None else caps[r]) for r in alphas}",
     "caps = {r: min(self.k_max + 1, self.k_max if caps is None else caps[r]) for r in alphas}",
     ["test_budget.py"]),
    ("n-gram drafter: the proposal starts one token after the match's continuation",
     "engine/ngram.py",
     "return self.text[start:start + k]",
     "return self.text[start + 1:start + k + 1]",
     ["test_engine_ngram.py"]),
    ("op wrappers: a per-row temperature tensor is replaced by row 0's temperature",
     "ops/_args.py",
     "    if isinstance(temperature, torch.Tensor):\n        return temperature\n",
     "    if isinstance(temperature, torch.Tensor):\n"
     "        return temperature.reshape(-1)[0] if temperature.numel() else temperature\n",
     ["test_temperature_rule.py", "test_sampling_api.py"]),
    ("op wrappers: filter conversion hands top_p to the op's top_k slot and top_k to top_p",
     "ops/_args.py",
     'for name, value in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)):',
     'for name, value in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p)):',
     ["test_sampling_filters.py"]),
    ("op wrappers: seed=None is always seed 0 instead of a draw from torch's generator",
     "ops/_args.py",
     "return torch.randint(0, _SEED_HIGH, (), dtype=torch.int64)",
     "return torch.tensor(0, dtype=torch.int64)",
     ["test_sampling_api.py"]),
    ("KVCache.rollback with host num_kept: the host lengths are not updated",
     "cache/contiguous.py",
     "            kv_rollback_(self.lengths, num_appended, kept_dev, invalid=self.errors)\n"
     "            self._host.copy_(new)\n",
     "            kv_rollback_(self.lengths, num_appended, kept_dev, invalid=self.errors)\n",
     ["test_kv_cache.py"]),
    ("block manager: rollback drops blocks from the table without freeing them",
     "cache/block_manager.py",
     "        for block in table[keep:]:\n            self._release(block)\n        del table[keep:]\n",
     "        del table[keep:]\n",
     ["test_paged_kv_cache.py"]),
    ("paged compaction: each row's step base one entry too late (every moved entry off by one)",
     "cache/paged.py",
     "base = torch.tensor([n - num_appended for n in lens], dtype=torch.int64).to(self.device)",
     "base = torch.tensor([n - num_appended + 1 for n in lens], dtype=torch.int64).to(self.device)",
     ["test_kv_compact.py"]),
    ("vLLM shim: each request's bonus token read from the row before its bonus row",
     "compat/vllm.py",
     "flat_rows, flat_bad = in_rows(torch.cat([target_idx, bonus_idx]))",
     "flat_rows, flat_bad = in_rows(torch.cat([target_idx, bonus_idx - 1]))",
     ["test_compat_vllm.py"]),
    ("FlashInfer shim: chain verification pads with 0 instead of -1",
     "compat/flashinfer.py",
     "return res.tokens.to(torch.int32), accepted_out, emitted_out",
     "return res.tokens.clamp(min=0).to(torch.int32), accepted_out, emitted_out",
     ["test_compat_flashinfer.py"]),
]


def copy_package(dest: pathlib.Path) -> None:
    """specdec_ext/ (its built _C*.so and assets included, bytecode caches left out) under ``dest``."""
    shutil.copytree(ROOT / "specdec_ext", dest / "specdec_ext", ignore=shutil.ignore_patterns("__pycache__"))


def pytest_args(tests: list) -> list:
    """A mutation's tests as pytest arguments: file names -> absolute paths, options as given."""
    return [str(ROOT / "python_tests" / t) if t.endswith(".py") else t for t in tests]


def run_tests(tmp: pathlib.Path, tests: list) -> tuple[int, str]:
    """pytest over ``tests`` (a mutation's list) against the copy under ``tmp``: (exit
    status, output). Raises RuntimeError if the tests imported specdec_ext from anywhere but
    the copy."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONDONTWRITEBYTECODE="1")
    env["SPECDEC_QUICK"] = "1"
    # One process: it imports specdec_ext, prints where from, then runs pytest (the tests get
    # that same module). cwd = the copy's directory, so that neither sys.path[0] nor the
    # editable install (a finder after sys.path's) finds the repository's package.
    args = ["--rootdir", str(ROOT), *PYTEST, *pytest_args(tests)]
    code = ("import sys, specdec_ext, pytest; print('specdec_ext from', specdec_ext.__file__, flush=True); "
            f"sys.exit(pytest.main({args!r}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    want = f"specdec_ext from {tmp / 'specdec_ext' / '__init__.py'}"
    if not out.startswith(want + "\n"):
        raise RuntimeError(f"the tests did not import the copy ({want!r} expected):\n{out[:3000]}")
    return proc.returncode, out


def run_mutant(rel: str, old: str, new: str, tests: list) -> tuple[bool, str]:
    """(caught, what happened) for one mutation."""
    with tempfile.TemporaryDirectory(prefix="py-mutant-") as tmp:
        tmp = pathlib.Path(tmp)
        copy_package(tmp)
        path = tmp / "specdec_ext" / rel
        text = path.read_text()
        if text.count(old) != 1:
            return False, (f"pattern found {text.count(old)} times in specdec_ext/{rel} "
                           "(the source changed: update MUTATIONS)")
        path.write_text(text.replace(old, new))
        status, out = run_tests(tmp, tests)
        failed = [ln.split()[1] for ln in out.splitlines() if ln.startswith("FAILED ")]
        if status == 0:
            return False, "NOT caught: every test passed"
        if status != 1 or not failed:  # 2: collection error / interrupted, 5: no test selected
            return False, f"no verdict (pytest exit {status}):\n" + out[-3000:]
        first = failed[0]  # a node id relative to the copy's directory: from python_tests/ on
        return True, "caught by " + first[first.find("python_tests/"):]


def control(tests: list) -> tuple[bool, str]:
    """``tests`` (as in a mutation) all pass against an unmutated copy."""
    with tempfile.TemporaryDirectory(prefix="py-mutant-control-") as tmp:
        tmp = pathlib.Path(tmp)
        copy_package(tmp)
        status, out = run_tests(tmp, tests)
        if status != 0:
            return False, f"the tests fail WITHOUT a planted bug (pytest exit {status}):\n" + out[-3000:]
        return True, out.splitlines()[0] + "; " + [ln for ln in out.splitlines() if ln.strip()][-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="run only the mutations whose name contains this text")
    parser.add_argument("--list", action="store_true",
                        help="print the mutations and their tests, and check each pattern occurs once; run nothing")
    opts = parser.parse_args()
    chosen = [m for m in MUTATIONS if opts.k in m[0]]
    if opts.list:
        stale = 0
        for name, rel, old, _, tests in chosen:
            found = (ROOT / "specdec_ext" / rel).read_text().count(old)
            stale += found != 1
            note = "" if found == 1 else f" -- STALE: the pattern occurs {found} times"
            print(f"{name}\n    specdec_ext/{rel}; tests: {' '.join(tests)}{note}")
        return 1 if stale else 0
    t_all = time.time()
    # the control: one run of every test file the mutations name
    quick = sorted({t for m in chosen for t in m[4] if t.endswith(".py")})
    groups = [quick] if quick else []
    ok = True
    for tests in groups:
        t0 = time.time()
        passed, msg = control(tests)
        ok &= passed
        print(f"[{'ok' if passed else 'FAIL'}] control (no planted bug: {' '.join(tests)}): {msg} "
              f"({time.time() - t0:.0f} s)", flush=True)
    if not ok:
        return 1
    rows = []
    for name, rel, old, new, tests in chosen:
        t0 = time.time()
        caught, msg = run_mutant(rel, old, new, tests)
        ok &= caught
        rows.append((name, tests, caught, msg))
        print(f"[{'ok' if caught else 'FAIL'}] {name}: {msg} ({time.time() - t0:.0f} s)", flush=True)
    print(f"\n{sum(r[2] for r in rows)} of {len(rows)} planted bugs caught ({time.time() - t_all:.0f} s in all)")
    print("| planted bug | tests run | verdict |\n|---|---|---|")
    for name, tests, caught, msg in rows:
        print(f"| {name} | {' '.join(tests)} | {msg.splitlines()[0] if caught else 'MISSED: ' + msg.splitlines()[0]} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
