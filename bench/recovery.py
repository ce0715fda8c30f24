"""Recovery from a lost node, with the master-hosted job store and with etcd (JOB_STORE),
side by side in one run (issue 36).

An elastic job (MIN_NODES=1, MAX_NODES=3) of 2 entrypoint nodes on loopback trains
examples/train.py under torchrun. Once global rank 0 has printed step 40, one node's every
process is SIGKILLed (as `docker kill` does), and the time runs from the kill to the end of
the first training step at world size 1 (disttrain.elastic prints it, same clock):

    built-in store   the worker (the master hosts the store: losing it ends the job)
    etcd             the node without global rank 0
    etcd             the node with global rank 0 (it serves the round's workers' store)

Each trial runs every case once, in turn, so the machine's load falls on all alike. Also
reported: start-up, from starting both nodes to the end of the first step at world size 2.
Each case runs with the image's defaults (ELASTIC_DEAD_AFTER=3, ELASTIC_LAST_CALL=2) and,
with `--fast`, with the shortest settings too (2 and 1). Goal (issue 36): p50 and p95 at
most 5 s; start-up with etcd within 1.1x of the built-in store's.

    python bench/recovery.py [--trials 20] [--fast] [--out bench/out]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procs import base_env  # noqa: E402
from testing.cluster import Node, loopback_env  # noqa: E402
from testing.etcd import EtcdCluster  # noqa: E402
from testing.ports import free_port  # noqa: E402
from testing.processes import ROOT  # noqa: E402

FIRST_STEP_RE = r"ELASTIC first step at world size {world} \(resumed from step \d+\) t=([\d.]+)"
ARGS = ["--steps", "100000", "--step-delay", "0.05", "--checkpoint-every", "1000"]
CASES = (("built-in store", "a worker"), ("etcd", "the node without global rank 0"),
         ("etcd", "the node with global rank 0"))
SETTINGS = {"defaults": {}, "fast": {"ELASTIC_DEAD_AFTER": "2", "ELASTIC_LAST_CALL": "1"}}


def _first(nodes: list[Node], pattern: str, timeout: float) -> tuple[Node, re.Match] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for node in nodes:
            found = re.search(pattern, node.output)
            if found:
                return node, found
        if all(node.proc.poll() is not None for node in nodes):
            return None
        time.sleep(0.05)
    return None


def _nodes(folder: Path, store: str, etcd: EtcdCluster, settings: dict) -> list[Node]:
    common = dict(NPROC_PER_NODE=1, MIN_NODES=1, MAX_NODES=3, MAX_RESTARTS=5, RDZV_TIMEOUT=120, OMP_NUM_THREADS=1,
                  ENTRYPOINT=str(ROOT / "examples/train.py"), CHECKPOINT_DIR=str(folder / "checkpoints"),
                  DATA_DIR=str(folder / "data"), **settings)
    if store == "etcd":
        env = base_env(JOB_STORE="etcd://" + ",".join(e.split("://")[1] for e in etcd.endpoints),
                       RUN_ID=f"bench-{uuid.uuid4().hex[:8]}", **{k: str(v) for k, v in common.items()})
        return [Node(env, ARGS, folder / f"node{k}.log") for k in range(2)]
    port = free_port()
    return [Node(base_env(**loopback_env(k, 2, port, **common)), ARGS, folder / f"node{k}.log") for k in range(2)]


def once(store: str, lost: str, etcd: EtcdCluster, settings: dict, timeout: float = 240) -> dict:
    """{"startup": s, "recovery": s}; a value is None where that part failed."""
    folder = Path(tempfile.mkdtemp(prefix="disttrain-bench-recovery-"))
    started = time.time()
    nodes = _nodes(folder, store, etcd, settings)
    out = {"startup": None, "recovery": None}
    try:
        first = _first(nodes, FIRST_STEP_RE.format(world=2), timeout)
        if first is None:
            return out
        out["startup"] = float(first[1].group(1)) - started
        found = _first(nodes, r"step 40 loss", timeout)
        if found is None:
            return out
        rank0 = found[0]
        victim = {"a worker": nodes[1], "the node with global rank 0": rank0}.get(
            lost, next(n for n in nodes if n is not rank0))
        killed_at = time.time()
        victim.kill()
        survivors = [n for n in nodes if n is not victim]
        resumed = _first(survivors, FIRST_STEP_RE.format(world=1), timeout)
        out["recovery"] = float(resumed[1].group(1)) - killed_at if resumed else None
        return out
    finally:
        for node in nodes:
            node.kill()
        shutil.rmtree(folder, ignore_errors=True)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(trials: int, settings_names: tuple[str, ...]) -> list[dict]:
    samples = {(s, store, lost): [] for s in settings_names for store, lost in CASES}
    with EtcdCluster(Path(tempfile.mkdtemp(prefix="disttrain-bench-etcd-"))) as etcd:
        for trial in range(trials):
            for key in samples:
                result = once(key[1], key[2], etcd, SETTINGS[key[0]])
                samples[key].append(result)
                print(f"trial {trial + 1}/{trials} {key}: {result}", flush=True)
    rows = []
    for (settings, store, lost), results in samples.items():
        rec = [r["recovery"] for r in results if r["recovery"] is not None]
        up = [r["startup"] for r in results if r["startup"] is not None]
        rows.append({"settings": settings, "store": store, "lost": lost, "trials": len(results),
                     "failures": sum(r["recovery"] is None for r in results),
                     "recovery_p50": statistics.median(rec) if rec else None, "recovery_p95": percentile(rec, 0.95),
                     "recovery_max": max(rec, default=None),
                     "startup_p50": statistics.median(up) if up else None, "samples": results})
    return rows


def table(rows: list[dict]) -> str:
    f = lambda v: "-" if v is None else f"{v:.1f}"          # noqa: E731
    lines = ["| settings | store | node lost | recovery p50 s | p95 s | max s | start-up p50 s | runs (failed) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['settings']} | {r['store']} | {r['lost']} | {f(r['recovery_p50'])} | {f(r['recovery_p95'])} "
                     f"| {f(r['recovery_max'])} | {f(r['startup_p50'])} | {r['trials']} ({r['failures']}) |")
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    short = {"a worker": "a worker", "the node without global rank 0": "not rank 0", "the node with global rank 0": "rank 0"}
    labels = [f"{r['store']}\n{short[r['lost']]}\n({r['settings']})" for r in rows]
    data = [[s["recovery"] for s in r["samples"] if s["recovery"] is not None] for r in rows]
    ax.boxplot(data, whis=(5, 95))
    ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.axhline(5.0, color="grey", ls="--", lw=1, label="goal: 5 s")
    ax.set_ylabel("SIGKILL to first step at the new size (s)")
    ax.legend()
    fig.tight_layout()
    path = out / "recovery.png"
    fig.savefig(path, dpi=120)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--fast", action="store_true", help="also with ELASTIC_DEAD_AFTER=2 ELASTIC_LAST_CALL=1")
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = measure(args.trials, ("defaults", "fast") if args.fast else ("defaults",))
    (out / "recovery.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    print(f"\nplot: {plot(rows, out)}")


if __name__ == "__main__":
    main()
