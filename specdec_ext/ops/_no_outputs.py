"""The ``no_outputs`` overload of every op whose only mutable arguments are optional output
buffers (``sample``'s ``probs_out`` / ``token_logprobs``, ``verify``'s ``token_logprobs``).

Why: torch.compile functionalizes a call of a mutable op into an ``auto_functionalized_v2``
node, and Inductor's decomposition of that node breaks when the call passes None for every
mutable argument and the op returns a single tensor (``sample(..., probs_out=None)``: the
graph ends in ``getitem(<tensor>, 0)`` and Inductor fails with "<built-in function getitem>
is not an OpOverload"). Such a call mutates nothing, so it is a functional call: a
FunctionalTensorMode rule (the mode torch.compile traces under) records it as
``op.no_outputs``, the same schema without the mutable arguments, which Inductor treats as
any functional op. Calls that pass an output buffer are functionalized as before.

``op.no_outputs`` runs ``op`` with None for the dropped arguments (CompositeExplicitAutograd:
every backend; its fake kernel is the op's own), so eager, compiled and raw calls give the
same tokens bit for bit.
"""
from __future__ import annotations

from typing import Dict, List

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode

__all__ = ["OVERLOAD", "op_names", "register", "registered"]

#: the overload name of the functional variant
OVERLOAD = "no_outputs"

_LIBS: Dict[str, torch.library.Library] = {}  # namespace -> the fragment holding the overloads (kept alive)
_DONE: Dict[str, List[str]] = {}  # namespace -> the ops given the overload


def _split_args(args_text: str) -> List[str]:
    """A schema's argument text split at its top-level commas."""
    parts, depth, cur = [], 0, ""
    for ch in args_text:
        depth += ch in "([" and 1 or (ch in ")]" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + ([cur.strip()] if cur.strip() else [])


def _mutable(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _qualifies(schema) -> bool:
    """Mutable arguments that are all optional tensors (output buffers a call may omit), and a result."""
    mutable = [a for a in schema.arguments if _mutable(a)]
    return bool(mutable) and bool(schema.returns) and all(
        isinstance(a.type, torch.OptionalType) and a.default_value is None for a in mutable)


def _register_one(lib: torch.library.Library, ns: str, name: str) -> None:
    op = getattr(getattr(torch.ops, ns), name).default
    schema = op._schema
    head, rest = str(schema).split("(", 1)
    args_text, returns = rest.rsplit(") -> ", 1)
    kept_text = [p for p, a in zip(_split_args(args_text), schema.arguments) if not _mutable(a)]
    lib.define(f"{name}.{OVERLOAD}({', '.join(kept_text)}) -> {returns}")
    kept = [a for a in schema.arguments if not _mutable(a)]
    mutable = [a.name for a in schema.arguments if _mutable(a)]

    def full_call(*args, **kwargs):
        """The op itself, with None for every output buffer."""
        given = dict(zip((a.name for a in kept), args), **kwargs)
        return op(*(None if a.name in mutable else given.get(a.name, a.default_value) for a in schema.arguments))

    lib.impl(f"{name}.{OVERLOAD}", full_call, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{ns}::{name}.{OVERLOAD}", full_call, lib=lib)
    functional = getattr(getattr(getattr(torch.ops, ns), name), OVERLOAD)
    names = [a.name for a in schema.arguments]

    def rule(mode, func, types, args, kwargs):
        bound = dict(zip(names, args), **kwargs)
        if any(bound.get(n) is not None for n in mutable):
            return mode.__torch_dispatch__(func, types, args, kwargs)  # an output buffer: functionalized as usual
        with mode:
            return functional(*(bound.get(a.name, a.default_value) for a in kept))

    torch.library.register_torch_dispatch(f"{ns}::{name}", FunctionalTensorMode, rule, lib=lib)


def op_names(ns: str = "specdec") -> List[str]:
    """The names of the ops registered in namespace ``ns`` (default overloads), sorted."""
    prefix = ns + "::"
    return sorted({n[len(prefix):] for n in torch._C._dispatch_get_all_op_names()
                   if n.startswith(prefix) and "." not in n[len(prefix):]})


def register(ns: str = "specdec") -> List[str]:
    """Give every qualifying op of ``torch.ops.<ns>`` its ``no_outputs`` overload and rule (once
    per namespace). Returns the names of those ops."""
    if ns in _DONE:
        return _DONE[ns]
    lib = _LIBS[ns] = torch.library.Library(ns, "FRAGMENT")
    done = []
    for name in op_names(ns):
        if _qualifies(getattr(getattr(torch.ops, ns), name).default._schema):
            _register_one(lib, ns, name)
            done.append(name)
    _DONE[ns] = done
    return done


def registered(ns: str = "specdec") -> List[str]:
    """The ops of ``ns`` that have the overload."""
    return list(_DONE.get(ns, []))
