"""The job store's one backend: torch's TCPStore, served by the master for the whole job.

The master's entrypoint serves a torch.distributed.TCPStore on MASTER_ADDR:MASTER_PORT;
every node's entrypoint is a client. torchrun's c10d rendezvous uses the same store
(is_host=0), so it lives as long as the job rather than as long as one torchrun. Keys are
under `disttrain/<RUN_ID>/` (transport.job_prefix); what they mean is the families'
(store/__init__.py names them).

TCPStore's own timeout does not bound a client's reads (torch 2.13: against a frozen
server, add/check/get/set block for good), so operations run on a thread of their own
and each is waited for at most PEER_TIMEOUT before the store counts as gone (StoreGone).

With JOB_SECRET (an `Identity`), the master serves the store on loopback behind a TLS Gate
on MASTER_PORT, and every other node reaches it through its own Tunnel (security/tunnel.py);
`local_endpoint` is where this node's clients (torch's agent, the training processes) find
it then.
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import queue
import socket
import threading
import time

from ..security.tunnel import Answer, Gate, Tunnel, handshake
from .transport import JobStore, RendezvousError, StoreGone, job_prefix


# A worker usually starts before its master's store serves: a probe is cheap (DNS, then a
# TCP connect), so it is retried often; once a second cost each job up to a second.
CONNECT_RETRY_S = 0.2
CLOSE_ROUND_TRIP_S = 2.0      # finish.LEAVE_WAIT_S: the longest a master waits for a worker's last write


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
    import and in every full collection after it (up to 0.1 s of CPU each).

    In this process, torch's C++ log stays quiet (c10 reads TORCH_CPP_LOG_LEVEL once, when
    torch loads): a TCPStore client logs each failed try with a C++ stack of 20-odd frames,
    some 260 lines before the one line that says why (a master that wants a JOB_SECRET,
    one that is not there yet), and the entrypoint says what failed in its own lines. The
    variable is put back at once, so the training processes log as torch does."""
    was_enabled = gc.isenabled()
    gc.disable()
    before = os.environ.get(CPP_LOG_LEVEL)
    os.environ.setdefault(CPP_LOG_LEVEL, "FATAL")
    try:
        import torch.distributed  # noqa: F401
    finally:
        if before is None:
            os.environ.pop(CPP_LOG_LEVEL, None)
        if was_enabled:
            gc.enable()
    gc.freeze()


CPP_LOG_LEVEL = "TORCH_CPP_LOG_LEVEL"


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


class TcpJobStore(JobStore):
    def __init__(self, host: str, port: int, run_id: str, serve: bool, timeout_s: float, op_timeout_s: float,
                 identity=None, say=print):
        """timeout_s: how long to look for the master (RDZV_TIMEOUT); op_timeout_s: how long
        one operation may wait for its reply before the store counts as gone (PEER_TIMEOUT).
        TCPStore's own timeout does not bound a client's reads (torch 2.13: against a frozen
        server, add/check/get/set block for good), so operations run on a thread of their
        own and each is waited for at most op_timeout_s. `identity` (secret.Identity or Deriving): the
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
        self.store, self._gone = None, None          # a new connection, to whichever store serves now
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
                                  f"JOB_SECRET or RUN_ID (its TLS certificate is not this job's); give every node "
                                  f"the same secret and RUN_ID")
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
        if self.tunnel is not None and self.store is not None and self._gone is None:
            try:        # answered after every write before it
                self._call("check", [self.prefix + "job/done"], timeout_s=CLOSE_ROUND_TRIP_S)
            except StoreGone:
                pass
        for server in (self.gate, self.tunnel):
            if server is not None:
                server.stop()

    # ----------------------------------------------------------------- raw keys
    def _serve_ops(self) -> None:
        while True:
            op, args, reply = self._ops.get()
            try:
                reply.put((True, op(*args)))
            except (RuntimeError, ValueError, OSError) as exc:   # DistStoreError, DistNetworkError
                reply.put((False, _first_line(exc)))

    def _call(self, op, *args, timeout_s: float | None = None):
        """TCPStore's `op`(*args) (a method's name, or a function of the store) on the
        store's thread; StoreGone without a reply within timeout_s (default: op_timeout_s),
        or before the store is connected."""
        if self._gone:
            raise StoreGone(self._gone)
        if self.store is None:
            raise StoreGone(f"not connected to the job store at {self.endpoint}")
        reply: queue.Queue = queue.Queue(1)
        self._ops.put((getattr(self.store, op) if isinstance(op, str) else op, args, reply))
        try:
            ok, value = reply.get(timeout=timeout_s or self.op_timeout_s)
        except queue.Empty:
            self._gone = (f"no reply within {timeout_s:g}s" if timeout_s else
                          f"no reply within PEER_TIMEOUT={self.op_timeout_s:g}s")
            raise StoreGone(self._gone) from None
        if not ok:
            raise StoreGone(value)
        return value

    def has(self, key: str) -> bool:
        return self._call("check", [self.prefix + key])

    def get(self, key: str) -> str | None:
        # TCPStore.get waits for a missing key, and every caller of this store waits behind it
        # (one thread serves them all): a key another thread of this process is about to
        # write would never come. So: check, then get.
        return self._call("get", self.prefix + key).decode() if self.has(key) else None

    def set(self, key: str, value: str) -> None:
        self._call("set", self.prefix + key, value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", self.prefix + key, amount))

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        return self._call("compare_set", self.prefix + key, expected, desired).decode()

    def wait(self, key: str, timeout_s: float) -> bool:
        """TCPStore's own wait: the store answers when the key is set, so a waiting node
        sends one request where polling sent one every POLL_S. A wait that times out is
        cancelled by torch's client (CANCEL_WAIT, in every torch the matrix carries), so
        the next operation reads its own reply. This node's other operations queue behind
        it: keep it short."""
        return self._call(self._wait_on_store, self.prefix + key, timeout_s, timeout_s=timeout_s + self.op_timeout_s)

    def _wait_on_store(self, key: str, timeout_s: float) -> bool:
        from torch.distributed import DistStoreError

        try:
            self.store.wait([key], dt.timedelta(seconds=max(timeout_s, 0.001)))
            return True
        except DistStoreError as exc:
            if "timeout" in str(exc).lower():             # "wait timeout after 500ms, keys: ..."
                return False
            raise
