"""Who is in the job: the node ranks claimed, what each node told the others, and the
master's go. Keys (under the job's prefix):

    next             counter: the last node rank handed out without NODE_RANK
    node/<k>/claim   a node took rank k (NODE_RANK, or the next free one)
    node/<k>/info    its address, process count and ports (NodeInfo JSON)
    node/<k>/link    the port of its link (links.py), where it has one, on its address
    node/<k>/cut     the master's link to it closed: its processes are gone
    job/launch       the master's go: every node has joined, the launcher's server is up
                     (its port), the port of torch.distributed's env:// store for launchers
                     whose processes form their own group, and the launcher's per-rank variables
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from dataclasses import dataclass

from ..store.transport import JobStore, read
from .placement import NodeInfo


@dataclass(frozen=True)
class Launch:
    """The master's go (job/launch), as every node reads it."""
    server_port: int | None = None               # the launcher's server on the master (Launcher.serve)
    torch_port: int | None = None                # torch's env:// store, on the master
    launch_env: tuple[dict[str, str], ...] = ()  # Launcher.launch_env

    def to_json(self) -> str:
        return json.dumps({"server_port": self.server_port, "torch_port": self.torch_port,
                           "launch_env": list(self.launch_env)})

    @staticmethod
    def from_json(text: str) -> "Launch":
        data = json.loads(text)
        return Launch(data.get("server_port"), data.get("torch_port"), tuple(data.get("launch_env", ())))


class Members:
    def __init__(self, store: JobStore):
        self.store = store

    def claim(self, rank: int) -> bool:
        """compare_set writes our token only if the key is absent; it returns what is stored."""
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        return self.store.compare_set(f"node/{rank}/claim", "", token) == token

    def next_rank(self) -> int:
        return self.store.add("next", 1)

    def claimed(self, rank: int) -> bool:
        return self.store.has(f"node/{rank}/claim")

    def highest_rank(self, bound: int) -> int:
        """The highest rank that may have been claimed: `bound` - 1, or above it when
        elastic nodes took fresh ranks beyond it."""
        return max(bound - 1, self.store.add("next", 0))

    def claimed_workers(self, bound: int) -> list[int]:
        """The worker ranks (1 and up) claimed so far; `bound`: the job's most nodes."""
        return [k for k in range(1, self.highest_rank(bound) + 1) if self.claimed(k)]

    def publish(self, info: NodeInfo) -> None:
        self.store.set(f"node/{info.node_rank}/info", info.to_json())

    def node_info(self, rank: int) -> NodeInfo | None:
        return read(self.store, f"node/{rank}/info", NodeInfo.from_json)

    def await_info(self, rank: int, timeout_s: float) -> bool:
        """Whether node `rank` has published its info within timeout_s."""
        return self.store.wait(f"node/{rank}/info", timeout_s)

    def publish_link(self, rank: int, port: int) -> None:
        self.store.set(f"node/{rank}/link", str(port))

    def link_port(self, rank: int) -> int | None:
        return read(self.store, f"node/{rank}/link", int)

    def mark_cut(self, rank: int) -> None:
        self.store.set(f"node/{rank}/cut", "1")

    def cut(self, rank: int) -> bool:
        return self.store.has(f"node/{rank}/cut")

    def announce_launch(self, launch: Launch) -> None:
        self.store.set("job/launch", launch.to_json())

    def launch(self) -> Launch | None:
        return read(self.store, "job/launch", Launch.from_json)

    def await_launch(self, timeout_s: float) -> bool:
        return self.store.wait("job/launch", timeout_s)


