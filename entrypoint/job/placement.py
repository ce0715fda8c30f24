"""Where a node stands in its job: what nodes tell each other at rendezvous. Plain values,
shared by the planner, the join and the launchers."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeInfo:
    """What a node tells the others at rendezvous."""
    node_rank: int
    addr: str
    nproc: int
    ports: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"node_rank": self.node_rank, "addr": self.addr, "nproc": self.nproc,
                           "ports": list(self.ports)})

    @staticmethod
    def from_json(text: str | bytes) -> "NodeInfo":
        data = json.loads(text)
        return NodeInfo(int(data["node_rank"]), data["addr"], int(data["nproc"]), tuple(data["ports"]))


@dataclass(frozen=True)
class Placement:
    """Where this node stands once it has joined the job: what the launchers need."""
    node_rank: int
    nodes: tuple[NodeInfo, ...] = ()     # every node when the launcher exchanges addresses, else this one
    iface: str | None = None             # NIC for NCCL, Gloo and Horovod (None: theirs to choose)
    master_port: int | None = None       # torch's MASTER_PORT for processes that form their own group
    server_addr: str | None = None       # where this node's processes reach the launcher's server (Launcher.serve)
    server_port: int | None = None
    launch_env: tuple[dict[str, str], ...] = ()   # the master's per-rank variables (Launcher.launch_env)
    store_endpoint: str | None = None    # behind JOB_SECRET: host:port where this node's processes reach the job store

    @property
    def store_host_port(self) -> tuple[str, int] | None:
        """store_endpoint split (None without a secret: the processes use MASTER_ADDR:MASTER_PORT)."""
        if self.store_endpoint is None:
            return None
        host, port = self.store_endpoint.rsplit(":", 1)
        return host, int(port)

    @property
    def me(self) -> NodeInfo | None:
        return next((n for n in self.nodes if n.node_rank == self.node_rank), None)

    @property
    def ordered(self) -> list[NodeInfo]:
        """Every node, in node-rank order."""
        return sorted(self.nodes, key=lambda n: n.node_rank)
