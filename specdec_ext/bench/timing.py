"""Timing helpers shared by the benchmarks.

* time_call: median wall time per call (CUDA events on a GPU, perf_counter on CPU), the
  eager time a Python caller sees, launch overhead included.
* time_graph: device time per call by CUDA-graph replay of many calls (launch gaps
  shrink to the device's own; what the op costs inside a captured decode step).
* cold mode (time_call(..., flush=...)): before every timed call a large buffer is
  streamed through the caches (bigger than the last-level cache), so the op starts with
  cold caches, as it does when interleaved with other work; the flush is not timed.
"""
import statistics
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
        print(f"  graph timing skipped: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        torch.cuda.synchronize()
        return None


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read + written."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, min_reps=5)
    return 2 * nbytes / t / 1e9
