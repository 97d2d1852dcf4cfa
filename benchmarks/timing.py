"""The benchmarks' one timing helper (the scripts run as `python benchmarks/<name>.py`, so this imports)."""
from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int) -> float:
    """Median wall-clock seconds of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
