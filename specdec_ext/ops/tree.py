"""The fused tree verification op ``specdec::verify_tree``: Python wrapper (thin, over
``torch.ops.specdec``) and its fake kernel for torch.compile."""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

import torch

from .._validate import check_int
from ._args import FloatOrTensor, IntOrTensor, Temperature, filter_args, float_arg, int64_arg, seed_arg, temperature_arg
from .registry import host_args
from ._fake_checks import FLOATS, INDEX, check_devices, check_dim, check_dtype, check_filters, check_row_values

__all__ = ["TreeVerifyResult", "tree_depth", "verify_tree"]

#: the op namespace the wrapper calls (specdec_ext.testing.simt rebinds it to the SIMT emulation)
_OPS = torch.ops.specdec

Parents = Union[torch.Tensor, Sequence[int], Sequence[Sequence[int]]]


class TreeVerifyResult(NamedTuple):
    """Result of :func:`verify_tree` (D: the ``depth`` the call used).

    tokens       int64 [B, D+1]: the accepted nodes' tokens, then the correction (or bonus)
                 token, then -1
    path         int64 [B, D+1]: 0 (the root), then the accepted nodes in order, then -1. The
                 entries ``path[b, :num_accepted[b] + 1]`` are the nodes whose KV a cache keeps
                 (:func:`specdec_ext.kv_compact_` takes them as ``src_index``); the correction
                 token has no KV yet and is fed next step
    num_accepted int64 [B] in [0, D]: row b emits num_accepted[b] + 1 tokens
    valid        bool  [B]: False for a row with a NaN / +inf logit at any node, all -inf logits
                 at a visited node, a node token outside [0, V), a malformed parents row (device
                 tensors), a bad draft probability the op reads, or an unusable per-row device
                 temperature / filter value; such a row is all -1 with num_accepted 0
    """

    tokens: torch.Tensor
    path: torch.Tensor
    num_accepted: torch.Tensor
    valid: torch.Tensor


def _parents_arg(parents: Parents) -> torch.Tensor:
    """A tensor as is (the op checks it); a list ([N] or [B, N] of ints) -> int64 [N] / [B, N],
    with its entries checked to be ints (TypeError / ValueError naming ``parents``)."""
    if isinstance(parents, torch.Tensor):
        return parents
    values, nested = _parents_rows(parents)
    return torch.tensor(values if nested else values[0], dtype=torch.int64)


def _parents_rows(parents) -> tuple:
    """A list ``parents`` checked as :func:`_parents_arg` says: ([[int]] rows, nested), in plain
    Python (no tensor, so torch.compile traces it as constants)."""
    if not isinstance(parents, (list, tuple)):
        raise TypeError(f"parents must be a tensor or a list of ints, got {type(parents).__name__}")
    nested = bool(parents) and all(isinstance(r, (list, tuple)) for r in parents)
    rows = parents if nested else [parents]
    if len({len(r) for r in rows}) > 1:
        raise ValueError(f"parents rows must have one length N, got lengths {[len(r) for r in rows]}")
    values = [[check_int(f"parents[{b}][{n}]" if nested else f"parents[{n}]", x, -(2**63), 2**63 - 1)
               for n, x in enumerate(r)] for b, r in enumerate(rows)]
    return values, nested


def tree_depth(parents: Parents) -> int:
    """The depth D of the tree(s) in ``parents`` ([N] or [B, N]; the deepest row): the root has
    depth 0, a child one more than its parent. Reads the values on the host (a device tensor is
    copied: one sync; a meta tensor has no values: ValueError). A malformed tree gives N - 1,
    the largest depth, and verify_tree's own check then names the problem; no rows or no
    nodes give 0."""
    if not isinstance(parents, torch.Tensor):
        return _depth_of_rows(_parents_rows(parents)[0])
    p = parents
    if p.device.type == "meta":
        raise ValueError("parents is a meta tensor: its depth is unknown, pass depth= to verify_tree")
    p = p.detach().to("cpu", torch.int64)
    if p.numel() == 0:
        return 0
    return _depth_of_rows(p.reshape(-1, p.shape[-1]).tolist() if p.dim() else [[int(p)]])


def _depth_of_rows(rows) -> int:
    """:func:`tree_depth` of ``rows`` (an [N] or [B, N] nested list of ints), in plain Python:
    no tensor op, so a list ``parents`` needs no graph break or guard under torch.compile."""
    if rows and not isinstance(rows[0], list):
        rows = [rows]
    best = 0
    for row in rows:
        depth = [0] * len(row)
        for n in range(1, len(row)):
            if not 0 <= row[n] < n:
                return len(row) - 1
            depth[n] = depth[row[n]] + 1
        best = max([best] + depth)
    return best


_NEEDS_DEPTH = ("verify_tree under torch.compile(fullgraph=True) needs depth= when parents is a tensor (its depth "
                "would be read from the tensor's values); pass depth=, or parents as a Python list")


