"""The job store: the keys through which the nodes of one job find, number and watch each other.

The master's entrypoint serves a torch.distributed.TCPStore on MASTER_ADDR:MASTER_PORT for
the whole job; every node's entrypoint is a client. torchrun's c10d rendezvous uses the
same store (is_host=0), so it lives as long as the job rather than as long as one
torchrun. Under the prefix `disttrain/<RUN_ID>/`:

    next             counter: the last node rank handed out without NODE_RANK
    node/<k>/claim   a node took rank k (NODE_RANK, or the next free one)
    node/<k>/info    its address, process count and ports (NodeInfo JSON)
    node/<k>/hb      heartbeat counter, bumped every second
    node/<k>/exit    its Outcome (JSON), when its processes are done
    node/<k>/left    worker k saw job/done and exits now (the master exits after it)
    job/launch       the master's go: every node has joined, Horovod's server is up (its port,
                     and the port of torch.distributed's env:// store for Horovod's workers)
    job/done         the master saw every node finish; workers may leave
    job/abort        the Outcome that ends the job on every node (ABORTED, with its cause)
    lost             counter: nodes the master found silent in an elastic job
    lost/<n>         {"node": k, "since": T}: node k, silent since wall-clock time T
    rounds           counter: training rounds reported by the processes (elastic)
    round/<n>        {"world": W, "step": S}: round n's world size and the step it resumed
                     from, written by global rank 0 through disttrain.elastic
    node/<k>/progress  its ranks' progress (a list of progress.RankProgress records), with each heartbeat
    job/hang         the master found a hang: {"id": ..., "ranks": [...]}: every node dumps its stacks
    hang/<id>/<k>    node k's answer: per rank, where its main thread is (vigil.py)
    hang/<id>/verdict  elastic: {"line": ..., "leave": [k, ...]}: the stalled nodes leave

This module only reads and writes those keys; joining (join.py) and watching (watch.py)
decide what they mean. Every method raises StoreGone once the store cannot be reached.

With JOB_SECRET (an `Identity`), the master serves the store on loopback behind a TLS Gate
on MASTER_PORT, and every other node reaches it through its own Tunnel (tunnel.py);
`local_endpoint` is where this node's clients (torch's agent, the training processes) find
it then.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import queue
import socket
import threading
import time
import uuid
from typing import Callable, TypeVar

from ..job.placement import NodeInfo, job_prefix
from ..running.outcome import Outcome
from ..security.tunnel import Answer, Gate, Tunnel, handshake


# A worker usually starts before its master's store serves: a probe is cheap (DNS, then a
# TCP connect), so it is retried often; once a second cost each job up to a second.
CONNECT_RETRY_S = 0.2
CLOSE_ROUND_TRIP_S = 2.0      # finish.LEAVE_WAIT_S: the longest a master waits for a worker's last write


T = TypeVar("T")


class StoreGone(Exception):
    """The job store cannot be reached (its host stopped, or the network failed)."""


class RendezvousError(Exception):
    """Joining failed; str() names MASTER_ADDR:MASTER_PORT and what was waited for.
    `ends_job`: the job cannot go on without this node (False for a node it never needed)."""

    def __init__(self, text: str, ends_job: bool = True):
        super().__init__(text)
        self.ends_job = ends_job


def probe(host: str, port: int) -> str | None:
    """None if host:port accepts a TCP connection now, else why not."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return None
    except socket.gaierror:
        return f"{host!r} does not resolve (yet)"
    except OSError as exc:
        return exc.strerror or str(exc)


