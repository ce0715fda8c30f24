"""2. Rendezvous scaling: N entrypoint processes on loopback (1 process each) until every
rank has joined its framework's group, for the torchrun, Horovod and TensorFlow paths.

On one 2-core machine, N nodes also means N framework imports competing for the same
cores, which real nodes do in parallel; so the time from the last import to the last
rank joining is reported too: that part is the rendezvous protocol."""

from __future__ import annotations

from .procs import WORKLOADS, base_env, entrypoint, free_port, median, run_many, stamps

READY = str(WORKLOADS / "ready.py")
PATHS = {"torchrun (c10d)": dict(FRAMEWORK="pytorch", LAUNCHER="native"),
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


def measure(sizes: list[int], repeats: int, timeout: float = 300) -> list[dict]:
    rows = []
    for name, path_env in PATHS.items():
        for n in sizes:
            samples, joins, failures = [], [], 0
            for _ in range(repeats):
                codes, out, start = run_many(job(n, path_env), timeout=timeout)
                ready, imported = stamps(out, "READY"), stamps(out, "IMPORTED")
                if all(c == 0 for c in codes) and len(ready) == n and len(imported) == n:
                    samples.append(max(ready) - start)
                    joins.append(max(ready) - max(imported))
                else:
                    failures += 1
            # `seconds` includes every node importing its framework on the same 2 cores;
            # `join_seconds` is the rendezvous itself: last import done -> every rank in.
            rows.append({"path": name, "nodes": n, "seconds": median(samples), "join_seconds": median(joins),
                         "runs": len(samples), "failures": failures})
    return rows
