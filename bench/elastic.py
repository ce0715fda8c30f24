"""6. Elastic PyTorch: how long training stops when the membership changes.

An elastic job (MIN_NODES=1, MAX_NODES=3) of 2 entrypoint nodes on loopback trains
examples/pytorch_elastic.py under torchrun, or examples/pytorch_horovod_elastic.py under
Horovod's elastic driver. Mid-training either
* a worker node is lost (every process of it SIGKILLed, as `docker kill` does): measured
  from the kill to the end of the first training step at world size 1, or
* a third node joins: measured from the start of its entrypoint to the end of the first
  training step at world size 3 (this includes the newcomer's own start: importing torch
  in its entrypoint, its torchrun, and its training process).
The first step's end is the time disttrain.elastic prints after it (same clock).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from entrypoint.contract.config import VARIABLES

from testing.ports import free_port
from testing.cluster import Node, loopback_env
from testing.processes import ROOT

from .procs import base_env, median

FIRST_STEP_RE = r"ELASTIC first step at world size {world} \(resumed from step (\d+)\) t=([\d.]+)"
ARGS = ["--steps", "100000", "--step-delay", "0.05", "--checkpoint-every", "1000"]


def _wait(node: Node, pattern: str, timeout: float) -> re.Match | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, node.output)
        if found:
            return found
        if node.proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


LAUNCHERS = {"torchrun": dict(LAUNCHER="native", MAX_RESTARTS=5), "Horovod elastic": dict(LAUNCHER="horovod")}


def _node(folder: Path, port: int, k: int, launcher: str) -> Node:
    env = base_env(**loopback_env(k, 2, port, HOROVOD_PORT=port + 1, NPROC_PER_NODE=1, MIN_NODES=1, MAX_NODES=3,
                                  RDZV_TIMEOUT=120, OMP_NUM_THREADS=1, ENTRYPOINT=str(ROOT / "examples/train.py"),
                                  CHECKPOINT_DIR=str(folder / "checkpoints"), DATA_DIR=str(folder / "data"),
                                  **LAUNCHERS[launcher]))
    return Node(env, ARGS, folder / f"node{k}.log")


def once(launcher: str, change: str, timeout: float = 240) -> float | None:
    """Seconds from the change to the end of the first step at the new world size."""
    folder = Path(tempfile.mkdtemp(prefix="disttrain-bench-elastic-"))
    port = free_port()
    nodes = [_node(folder, port, k, launcher) for k in range(2)]
    try:
        if not _wait(nodes[0], r"step 40 loss", timeout):
            return None
        if change == "lost":
            changed_at, world = time.time(), 1
            nodes[1].kill()
        else:
            changed_at, world = time.time(), 3
            nodes.append(_node(folder, port, 2, launcher))
        found = _wait(nodes[0], FIRST_STEP_RE.format(world=world), timeout)
        return float(found.group(2)) - changed_at if found else None
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(folder, ignore_errors=True)


def measure(repeats: int, launchers: tuple[str, ...] = tuple(LAUNCHERS)) -> list[dict]:
    rows = []
    for launcher in launchers:
        for change, text, sizes in (("lost", "a worker node is lost (SIGKILL)", "2 → 1"),
                                    ("joined", "a node joins", "2 → 3")):
            samples = [once(launcher, change) for _ in range(repeats)]
            ok = [s for s in samples if s is not None]
            rows.append({"launcher": launcher, "change": text, "world": sizes, "seconds": median(ok),
                         "min": min(ok, default=None), "max": max(ok, default=None), "runs": len(ok),
                         "failures": len(samples) - len(ok),
                         "settings": {**{v.name: v.default for v in VARIABLES
                                         if v.name.startswith("ELASTIC_") or v.name == "PEER_TIMEOUT"},
                                      "cpus": os.cpu_count()}})
    return rows