def _import_torch() -> None:
    """torch.distributed, imported with the cyclic collector paused, then frozen out of its
    way. The import makes ~170k objects that live as long as the process and no garbage
    worth collecting, yet the collector would walk them all, two or three times during the
    import and in every full collection after it (up to 0.1 s of CPU each)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        import torch.distributed  # noqa: F401
    finally:
        if was_enabled:
            gc.enable()
    gc.freeze()


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


class JobStore:
    def __init__(self, host: str, port: int, run_id: str, serve: bool, timeout_s: float, op_timeout_s: float,
                 identity=None, say=print):
        """timeout_s: how long to look for the master (RDZV_TIMEOUT); op_timeout_s: how long
        one operation may wait for its reply before the store counts as gone (PEER_TIMEOUT).
        TCPStore's own timeout does not bound a client's reads (torch 2.13: against a frozen
        server, add/check/get/set block for good), so operations run on a thread of their
        own and each is waited for at most op_timeout_s. `identity` (secret.Identity): the
        job's secret, for TLS; `say`: where the Gate reports refused peers."""
        self.host, self.port, self.serve = host, port, serve
        self.identity, self.say = identity, say
        self.gate: Gate | None = None
        self.tunnel: Tunnel | None = None
        self._backend_port: int | None = None
        self._listener: socket.socket | None = None
        self.endpoint = f"{host}:{port}"
        self.prefix = job_prefix(run_id)
        self.timeout_s, self.op_timeout_s = timeout_s, op_timeout_s
        self.store = None
        self._gone: str | None = None          # why the store counts as gone, once it does
        self._ops: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve_ops, daemon=True, name="jobstore").start()

    # ----------------------------------------------------------------- connecting
    @property
    def local_endpoint(self) -> str:
        """host:port where this node's own clients reach the store."""
        if self.identity is None:
            return self.endpoint
        if self.serve:
            return f"127.0.0.1:{self._backend_port}"
        return self.tunnel.endpoint

    def connect(self, deadline: float, cancelled=lambda: False) -> None:
        # torch first: importing it takes seconds, which a worker spends while its master
        # starts, not after the master is up (an elastic round may start without it).
        _import_torch()
        if self.serve:
            self._serve()
            return
        if self.identity is not None and self.tunnel is None:
            self.tunnel = Tunnel(self.host, self.port, self.identity.client_context()).start()
        last = "no attempt"
        while time.monotonic() < deadline and not cancelled():
            # Probe quietly first (DNS, then TCP; with a secret, the TLS handshake): TCPStore
            # logs every failed attempt with a C++ stack trace, and a worker routinely starts
            # before its master.
            last = self._probe()
            if last is None:
                host, port = self.local_endpoint.rsplit(":", 1)
                try:
                    self.store = self._client(host, int(port))
                    return
                except (RuntimeError, ValueError) as exc:
                    last = _first_line(exc)
                    if self.identity is None and self._master_insists_on_tls():
                        raise RendezvousError(f"the master at MASTER_ADDR:MASTER_PORT={self.endpoint} takes only "
                                              f"nodes that hold its JOB_SECRET, and this node has none; set the "
                                              f"same JOB_SECRET (or JOB_SECRET_FILE) on every node") from None
            time.sleep(CONNECT_RETRY_S)
        if cancelled():
            return
        raise RendezvousError(f"no master at MASTER_ADDR:MASTER_PORT={self.endpoint} after RDZV_TIMEOUT={self.timeout_s:g}s "
                              f"(is the master running and the port reachable?); last error: {last}")

    def _master_insists_on_tls(self) -> bool:
        """(No secret here, and the store's client failed after the probe) whether the master
        takes TLS only: it has a JOB_SECRET this node lacks."""
        return handshake(self.host, self.port, None, timeout=2.0).answer is Answer.TLS

    def _client(self, host: str, port: int):
        from torch.distributed import TCPStore

        return TCPStore(host, port, is_master=False, wait_for_workers=False,
                        timeout=dt.timedelta(seconds=max(5.0, self.op_timeout_s)))

    def _probe(self) -> str | None:
        """None when the master's store can be talked to now, else why not (still to be retried)."""
        if self.identity is None:
            return probe(self.host, self.port)
        found = handshake(self.host, self.port, self.identity.client_context())
        if found.answer is Answer.WRONG_SECRET:
            raise RendezvousError(f"the master at MASTER_ADDR:MASTER_PORT={self.endpoint} holds a different "
                                  f"JOB_SECRET (its TLS certificate is not this job's); give every node the same "
                                  f"secret")
        if found.answer is Answer.NO_TLS:
            raise RendezvousError(f"the master at MASTER_ADDR:MASTER_PORT={self.endpoint} takes no TLS: it runs "
                                  f"without JOB_SECRET ({found.detail}); set the same JOB_SECRET on every node, "
                                  f"or on none")
        return None if found.answer is Answer.IN else found.detail

    def _serve(self) -> None:
        from torch.distributed import TCPStore

        options = dict(is_master=True, wait_for_workers=False, timeout=dt.timedelta(seconds=self.timeout_s))
        try:
            if self.identity is None:
                self.store = TCPStore("0.0.0.0", self.port, **options)
                return
            # The store listens on loopback only (a socket bound here, handed to TCPStore);
            # MASTER_PORT is the Gate's.
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(512)
            self._backend_port = listener.getsockname()[1]
            self.store = TCPStore("127.0.0.1", self._backend_port, master_listen_fd=listener.fileno(), **options)
            self._listener = listener                  # TCPStore uses the fd: keep the socket open
            self.gate = Gate(self.port, self._backend_port, self.identity.server_context(), self.say).start()
        except (RuntimeError, OSError) as exc:
            raise RendezvousError(f"cannot serve the job store on port {self.port} (MASTER_PORT): "
                                  f"{_first_line(exc) if isinstance(exc, RuntimeError) else exc}") from None

    def close(self) -> None:
        """Stop serving (the Gate) and tunnelling; the store itself goes with the process.
        A node's last writes reach the master first: TCPStore's set sends without waiting
        for a reply, so through a Tunnel its bytes could still be in this process's relay
        when the process ends (the master would wait for a `left` that never comes, or miss
        an abort's reason). A round trip after them means the store has read them; it waits
        no longer than the master waits for a `left` (LEAVE_WAIT_S), so a frozen master
        does not hold up this node's exit."""
        if self.tunnel is not None and self.connected and self._gone is None:
            try:        # answered after every write before it
                self._call(self.store.check, [self.prefix + "job/done"], timeout_s=CLOSE_ROUND_TRIP_S)
            except StoreGone:
                pass
        for server in (self.gate, self.tunnel):
            if server is not None:
                server.stop()

    def disconnect(self) -> None:
        """Drop the client connection (a later connect() makes a new one, to whichever
        store then serves the endpoint)."""
        self.store, self._gone = None, None

    @property
    def connected(self) -> bool:
        return self.store is not None

    # ----------------------------------------------------------------- raw keys
    def _serve_ops(self) -> None:
        while True:
            op, args, reply = self._ops.get()
            try:
                reply.put((True, op(*args)))
            except (RuntimeError, ValueError, OSError) as exc:   # DistStoreError, DistNetworkError
                reply.put((False, _first_line(exc)))

    def _call(self, op, *args, timeout_s: float | None = None):
        """op(*args) on the store's thread; StoreGone without a reply within timeout_s
        (default: op_timeout_s)."""
        if self._gone:
            raise StoreGone(self._gone)
        reply: queue.Queue = queue.Queue(1)
        self._ops.put((op, args, reply))
        try:
            ok, value = reply.get(timeout=timeout_s or self.op_timeout_s)
        except queue.Empty:
            self._gone = (f"no reply within {timeout_s:g}s" if timeout_s else
                          f"no reply within PEER_TIMEOUT={self.op_timeout_s:g}s")
            raise StoreGone(self._gone) from None
        if not ok:
            raise StoreGone(value)
        return value

    def has(self, name: str) -> bool:
        return self._call(self.store.check, [self.prefix + name])

    def get(self, name: str) -> str:
        """A key that is set. TCPStore.get waits for a missing one, and every caller of this
        JobStore waits behind it (one thread serves them all): a key another thread of this
        process is about to write would never come. Read keys that may be missing with find()."""
        return self._call(self.store.get, self.prefix + name).decode()

    def find(self, name: str) -> str | None:
        """The key's value, or None while it is not set (keys are never deleted)."""
        return self.get(name) if self.has(name) else None

    def find_as(self, name: str, parse: Callable[[str], T]) -> T | None:
        """The key's value parsed, or None while it is not set."""
        found = self.find(name)
        return parse(found) if found is not None else None

    def get_json(self, name: str):
        return self.find_as(name, json.loads)

    def set(self, name: str, value: str) -> None:
        self._call(self.store.set, self.prefix + name, value)

    def add(self, name: str, amount: int) -> int:
        return int(self._call(self.store.add, self.prefix + name, amount))

    def compare_set(self, name: str, expected: str, desired: str) -> str:
        return self._call(self.store.compare_set, self.prefix + name, expected, desired).decode()

    # ----------------------------------------------------------------- nodes
    def claim(self, rank: int) -> bool:
        """compare_set writes our token only if the key is absent; it returns what is stored."""
        token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        return self.compare_set(f"node/{rank}/claim", "", token) == token

    def next_rank(self) -> int:
        return self.add("next", 1)

    def claimed(self, rank: int) -> bool:
        return self.has(f"node/{rank}/claim")

    def highest_rank(self, bound: int) -> int:
        """The highest rank that may have been claimed: `bound` - 1, or above it when
        elastic nodes took fresh ranks beyond it."""
        return max(bound - 1, self.add("next", 0))

    def claimed_workers(self, bound: int) -> list[int]:
        """The worker ranks (1 and up) claimed so far; `bound`: the job's most nodes."""
        return [k for k in range(1, self.highest_rank(bound) + 1) if self.claimed(k)]

    def publish(self, info: NodeInfo) -> None:
        self.set(f"node/{info.node_rank}/info", info.to_json())

    def node_info(self, rank: int) -> NodeInfo | None:
        return self.find_as(f"node/{rank}/info", NodeInfo.from_json)

    def beat(self, rank: int) -> None:
        self.add(f"node/{rank}/hb", 1)

    def heartbeat(self, rank: int) -> int:
        return self.add(f"node/{rank}/hb", 0)

    def set_exit(self, rank: int, outcome: Outcome) -> None:
        self.set(f"node/{rank}/exit", outcome.to_json())

    def exit(self, rank: int) -> Outcome | None:
        return self.find_as(f"node/{rank}/exit", Outcome.from_json)

    # ----------------------------------------------------------------- the job
    def announce_launch(self, horovod_port: int | None, torch_port: int | None = None,
                        launch_env: tuple[dict[str, str], ...] = ()) -> None:
        """Carries the master's Horovod port (only the master needs HOROVOD_PORT), the
        port of torch.distributed's env:// store for processes under Horovod, and the
        launcher's per-rank variables (Launcher.launch_env)."""
        self.set("job/launch", json.dumps({"horovod_port": horovod_port, "torch_port": torch_port,
                                           "launch_env": list(launch_env)}))

    def launch(self) -> dict | None:
        return self.get_json("job/launch")

    def abort(self, outcome: Outcome) -> None:
        """Record why the job ends (the first reason wins). Quiet when the store is gone:
        the others then find out by themselves."""
        if self.store is None:
            return
        try:
            self.compare_set("job/abort", "", outcome.aborting().to_json())
        except StoreGone:
            pass

    def aborted(self) -> Outcome | None:
        return self.find_as("job/abort", Outcome.from_json)

    def mark_done(self) -> None:
        self.set("job/done", "1")

    def done(self) -> bool:
        return self.has("job/done")

    def leave(self, rank: int) -> None:
        """A worker saw job/done and exits now (the master waits for this before it does)."""
        self.set(f"node/{rank}/left", "1")

    def has_left(self, rank: int) -> bool:
        return self.has(f"node/{rank}/left")

    # ----------------------------------------------------------------- lost nodes (elastic)
    def report_lost(self, node: int, since: float) -> None:
        n = self.add("lost", 1)
        self.set(f"lost/{n}", json.dumps({"node": node, "since": since}))

    def losses(self) -> int:
        return self.add("lost", 0)

    def loss(self, n: int) -> dict | None:
        return self.get_json(f"lost/{n}")

    # ----------------------------------------------------------------- training rounds (elastic)
    def rounds(self) -> int:
        return self.add("rounds", 0)

    def round(self, n: int) -> dict | None:
        return self.get_json(f"round/{n}")

    # ----------------------------------------------------------------- progress and hangs (vigil.py)
    def publish_progress(self, node: int, ranks: list[dict]) -> None:
        self.set(f"node/{node}/progress", json.dumps(ranks))

    def progress(self, node: int) -> list[dict]:
        return self.get_json(f"node/{node}/progress") or []

    def announce_hang(self, incident: dict) -> None:
        self.set("job/hang", json.dumps(incident))

    def hang(self) -> dict | None:
        return self.get_json("job/hang")

    def report_stacks(self, incident: str, node: int, report: dict) -> None:
        self.set(f"hang/{incident}/{node}", json.dumps(report))

    def stacks(self, incident: str, node: int) -> dict | None:
        return self.get_json(f"hang/{incident}/{node}")

    def announce_verdict(self, incident: str, verdict: dict) -> None:
        self.set(f"hang/{incident}/verdict", json.dumps(verdict))

    def verdict(self, incident: str) -> dict | None:
        return self.get_json(f"hang/{incident}/verdict")
