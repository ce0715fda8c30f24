"""A lost node counts as dead when its connection closes, not only once its heartbeat ages out.

torch's rendezvous knows a node is gone when its keep-alive is `ELASTIC_DEAD_AFTER` old:
a survivor whose collectives failed at once (connection reset) still waited that long for
the next round. Here each node's agent has a link port (job/links.py), published in the
rendezvous store; after each round it links to every other node of the round. When a
node's processes all end, the others read the end of its link at once: each writes that
node's keep-alive as long past into torch's rendezvous state (a compare-and-set through
the backend, as torch's own writes are), and every node's next read drops it, as torch
would have `ELASTIC_DEAD_AFTER` later. What a link is, and what it is not (a host that
stops closes nothing; a stranger learns nothing), is links.py's.
"""

from __future__ import annotations

import datetime as dt
import pickle
import socket
import threading
import time

from ...job.links import LinkPort, end, open_link, until_closed

LOOK_S = 5.0                            # how long to look for a peer's published port
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
        self._port = LinkPort(self.node.addr, identity)          # where the others reach this node
        handler._store.set(_key(handler._settings.run_id, self.node), f"{self.node.addr}:{self._port.port}")

    def follow(self, participants) -> None:
        """After a round: a link to each other node of it, none to a node no longer in it."""
        with self._lock:
            for node in set(self._links) - set(participants):
                end(self._links.pop(node))
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
                end(conn)
                return
            self._links[node] = conn
        until_closed(conn)
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
        """A link to `node`'s port, or None (not published in time, or not reachable)."""
        store, key = self.handler._store, _key(self.handler._settings.run_id, node)
        try:
            for _ in range(int(LOOK_S / 0.1)):      # check, not wait: a waiting get holds a TCPStore
                if store.check([key]):              # client, which this node's heartbeats use too
                    break
                time.sleep(0.1)
            else:
                return None                         # a node that links to no one
            host, port = store.get(key).decode().rsplit(":", 1)
        except Exception:                               # noqa: BLE001 - no link; the keep-alive still ages out
            return None
        return open_link(host, int(port), self.identity)

    def close(self) -> None:
        with self._lock:
            links, self._links = [c for c in self._links.values() if c is not None], {}
        for conn in links:
            end(conn)
        self._port.close()
