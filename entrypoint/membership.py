"""The job store: how the nodes of one job find, number and watch each other.

The master's entrypoint serves a torch.distributed.TCPStore on MASTER_ADDR:MASTER_PORT for
the whole job; every node's entrypoint is a client. torchrun's c10d rendezvous uses the
same store (is_host=0), so it lives as long as the job rather than as long as one
torchrun. On top of it, under the prefix `disttrain/<RUN_ID>/`:

    node/<k>/claim   a node took rank k (NODE_RANK, or the next free one)
    node/<k>/info    its address, process count and ports (NodeInfo JSON)
    node/<k>/hb      heartbeat counter, bumped every second
    node/<k>/exit    its exit code, when its processes are done
    job/launch       the master's go: every node has joined, Horovod's server is up (its port)
    job/done         the master saw every node finish successfully; workers may leave
    job/abort        why the job is being stopped, and the exit code it means (1 for a failure,
                     143 when a node was stopped with SIGTERM); every node stops its processes

A node whose heartbeat stops for PEER_TIMEOUT seconds, a non-zero exit, or a master that
can no longer be reached ends the job on every node, so nothing waits for a dead peer.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import time
import uuid

from .config import Config
from .plan import NodeInfo


def _probe(host: str, port: int) -> str | None:
    """None if host:port accepts a TCP connection now, else why not."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return None
    except socket.gaierror:
        return f"{host!r} does not resolve (yet)"
    except OSError as exc:
        return exc.strerror or str(exc)


MASTER_LINGER_S = 0.5
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)     # exit codes of a node stopped on purpose


class RendezvousError(Exception):
    """Rendezvous failed; str() names MASTER_ADDR:MASTER_PORT and what was waited for."""


