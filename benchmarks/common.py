"""Shared benchmark plumbing: timing, summary statistics and the JSON result file.

Every `bench_<name>.py` measures side by side in one run, then calls `write_result(name, config,
numbers)`, which adds the commit and machine and writes `benchmarks/results/<name>.json`, and
`print_table` for humans. Knows nothing about what is measured.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "summarize", "time_repeats", "write_result", "print_table", "machine"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def summarize(samples: list[float]) -> dict[str, float]:
    """min / median / max / n of a list of samples (same unit as the samples)."""
    if not samples:
        raise ValueError("summarize() needs at least one sample")
    return {
        "min": min(samples),
        "median": statistics.median(samples),
        "max": max(samples),
        "n": len(samples),
    }


def time_repeats(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls of `fn` after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=RESULTS_DIR.parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def write_result(name: str, config: dict[str, Any], numbers: dict[str, Any]) -> Path:
    """Write `benchmarks/results/<name>.json` with config, commit, machine and numbers."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    record = {
        "name": name,
        "commit": _commit(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "config": config,
        "numbers": numbers,
    }
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    """Print rows (dicts with the same keys) as an aligned text table."""
    if not rows:
        print(f"{title}: no rows")
        return
    keys = list(rows[0])
    cells = [[_fmt(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print(title)
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
