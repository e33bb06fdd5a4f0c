"""Registry completeness: every op of the op table (csrc/op_schemas.h ``kOps``, exported as
``specdec_ext.ops.registry``) has everything an op needs, and nothing is registered outside it.

For each op: the schema is registered; a CPU kernel; a fake kernel (torch.compile, meta tensors);
the device rule at BackendSelect; the CUDA kernel when this build has CUDA kernels and the op has
one; its SIMT registration (``simt``-marked); an entry in test_compile_ops.CALLS, whose calls are
run through ``torch.library.opcheck`` here and compiled with Inductor there; a fuzz target; its
CUDA kernel file in the SIMT coverage gate. Removing any one registration fails a test here
(checked: without the fake kernel of ``sample_reference``, ``test_fake_kernel`` fails).
"""
from __future__ import annotations

import importlib
import importlib.util
import pathlib

import pytest
import torch

import specdec_ext
from specdec_ext.ops import _no_outputs, registry
from test_compile_ops import CALLS

ROOT = pathlib.Path(__file__).resolve().parents[1]
OPS = registry.names()
CUDA_OPS = registry.names("cuda")

#: op -> where it is fuzzed (test_fuzz_ops.py target, or another module's hypothesis test)
FUZZED_BY = {
    "verify": "verify", "verify_block": "test_verify_block.py::test_fuzz_verify_block", "sample": "sample", "filtered_probs": "filtered", "mask_logits": "filtered",
    "softmax": "test_softmax.py::test_fuzz_softmax",
    "logprobs": "logprobs", "verify_tree": "verify_tree", "kv_append_": "kv_append_", "kv_rollback_": "kv_rollback_",
    "paged_kv_append_": "paged_kv_append_", "paged_kv_gather": "paged_kv_gather",
    "paged_kv_gather_into_": "paged_kv_gather",  # the target calls both the allocating and the _into_ form
    "kv_compact_": "kv_compact_", "paged_kv_compact_": "paged_kv_compact_",
    "verify_shard": "test_distributed.py::test_fuzz_aligned_shards_match_verify",
    "verify_shard_finish": "test_distributed.py::test_fuzz_aligned_shards_match_verify",
    # the readable references are test oracles: test_native_reference.py compares them with the
    # kernels on random calls, and their arguments go through prepare_verify / prepare_sample, the
    # fuzzed kernels' own argument handling
    "verify_reference": "test_native_reference.py", "sample_reference": "test_native_reference.py",
    "skinny_linear": "test_skinny_linear.py::test_fuzz_skinny_linear",
}


def _has(name: str, key: str, ns: str = "specdec") -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{name}", key)


def test_the_registered_ops_are_the_table():
    assert _no_outputs.op_names() == sorted(OPS), "an op is registered outside csrc/op_schemas.h kOps (or not at all)"
    assert set(CUDA_OPS) <= set(OPS) and len(set(OPS)) == len(OPS)


@pytest.mark.parametrize("name", OPS)
def test_cpu_kernel(name):
    assert _has(name, "CPU"), f"{name}: no CPU kernel (csrc/cpu)"


@pytest.mark.parametrize("name", OPS)
def test_fake_kernel(name):
    from torch._library.simple_registry import singleton

    assert singleton.find(f"specdec::{name}").fake_impl.kernel is not None, \
        f"{name}: no fake kernel (torch.library.register_fake in specdec_ext/ops)"


@pytest.mark.parametrize("name", OPS)
def test_device_rule_at_backend_select(name):
    assert _has(name, "BackendSelect"), f"{name}: no device guard (csrc/ops.cpp)"


@pytest.mark.parametrize("name", OPS)
def test_cuda_kernel_when_built(name):
    if not specdec_ext.has_cuda_kernels():
        pytest.skip("a CPU-only build")
    assert _has(name, "CUDA") == (name in CUDA_OPS), f"{name}: CUDA registration does not match the table"


@pytest.mark.simt
@pytest.mark.parametrize("name", CUDA_OPS)
def test_simt_registration(name):
    from specdec_ext.testing import simt

    simt.load()
    assert _has(name, "CPU", "specdec_simt"), f"{name}: no SIMT registration (csrc/simt/ops_simt.cpp)"


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    """torch.library.opcheck (schema, fake kernel, autograd registration) on the op's CALLS entry."""
    assert name in CALLS, f"{name}: give it a call in test_compile_ops.CALLS"
    torch.library.opcheck(getattr(torch.ops.specdec, name).default, tuple(CALLS[name]()))


def _module(name: str):
    return importlib.import_module(name)


def test_every_op_is_fuzzed():
    assert sorted(FUZZED_BY) == sorted(OPS), "give every op a fuzz target (FUZZED_BY)"
    targets = set(_module("test_fuzz_ops").TARGET_NAMES)
    for op, where in FUZZED_BY.items():
        if "::" in where:
            module, test = where.split("::")
            assert hasattr(_module(module[:-3]), test), (op, where)
        elif where.endswith(".py"):
            assert (ROOT / "python_tests" / where).exists(), (op, where)
        else:
            assert where in targets, f"{op}: fuzz target {where!r} is not in test_fuzz_ops.TARGET_NAMES"


def test_every_cuda_kernel_is_in_the_coverage_gate():
    gate = _coverage_gate()
    for name in CUDA_OPS:
        cuda_file = registry.OPS[name].cuda_file
        assert cuda_file and (ROOT / "csrc" / cuda_file).exists(), (name, cuda_file)
        assert f"csrc/{cuda_file}" in gate, f"{name}: csrc/{cuda_file} is not in scripts/simt_coverage.py's gate"


def _coverage_gate():
    spec = importlib.util.spec_from_file_location("simt_coverage", ROOT / "scripts" / "simt_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.KERNEL_FILES
