"""pytest configuration: the ``cuda``, ``simt`` and ``law`` markers and the ``device`` /
``variant`` / ``gpu`` fixtures.

Tests marked ``cuda`` need a GPU and a build with the CUDA kernels; they are skipped
(with the reason) elsewhere. ``pytest -m cuda`` selects exactly them (scripts/gpu_check.sh).
Tests marked ``simt`` run the CUDA kernels in the SIMT emulation (backends.py);
``pytest -m simt`` selects them (scripts/simt_check.sh runs them in each emulator build).
Under ``SPECDEC_QUICK=1`` (``bash scripts/test.sh --quick``) every test runs, the long
statistical and fuzz runs at the reduced counts of ``helpers.draws``.

Under pytest-xdist with ``--dist loadscope --no-loadscope-reorder`` (scripts/test.sh
--quick) each test module goes to one worker as a whole, in collection order; the workers
order the modules by the seconds each took in the last run (pytest's cache,
``specdec/module_seconds``), longest first, so that the long ones (torch.compile) start
early and the short ones fill in at the end. Only the order of modules changes.
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


_SECONDS_KEY = "specdec/module_seconds/" + ("quick" if QUICK else "full")


def _module(nodeid):
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput") and getattr(config, "cache", None) is not None:  # an xdist worker
        last = config.cache.get(_SECONDS_KEY, {})
        first = {}  # stable: modules of equal (or no) record keep their order
        for i, item in enumerate(items):
            first.setdefault(_module(item.nodeid), i)
        items.sort(key=lambda item: (-last.get(_module(item.nodeid), 0.0), first[_module(item.nodeid)]))
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


_seconds = {}


def pytest_runtest_logreport(report):
    """Seconds per module (set-up, call and tear-down), on the xdist controller or in a
    plain run."""
    _seconds[_module(report.nodeid)] = _seconds.get(_module(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    config = session.config
    if hasattr(config, "workerinput") or getattr(config, "cache", None) is None or not _seconds:
        return
    record = config.cache.get(_SECONDS_KEY, {})
    record.update({m: round(s, 2) for m, s in _seconds.items()})
    config.cache.set(_SECONDS_KEY, record)
