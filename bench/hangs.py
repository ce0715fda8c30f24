"""7. Silent failures: how long a stalled rank takes to be named and the job to end, and what
the progress reporting costs a training step.

* Detection: a job of N entrypoint nodes on loopback (1 process each, torchrun, DDP over
  Gloo) runs bench/workloads/stall.py; global rank 1 stops at step 15 while the others wait in
  the allreduce. Measured from the stall (the time the stalled rank prints) to the master's
  diagnosis line, and to the end of the job (every node exited, 124), against HANG_TIMEOUT.
  Goal: at most HANG_TIMEOUT + 10 s.
* Cost: steps per second of a small PyTorch loop (bench/workloads/steps.py, one process, one
  thread), blocks of steps alternating between the image's progress hooks on and off;
  per CPU second of the process (its reporting thread included), which the other processes
  of a shared 2-core machine disturb far less than the wall clock; and the cost of one step
  in microseconds. Goal: within 1%.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from testing.ports import free_port
from testing.cluster import Node, loopback_env
from testing.processes import PY, ROOT

from .procs import WORKLOADS, base_env, median

STALL = str(WORKLOADS / "stall.py")
STEPS = str(WORKLOADS / "steps.py")


def _detect_once(count: int, timeout: int) -> dict | None:
    folder = Path(tempfile.mkdtemp(prefix="disttrain-bench-hang-"))
    port = free_port()
    nodes: list[Node] = []
    try:
        for k in range(count):
            env = base_env(**loopback_env(k, count, port, NPROC_PER_NODE=1, OMP_NUM_THREADS=1, RDZV_TIMEOUT=120,
                                          HANG_TIMEOUT=timeout, ENTRYPOINT=STALL, STEPS=100000,
                                          CHECKPOINT_DIR=str(folder / "checkpoints"),
                                          DISTTRAIN_STATUS=str(folder / "status.json")))
            nodes.append(Node(env, [], folder / f"node{k}.log"))
        stalled = diagnosed = None
        deadline = time.monotonic() + 120 + timeout
        while time.monotonic() < deadline and any(n.proc.poll() is None for n in nodes):
            text = "\n".join(n.output for n in nodes)
            if stalled is None and (m := re.search(r"STALL-SCRIPT stalls t=([\d.]+)", text)):
                stalled = float(m[1])
            if diagnosed is None and "entrypoint: stopping: no progress for" in nodes[0].output:
                diagnosed = time.time()
            time.sleep(0.05)
        ended = time.time()
        codes = [n.proc.poll() for n in nodes]
        if stalled is None or diagnosed is None or codes != [124] * count:
            return None
        return {"diagnosis": diagnosed - stalled, "end": ended - stalled}
    finally:
        for n in nodes:
            n.kill()
        shutil.rmtree(folder, ignore_errors=True)


def detection(nodes: tuple[int, ...], timeouts: tuple[int, ...], repeats: int) -> list[dict]:
    rows = []
    for timeout in timeouts:
        for n in nodes:
            runs = [_detect_once(n, timeout) for _ in range(repeats)]
            ok = [r for r in runs if r]
            rows.append({"nodes": n, "hang_timeout": timeout, "runs": len(runs), "failures": len(runs) - len(ok),
                         "diagnosis_s": median([r["diagnosis"] for r in ok]) if ok else None,
                         "end_s": median([r["end"] for r in ok]) if ok else None,
                         "max_end_s": max((r["end"] for r in ok), default=None),
                         "goal_s": timeout + 10})
    return rows


def cost(rounds: int, block: int, hiddens: tuple[int, ...]) -> list[dict]:
    rows = []
    for hidden in hiddens:
        out = subprocess.run([PY, STEPS, "--rounds", str(rounds), "--block", str(block), "--hidden", str(hidden)],
                             env=base_env(OMP_NUM_THREADS=1), capture_output=True, text=True, timeout=900,
                             cwd=str(ROOT))
        m = re.search(r"STEPS on=([\d.]+) off=([\d.]+) wall_on=([\d.]+) wall_off=([\d.]+)", out.stdout)
        if m is None:
            raise RuntimeError(f"steps.py failed: {out.stdout[-500:]}{out.stderr[-2000:]}")
        on, off, wall_on, wall_off = map(float, m.groups())
        rows.append({"hidden": hidden, "steps": 2 * rounds * block, "runs": rounds, "without": off, "with": on,
                     "ratio": on / off, "wall_ratio": wall_on / wall_off, "step_cost_us": (1 / on - 1 / off) * 1e6})
    return rows
