"""The CUDA kernels of specdec_ext, run on any machine: the source of ``csrc/cuda`` compiled
as host C++ against a CPU emulation of the SIMT model (``csrc/simt``, see its NOTES.md) and
called on CPU tensors.

The ops here have the public ops' names, signatures and semantics (the same Python wrappers,
bound to ``torch.ops.specdec_simt``), with the CUDA launchers' argument handling: CPU tensors
stand for device tensors, so a bad value in a per-row ``[B]`` tensor makes its row invalid
instead of raising, exactly as on a GPU. Every call runs the kernels to completion before it
returns.

    from specdec_ext.testing import simt
    res = simt.verify(logits, drafts, q, 0.8, seed=1)          # CUDA kernels, emulated
    with simt.options(launch="stages", loads="scalar", schedule=3):
        ...

The emulator library is compiled on first use (torch.utils.cpp_extension, cached under
``build/simt-<build>`` of the source tree; about a minute) in one of three builds, chosen
by ``SPECDEC_SIMT_BUILD``:

- ``opt``      (default) -O2;
- ``asan``     AddressSanitizer + UBSan (memcheck analog). The process must have the ASan
  runtime loaded first: ``LD_PRELOAD="$(gcc -print-file-name=libasan.so)
  $(gcc -print-file-name=libstdc++.so)"`` (``scripts/simt_check.sh asan`` does this);
- ``coverage`` -O2 --coverage: optimised, and counting lines for gcov (``scripts/simt_coverage.py``).

It needs the source tree (an editable install) and Boost.Context (Debian:
``libboost-context-dev``).
"""
from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import types
from typing import Iterator, Optional, Union

import torch

from ..ops import filtered as _filtered
from ..ops import kv as _kv
from ..ops import paged_kv as _paged_kv
from ..ops import sampling as _sampling
from ..ops import fused_softmax as _softmax
from ..ops import tree as _tree

__all__ = ["BUILDS", "build", "filtered_probs", "kv_append_", "kv_compact_", "kv_rollback_", "load", "mask_logits",
           "options", "paged_kv_append_", "paged_kv_compact_", "paged_kv_gather", "sample", "softmax", "source_root",
           "verify", "verify_shard", "verify_shard_finish", "verify_tree"]

#: compiler flags of each build (all: the SIMT macro, the emulated CUDA headers)
BUILDS = {
    "opt": ["-O2"],
    "asan": ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
             "-fno-omit-frame-pointer"],
    "coverage": ["-O2", "--coverage"],
}
_LDFLAGS = {"opt": [], "asan": ["-fsanitize=address,undefined"], "coverage": ["--coverage"]}

_SOURCES = ("csrc/simt/simt.cpp", "csrc/simt/kernels_simt.cpp", "csrc/simt/ops_simt.cpp", "csrc/sampling_args.cpp")


def source_root() -> pathlib.Path:
    """The source tree the emulator is compiled from: ``SPECDEC_SIMT_SOURCE`` (a copy of the
    tree, e.g. a deliberately broken one: scripts/simt_mutations.py), else the tree this
    package was installed from (needs an editable install)."""
    env = os.environ.get("SPECDEC_SIMT_SOURCE")
    root = pathlib.Path(env).resolve() if env else pathlib.Path(__file__).resolve().parents[2]
    if not (root / "csrc" / "simt" / "simt.cpp").exists():
        raise RuntimeError("specdec_ext.testing.simt compiles csrc/ of the source tree, which this install does "
                           f"not have (looked in {root}): install with `pip install -e .` from a checkout")
    return root


def build() -> str:
    """The build in use: ``SPECDEC_SIMT_BUILD`` (opt | asan | coverage), default opt."""
    name = os.environ.get("SPECDEC_SIMT_BUILD", "opt")
    if name not in BUILDS:
        raise ValueError(f"SPECDEC_SIMT_BUILD must be one of {sorted(BUILDS)}, got {name!r}")
    return name


def _asan_loaded() -> bool:
    with open("/proc/self/maps") as f:
        return "libasan" in f.read()


