"""Links: a held connection whose end says at once that a node's processes are gone.

A heartbeat can only say a node is gone once it is old (PEER_TIMEOUT). But when every
process of a node ends (SIGKILL, the OOM killer, `docker kill`, a deleted pod), its kernel
closes their sockets, and whoever holds a connection to it reads the end of the stream
at once. So a node listens on a port of its own address (LinkPort), and the nodes that
must know when it dies connect to it and hold the connection (open_link, until_closed).
A host that stops or a network that parts closes nothing: then the heartbeat still ages
out, as before. A connection that cannot be made (a firewall) is no link: the same.

Nothing is sent on a link and nothing read from one but its end: whoever reaches the port
learns nothing and can do nothing but hold a connection (at most MAX_ACCEPTED); behind
JOB_SECRET, not even that once the TLS handshake fails (the job's certificate, both ways,
as at the master's Gate). Only the node that made a connection reads its end, so a
stranger cannot get a node counted as lost without cutting a connection between two nodes.

Who uses them: elastic torchrun's agents, to each other (launchers/torchrun/peer_links.py),
and the master of an elastic Horovod job, to each worker (WorkerLinks, from JobWatch).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

MAX_ACCEPTED = 1024         # connections held for the others; a stranger's beyond are closed
CONNECT_S = 3.0             # to connect to a node's port (and finish TLS)


def end(conn: socket.socket | None) -> None:
    """Close a connection (or a listener), waking a thread blocked on it."""
    if conn is None:
        return
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


def until_closed(conn: socket.socket) -> None:
    """Block until the other end closes `conn` (or it fails, or is ended here)."""
    try:
        while conn.recv(64):
            pass
    except (OSError, ValueError):
        pass


def open_link(host: str, port: int, identity=None) -> socket.socket | None:
    """A held connection to a node's LinkPort (TLS with the job's `identity`), or None."""
    try:
        conn = socket.create_connection((host, port), timeout=CONNECT_S)
        if identity is not None:
            conn = identity.client_context().wrap_socket(conn)
    except OSError:                                 # ssl.SSLError included
        return None
    conn.settimeout(None)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return conn


class LinkPort:
    """This node's link port on `addr` (where the others reach it; every address when this
    host cannot bind that name): holds each connection made to it until it ends. With the
    job's TLS `identity` (JOB_SECRET), a connection without the job's certificate is closed
    once its handshake fails. OSError: no port to listen on."""

    def __init__(self, addr: str, identity=None):
        self.identity = identity
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        try:
            self._listener = socket.create_server((addr, 0))
        except OSError:                                 # a name this host cannot bind
            self._listener = socket.create_server(("", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="link-port", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                full = len(self._held) >= MAX_ACCEPTED
                if not full:
                    self._held.append(conn)
            if full:
                end(conn)
            else:
                threading.Thread(target=self._hold, args=(conn,), name="link-held", daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        held = conn
        if self.identity is not None:
            try:
                conn.settimeout(CONNECT_S)
                held = self.identity.server_context().wrap_socket(conn, server_side=True)
                held.settimeout(None)
            except (OSError, ValueError):
                held = None
            with self._lock:
                if conn in self._held and held is not None:
                    self._held[self._held.index(conn)] = held
        if held is not None:
            until_closed(held)
        with self._lock:
            self._held = [c for c in self._held if c is not conn and c is not held]
        end(held or conn)

    def close(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for conn in held + [self._listener]:
            end(conn)


class WorkerLinks:
    """The master's links to its workers' LinkPorts, by node rank: `cut(k)` once node k's
    closed (then `on_cut(k)` is called, from the link's thread)."""

    def __init__(self, identity=None, on_cut: Callable[[int], None] | None = None):
        self.identity, self.on_cut = identity, on_cut
        self._lock = threading.Lock()
        self._links: dict[int, socket.socket | None] = {}
        self._cut: dict[int, float] = {}

    def following(self, rank: int) -> bool:
        with self._lock:
            return rank in self._links or rank in self._cut

    def follow(self, rank: int, host: str, port: int) -> None:
        """Hold a link to node `rank` (once; a node that cannot be reached has none)."""
        with self._lock:
            if rank in self._links or rank in self._cut:
                return
            self._links[rank] = None
        threading.Thread(target=self._watch, args=(rank, host, port), name=f"link-node{rank}",
                         daemon=True).start()

    def _watch(self, rank: int, host: str, port: int) -> None:
        conn = open_link(host, port, self.identity)
        with self._lock:
            if conn is None or rank not in self._links:         # no link, or closed meanwhile
                end(conn)
                return
            self._links[rank] = conn
        until_closed(conn)
        with self._lock:
            ours = self._links.pop(rank, None) is conn
            if ours:
                self._cut[rank] = time.time()
        if ours and self.on_cut is not None:
            try:
                self.on_cut(rank)
            except Exception:                       # noqa: BLE001 - the store is lost: the watch says so
                pass

    def held(self, rank: int) -> bool:
        """Whether a link to node `rank` is open now."""
        with self._lock:
            return self._links.get(rank) is not None

    def cut(self, rank: int) -> bool:
        with self._lock:
            return rank in self._cut

    def let_go(self, rank: int) -> None:
        """Node `rank` ends on purpose (it finished or left): its link's end means nothing."""
        with self._lock:
            conn = self._links.pop(rank, None)
        end(conn)

