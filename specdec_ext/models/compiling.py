"""``torch.compile`` of a model's decode step, shared by the reference model
(:meth:`~specdec_ext.models.llama.LlamaModel.compile_decode`) and the batched Hugging Face
path (:meth:`~specdec_ext.models.hf.HFBatchedSpecModel.compile_decode`).

Two process-wide settings of torch matter here, and this is the one place that touches them:

- ``torch._dynamo.config.recompile_limit``: dynamo caps the graphs per code object
  (default 8; past it the function silently runs eager). Every model of one class shares
  one forward code object, so a target and a draft, each with masked and unmasked steps at
  one or more batch sizes, pass the default. :func:`compile_step` raises it to at least
  :data:`RECOMPILE_LIMIT`.
- ``torch._inductor.config.freezing``: with it, the weights go into the graph as constants,
  so Inductor can fold them and pre-pack them for its GEMM kernels. Passed as
  ``torch.compile(options={"freezing": True})`` it did not change the bundled target's step
  time on the CPU, while the global flag did (torch 2.14), so ``freeze=True`` sets the flag
  around each call of the compiled step (compilation happens inside calls) and restores it.
- Two tracing settings, set the same way around each call (measured 2026-12-02, torch
  2.14.1, 2 cores):

  - ``torch._dynamo.config.specialize_float = True`` (always): a model's float attributes
    (RMSNorm ``eps``, the attention ``scale``) are constants of the graph. Left symbolic,
    dynamo turns them into tensors, finds that ``scaled_dot_product_attention(scale=)``
    needs a Python float, and traces the whole step a second time ("Restarting analysis due
    to _tensorify_python_scalars"). The transformers pair's compiled-forward test went from
    5 graphs in 27-38 s to 4 graphs in 26-27 s.
  - ``torch.fx.experimental._config.use_duck_shape = False`` (``duck_shape=False``, the
    reference model): no two sizes share a symbol because they were equal when traced.
    With duck shapes, the reference model's prefill (cache length == step length) compiles
    a graph guarded on that equality and the first decode step another: the bundled pair's
    ``generate --compile`` compiled 5 graphs in 56 s, and with both settings 3 in 37 s. The
    transformers forward traces slower without duck shapes (26 -> 41 s), so it keeps them.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["RECOMPILE_LIMIT", "compile_step"]

#: the least ``torch._dynamo.config.recompile_limit`` :func:`compile_step` sets
RECOMPILE_LIMIT = 64


def _raise_recompile_limit() -> None:
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"  # older torch
    setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))


def compile_step(fn: Callable[..., Any], freeze: bool = False, *, duck_shape: bool = True,
                 **options: Any) -> Callable[..., Any]:
    """``torch.compile(fn, dynamic=True, **options)``, after raising the recompile limit;
    every call runs with ``specialize_float`` set and, for ``duck_shape=False``, without
    duck-shaped sizes (see the module docstring).

    ``freeze=True``: every call runs with ``torch._inductor.config.freezing`` set, so the
    graphs it compiles hold the weights as constants (Inductor's freezing): for weights that
    are final. Changing them afterwards (``load_state_dict`` included) is unsupported:
    whether a compiled step sees the change depends on what Inductor did with each weight
    (a pre-packed copy for a GEMM kernel, which also takes memory next to the parameter, or
    a reference). Setting the flags costs a few microseconds per call.
    """
    _raise_recompile_limit()
    compiled = torch.compile(fn, dynamic=True, **options)
    import torch._dynamo.config as dynamo_config
    import torch.fx.experimental._config as shapes_config
    from torch._inductor import config as inductor_config

    def step(*args: Any, **kwargs: Any) -> Any:
        before = (dynamo_config.specialize_float, shapes_config.use_duck_shape, inductor_config.freezing)
        dynamo_config.specialize_float, shapes_config.use_duck_shape = True, duck_shape
        if freeze:
            inductor_config.freezing = True
        try:
            return compiled(*args, **kwargs)
        finally:
            dynamo_config.specialize_float, shapes_config.use_duck_shape, inductor_config.freezing = before

    return step
