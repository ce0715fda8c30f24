"""2. Rendezvous scaling: N nodes on loopback (1 process each) until every rank has joined
its framework's group, through the entrypoint (torchrun, Horovod and TensorFlow paths) and,
as the raw counterpart, plain torchrun with one agent per node on a c10d store (node 0's
agent hosts it), as a user without this image would start the same job.

Each run reports, besides the time until every rank is in, the whole job's wall time (start
to the last process's exit) and CPU-seconds (user + system of every process it started);
the paths take turns within each repeat, so a load change on the machine hits them alike.

On one 2-core machine, N nodes also means N framework imports competing for the same
cores, which real nodes do in parallel; so the time from the last import to the last
rank joining is reported too: that part is the rendezvous protocol."""

from __future__ import annotations

import os

from .procs import PY, WORKLOADS, base_env, children_cpu_seconds, entrypoint, free_port, median, run_many, stamps

READY = str(WORKLOADS / "ready.py")
RAW = "raw torchrun (c10d, one agent per node)"
PATHS = {"torchrun (c10d)": dict(FRAMEWORK="pytorch", LAUNCHER="native"),
         RAW: None,
         "Horovod (no SSH)": dict(FRAMEWORK="pytorch", LAUNCHER="horovod"),
         "TensorFlow (TF_CONFIG)": dict(FRAMEWORK="tensorflow", LAUNCHER="native")}


def job(n: int, path_env: dict) -> list[tuple[list[str], dict]]:
    port, hvd_port = free_port(), free_port()
    cmds = []
    for k in range(n):
        env = base_env(TRAIN_MODE="distributed", NUM_NODES=n, ROLE="master" if k == 0 else "worker",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HOROVOD_PORT=hvd_port,
                       NODE_ADDR=f"127.0.0.{k + 1}", NPROC_PER_NODE=1, ENTRYPOINT=READY, RDZV_TIMEOUT=240,
                       OMP_NUM_THREADS=1, **path_env)
        cmds.append((entrypoint(), env))
    return cmds


def raw_job(n: int) -> list[tuple[list[str], dict]]:
    """torchrun as documented for multi-node c10d, one agent per node; node 0's hosts the store."""
    port = free_port()
    return [([PY, "-m", "torch.distributed.run", f"--nnodes={n}", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=bench", f"--rdzv-conf=is_host={int(k == 0)}",
              f"--local-addr=127.0.0.{k + 1}", READY], base_env(OMP_NUM_THREADS=1, FRAMEWORK="pytorch"))
             for k in range(n)]


def once(n: int, path_env: dict | None, timeout: float) -> dict | None:
    """One job: seconds to every rank in, after the last import, wall and CPU; None if it failed."""
    cpu = children_cpu_seconds()
    codes, out, start, wall = run_many(raw_job(n) if path_env is None else job(n, path_env), timeout=timeout)
    cpu = children_cpu_seconds() - cpu
    ready, imported = stamps(out, "READY"), stamps(out, "IMPORTED")
    if not (all(c == 0 for c in codes) and len(ready) == n and len(imported) == n):
        return None
    return {"seconds": max(ready) - start, "join_seconds": max(ready) - max(imported), "wall": wall, "cpu": cpu}


def measure(sizes: list[int], repeats: int, timeout: float = 300) -> list[dict]:
    samples: dict[tuple[str, int], list[dict]] = {(name, n): [] for n in sizes for name in PATHS}
    failures = dict.fromkeys(samples, 0)
    for n in sizes:
        for _ in range(repeats):
            for name, path_env in PATHS.items():          # interleaved: one of each, then again
                result = once(n, path_env, timeout)
                if result is None:
                    failures[(name, n)] += 1
                else:
                    samples[(name, n)].append(result)
    rows = []
    for (name, n), runs in samples.items():
        # `seconds` includes every node importing its framework on the same 2 cores;
        # `join_seconds` is the rendezvous itself: last import done -> every rank in.
        rows.append({"path": name, "nodes": n, **{key: median([r[key] for r in runs])
                                                  for key in ("seconds", "join_seconds", "wall", "cpu")},
                     "runs": len(runs), "failures": failures[(name, n)], "load": os.getloadavg()[0]})
    for row in rows:
        raw = next(r for r in rows if r["path"] == RAW and r["nodes"] == row["nodes"])
        row["ratio_wall"], row["ratio_cpu"] = row["wall"] / raw["wall"], row["cpu"] / raw["cpu"]
    return rows
