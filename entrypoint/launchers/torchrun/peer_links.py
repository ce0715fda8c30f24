"""A lost node counts as dead when its connection closes, not only once its heartbeat ages out.

torch's rendezvous knows a node is gone when its keep-alive is `ELASTIC_DEAD_AFTER` old:
a survivor whose collectives failed at once (connection reset) still waited that long for
the next round. Here each node's agent listens on a port of its own, published in the
rendezvous store; after each round it connects to every other node of the round and
holds the connection. When a node's processes all end (SIGKILL, the OOM killer,
`docker kill`, a deleted pod), its kernel closes their sockets and the others read the end
of the stream at once: each writes that node's keep-alive as long past into torch's
rendezvous state (a compare-and-set through the backend, as torch's own writes are), and
every node's next read drops it, as torch would have `ELASTIC_DEAD_AFTER` later. A host
that stops or a network that parts closes nothing: then the keep-alive ages out, as
before. A connection that cannot be made (a firewall between nodes) is no link: the same.

The port is on the node's own address (the one the others reach it at). Nothing is sent
on a link and nothing read from one but its end: whoever reaches the port learns nothing
and can do nothing but hold a connection (at most MAX_ACCEPTED); behind JOB_SECRET, not
even that once the TLS handshake fails (the job's certificate, both ways, as at the
master's Gate). Only the node that made a connection reads its end, so a stranger cannot
get a node dropped without cutting a connection between two nodes.
"""

from __future__ import annotations

import datetime as dt
import pickle
import socket
import threading
import time

MAX_ACCEPTED = 1024                     # connections held for the others; a stranger's beyond are closed
LOOK_S, CONNECT_S = 5.0, 3.0            # how long to look for a peer's port, and to connect to it
LONG_PAST = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def _key(run_id: str, node) -> str:
    return f"disttrain/{run_id}/link/{node}"


def mark_dead(backend, node) -> bool:
    """Write `node`'s keep-alive as long past into the rendezvous state behind torch's
    RendezvousBackend `backend`; True once written, False if the state no longer holds it."""
    for _ in range(20):
        got = backend.get_state()
        if got is None:
            return False
        bits, token = got
        state = pickle.loads(bits)
        if node not in state.last_heartbeats or state.last_heartbeats[node] == LONG_PAST:
            return False
        state.last_heartbeats[node] = LONG_PAST
        answer = backend.set_state(pickle.dumps(state), token)
        if answer is not None and answer[2]:
            return True
    return False


def _end(conn: socket.socket | None) -> None:
    """Close a connection (or the listener), waking a thread blocked on it."""
    if conn is None:
        return
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    conn.close()


class PeerLinks:
    """This node's links to the other nodes of its round, on torch's DynamicRendezvousHandler
    `handler` (its store, backend, node and state). With the job's TLS `identity`
    (JOB_SECRET), a link is TLS with the job's certificate both ways: a connection without it
    is closed once its handshake fails."""

    def __init__(self, handler, identity=None, on_dead=None):
        self.handler, self.identity, self.on_dead = handler, identity, on_dead
        self.node, self.backend = handler._this_node, handler._state_holder._backend
        self._lock = threading.Lock()
        self._links: dict[object, socket.socket | None] = {}
        self._accepted: list[socket.socket] = []
        try:                                            # where the others reach this node, only
            self._listener = socket.create_server((self.node.addr, 0))
        except OSError:                                 # a name this host cannot bind
            self._listener = socket.create_server(("", 0))
        port = self._listener.getsockname()[1]
        handler._store.set(_key(handler._settings.run_id, self.node), f"{self.node.addr}:{port}")
        threading.Thread(target=self._accept, name="peer-links-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                full = len(self._accepted) >= MAX_ACCEPTED
                if not full:
                    self._accepted.append(conn)
            if full:
                _end(conn)
            else:
                threading.Thread(target=self._hold, args=(conn,), name="peer-link-held", daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        """Hold a link another node made to this one until it ends (after TLS with the job's
        certificate, behind JOB_SECRET), then let it go."""
        held = conn
        try:
            if self.identity is not None:
                conn.settimeout(CONNECT_S)
                held = self.identity.server_context().wrap_socket(conn, server_side=True)
                held.settimeout(None)
                with self._lock:
                    if conn in self._accepted:
                        self._accepted[self._accepted.index(conn)] = held
            while held.recv(64):
                pass
        except (OSError, ValueError):
            pass
        with self._lock:
            self._accepted = [c for c in self._accepted if c is not conn and c is not held]
        _end(held)

    def follow(self, participants) -> None:
        """After a round: a link to each other node of it, none to a node no longer in it."""
        with self._lock:
            for node in set(self._links) - set(participants):
                _end(self._links.pop(node))
            new = [n for n in participants if n != self.node and n not in self._links]
            for node in new:
                self._links[node] = None
        for node in new:
            threading.Thread(target=self._watch, args=(node,), name="peer-link", daemon=True).start()

    def _watch(self, node) -> None:
        conn = self._connect(node)
        if conn is None:
            return
        with self._lock:
            if node not in self._links:         # left the round meanwhile
                conn.close()
                return
            self._links[node] = conn
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        with self._lock:
            ours = self._links.get(node) is conn
            if ours:
                del self._links[node]
        try:
            dropped = ours and mark_dead(self.backend, node)
        except Exception:                               # noqa: BLE001 - the store is lost: the agent says so
            return
        if dropped and self.on_dead is not None:
            self.on_dead(node)

    def _connect(self, node) -> socket.socket | None:
        """A connection to `node`'s port, or None (not published in time, or not reachable)."""
        store, key = self.handler._store, _key(self.handler._settings.run_id, node)
        try:
            for _ in range(int(LOOK_S / 0.1)):      # check, not wait: a waiting get holds a TCPStore
                if store.check([key]):              # client, which this node's heartbeats use too
                    break
                time.sleep(0.1)
            else:
                return None                         # a node that links to no one
            host, port = store.get(key).decode().rsplit(":", 1)
            conn = socket.create_connection((host, int(port)), timeout=CONNECT_S)
            if self.identity is not None:
                conn = self.identity.client_context().wrap_socket(conn)
        except Exception:                               # noqa: BLE001 - no link; the keep-alive still ages out
            return None
        conn.settimeout(None)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return conn

    def close(self) -> None:
        with self._lock:
            links, self._links = [c for c in self._links.values() if c is not None], {}
            accepted, self._accepted = self._accepted, []
        for conn in links + accepted + [self._listener]:
            _end(conn)
