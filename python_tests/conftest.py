"""pytest configuration: the ``cuda``, ``simt`` and ``law`` markers and the ``device`` /
``variant`` / ``gpu`` fixtures.

Tests marked ``cuda`` need a GPU and a build with the CUDA kernels; they are skipped
(with the reason) elsewhere. ``pytest -m cuda`` selects exactly them (scripts/gpu_check.sh).
Tests marked ``simt`` run the CUDA kernels in the SIMT emulation (backends.py);
``pytest -m simt`` selects them (scripts/simt_check.sh runs them in each emulator build).
Under ``SPECDEC_QUICK=1`` (``bash scripts/test.sh --quick``) every test runs, the long
statistical and fuzz runs at the reduced counts of ``helpers.draws``.
"""
import pytest

import backends
from helpers import CUDA, DEVICES, QUICK


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a GPU and a build with the CUDA kernels")
    config.addinivalue_line("markers", "simt: runs the CUDA kernels in the SIMT emulation (specdec_ext.testing.simt)")
    config.addinivalue_line("markers", "law: a chi-square goodness-of-fit test (many draws)")


def pytest_report_header(config):
    if QUICK:
        return "SPECDEC_QUICK=1: the quick tier (long statistical and fuzz runs at reduced counts, helpers.draws)"


def pytest_collection_modifyitems(config, items):
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs a GPU and a build with the CUDA kernels")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture(params=["avx2", "default", pytest.param("cuda", marks=pytest.mark.cuda)])
def variant(request, monkeypatch):
    """Every compiled copy of the sampling kernels: the CPU AVX2 and default copies (chosen
    through SPECDEC_CPU_CAPABILITY) and CUDA. Returns the device to run on."""
    if request.param == "default":
        monkeypatch.setenv("SPECDEC_CPU_CAPABILITY", "default")
    else:
        monkeypatch.delenv("SPECDEC_CPU_CAPABILITY", raising=False)
    return "cuda" if request.param == "cuda" else "cpu"


_SIMT = pytest.param("simt", marks=pytest.mark.simt)
_CUDA = pytest.param("cuda", marks=pytest.mark.cuda)


@pytest.fixture(params=[_SIMT, _CUDA])
def gpu(request):
    """Where the CUDA kernels run (backends.py): the SIMT emulation on every machine, and
    the GPU where there is one."""
    return backends.make(request.param)
