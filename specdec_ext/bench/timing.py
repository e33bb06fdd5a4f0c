"""Timing helpers shared by the benchmarks: median wall time per call."""
import statistics
import time

import torch


def time_call(fn, device: str, min_reps: int = 3, min_seconds: float = 0.2, warmup: int = 1) -> float:
    """Median seconds per call of fn(): CUDA events on a GPU, perf_counter on CPU."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    start_all = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start_all < min_seconds and len(times) < 500):
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


def copy_bandwidth(device: str, nbytes: int = 1 << 30) -> float:
    """Measured device-to-device copy bandwidth in GB/s, counting bytes read + written."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device, min_reps=5)
    return 2 * nbytes / t / 1e9
