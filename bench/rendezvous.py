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

from .compare import spread
from testing.cluster import loopback_env
from testing.ports import free_port
from testing.processes import PY, children_cpu_seconds, entrypoint, run_many

from .procs import WORKLOADS, base_env, median, rotated, stamps

READY = str(WORKLOADS / "ready.py")
RAW = "raw torchrun (c10d, one agent per node)"
SECRET = "7c2e9a4f1b8d6e3a5c0f7b9d2e4a6c81"
PATHS = {"torchrun (c10d)": dict(FRAMEWORK="pytorch", LAUNCHER="native"),
         "torchrun (c10d), JOB_SECRET": dict(FRAMEWORK="pytorch", LAUNCHER="native", JOB_SECRET=SECRET),
         RAW: None,
         "Horovod (no SSH)": dict(FRAMEWORK="pytorch", LAUNCHER="horovod"),
         "Horovod (no SSH), JOB_SECRET": dict(FRAMEWORK="pytorch", LAUNCHER="horovod", JOB_SECRET=SECRET),
         "TensorFlow (TF_CONFIG)": dict(FRAMEWORK="tensorflow", LAUNCHER="native")}


def job(n: int, path_env: dict) -> list[tuple[list[str], dict]]:
    port, hvd_port = free_port(), free_port()
    cmds = []
    for k in range(n):
        env = base_env(**loopback_env(k, n, port, HOROVOD_PORT=hvd_port, NPROC_PER_NODE=1, ENTRYPOINT=READY,
                                      RDZV_TIMEOUT=240, OMP_NUM_THREADS=1, **path_env))
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
    return {"seconds": max(ready) - start, "join_seconds": max(ready) - max(imported),
            "imported_seconds": max(imported) - start, "wall": wall, "cpu": cpu}


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
        if row["path"].endswith(", JOB_SECRET"):
            plain = next(r for r in rows if r["path"] == row["path"].removesuffix(", JOB_SECRET")
                         and r["nodes"] == row["nodes"])
            row["vs_plain"] = row["seconds"] / plain["seconds"]
    return rows


def secret_vs_plain(sizes: list[int], rounds: int, paths: tuple[str, ...] = ("torchrun (c10d)", "Horovod (no SSH)"),
                    timeout: float = 300) -> list[dict]:
    """JOB_SECRET's cost at start-up: each path without and with the secret, one right after
    the other in every round (which goes first swaps every round), and the ratio secret/plain
    of the time until every rank is in within each round: its median and interquartile range;
    and the medians both ways of the whole job's wall time (to the last node's exit), of the
    time to the last rank's imports (the nodes' own start: the entrypoint, joining, the
    launch), of the ranks' own rendezvous after that, and of the CPU-seconds of every process."""
    rows = []
    for n in sizes:
        for name in paths:
            pair = {"plain": PATHS[name], "secret": PATHS[f"{name}, JOB_SECRET"]}
            runs: dict[str, list[dict]] = {"plain": [], "secret": []}
            ratios, failures = [], 0
            for r in range(rounds):
                order = rotated(["plain", "secret"], r)
                got = {which: once(n, pair[which], timeout) for which in order}
                if None in got.values():
                    failures += 1
                    continue
                for which in order:
                    runs[which].append(got[which])
                ratios.append(got["secret"]["seconds"] / got["plain"]["seconds"])
            q2, q1, q3 = spread(ratios) if ratios else (float("nan"),) * 3
            rows.append({"path": name, "nodes": n, "ratio": q2, "q1": q1, "q3": q3, "rounds": len(ratios),
                         "failures": failures,
                         **{f"{which}{suffix}": median([run[key] for run in runs[which]])
                            for which in runs for key, suffix in (("seconds", ""), ("wall", "_wall"),
                                                                  ("imported_seconds", "_imported"),
                                                                  ("join_seconds", "_join"), ("cpu", "_cpu"))}})
    return rows


