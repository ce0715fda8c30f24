"""7. `docker compose up` → every node in its first collective (bench/workloads/ready.py:
init_process_group + an allreduce), 2 nodes on one Docker host: compose/two-node.yml (the
entrypoint) against bench/compose/torchrun.yml (plain torchrun in the same image). The two
take turns within each repeat; each run is a fresh project, removed after."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from testing.processes import ROOT

from .procs import WORKLOADS, median, stamps

SHIPPED = [ROOT / "compose" / "two-node.yml", ROOT / "bench" / "compose" / "ready.yml"]
FILES = {"entrypoint (compose/two-node.yml)": SHIPPED,
         # What waiting for the master's healthcheck (as the file did before) would cost.
         "entrypoint, worker waiting for the healthcheck": SHIPPED + [ROOT / "bench" / "compose" / "wait-healthy.yml"],
         "raw torchrun (bench/compose/torchrun.yml)": [ROOT / "bench" / "compose" / "torchrun.yml"]}
RAW = "raw torchrun (bench/compose/torchrun.yml)"


def compose() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"]


def once(files: list, image: str, timeout: float = 300) -> dict | None:
    """Seconds from `compose up` to the last node's READY, and to the last container's exit."""
    project = f"bench-{uuid.uuid4().hex[:8]}"
    base = [*compose(), "-p", project] + [arg for f in files for arg in ("-f", str(f))]
    env = {**os.environ, "IMAGE": image, "CODE_PATH": str(WORKLOADS)}
    start = time.time()
    try:
        up = subprocess.run([*base, "up", "--abort-on-container-exit", "--no-color"], env=env, capture_output=True,
                            text=True, timeout=timeout)
        wall = time.time() - start
        ready = stamps(up.stdout, "READY")
        if up.returncode != 0 or len(ready) != 2:
            return None
        return {"seconds": max(ready) - start, "wall": wall}
    except subprocess.TimeoutExpired:
        return None
    finally:
        subprocess.run([*base, "down", "-v", "-t", "5"], env=env, capture_output=True, timeout=120)


def measure(repeats: int, image: str = "distributed-training-framework:cpu") -> list[dict]:
    samples: dict[str, list[dict]] = {name: [] for name in FILES}
    failures = dict.fromkeys(FILES, 0)
    for _ in range(repeats):
        for name, files in FILES.items():
            result = once(files, image)
            if result is None:
                failures[name] += 1
            else:
                samples[name].append(result)
    rows = [{"path": name, "image": image, "seconds": median([r["seconds"] for r in runs]),
             "wall": median([r["wall"] for r in runs]), "runs": len(runs), "failures": failures[name],
             "load": os.getloadavg()[0]} for name, runs in samples.items()]
    raw = next(r for r in rows if r["path"] == RAW)
    for row in rows:
        row["ratio"], row["ratio_wall"] = row["seconds"] / raw["seconds"], row["wall"] / raw["wall"]
    return rows
