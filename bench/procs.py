"""What the benchmarks add to the shared harness (testing/): their processes' defaults, and
reading their timestamps."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from testing.processes import child_env

WORKLOADS = Path(__file__).resolve().parent / "workloads"


def base_env(**extra) -> dict[str, str]:
    """A benchmark's process: unbuffered output, quiet TensorFlow, scratch folders."""
    defaults = dict(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", CHECKPOINT_DIR="/tmp/disttrain-bench-ckpt",
                    DATA_DIR="/tmp/disttrain-bench-data")
    return child_env(**{**defaults, **extra})


def stamps(output: str, tag: str) -> list[float]:
    return [float(t) for t in re.findall(rf"{tag} rank=[\d?]+ t=([\d.]+)", output)]


def rotated(items: list, r: int) -> list:
    """Round r's order: it starts with the r-th item, so no run always goes first (on a cold
    cache) or last."""
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