def store_latency(ops: int) -> list[dict]:
    """The job store's per-operation time as a node's entrypoint sees it: a TCPStore client
    straight to the store, and the same client through its Tunnel and the master's Gate
    (JOB_SECRET). Median of `ops` round trips, per operation."""
    import datetime as dt
    import socket
    import time

    from torch.distributed import TCPStore

    from entrypoint.security.secret import Identity
    from entrypoint.security.tunnel import Gate, Tunnel

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno())
    identity = Identity.derive(SECRET.encode())
    gate = Gate(free_port(), port, identity.server_context(), lambda line: None).start()
    tunnel = Tunnel("127.0.0.1", gate.port, identity.client_context()).start()
    rows = []
    for name, client_port in (("plain TCPStore", port), ("through Tunnel and Gate (JOB_SECRET)", tunnel.port)):
        client = TCPStore("127.0.0.1", client_port, is_master=False, timeout=dt.timedelta(seconds=30))
        client.set("bench/key", "x" * 64)
        for op, call in (("add", lambda: client.add("bench/n", 1)), ("get", lambda: client.get("bench/key")),
                         ("set", lambda: client.set("bench/key", "y" * 64)),
                         ("check", lambda: client.check(["bench/key"]))):
            times = []
            for _ in range(ops):
                t = time.perf_counter()
                call()
                times.append(time.perf_counter() - t)
            rows.append({"path": name, "op": op, "us": median(times) * 1e6, "ops": ops})
    for row in rows:
        plain = next(r for r in rows if r["op"] == row["op"] and r["path"] == "plain TCPStore")
        row["ratio"] = row["us"] / plain["us"]
    gate.stop()
    tunnel.stop()
    del server                                  # the store lives as long as its object
    return rows


def rendezvous_requests(requests: int) -> list[dict]:
    """Horovod's HTTP rendezvous as a worker node's Horovod sees it: a PUT then a GET of a
    key, each on a connection of its own (as Gloo's HTTPStore makes them), straight to the
    server, through a Tunnel and the master's Gate (JOB_SECRET: a TLS connection per
    request), and through a RequestTunnel (the entrypoint's: each request framed over a kept
    TLS connection). The Gate runs in a process of its own, as on a master node. Median of
    `requests` pairs, per request."""
    import http.client
    import subprocess
    import time

    from entrypoint.security.secret import Identity
    from entrypoint.security.tunnel import RequestTunnel, Tunnel

    gate_port = free_port()
    master = subprocess.Popen([PY, str(WORKLOADS / "gated_rendezvous.py"), str(gate_port), SECRET],
                              stdout=subprocess.PIPE, text=True, env=base_env())
    try:
        local = int(master.stdout.readline())
        context = Identity.derive(SECRET.encode()).client_context()
        tunnels = [Tunnel("127.0.0.1", gate_port, context).start(),
                   RequestTunnel("127.0.0.1", gate_port, context).start()]
        paths = {"plain HTTP": local, "through Tunnel and Gate (a handshake per request)": tunnels[0].port,
                 "through RequestTunnel and Gate (kept connections)": tunnels[1].port}

        def request(port: int, method: str, key: str) -> float:
            started = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request(method, f"/global/{key}", body=b"x" * 64 if method == "PUT" else None)
            conn.getresponse().read()
            conn.close()
            return time.perf_counter() - started

        times: dict[str, list[float]] = {name: [] for name in paths}
        for i in range(requests):
            for k, (name, port) in enumerate(paths.items()):          # interleaved, as the other tables
                times[name] += [request(port, "PUT", f"path{k}-{i}"), request(port, "GET", f"path{k}-{i}")]
        for tunnel in tunnels:
            tunnel.stop()
    finally:
        master.kill()
        master.wait()
    plain = median(times["plain HTTP"])
    return [{"path": name, "ms": median(t) * 1e3, "ratio": median(t) / plain, "requests": len(t)}
            for name, t in times.items()]
