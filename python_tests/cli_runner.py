"""Run the package's command-line programs from tests without paying for a fresh Python
each time: ``run(["-m", "specdec_ext.generate", ...])`` is ``subprocess.run([sys.executable,
"-m", "specdec_ext.generate", ...], capture_output=True, text=True)``, executed in a fork
of a helper process that imported torch and specdec_ext once.

Why: some 70 tests run ``python -m specdec_ext.generate``, an example script or a fuzz
target. As real subprocesses each spends ~2-4 s importing torch (and torch._dynamo,
transformers, hypothesis) before doing its milliseconds to seconds of work: over 200 s of
the quick tier on a 2-core machine. Here a pytest process (each xdist worker) starts a
helper (``python cli_runner.py --serve``, one per concurrent caller) that imports PRELOAD
and then, per request, fork()s a child that runs the command. The helper never runs a torch
op (OpenMP thread pools do not survive a fork), so each child starts as a process that has
just imported those modules.

What a command gets, as with a real subprocess: ``sys.argv`` (``argv[0]`` the module's or
script's path), ``__main__`` (runpy: ``-m module`` with ``sys.path[0]`` = the working
directory, or a script path with ``sys.path[0]`` = its folder), the caller's current
environment (a helper is started with it: when it changes, e.g. torch setting
TORCHINDUCTOR_CACHE_DIR at its first compile, a new helper is started), the requested
``cwd``, stdin from /dev/null, stdout and stderr into files (not a terminal: block-buffered,
UTF-8) read back as text, atexit handlers, and the exit status: SystemExit's code (None -> 0,
a message -> printed, 1), an uncaught exception -> its traceback on stderr and 1, a signal ->
-N. ``timeout`` kills the child and raises subprocess.TimeoutExpired.

What it does NOT cover: interpreter start-up and the import of PRELOAD, done once by the
helper: its import-time output goes to the helper's log, not to the command's stderr, and
the hash seed and numpy's global RNG are the helper's. So a test of the import itself (a
compiled library that fails to load, the source folder shadowing an install, importing
without transformers) must use a real subprocess, and so does a command given its own
``env`` (``run`` falls back to one then, for an ``input`` and for any other form of command:
``-c``, options before ``-m``; everywhere when SPECDEC_CLI_RUNNER=0). Start-up-time
variables (OMP_NUM_THREADS, PYTHONFAULTHANDLER, ...) in ``extra_env`` do not act.
"""
import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading

#: imported once by the helper: what the commands import (generate, its lazy imports, the fuzz
#: targets'); not transformers, which only --hf runs and the example script import
PRELOAD = ("torch", "torch._dynamo", "numpy", "specdec_ext", "specdec_ext.bundled", "specdec_ext.models",
           "specdec_ext.generate", "specdec_ext.bench.__main__", "tokenizers", "safetensors", "pytest", "hypothesis")

_lock = threading.Lock()
_idle = []  # helpers (Popen, log path, key) waiting for a request, least recently used first
MAX_IDLE = 3  # helpers kept for other environments / PRELOADs (each holds torch: ~0.5 GB)


