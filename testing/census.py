"""Who listens where: the listening TCP sockets of a job's processes on this machine.

A port bound to a node's own address, or to every interface, is one the other nodes (and
anyone else on their network) can reach; one bound to 127.0.0.1 or ::1 is the node's own.
On loopback the nodes stand on 127.0.0.k, so only 127.0.0.1 counts as the node's own
there: start a job whose ports are counted with addresses other than 127.0.0.1
(`Jobs.start(addrs=...)`), or the master's own address hides among its private ports.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

PRIVATE = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class Listener:
    node: int              # the node's index in the job
    pid: int
    entrypoint: bool       # the node's entrypoint process itself (else a process it started)
    command: str           # the process's command line, shortened
    ip: str
    port: int

    @property
    def everywhere(self) -> bool:
        return self.ip in ("0.0.0.0", "::")


def listeners(nodes: list) -> list[Listener]:
    """Every listening TCP socket of the nodes' processes (testing.cluster.Node)."""
    import psutil

    found = []
    for k, node in enumerate(nodes):
        for process in node.tree():
            try:
                sockets = process.net_connections(kind="tcp")
                command = " ".join(process.cmdline())[:120]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            found += [Listener(k, process.pid, process.pid == node.proc.pid, command, c.laddr.ip, c.laddr.port)
                      for c in sockets if c.status == psutil.CONN_LISTEN]
    return found


def reachable(nodes: list) -> list[Listener]:
    """The listeners other hosts could reach: bound to anything but 127.0.0.1 and ::1."""
    return [found for found in listeners(nodes) if found.ip not in PRIVATE]


def described(found: list[Listener], addrs: list[str], gates: dict[int, str]) -> Counter:
    """What each listener that other hosts could reach is, counted: the master's Gates (its
    entrypoint on every interface, on a port of `gates`, named by its variable), an elastic
    node's link port (its entrypoint, on its node's own address: job/links.py), a rank's
    (any process the entrypoint started) on every interface or on its node's own address
    (`addrs[k]`: node k's), and anything else by its process, address and port, which no
    list names."""
    said: Counter = Counter()
    for f in found:
        if f.ip in PRIVATE:
            continue
        if f.entrypoint and f.node == 0 and f.everywhere and f.port in gates:
            said[f"Gate on {gates[f.port]}"] += 1
        elif f.entrypoint and f.ip == addrs[f.node]:
            said["peer link, its node's address"] += 1
        elif not f.entrypoint and (f.everywhere or f.ip == addrs[f.node]):
            said["rank, every interface" if f.everywhere else "rank, its node's address"] += 1
        else:
            said[f"node {f.node}: {f.command} on {f.ip}:{f.port}"] += 1
    return said


# Run inside a container (`docker exec`, as the image's user, who runs the job): every
# listening socket of the container's processes, as JSON lines.
_IN_CONTAINER = """
import json, psutil
for p in psutil.process_iter():
    try:
        for c in p.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN:
                print(json.dumps([p.pid, " ".join(p.cmdline())[:120], c.laddr.ip, c.laddr.port]))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
"""


def container_listeners(containers: list[str]) -> list[Listener]:
    """Every listening TCP socket in each container (a node of the job, by name or id);
    the census process's own none."""
    import json
    import subprocess

    found = []
    for k, name in enumerate(containers):
        out = subprocess.run(["docker", "exec", name, "python", "-c", _IN_CONTAINER], capture_output=True,
                             text=True, timeout=60, check=True).stdout
        for pid, command, ip, port in map(json.loads, out.splitlines()):
            found.append(Listener(k, pid, "entrypoint.main" in command, command, ip, port))
    return found
