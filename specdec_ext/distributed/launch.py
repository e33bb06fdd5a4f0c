"""Run a function on P local processes joined in a process group (gloo; NCCL with one GPU per
rank): what the tests, the benchmark and the example use to try :mod:`specdec_ext.distributed`
on one machine."""
from __future__ import annotations

import datetime
import io
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["RankError", "run_ranks"]


class RankError(RuntimeError):
    """A rank raised (its traceback is the message), or the ranks did not finish in time."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, timeout_s: float, threads: int, backend: str, fn, args,
               results) -> None:
    try:
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            buf = io.BytesIO()  # bytes, not shared-memory tensors: this process exits right after
            torch.save(fn(rank, world, *args), buf)
            results.put((rank, True, buf.getvalue()))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001  (reported to the parent, which raises)
        results.put((rank, False, traceback.format_exc()))


def _context():
    """Where the ranks come from: a fork server (POSIX) that imported torch and specdec_ext once
    and never runs a torch op (so no OpenMP pool is forked), which starts each rank in
    milliseconds instead of a fresh interpreter's seconds of imports; spawn elsewhere."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "specdec_ext", "specdec_ext.distributed"])
    return ctx


def run_ranks(fn: Callable[..., Any], world: int, *args, timeout_s: float = 60.0, threads: int = 1,
              backend: str = "gloo", allow_exit: bool = False) -> List[Any]:
    """``fn(rank, world, *args)`` on ``world`` new processes in one process group (its
    collectives time out after ``timeout_s``); returns the P results in rank order.
    backend: "gloo", or "nccl" (rank r on GPU r: needs ``world`` GPUs).

    ``fn`` and ``args`` must be picklable (a module-level function). Raises :class:`RankError`
    with the first failing rank's traceback, or when the ranks do not all report within
    ``2 * timeout_s`` (then they are killed). A rank that exits without reporting raises
    :class:`RankError` at once, unless ``allow_exit`` (fault-injection tests that kill a rank):
    then its result is None and the other ranks are still awaited.
    """
    ctx = _context()
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, timeout_s, threads, backend, fn, args, results),
                         daemon=True) for r in range(world)]
    env = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        for p in procs:
            p.start()
    finally:
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
    out: List[Any] = [None] * world
    failures, reported = [], set()
    deadline = time.monotonic() + 2 * timeout_s
    try:
        while len(reported) < world:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in reported and p.exitcode not in (None, 0)]
                if allow_exit:
                    reported.update(dead)  # its result stays None
                elif dead:  # died without reporting (e.g. could not start): no use waiting for it
                    raise RankError(f"rank {dead[0]} of {world} exited with code {procs[dead[0]].exitcode} "
                                    "before reporting") from None
                if time.monotonic() > deadline:
                    raise RankError(f"the {world} ranks did not all finish within {2 * timeout_s:.0f} s") from None
                continue
            reported.add(rank)
            if ok:
                out[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                failures.append((rank, value))
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if failures:
        rank, tb = min(failures)
        raise RankError(f"rank {rank} of {world} raised:\n{tb}")
    return out
