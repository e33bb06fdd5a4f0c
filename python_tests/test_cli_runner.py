"""cli_runner (the CLI tests' forking helper) behaves as ``subprocess.run([sys.executable,
...], capture_output=True, text=True)`` does: the same exit status, stdout and stderr for a
normal exit, sys.exit(n), sys.exit(message), an uncaught exception (its traceback), a
signal; argv, cwd, stdin from /dev/null, sys.path[0], atexit handlers; a timeout raises
TimeoutExpired; a command with its own env runs as a real subprocess; and a changed
environment gets a helper that imported with it."""
import os
import subprocess
import sys
import textwrap

import pytest

import cli_runner

PROGRAM = textwrap.dedent("""\
    import atexit, os, sys
    mode = sys.argv[1]
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "stdin", repr(sys.stdin.read()), "path0", sys.path[0])
    print("to stderr", file=sys.stderr)
    atexit.register(print, "atexit ran")
    if mode == "exit3":
        sys.exit(3)
    if mode == "exit_message":
        sys.exit("a message")
    if mode == "exit_none":
        sys.exit()
    if mode == "raise":
        raise ValueError("boom")
    if mode == "kill":
        sys.stdout.flush()
        os.kill(os.getpid(), 9)
    if mode == "sleep":
        import time
        time.sleep(60)
    print("the end")
""")


@pytest.fixture(autouse=True)
def light_helpers(monkeypatch):
    """Helpers that import nothing much (the programs here need nothing): started in a
    fraction of a second. The CLI tests use the real PRELOAD."""
    monkeypatch.setattr(cli_runner, "PRELOAD", ("json",))


@pytest.fixture
def program(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "prog.py").write_text(PROGRAM)
    (tmp_path / "prog.py").write_text(PROGRAM)
    return tmp_path


def _both(args, **kw):
    real = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, **kw)
    forked = cli_runner.run(args, timeout=60, **kw)
    return real, forked


@pytest.mark.parametrize("mode,rc", [("ok", 0), ("exit3", 3), ("exit_message", 1), ("exit_none", 0), ("raise", 1),
                                     ("kill", -9)])
@pytest.mark.parametrize("form", ["script", "module"])
def test_same_result_as_a_subprocess(program, mode, rc, form):
    args = [str(program / "prog.py"), mode] if form == "script" else ["-m", "pkg.prog", mode]
    real, forked = _both(args, cwd=program)
    assert real.returncode == forked.returncode == rc
    assert forked.stdout == real.stdout and f"cwd {program} stdin '' path0 {program}" in forked.stdout
    if mode == "raise" and form == "module":  # the interpreter's runpy frames <frozen runpy> are left out
        assert forked.stderr.startswith("to stderr\nTraceback (most recent call last):\n")
        assert forked.stderr.endswith(real.stderr[real.stderr.index(f'  File "{program}'):])
    else:
        assert forked.stderr == real.stderr
    assert ("atexit ran" in forked.stdout) == (mode != "kill")
    assert ("the end" in forked.stdout) == (mode == "ok")


def test_runs_in_a_fork_of_the_helper_unless_given_an_env(program):
    if not cli_runner.enabled():
        pytest.skip("SPECDEC_CLI_RUNNER=0")
    code = [str(program / "ppid.py")]
    (program / "ppid.py").write_text("import os; print(os.getppid(), os.environ.get('X'))")
    assert cli_runner.run(code).stdout.split()[0] != str(os.getpid())  # the helper's child
    assert cli_runner.run(code, env=dict(os.environ, X="1")).stdout.split() == [str(os.getpid()), "1"]


def test_timeout(program):
    with pytest.raises(subprocess.TimeoutExpired):
        cli_runner.run([str(program / "prog.py"), "sleep"], timeout=1)
    assert cli_runner.run([str(program / "prog.py"), "ok"], timeout=60).returncode == 0  # the helper lives on


def test_a_changed_environment_gets_a_helper_started_with_it(program, monkeypatch):
    if not cli_runner.enabled():
        pytest.skip("SPECDEC_CLI_RUNNER=0")
    code = [str(program / "env.py")]
    (program / "env.py").write_text("import os, sys\n"
                                    "helper = open(f'/proc/{os.getppid()}/environ', 'rb').read().split(b'\\0')\n"
                                    "print(os.getppid(), os.environ.get('CLI_RUNNER_TEST'), b'CLI_RUNNER_TEST=1' in helper,"
                                    "      'json' in sys.modules)")
    monkeypatch.delenv("CLI_RUNNER_TEST", raising=False)
    before = cli_runner.run(code).stdout.split()
    monkeypatch.setenv("CLI_RUNNER_TEST", "1")
    after = cli_runner.run(code).stdout.split()
    assert before[1:] == ["None", "False", "True"] and after[1:] == ["1", "True", "True"] and after[0] != before[0]
    monkeypatch.delenv("CLI_RUNNER_TEST")
    assert cli_runner.run(code).stdout.split() == before  # the first helper again
