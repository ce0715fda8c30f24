"""The training processes' own torch.distributed store under torch's agent, behind JOB_SECRET:
a fresh store for every rendezvous round, on the master's loopback, reached through
MASTER_PORT's Gate.

Without a secret, global rank 0's process serves the workers' store (a TCPStore on every
interface of its node), a new one each round because that process is new each round. With a
secret nothing may listen outside the Gates, and the job store cannot take the workers' keys:
torch puts no per-round prefix on them (torch 2.13's env:// store), so a later round would
find the keys of the one before (process groups' addresses, counters) and meet ghosts.

So, each round, the master's entrypoint serves a new TCPStore on 127.0.0.1 and routes a new
server name to it on its Gate (tunnel.Gate.route); it writes that name into the round's own
rendezvous store (c10d's keys for the round), where every node's agent reads it and opens a
Tunnel asking for it. The round's workers then use 127.0.0.1:<that port> as MASTER_ADDR:
MASTER_PORT, every one a client (TORCHELASTIC_USE_AGENT_STORE), as under torch's default
shared store. The previous round's store and tunnel close when the next round forms (its
workers are stopped by then: torch's agent stops them before it re-rendezvouses).
"""

from __future__ import annotations

import datetime as dt
import socket
import uuid

from ...security.tunnel import ROUTE_SUFFIX, Tunnel

NAME_KEY = "disttrain/workers_store"       # in the round's rendezvous store


class WorkersStores:
    """One per node for the run of its agent; `open(round_store)` once per round gives the
    port on 127.0.0.1 where this node's workers find the round's store."""

    def __init__(self, job_store):
        """`job_store`: this node's JobStore, with its identity (and its Gate on the master)."""
        self.job_store = job_store
        self.serving = job_store.serve
        self._current = None            # (name, TCPStore, listener) on the master; a Tunnel elsewhere

    def open(self, round_store) -> int:
        self.close()
        if self.serving:
            name, port = self._serve()
            round_store.set(NAME_KEY, name)
            return port
        name = round_store.get(NAME_KEY).decode()
        s = self.job_store
        tunnel = Tunnel(s.host, s.port, s.identity.client_context(), server_name=name).start()
        self._current = tunnel
        return tunnel.port

    def _serve(self) -> tuple[str, int]:
        from torch.distributed import TCPStore

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(512)
        port = listener.getsockname()[1]
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno(),
                         timeout=dt.timedelta(seconds=self.job_store.timeout_s))
        name = f"workers-{uuid.uuid4().hex[:16]}{ROUTE_SUFFIX}"
        self.job_store.gate.route(name, port)
        self._current = (name, store, listener)
        return name, port

    def close(self) -> None:
        current, self._current = self._current, None
        if current is None:
            return
        if isinstance(current, Tunnel):
            current.stop()
            return
        name, _, listener = current
        self.job_store.gate.unroute(name)
        current = None                  # the TCPStore server goes with its object, before its socket
        listener.close()
