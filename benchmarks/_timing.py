"""Timing calls against each other in one run, the benchmarks' shared way."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


def timed(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict]:
    """Each call once (compiling, warming up), then `repeats` rounds that make every call in turn,
    so a machine that speeds up or slows down during a run (seen on a 2-core CPU by 10 % and more)
    shifts every call alike instead of whichever ran last.

    Returns {name: {"compile_s", "median_s", "times_s"}}; compile_s is the first call's excess
    over the median.
    """
    first, times = {}, {name: [] for name in calls}
    for name, call in calls.items():
        start = time.perf_counter()
        jax.block_until_ready(call())
        first[name] = time.perf_counter() - start
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    result = {}
    for name, seconds in times.items():
        median = float(np.median(seconds))
        result[name] = dict(
            compile_s=max(first[name] - median, 0.0), median_s=median, times_s=seconds
        )
    return result