class JobStore:
    def __init__(self, config: Config, serve: bool):
        self.config = config
        self.serve = serve
        self.endpoint = f"{config.master_addr}:{config.master_port}"
        self.prefix = f"disttrain/{config.run_id}/"
        self.store = None
        self.node_rank: int | None = None
        self._seen: dict[int, tuple[int, float]] = {}     # node -> (last heartbeat, when it changed)
        self._gone: set[int] = set()                       # elastic: nodes that left
        self._started = time.monotonic()

    # ----------------------------------------------------------------- joining
    def connect(self, deadline: float) -> None:
        from torch.distributed import TCPStore

        c = self.config
        if self.serve:
            try:
                self.store = TCPStore("0.0.0.0", c.master_port, is_master=True, wait_for_workers=False,
                                      timeout=dt.timedelta(seconds=c.rdzv_timeout))
            except RuntimeError as exc:
                raise RendezvousError(f"cannot serve the job store on port {c.master_port} (MASTER_PORT): "
                                      f"{str(exc).splitlines()[0]}") from None
            return
        last, waited = "no attempt", False
        while time.monotonic() < deadline:
            # Probe quietly first (DNS, then TCP): TCPStore logs every failed attempt with a
            # C++ stack trace, and a worker routinely starts before its master.
            last = _probe(c.master_addr, c.master_port)
            if last is None:
                try:
                    self.store = TCPStore(c.master_addr, c.master_port, is_master=False, wait_for_workers=False,
                                          timeout=dt.timedelta(seconds=max(5.0, c.rdzv_timeout)))
                    if not self._no_place_for_us():
                        return
                    # A node restarted after a failure (compose `restart: on-failure`) finds the
                    # job it left still ending: it joins the master's next start instead.
                    if not waited:
                        print(f"entrypoint: the job at {self.endpoint} started without this node (all "
                              f"NUM_NODES={c.num_nodes} had joined); waiting for it to end, to join its "
                              f"next start", flush=True)
                    self.store, last, waited = None, "the job there had started without this node", True
                except (RuntimeError, ValueError) as exc:
                    last = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            time.sleep(1.0)
        raise RendezvousError(f"no master at MASTER_ADDR:MASTER_PORT={self.endpoint} after "
                              f"RDZV_TIMEOUT={c.rdzv_timeout}s (is the master running and the port "
                              f"reachable?); last error: {last}")

    def _no_place_for_us(self) -> bool:
        """The job this store serves has every node it needs, or is ending: no place for us."""
        if self._has("job/launch") or self._has("job/abort"):
            return True
        return not self.config.elastic and all(self._has(f"node/{k}/info") for k in range(self.config.num_nodes))

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _has(self, name: str) -> bool:
        return self.store.check([self._key(name)])

    def _get(self, name: str) -> str:
        return self.store.get(self._key(name)).decode()

    def claim_rank(self, wanted: int | None) -> int:
        """Rank 0 for the master, NODE_RANK if given, else the next free one."""
        c = self.config
        upper = c.max_nodes if c.elastic else c.num_nodes
        if wanted is not None:
            if not self._claim(wanted):
                raise RendezvousError(f"NODE_RANK={wanted} is already taken by another node at "
                                      f"{self.endpoint}; give each node its own NODE_RANK")
            self.node_rank = wanted
            return wanted
        while True:
            candidate = int(self.store.add(self._key("next"), 1))
            if not c.elastic and candidate >= upper:
                raise RendezvousError(f"more nodes joined {self.endpoint} than NUM_NODES={c.num_nodes}; "
                                      f"this one would be node {candidate}")
            if self._claim(candidate):
                self.node_rank = candidate
                return candidate

    def _claim(self, rank: int) -> bool:
        """compare_set writes our token only if the key is absent; it returns what is stored."""
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        return self.store.compare_set(self._key(f"node/{rank}/claim"), "", token).decode() == token

    def publish(self, info: NodeInfo) -> None:
        self.store.set(self._key(f"node/{info.node_rank}/info"), info.to_json())
        self.beat()

    def wait_for_nodes(self, count: int, deadline: float) -> list[NodeInfo]:
        names = [f"node/{k}/info" for k in range(count)]
        while True:
            missing = [k for k, name in enumerate(names) if not self._has(name)]
            if not missing:
                return [NodeInfo.from_json(self._get(name)) for name in names]
            if self._has("job/abort"):
                raise RendezvousError(f"job aborted during rendezvous: {self.abort_reason()[0]}")
            if time.monotonic() > deadline:
                raise RendezvousError(f"only {count - len(missing)} of {count} nodes joined "
                                      f"MASTER_ADDR:MASTER_PORT={self.endpoint} within "
                                      f"RDZV_TIMEOUT={self.config.rdzv_timeout}s; missing node(s) "
                                      f"{', '.join(map(str, missing))}")
            self.beat()
            time.sleep(0.2)

    def announce_launch(self, horovod_port: int | None = None, torch_port: int | None = None) -> None:
        """Every node is in; workers may start. Carries the master's Horovod port, so only
        the master needs HOROVOD_PORT, and the port of torch.distributed's env:// store."""
        self.store.set(self._key("job/launch"), json.dumps({"horovod_port": horovod_port,
                                                              "torch_port": torch_port}))

    def wait_for_launch(self, deadline: float) -> dict:
        while not self._has("job/launch"):
            if self._has("job/abort"):
                raise RendezvousError(f"job aborted during rendezvous: {self.abort_reason()[0]}")
            if time.monotonic() > deadline:
                raise RendezvousError(f"the master at {self.endpoint} did not start the job within "
                                      f"RDZV_TIMEOUT={self.config.rdzv_timeout}s")
            self.beat()
            time.sleep(0.2)
        return json.loads(self._get("job/launch"))

    # ----------------------------------------------------------------- watching
    def beat(self) -> None:
        self.store.add(self._key(f"node/{self.node_rank}/hb"), 1)

    def abort(self, reason: str, code: int = 1) -> None:
        if self.store is None:
            return        # never reached the store: there is nobody to tell
        try:
            if not self._has("job/abort"):
                self.store.set(self._key("job/abort"), json.dumps({"reason": reason, "code": code}))
        except RuntimeError:
            pass      # the store is gone: the others find out by themselves

    def abort_reason(self) -> tuple[str, int]:
        data = json.loads(self._get("job/abort"))
        return data["reason"], int(data["code"])

    def exit_code(self, rank: int) -> int | None:
        name = f"node/{rank}/exit"
        return int(self._get(name)) if self._has(name) else None

    def registered_workers(self) -> list[int]:
        upper = self.config.max_nodes if self.config.elastic else self.config.num_nodes
        return [k for k in range(1, upper) if self._has(f"node/{k}/claim")]

    def poll(self) -> tuple[str, int] | str | None:
        """Called about once a second while the processes run: None, or why to stop
        (with the exit code it means, when that is not 1)."""
        try:
            self.beat()
            if self._has("job/abort"):
                return self.abort_reason()
            if self.serve:
                return self._check_workers()
            code = self.exit_code(0)
            if code is not None and code != 0:
                stopped = code in STOPPED
                return f"the master's processes {'were stopped' if stopped else 'failed'} (exit {code})", \
                    code if stopped else 1
            return None
        except RuntimeError as exc:
            if self.serve:
                return f"the job store failed: {exc}"
            return (f"lost the master at {self.endpoint} ({str(exc).splitlines()[0] if str(exc) else 'closed'}); "
                    f"it stopped or its host is unreachable")

    def master_finished(self) -> int | None:
        """For nodes without a process of their own to wait for (TF servers, MPI hosts)."""
        try:
            return self.exit_code(0)
        except RuntimeError:
            return 1

    def _check_workers(self) -> str | None:
        """Why the master must stop, from the workers' side: too few joined, one failed,
        or one went silent. None while all is well."""
        c = self.config
        if not c.elastic and time.monotonic() - self._started > c.rdzv_timeout:
            joined = len(self.registered_workers()) + 1
            if joined < c.num_nodes:
                return (f"only {joined} of {c.num_nodes} nodes joined MASTER_ADDR:MASTER_PORT={self.endpoint} "
                        f"within RDZV_TIMEOUT={c.rdzv_timeout}s")
        for k in self.registered_workers():
            if k in self._gone:
                continue
            code = self.exit_code(k)
            if code is not None:
                if code != 0:
                    return f"node {k} failed (exit {code})"
                continue
            if self._silent(k):
                if self.config.elastic:        # torchrun re-forms the group without it
                    self._gone.add(k)
                    continue
                return f"node {k} stopped answering (no heartbeat for {self.config.peer_timeout}s)"
        return None

    def _silent(self, node: int) -> bool:
        """True once `node`'s heartbeat counter has not moved for PEER_TIMEOUT seconds."""
        now = time.monotonic()
        beats = int(self.store.add(self._key(f"node/{node}/hb"), 0))
        last, since = self._seen.get(node, (-1, now))
        if beats != last:
            self._seen[node] = (beats, now)
            return False
        return now - since > self.config.peer_timeout

    # ----------------------------------------------------------------- finishing
    def finish(self, code: int, stop_requested=lambda: False) -> int:
        """Record this node's exit. The master then waits for the workers' results, and a
        successful worker for the master's; both as long as the others' heartbeats move."""
        try:
            if code not in (0, *STOPPED) and self._has("job/abort"):
                reason, abort_code = self.abort_reason()
                if abort_code in STOPPED:
                    # This node's processes failed because another node was being stopped.
                    print(f"entrypoint: {reason}", flush=True)
                    code = abort_code
            if code in STOPPED:
                self.abort(f"node {self.node_rank} was stopped ({signal.Signals(code - 128).name})", code)
            elif code != 0:
                self.abort(f"node {self.node_rank} failed (exit {code})")
            self.store.set(self._key(f"node/{self.node_rank}/exit"), str(code))
            if code != 0:
                return code
            if not self.serve:
                return self._wait_for_master(stop_requested)
            while True:
                reason = self._check_workers()          # a failed or silent worker ends the wait
                if reason:
                    print(f"entrypoint: {reason}", flush=True)
                    return 1
                if all(k in self._gone or self.exit_code(k) is not None for k in self.registered_workers()):
                    # Every node is done: the workers may leave. Leaving a moment after them
                    # lets `compose up --abort-on-container-exit` see the workers end first
                    # rather than stopping them while they exit.
                    self.store.set(self._key("job/done"), "0")
                    time.sleep(MASTER_LINGER_S)
                    return 0
                if stop_requested():
                    return 143
                self.beat()
                time.sleep(0.2)
        except RuntimeError:
            return code       # the store is gone; this node's own result still stands

    def _wait_for_master(self, stop_requested) -> int:
        """A worker whose processes succeeded stays until the master has seen every node
        finish (job/done), so that `compose up --abort-on-container-exit`, which stops the
        rest when one container exits, never stops a node that is still finishing. It
        waits as long as the master's heartbeat moves."""
        while True:
            if self._has("job/done"):            # raises once the master closed the store
                return 0
            if self._has("job/abort"):
                reason, abort_code = self.abort_reason()
                print(f"entrypoint: {reason}", flush=True)
                return abort_code
            if stop_requested():
                return 143
            if self._silent(0):
                print(f"entrypoint: the master stopped answering (no heartbeat for "
                      f"{self.config.peer_timeout}s)", flush=True)
                return 1
            self.beat()
            time.sleep(0.2)
