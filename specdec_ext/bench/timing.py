"""Timing helpers shared by the benchmarks.

* time_call: median wall time per call (CUDA events on a GPU, perf_counter on CPU), the
  eager time a Python caller sees, launch overhead included.
* time_graph: device time per call by CUDA-graph replay of many calls (launch gaps
  shrink to the device's own; what the op costs inside a captured decode step).
* cold mode (time_call(..., flush=...)): before every timed call a large buffer is
  streamed through the caches (bigger than the last-level cache), so the op starts with
  cold caches, as it does when interleaved with other work; the flush is not timed.
* machine_load / busy_reason / warn_if_busy: the 1-minute load average and core count,
  recorded with every benchmark result, so a run timed on a busy machine can be told
  apart (benchmarks/check_targets.py refuses to judge one).
"""
import json
import os
import statistics
import sys
import time

import torch


def cache_flusher(device: str, nbytes: int = None):
    """A function that streams a buffer larger than the last-level cache (64 MiB on CPU,
    256 MiB on a GPU: an H200 has 60 MB of L2) through the caches."""
    if nbytes is None:
        nbytes = (256 << 20) if device == "cuda" else (64 << 20)
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    def flush():
        buf.add_(1.0)  # reads and writes every line

    return flush


def time_call(fn, device: str, min_reps: int = 3, min_seconds: float = 0.2, warmup: int = 1, flush=None,
              max_reps: int = 500) -> float:
    """Median seconds per call of fn(): CUDA events on a GPU, perf_counter on CPU.
    flush (optional): called before every timed call, outside the timed region."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    start_all = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start_all < min_seconds and len(times) < max_reps):
        if flush is not None:
            flush()
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_graph(fn, calls: int = 20, reps: int = 5):
    """Device seconds per call of fn() by CUDA-graph replay: `calls` calls captured in
    one graph, replayed `reps` times (median). None when fn cannot be captured."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()  # warm up outside the capture (allocator, occupancy caches, compile)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(calls):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3 / calls)
        del g
        return statistics.median(times)
    except Exception as e:  # not capturable (a host sync, an RNG without graph support): report, no column
        print(f"  graph timing skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
        torch.cuda.synchronize()
        return None


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read + written."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, min_reps=5)
    return 2 * nbytes / t / 1e9


def machine_load() -> dict:
    """How busy the machine is now: ``{"load_1min": float | None, "cpu_count": int | None}``.

    load_1min is os.getloadavg()'s 1-minute average (runnable + waiting tasks, None where
    the OS has none); cpu_count is os.cpu_count(). A load above the core count means other
    work competed for the cores during the last minute, so timings are not trustworthy.
    Put it in every result row (``row.update(machine_load())``): benchmarks/check_targets.py
    reads these two keys."""
    try:
        load = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # no load average on this OS
        load = None
    return dict(load_1min=load, cpu_count=os.cpu_count())


def busy_reason(load: dict):
    """'machine busy (load X > N cores)' when ``load`` (a machine_load() dict) shows more
    runnable work than cores, else None (also when either figure is unknown)."""
    if load.get("load_1min") is None or not load.get("cpu_count"):
        return None
    if load["load_1min"] > load["cpu_count"]:
        return f"machine busy (load {load['load_1min']:.2f} > {load['cpu_count']} cores)"
    return None


def busiest(rows) -> dict:
    """The row (or machine_load() dict) of ``rows`` with the highest ``load_1min``; {} when
    none records one."""
    known = [r for r in rows if r.get("load_1min") is not None]
    return max(known, key=lambda r: r["load_1min"]) if known else {}


def warn_if_busy(load: dict, file=None) -> bool:
    """Print a one-line warning (stderr) when busy_reason(load); True when it warned."""
    why = busy_reason(load)
    if why:
        print(f"warning: {why}: timings are unreliable; rerun on an idle machine", file=file or sys.stderr)
    return why is not None


def write_rows_json(path: str, rows, **extra) -> None:
    """The benchmark file: ``{"rows": rows, "torch": version, "machine": machine_load(), **extra}``,
    written whole or not at all (a run killed while saving keeps the previous file)."""
    with open(path + ".tmp", "w") as f:
        json.dump(dict(rows=rows, torch=torch.__version__, machine=machine_load(), **extra), f, indent=1)
    os.replace(path + ".tmp", path)
