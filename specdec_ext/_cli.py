"""What every command line of the package shares (``python -m specdec_ext.generate`` and each
``python -m specdec_ext.bench`` command): a parser whose errors are one line with exit code 2,
and the argparse types that range-check numbers by the ops' own rules, so a bad value is
refused while parsing, before anything loads or runs."""
from __future__ import annotations

import argparse
import os
from typing import Optional

from ._validate import check_temperature

__all__ = ["OneLineParser", "float_in", "int_in", "output_path", "port", "seed", "temperature"]

SEED_LOW, SEED_HIGH = -(2**63), 2**64 - 1  # any 64-bit pattern is a seed (the ops' rule)


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): ``prog: error: ... (see --help)``, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def int_in(low: int, high: Optional[int] = None):
    """argparse type: an integer in [low, high] (high optional)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}" if high is None
                                             else f"must be in [{low}, {high}], got {value}")
        return value
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def float_in(low: float, high: Optional[float] = None, low_open: bool = False):
    """argparse type: a finite number >= low (> low with ``low_open``), <= high if given."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad_low = value <= low if low_open else value < low
        if value != value or bad_low or (high is not None and value > high) or value in (float("inf"), float("-inf")):
            lo = f"> {low}" if low_open else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be finite and {lo}{'' if high is None else f' and <= {high}'}, "
                                             f"got {text}")
        return value
    parse.__name__ = "number"
    return parse


def temperature(text: str) -> float:
    """argparse type: a temperature by the ops' one rule (0 = greedy)."""
    try:
        return check_temperature(float(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if "temperature" in str(e) else f"expected a number, got {text!r}") \
            from None


#: argparse type: a sampling seed, any 64-bit pattern ([-2^63, 2^64 - 1], as the ops take it)
seed = int_in(SEED_LOW, SEED_HIGH)

#: argparse type: a TCP port; 0 lets the system pick one
port = int_in(0, 65535)


def output_path(text: str) -> str:
    """argparse type: a file to write at the end of a run, refused now if its folder is missing."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: folder {folder!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, not a file")
    return text