@functools.lru_cache(maxsize=None)
def load(name: Optional[str] = None) -> str:
    """Compiles (once; cached on disk) and loads the emulator library of build ``name``
    (default :func:`build`), registering ``torch.ops.specdec_simt.*``. Returns the build."""
    name = name or build()
    if name not in BUILDS:
        raise ValueError(f"unknown SIMT build {name!r}; one of {sorted(BUILDS)}")
    if name == "asan" and not _asan_loaded():
        raise RuntimeError("the asan build needs the ASan runtime loaded first: run under "
                           "LD_PRELOAD=\"$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)\" "
                           "ASAN_OPTIONS=detect_leaks=0 (scripts/simt_check.sh asan)")
    from torch.utils import cpp_extension

    root = source_root()
    build_dir = root / "build" / f"simt-{name}"  # inside the tree compiled, so a copy builds apart
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=f"specdec_simt_{name}",
        sources=[str(root / s) for s in _SOURCES],
        extra_cflags=["-DSPECDEC_SIMT", f"-I{root / 'csrc' / 'simt' / 'include'}",
                      f"-I{root / 'csrc'}", "-fno-strict-aliasing", "-fvisibility=hidden", "-fno-plt", "-Wall", "-Wno-unknown-pragmas"] + BUILDS[name],
        extra_ldflags=["-lboost_context"] + _LDFLAGS[name],
        build_directory=str(build_dir),
        is_python_module=False,
        verbose=os.environ.get("SPECDEC_SIMT_VERBOSE", "0") == "1",
    )
    return name


class _SimtOps:
    """``torch.ops.specdec_simt``, loaded on first use."""

    def __getattr__(self, op):
        load()
        return getattr(torch.ops.specdec_simt, op)


def _on_simt(wrapper):
    """The public wrapper ``wrapper`` (same code, defaults and docstring) calling the emulated ops."""
    env = dict(wrapper.__globals__)
    env["_OPS"] = _SimtOps()
    fn = types.FunctionType(wrapper.__code__, env, wrapper.__name__, wrapper.__defaults__, wrapper.__closure__)
    fn.__kwdefaults__ = wrapper.__kwdefaults__
    fn.__doc__ = (f"{wrapper.__name__} on the SIMT emulation of the CUDA kernels (CPU tensors).\n\n"
                  + (wrapper.__doc__ or ""))
    fn.__qualname__ = wrapper.__qualname__
    fn.__module__ = __name__
    return fn


verify = _on_simt(_sampling.verify)
sample = _on_simt(_sampling.sample)
filtered_probs = _on_simt(_filtered.filtered_probs)
softmax = _on_simt(_softmax.softmax)
mask_logits = _on_simt(_filtered.mask_logits)
verify_tree = _on_simt(_tree.verify_tree)
kv_append_ = _on_simt(_kv.kv_append_)


def verify_shard(*args):
    """``torch.ops.specdec.verify_shard`` (one step of vocabulary-parallel verify, see
    specdec_ext.distributed) on the SIMT emulation of its CUDA kernels (CPU tensors)."""
    return _SimtOps().verify_shard(*args)


def verify_shard_finish(*args):
    """``torch.ops.specdec.verify_shard_finish`` on the SIMT emulation of its CUDA kernel."""
    return _SimtOps().verify_shard_finish(*args)


kv_rollback_ = _on_simt(_kv.kv_rollback_)
paged_kv_append_ = _on_simt(_paged_kv.paged_kv_append_)
paged_kv_gather = _on_simt(_paged_kv.paged_kv_gather)
kv_compact_ = _on_simt(_kv.kv_compact_)
paged_kv_compact_ = _on_simt(_paged_kv.paged_kv_compact_)


@contextlib.contextmanager
def options(*, launch: Optional[str] = None, loads: Optional[str] = None, schedule: Union[str, int, None] = None,
            sms: Optional[int] = None, blocks_per_sm: Optional[int] = None,
            cooperative: Union[bool, str, None] = None, capturing: Optional[bool] = None) -> Iterator[None]:
    """Emulation settings for the calls inside the ``with`` block (environment variables,
    read at every launch; None leaves a setting as it is):

    launch         "cooperative" | "stages": the launch path (SPECDEC_CUDA_LAUNCH, as on a GPU)
    loads          "scalar": no 16-byte vector loads (SPECDEC_CUDA_LOADS, as on a GPU)
    schedule       "inorder" | "reversed" | an int seed: the order of the threads between sync points
    sms, blocks_per_sm: the emulated device (default 2 SMs x 2 resident blocks)
    cooperative    True (default) | False (no cooperative launch) | "refuse" (supported, but every
                   cooperative launch is refused, as under MPS: the launchers fall back to stages)
    capturing      emulate a CUDA-graph capture (the launch-path choice sees it)
    """
    values = {"SPECDEC_CUDA_LAUNCH": launch, "SPECDEC_CUDA_LOADS": loads,
              "SPECDEC_SIMT_SCHEDULE": None if schedule is None else str(schedule),
              "SPECDEC_SIMT_SMS": None if sms is None else str(sms),
              "SPECDEC_SIMT_BLOCKS_PER_SM": None if blocks_per_sm is None else str(blocks_per_sm),
              "SPECDEC_SIMT_COOPERATIVE": (None if cooperative is None else cooperative
                                           if isinstance(cooperative, str) else str(int(cooperative))),
              "SPECDEC_SIMT_CAPTURING": None if capturing is None else str(int(capturing))}
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is not None:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