def _key():
    """What a helper's imports saw: the environment (pytest's per-test variable aside) and PRELOAD."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST")), tuple(PRELOAD)


def enabled():
    return os.environ.get("SPECDEC_CLI_RUNNER", "1") != "0" and hasattr(os, "fork")


def run(args, *, cwd=None, env=None, extra_env=None, input=None, timeout=None):
    """``subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
    env=env, input=input, timeout=timeout)``: a subprocess.CompletedProcess. ``args`` is
    ``["-m", module, ...]`` or ``[script.py, ...]`` to run in a helper's fork; anything else,
    an ``env`` or an ``input``, runs as a real subprocess. ``extra_env``: variables the
    command reads only at run time, after its imports (set in the fork's os.environ; a real
    subprocess gets them in its environment)."""
    args = [os.fspath(a) for a in args]
    cmd = [sys.executable, *args]
    forkable = args and (args[0] == "-m" and len(args) > 1 or not args[0].startswith("-"))
    if not enabled() or env is not None or input is not None or not forkable:
        if extra_env:
            env = dict(os.environ if env is None else env, **extra_env)
        return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, input=input, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="cli_runner") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        reply = _request(dict(args=args, cwd=os.path.abspath(cwd or os.getcwd()),
                              env=dict(os.environ, **(extra_env or {})), stdout=out, stderr=err, timeout=timeout))
        with open(out) as f:  # decoded as subprocess.run(text=True) decodes: locale encoding, universal newlines
            stdout = f.read()
        with open(err) as f:
            stderr = f.read()
    if reply["timed_out"]:
        raise subprocess.TimeoutExpired(cmd, timeout, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(cmd, reply["returncode"], stdout, stderr)


def _request(msg):
    """Send ``msg`` to an idle helper started with this process's current environment and
    PRELOAD (else start one: the environment changes, e.g. torch sets TORCHINDUCTOR_CACHE_DIR
    at its first compile), return its reply."""
    key = _key()
    with _lock:
        helper = next((h for h in reversed(_idle) if h[2] == key), None)
        if helper is not None:
            _idle.remove(helper)
    if helper is None:
        log = tempfile.NamedTemporaryFile(prefix="cli_runner_helper", suffix=".log", delete=False)
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", ",".join(PRELOAD)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=os.getcwd())
        log.close()
        helper = (proc, log.name, key)
        atexit.register(_stop, proc, log.name)
    proc, log, _ = helper
    try:
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()
        line = proc.stdout.readline()
    except BrokenPipeError:
        line = b""
    if not line:
        proc.wait()
        with open(log, errors="replace") as f:
            raise RuntimeError(f"the CLI helper process died (exit status {proc.returncode}):\n{f.read()[-4000:]}")
    with _lock:
        _idle.append(helper)
        while len(_idle) > MAX_IDLE:
            _stop(*_idle.pop(0)[:2])
    return json.loads(line)


def _stop(proc, log):
    try:
        proc.stdin.close()  # EOF: the helper exits
        proc.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
    try:
        os.unlink(log)
    except OSError:
        pass


# ---------------------------------------------------------------- the helper
def serve(preload):
    """The helper: import ``preload``, then one forked child per request line (JSON) on stdin,
    one reply line {"returncode", "timed_out"} on stdout; exits at EOF."""
    import importlib

    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the reply pipe
    sys.path[0] = os.getcwd()  # as `python -m` would (the modules come from where the tests import them)
    for name in filter(None, preload.split(",")):
        try:
            importlib.import_module(name)
        except ImportError as e:  # e.g. transformers not installed: the child imports (or fails) itself
            print(f"cli_runner: preload {name}: {e}", file=sys.stderr)
    sys.modules.pop("specdec_ext.generate", None)  # else runpy warns it is about to run a module already imported
    sys.modules.pop("specdec_ext.bench.__main__", None)
    for line in iter(requests.readline, b""):
        msg = json.loads(line)
        rc, timed_out = _fork_and_wait(msg)
        replies.write((json.dumps(dict(returncode=rc, timed_out=timed_out)) + "\n").encode())
        replies.flush()


def _fork_and_wait(msg):
    import select
    import signal
    import time

    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(msg)  # never returns
    timeout = msg.get("timeout")
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            if fd is not None:
                os.close(fd)
            return None, True
        if fd is not None:
            select.select([fd], [], [], left)
        else:
            time.sleep(0.02 if left is None else min(0.02, left))
    if fd is not None:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), False


def _child(msg):
    """In the fork: become ``python <args>`` with stdio on the given files; exit with its status."""
    import io
    import runpy
    import traceback

    code = 1
    try:
        os.setpgid(0, 0)  # a process group of its own, as a subprocess would not share the helper's signals
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(msg["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(msg["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for src, dst in ((null, 0), (out, 1), (err, 2)):
            os.dup2(src, dst)
            os.close(src)
        # fresh text streams over fds 0-2, configured as Python configures them for pipes
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                                       errors="strict", write_through=False)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                                       errors="backslashreplace", line_buffering=True)
        os.environ.clear()
        os.environ.update(msg["env"])  # the caller's (equal to the helper's but for PYTEST_CURRENT_TEST)
        os.chdir(msg["cwd"])
        args = msg["args"]
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]  # runpy sets argv[0] to the module's file
            sys.path[0] = msg["cwd"]
            sys.modules.pop(args[1], None)
            run = lambda: runpy.run_module(args[1], run_name="__main__", alter_sys=True)  # noqa: E731
        else:
            path = os.path.abspath(args[0])
            sys.argv = [args[0], *args[1:]]
            sys.path[0] = os.path.dirname(path)
            run = lambda: runpy.run_path(path, run_name="__main__")  # noqa: E731
        try:
            run()
            code = 0
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException as e:  # noqa: BLE001  (what the interpreter does with an uncaught exception)
            tb = e.__traceback__  # from the program's own frames on, as the interpreter prints it
            while tb is not None and tb.tb_frame.f_code.co_filename != sys.argv[0]:
                tb = tb.tb_next
            traceback.print_exception(type(e), e, tb or e.__traceback__)
            code = 1
        import atexit as _atexit
        _atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001  (e.g. the program closed it)
                pass
    except BaseException:  # noqa: BLE001  (the set-up itself failed: say so on whatever stderr is)
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    os._exit(code & 0xFF)  # as the interpreter truncates sys.exit(n)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--serve":
    serve(sys.argv[2])
