"""pytest configuration: the ``cuda`` marker and the ``device`` fixture.

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
