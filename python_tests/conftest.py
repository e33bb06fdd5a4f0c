"""pytest configuration: the ``cuda`` marker and the ``device`` / ``variant`` fixtures.

Tests marked ``cuda`` need a GPU and a build with the CUDA kernels; they are skipped
(with the reason) elsewhere. ``pytest -m cuda`` selects exactly them (scripts/gpu_check.sh).
"""
import pytest

from helpers import CUDA, DEVICES


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a GPU and a build with the CUDA kernels")


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