@torch.compiler.assume_constant_result
def _refuse_tensor_depth_in_one_graph() -> bool:
    """Run by dynamo at trace time (not traced), so its ValueError reaches the user with this
    message first instead of dynamo's data-dependent guard error. Only a one-graph compile
    refuses: otherwise the depth read is a graph break and runs eagerly, as it always did."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        one_graph = bool(getattr(tx, "one_graph", False) or getattr(tx, "error_on_graph_break", False))
    except Exception:  # another torch's internals: leave it to dynamo's own error
        return False
    if one_graph:
        raise ValueError(_NEEDS_DEPTH)
    return False


def verify_tree(
    target_logits: torch.Tensor,
    tree_token_ids: torch.Tensor,
    parents: Parents,
    draft_probs: Optional[torch.Tensor] = None,
    temperature: Temperature = 1.0,
    *,
    top_k: Optional[IntOrTensor] = None,
    top_p: Optional[FloatOrTensor] = None,
    min_p: Optional[FloatOrTensor] = None,
    seed: Optional[IntOrTensor] = None,
    offset: IntOrTensor = 0,
    depth: Optional[int] = None,
) -> TreeVerifyResult:
    """Verify a TREE of drafted tokens per row against the target, in one fused op.

    Multi-draft speculative sampling (SpecInfer style), walking from the root: at node n
    with children c_1 < c_2 < ... the residual law starts as r = p'_n (the target's law
    after node n, with temperature and filters). With ``draft_probs`` the children are
    i.i.d. draws from q_n: child c_i (token x) is accepted with probability
    min(1, r(x) / q_n(x)), else r <- normalise(max(0, r - q_n)) and the next child is
    tried. Without ``draft_probs`` the children are deterministic candidates (e.g. the
    draft's top-k): c_i is accepted with probability r(x), else r(x) <- 0 and r is
    renormalised. The first accepted child is moved to; when every child is rejected a
    token is drawn from r; at a leaf a bonus token is drawn from p'_leaf. The emitted
    tokens are distributed exactly as sampling from the target (repeated sibling tokens
    included). A chain-shaped tree (parents = [-1, 0, 1, ...]) gives the tokens of
    :func:`verify` with the same seed and offset.

    Parameters
    ----------
    target_logits : Tensor [B, N, V] float32 | float16 | bfloat16 (| float64, converted)
        The target's logits after each node (row n: the prediction after node n's token).
    tree_token_ids : Tensor [B, N] int64 | int32
        Node n's token; node 0 is the root (the last committed token), its entry is not read.
    parents : Tensor [N] or [B, N] int64 | int32, or a list
        parents[0] = -1 and 0 <= parents[n] < n (node indices are a topological order, e.g.
        BFS). A CPU tensor / list is checked here (``ValueError``); on a device a malformed
        row is an invalid row.
    draft_probs : Tensor [B, N, V] float32 | float16 | bfloat16, optional
        q_n: the draft law node n's children were sampled from (i.i.d., with replacement;
        the FILTERED law if filters are on, e.g. ``probs_out`` of :func:`sample`). None:
        deterministic children.
    temperature, top_k, top_p, min_p, seed, offset
        As in :func:`verify` (greedy rows: the first child whose token is the argmax is
        accepted, else the argmax is emitted; filters never apply to greedy rows).
    depth : int, optional
        D >= the tree's depth: the outputs hold D + 1 entries per row. None: computed from
        ``parents`` (:func:`tree_depth`; a device tensor then costs one host sync, so pass
        ``depth`` in a decode loop or under CUDA-graph capture). A list / tuple ``parents`` is
        measured in plain Python, so it compiles (``torch.compile(fullgraph=True)``) without
        ``depth``; a tensor ``parents`` there needs ``depth`` (``ValueError`` saying so).

    Returns
    -------
    TreeVerifyResult(tokens [B, D+1] int64, path [B, D+1] int64, num_accepted [B] int64,
    valid [B] bool)
    """
    if depth is None and isinstance(parents, torch.Tensor) and torch.compiler.is_compiling():
        _refuse_tensor_depth_in_one_graph()
    depth = tree_depth(parents) if depth is None else check_int("depth", depth, 0, 2**62)
    parents = _parents_arg(parents)
    tokens, path, num_accepted, valid = _OPS.verify_tree(
        float_arg(target_logits), tree_token_ids, parents, float_arg(draft_probs), temperature_arg(temperature),
        seed_arg(seed), int64_arg(offset, "offset"), depth, *filter_args(top_k, top_p, min_p))
    return TreeVerifyResult(tokens, path, num_accepted, valid)


# ---- fake (meta) kernel: output shapes / dtypes for torch.compile tracing ----

@torch.library.register_fake("specdec::verify_tree")
def _verify_tree_fake(target_logits, tree_token_ids, parents, draft_probs, temperature, seed, offset, depth,
                      top_k=None, top_p=None, min_p=None):
    check_devices(target_logits, "target_logits",
                  dict(tree_token_ids=tree_token_ids, parents=parents, draft_probs=draft_probs,
                       temperature=temperature, seed=seed, offset=offset, top_k=top_k, top_p=top_p, min_p=min_p),
                  host_ok=host_args("verify_tree"))
    check_filters(top_k, top_p, min_p)
    check_dim(target_logits, "target_logits", 3, "[B, N, V]")
    check_dim(tree_token_ids, "tree_token_ids", 2, "[B, N]")
    check_dim(draft_probs, "draft_probs", 3, "[B, N, V]")
    check_dtype(target_logits, "target_logits", FLOATS)
    check_dtype(tree_token_ids, "tree_token_ids", INDEX)
    check_dtype(parents, "parents", INDEX)
    check_dtype(draft_probs, "draft_probs", FLOATS)
    check_row_values(temperature, seed, offset)
    if parents.dim() not in (1, 2):
        raise ValueError(f"parents must be [N] or [B, N], got shape {tuple(parents.shape)}")
    B, N = target_logits.shape[0], target_logits.shape[1]
    if not 0 <= depth < N:
        raise ValueError(f"depth must be in [0, N - 1 = {N - 1}], got {depth}")
    tokens = target_logits.new_empty((B, depth + 1), dtype=torch.int64)
    path = target_logits.new_empty((B, depth + 1), dtype=torch.int64)
    num_accepted = target_logits.new_empty((B,), dtype=torch.int64)
    valid = target_logits.new_empty((B,), dtype=torch.bool)
    return tokens, path, num_accepted, valid
