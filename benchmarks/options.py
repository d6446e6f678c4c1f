"""Argument types shared by the benchmark commands: argparse rejects a bad value with one
usage line naming the option."""

from __future__ import annotations

import argparse
import math


def count(text: str) -> int:
    """An integer of at least 1 (repeats, steps)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} must be at least 1")
    return n


def seconds(text: str) -> float:
    """A positive, finite number of seconds (``min_time``)."""
    s = _number(text)
    if not (s > 0 and math.isfinite(s)):  # also rejects nan
        raise argparse.ArgumentTypeError(f"{text} must be a finite number above 0")
    return s


def seconds_or_zero(text: str) -> float:
    """A finite number of seconds, 0 included (``warmup``)."""
    s = _number(text)
    if not (s >= 0 and math.isfinite(s)):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number, 0 or above")
    return s


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
