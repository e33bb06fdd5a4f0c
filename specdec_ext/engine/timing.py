"""Phase timers of an engine step and the CUDA sync-debug guard.

On the CPU the ops run synchronously, so host clock marks time the phases. On CUDA the
marks are events read after the step's one device-to-host copy (no extra syncs)."""
from __future__ import annotations

import time
from typing import List, Tuple

import torch

__all__ = ["SyncDebug", "make_timer"]


class _HostTimer:
    def __init__(self):
        self.t: List[float] = []

    def mark(self) -> None:
        self.t.append(time.perf_counter())

    def read(self) -> Tuple[float, ...]:
        """Seconds between consecutive marks."""
        return tuple(b - a for a, b in zip(self.t, self.t[1:]))


class _CudaTimer:
    def __init__(self):
        self.ev: List[torch.cuda.Event] = []

    def mark(self) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.ev.append(e)

    def read(self) -> Tuple[float, ...]:
        return tuple(a.elapsed_time(b) / 1e3 for a, b in zip(self.ev, self.ev[1:]))


def make_timer(device: torch.device):
    """A fresh timer: ``mark()`` between phases, ``read()`` the seconds in between."""
    return _CudaTimer() if device.type == "cuda" else _HostTimer()


class SyncDebug:
    """Context: ``torch.cuda.set_sync_debug_mode('error')`` while active (CUDA only), so any
    hidden host sync inside a phase raises."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        if self.enabled:
            torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc):
        if self.enabled:
            torch.cuda.set_sync_debug_mode("default")
        return False
