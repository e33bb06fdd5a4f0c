"""The op table, as Python data: every ``torch.ops.specdec`` op with where its kernels are, which
tensor arguments may stay on the host and which csrc/cuda file holds its CUDA kernel bodies.

The table is declared once, in C++ (``csrc/op_schemas.h``: ``kOps``), and exported by the built
library (``specdec_ext._C.OPS``); the registrations, the device rule, the fake kernels' host
arguments, the SIMT emulation's op list, the tests' op lists and the coverage gate derive from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .. import _C

__all__ = ["OPS", "OpInfo", "host_args", "names"]


@dataclass(frozen=True)
class OpInfo:
    name: str                      # torch.ops.specdec.<name>
    backends: Tuple[str, ...]      # "cpu", and "cuda" when it has CUDA kernels (also run in the SIMT emulation)
    host_args: Tuple[str, ...]     # tensor arguments that may be CPU tensors when the data is on a device
    cuda_file: Optional[str]       # csrc/<cuda_file> holds its CUDA kernel bodies (None: no CUDA kernel)


#: name -> OpInfo, in declaration order
OPS: Dict[str, OpInfo] = {
    name: OpInfo(name, tuple(backends), tuple(a for a in host.split(",") if a), cuda_file)
    for name, backends, host, cuda_file in _C.OPS
}


def names(backend: Optional[str] = None) -> List[str]:
    """The op names, in declaration order; with ``backend`` ("cpu" | "cuda") those that have it."""
    return [n for n, op in OPS.items() if backend is None or backend in op.backends]


def host_args(name: str) -> Tuple[str, ...]:
    """The tensor arguments of op ``name`` that may stay on the host (the device rule's exception)."""
    return OPS[name].host_args
