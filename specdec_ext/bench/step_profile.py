"""How one decode step of the reference Llama decoder spends its time: wall clock, the
same step under ``torch.profiler``, and the share of its matmuls (:func:`step_profile`).
A benchmark helper, not a test (benchmarks/HISTORY.md quotes its numbers)."""
from __future__ import annotations

import time
from typing import Dict, Optional

import torch

from ..models.llama import LlamaModel

__all__ = ["step_profile"]

_MATMUL_OPS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::linear", "aten::matmul",
               "specdec::skinny_linear")  # the last: models/cpu_linear.py on a CPU


def _wall_ms(step, undo, iters: int) -> float:
    """Mean wall time (ms) of the faster half of ``iters`` calls of ``step`` (``undo`` after each)."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        undo()
    times.sort()
    half = max(1, len(times) // 2)
    return 1e3 * sum(times[:half]) / half


def _profiled(step, undo, undo_alone, iters: int):
    """(step µs, matmul self µs, aten ops) summed over ``iters`` profiled steps. The undo
    calls run inside the profile but outside the step's record_function; their ops are
    subtracted by profiling ``undo_alone`` on its own."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            with torch.profiler.record_function("step_profile.step"):
                step()
            undo()
    events = prof.key_averages()
    step_us = sum(e.cpu_time_total for e in events if e.key == "step_profile.step")
    matmul_us = sum(e.self_cpu_time_total for e in events if e.key in _MATMUL_OPS)
    n_ops = sum(e.count for e in events if e.key.startswith("aten::"))
    with profile(activities=[ProfilerActivity.CPU]) as prof_undo:
        for _ in range(iters):
            undo_alone()
    return step_us, matmul_us, n_ops - sum(e.count for e in prof_undo.key_averages() if e.key.startswith("aten::"))


def step_profile(model: LlamaModel, tokens: int = 1, *, batch: int = 1, context: int = 64, iters: int = 50,
                 threads: Optional[int] = 1, forward=None, print_result: bool = True) -> Dict[str, float]:
    """Profile one decode step of ``tokens`` tokens per row after a ``context``-token prefill.

    A benchmark, not a test: returns (and prints) ``forward_ms`` (mean wall time of a step,
    profiler off), ``profiled_ms`` (mean step time under ``torch.profiler``), ``matmul_ms``
    (mean summed self CPU time of aten::addmm / mm / bmm / linear / matmul per step),
    ``ratio`` (= profiled_ms / matmul_ms), ``wall_ratio`` (= forward_ms / matmul_ms) and
    ``ops`` (aten ops per step). Each step is rolled back, so every one sees the same
    positions. ``threads`` sets ``torch.set_num_threads`` for the run (restored after);
    ``forward`` replaces ``model.forward`` (e.g. a compiled step), default the model itself.
    """
    fwd = model if forward is None else forward
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, model.vocab_size, (batch, context), generator=gen).to(model.device)
        step_ids = torch.randint(0, model.vocab_size, (batch, tokens), generator=gen).to(model.device)
        cache = model.new_cache(batch, context + tokens + 1)
        model(prompt, cache)
        kept = torch.zeros(batch, dtype=torch.int64, device=model.device)
        for _ in range(5):  # warm up (and compile, if ``forward`` is compiled)
            fwd(step_ids, cache)
            cache.rollback(tokens, kept)
        forward_ms = _wall_ms(lambda: fwd(step_ids, cache), lambda: cache.rollback(tokens, kept), iters)
        step_us, matmul_us, n_ops = _profiled(lambda: fwd(step_ids, cache), lambda: cache.rollback(tokens, kept),
                                              lambda: cache.rollback(0, kept), iters)
    finally:
        torch.set_num_threads(old_threads)
    res = {"forward_ms": forward_ms, "profiled_ms": step_us / 1e3 / iters, "matmul_ms": matmul_us / 1e3 / iters,
           "ops": n_ops / iters}
    res["ratio"] = res["profiled_ms"] / res["matmul_ms"]
    res["wall_ratio"] = res["forward_ms"] / res["matmul_ms"]
    if print_result:
        print(f"tokens={tokens} batch={batch}: forward {res['profiled_ms']:.3f} ms, matmul {res['matmul_ms']:.3f} ms, "
              f"ratio {res['ratio']:.2f} (profiled; wall-clock forward {res['forward_ms']:.3f} ms, ratio "
              f"{res['wall_ratio']:.2f}; {res['ops']:.0f} aten ops)")
    return res
