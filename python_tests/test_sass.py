"""Static checks of the built CUDA kernels (no GPU needed; `python -m specdec_ext.bench sass`):
no register spills in any of our kernels, <= 80 registers for verify / sample /
filtered_probs (3 blocks of 256 threads per SM on an H200), and at least one 128-bit global
load in every verify, sample and filtered_probs / mask_logits instantiation. Skipped on a CPU-only build or when no cuobjdump is found.
The analysis is kept in pytest's cache under the hashes of the library and the tools (_analysis)."""
import hashlib
import shutil

import pytest

from specdec_ext.bench import sass

MAX_REGS = 80
# logits dtypes: float32 / float16 / bfloat16 and float32 probabilities (probs_input: ProbAsLogit)
N_LOGITS = 4
# every (logits, probs) dtype pair of verify and every logits dtype of sample
N_VERIFY, N_SAMPLE = N_LOGITS * 3, N_LOGITS
# filter_cutoff_kernel per logits dtype; coupled_race_kernel and coupled_decide_kernel (which reads
# the logits for token_logprobs) per logits dtype
N_FILTER, N_COUPLED = N_LOGITS, 2 * N_LOGITS
# filtered_kernel: filtered_probs per logits dtype, mask_logits per float dtype (logits only)
N_FILTERED = N_LOGITS + 3


@pytest.fixture(scope="module")
def rows(request):
    lib = sass.find_library()
    if not lib:
        pytest.skip("no built specdec_ext/_C*.so")
    tool = sass.find_cuobjdump()
    if not tool:
        pytest.skip("no cuobjdump (triton/backends/nvidia/bin, PATH or CUDA_HOME/bin)")
    try:
        rows = _analysis(request.config, lib, tool)
    except sass.NoDeviceCode as e:
        pytest.skip(f"CPU-only build: {e}")
    return [r for r in rows if r["arch"] is not None]


def _analysis(config, lib, tool):
    """sass.analyse(lib, tool) (~20 s: cuobjdump and the parse of its listing), kept in
    pytest's cache under the hash of every file it depends on: the library, sass.py,
    cuobjdump and c++filt; a rebuilt library is analysed again."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return sass.analyse(lib, tool)
    digest = hashlib.sha256()
    for path in (lib, sass.__file__, tool, shutil.which("c++filt")):
        digest.update(repr(path).encode())
        if path:
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    key = digest.hexdigest()
    kept = cache.get("specdec/sass_analysis", None)
    if kept and kept.get("key") == key:
        return kept["rows"]
    rows = sass.analyse(lib, tool)
    cache.set("specdec/sass_analysis", dict(key=key, rows=rows))
    return rows


def _of(rows, kind):
    return [r for r in rows if r["kind"] == kind]


def test_parser_units():
    assert sass.ldg_width("LDG.E.128") == 128
    assert sass.ldg_width("LDG.E.128.CONSTANT") == 128
    assert sass.ldg_width("LDG.E.64") == 64
    assert sass.ldg_width("LDG.E.U16") == 16
    assert sass.ldg_width("LDG.E") == 32
    assert sass.blocks_per_sm(80, 1024) == (3, "regs")
    assert sass.blocks_per_sm(96, 1024)[0] == 2
    assert sass.blocks_per_sm(32, 0)[0] == 8
    assert sass.blocks_per_sm(24, 0) == (8, "threads")


def test_all_kernels_found(rows):
    archs = {r["arch"] for r in rows}
    for arch in archs:
        here = [r for r in rows if r["arch"] == arch]
        assert len(_of(here, "verify")) == N_VERIFY, [r["name"] for r in here]
        assert len(_of(here, "sample")) == N_SAMPLE, [r["name"] for r in here]
        assert len(_of(here, "filter")) == N_FILTER, [r["name"] for r in here]
        assert len(_of(here, "coupled")) == N_COUPLED, [r["name"] for r in here]
        assert len(_of(here, "filtered")) == N_FILTERED, [r["name"] for r in here]
        assert _of(here, "kv"), [r["name"] for r in here]


def test_no_spills(rows):
    bad = [(r["arch"], r["name"], r["stl"], r["ldl"], r["local"]) for r in rows if r["spills"]]
    assert not bad, bad


def test_registers_verify_sample(rows):
    staged = _of(rows, "verify") + _of(rows, "sample") + _of(rows, "filtered")  # same launch bounds
    bad = [(r["arch"], r["name"], r["reg"]) for r in staged if r["reg"] is None or r["reg"] > MAX_REGS]
    assert not bad, bad
    for r in staged:
        assert r["blocks_per_sm"] >= 3, r


def test_registers_coupled_race(rows):
    """coupled_race_kernel runs the sample stages under the same launch bounds (3 blocks/SM)."""
    race = [r for r in _of(rows, "coupled") if "coupled_race_kernel" in r["name"]]
    bad = [(r["arch"], r["name"], r["reg"]) for r in race if r["reg"] is None or r["reg"] > MAX_REGS]
    assert not bad, bad


def test_128bit_loads_verify_sample(rows):
    bad = [(r["arch"], r["name"], r["ldg128"]) for r in _of(rows, "verify") + _of(rows, "sample") + _of(rows, "filtered")
           if not r["ldg128"]]
    assert not bad, bad
