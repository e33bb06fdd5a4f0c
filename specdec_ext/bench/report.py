"""How every benchmark prints: it measures first, then prints its tables, last, on stdout.

Why: libraries print while a benchmark measures. torch logs "No CUDA runtime is found" when
Inductor first compiles, transformers draws weight-loading progress bars and logs
deprecation notices from ``generate``, and code anywhere may call ``warnings.warn``. Rows
printed as they were measured got these lines in between them, on a terminal, even with
``--no-progress``. So a command collects its rows, measures inside :func:`measuring`
(Python warnings and torch's / transformers' log records are held back there and printed
once each on stderr when it ends; transformers' progress bars are off), and only then
prints its tables with :func:`print_table`. Whatever still writes to the terminal
directly (a C++ library, a compiler subprocess) does so while measuring, so before the
first table line.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from typing import Iterator, List, Sequence

__all__ = ["measuring", "print_table", "progress_bar"]

#: the loggers whose records are held back while measuring (each has its own stderr handler
#: and does not propagate, so a handler on the root logger would not see them)
LOGGERS = ("torch", "transformers")


class _Hold(logging.Handler):
    """Keeps the log records it is handed."""

    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records: List[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def measuring(file=None) -> Iterator[None]:
    """Measure inside this block: third-party noise is held back until it ends.

    Inside: ``warnings.warn`` calls are recorded (the active filters still decide which are
    kept); records of the ``torch`` and ``transformers`` loggers go to a holding handler
    instead of their own; transformers' progress bars are disabled (when transformers is
    installed: its logging module is imported for that, which is light). When the block
    ends, even by an exception, everything held is printed on ``file`` (default stderr),
    each distinct message once, as ``note while measuring: ...`` lines, and the loggers,
    bars and warning filters are as they were.

    Parameters
    ----------
    file : text stream, optional
        Where the held messages go (default ``sys.stderr`` at exit time).
    """
    try:  # imported now so that its handler exists and can be swapped out below
        from transformers.utils import logging as hf_logging
    except ImportError:
        hf_logging = None
    hold = _Hold()
    saved = []
    for name in LOGGERS:
        log = logging.getLogger(name)
        saved.append((log, log.handlers[:], log.propagate))
        log.handlers, log.propagate = [hold], False
    bars_were_on = hf_logging.is_progress_bar_enabled() if hf_logging is not None else False
    if bars_were_on:
        hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings(record=True) as caught:
            yield
    finally:
        for log, handlers, propagate in saved:
            log.handlers, log.propagate = handlers, propagate
        if bars_were_on:
            hf_logging.enable_progress_bar()
        lines = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
        lines += [f"{r.name}: {r.levelname.lower()}: {r.getMessage()}" for r in hold.records]
        out = file or sys.stderr
        for line in dict.fromkeys(lines):  # each distinct message once, in order
            print(f"note while measuring: {line}", file=out)
        out.flush()


def print_table(header: str, legend: Sequence[str], lines: Sequence[str], file=None) -> None:
    """Print one table: the header, the legend lines (what each ratio column divides), the
    rows; flushed at once, so no other output lands inside it."""
    out = file or sys.stdout
    out.write("\n".join([header, *legend, *lines]) + "\n")
    out.flush()


class _NoBar:
    """What :func:`progress_bar` gives without tqdm or with ``disable``: counts nothing."""
    total = 0

    def update(self, n=1):
        pass

    def close(self):
        pass


def progress_bar(disable: bool, unit: str = "row"):
    """A tqdm bar on stderr that disappears when closed (``leave=False``), so it is gone
    before the tables print; a no-op with ``disable`` or without tqdm. ``bar.total`` may be
    raised as work is found; ``bar.update(n)``, ``bar.close()``."""
    if disable:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=0, unit=unit, file=sys.stderr, leave=False)
