"""How a user learns what they installed: ``python -m specdec_ext.info`` (versions, CUDA
kernels and archs, CPU kernel copy, compiler), the build record setup.py writes for it,
``specdec_ext.__version__``, and the ImportError that explains a missing or broken ``_C``
(the source folder shadowing an installed copy) instead of "circular import"."""
import os
import re
import shutil
import subprocess
import sys
import types

import pytest
import torch

import specdec_ext
from specdec_ext import _load, info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(os.path.abspath(specdec_ext.__file__))

# An editable install resolves specdec_ext._C through its own finder on sys.meta_path,
# whatever folder specdec_ext was imported from; drop it so the subprocess imports as a
# regular install does.
IMPORT_AS_INSTALLED = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
                       "if 'editable' not in str(getattr(f, '__module__', type(f).__module__))]; import specdec_ext")


def _run(*argv, **kw):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, **kw)


# ---------------------------------------------------------------- version, info command
def test_version_matches_setup_py():
    with open(os.path.join(ROOT, "setup.py")) as f:
        assert re.search(r'version="([^"]+)"', f.read()).group(1) == specdec_ext.__version__ == "0.1.0"


def test_info_command_prints_every_line():
    r = _run("-m", "specdec_ext.info")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for start in ("specdec_ext 0.1.0 in ", "python:", "torch running:", "torch built against:", "CUDA kernels:",
                  "CPU kernels:", "compiler:"):
        assert sum(line.startswith(start) for line in lines) == 1, (start, r.stdout)
    cuda = next(line for line in lines if line.startswith("CUDA kernels:"))
    assert cuda.split(":", 1)[1].strip().startswith("built" if specdec_ext.has_cuda_kernels() else "not built")
    assert f"torch running:        {torch.__version__}" in r.stdout
    assert re.search(r"CPU kernels:\s+(AVX2|default) \(", r.stdout)


def test_info_refuses_arguments():
    assert info.main(["--bogus"]) == 2
    assert info.main(["--help"]) == 0


def test_report_uses_the_build_record(monkeypatch):
    record = types.ModuleType("specdec_ext._build_info")
    record.__dict__.update(TORCH_VERSION="0.0.1-other", TORCH_CUDA=None, CUDA_KERNELS=False, CUDA_ARCH_LIST=None,
                           NVCC=None, CXX="c++", CXX_VERSION="c++ (Test) 1.2.3", MACHINE="x86_64")
    monkeypatch.setitem(sys.modules, "specdec_ext._build_info", record)
    monkeypatch.setattr(specdec_ext, "_build_info", record, raising=False)
    text = "\n".join(info.report())
    assert "torch built against:  0.0.1-other (CUDA none)" in text
    assert "WARNING: built against another torch: rebuild" in text
    assert "compiler:             c++ (Test) 1.2.3" in text


@pytest.mark.parametrize("machine,flags,env,variant,why", [
    ("x86_64", {"avx2", "fma", "f16c", "sse4_2"}, {}, "AVX2", "has AVX2, FMA and F16C"),
    ("x86_64", {"avx2", "fma"}, {}, "default", "lacks F16C"),
    ("x86_64", {"avx2", "fma", "f16c"}, {"SPECDEC_CPU_CAPABILITY": "default"}, "default", "SPECDEC_CPU_CAPABILITY"),
    ("aarch64", {"avx2", "fma", "f16c"}, {}, "default", "x86-64 only"),
])
def test_cpu_kernel_variant(machine, flags, env, variant, why):
    got, reason = info.cpu_kernel_variant(dict(MACHINE=machine), flags=flags, env=env)
    assert got == variant and why in reason


@pytest.mark.parametrize("archs,cap,says", [
    ("9.0+PTX", (9, 0), "machine code"), ("8.0;8.6", (8, 9), "machine code"), ("9.0+PTX", (10, 0), "PTX"),
    ("8.0", (9, 0), "NOT covered"), ("9.0a", (9, 0), "machine code"), ("9.0a", (9, 2), "NOT covered"),
    ("10.0", (9, 0), "NOT covered"),
])
def test_arch_coverage(archs, cap, says):
    assert says in info.arch_coverage(archs, cap)


def test_setup_py_writes_the_build_record(tmp_path):
    """setup.py, run in a scratch tree (CPU-only: no compiler runs), writes
    specdec_ext/_build_info.py with what the build uses."""
    shutil.copy(os.path.join(ROOT, "setup.py"), tmp_path / "setup.py")
    (tmp_path / "specdec_ext").mkdir()
    (tmp_path / "specdec_ext" / "__init__.py").write_text("")
    r = _run("setup.py", "--version", cwd=tmp_path, env=dict(os.environ, SPECDEC_CPU_ONLY="1"))
    assert r.returncode == 0 and r.stdout.strip().endswith(specdec_ext.__version__), r.stderr
    record = {}
    exec((tmp_path / "specdec_ext" / "_build_info.py").read_text(), record)
    assert record["TORCH_VERSION"] == torch.__version__ and record["CUDA_KERNELS"] is False
    assert record["CUDA_ARCH_LIST"] is None and record["CXX"] and record["MACHINE"]


# ---------------------------------------------------------------- a missing / broken _C
def _copy_without_library(dest):
    """The package's Python sources (no _C library, no model files) under dest/specdec_ext."""
    shutil.copytree(PACKAGE, dest / "specdec_ext",
                    ignore=shutil.ignore_patterns("_C*.so", "_C*.pyd", "assets", "__pycache__", "_build_info.py"))
    return dest / "specdec_ext"


def test_source_folder_shadowing_an_install_says_so(tmp_path):
    """Run from a checkout without _C while a built specdec_ext is installed elsewhere on the
    path: the error names both folders and the fix, not a circular import."""
    src = _copy_without_library(tmp_path)
    r = _run("-c", IMPORT_AS_INSTALLED, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=os.path.dirname(PACKAGE)))
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and last.startswith("ImportError: specdec_ext's compiled ops (_C) are not in"), r.stderr
    assert str(src) in last and f"instead of the installed specdec_ext in {PACKAGE}" in last
    assert "pip install --no-build-isolation -e ." in last and "circular import" not in r.stderr


def test_unbuilt_checkout_says_how_to_build(tmp_path, monkeypatch):
    src = _copy_without_library(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])  # no built copy anywhere on the path
    message = _load.missing_message(str(src))
    assert "the package is not built" in message and "pip install --no-build-isolation -e ." in message


def test_library_that_fails_to_load_says_rebuild(tmp_path):
    src = _copy_without_library(tmp_path)
    (src / os.path.basename(_load._library_files(PACKAGE)[0])).write_bytes(b"not a shared library")
    r = _run("-c", IMPORT_AS_INSTALLED, cwd=tmp_path)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: specdec_ext's compiled ops (_C) in") and "failed to load" in last, r.stderr
    assert "Rebuild against the torch you run" in last


def test_cpu_kernels_are_built_to_run_on_torchs_threads():
    """at::parallel_for is header code: its ``#pragma omp parallel`` is compiled into _C, and
    without -fopenmp it is dropped, so every CPU kernel ran on one thread whatever
    torch.get_num_threads() said (the build of 2026-12-03 and before). A build with the flag
    calls into the OpenMP runtime, and in the process that runtime is torch's own copy."""
    import specdec_ext._C as ext

    with open(ext.__file__, "rb") as f:
        assert b"GOMP_parallel" in f.read(), "specdec_ext._C was built without -fopenmp (setup.py's cxx flags)"
    loaded = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
    assert len(loaded) <= 1, f"two OpenMP runtimes in one process: {loaded}"
