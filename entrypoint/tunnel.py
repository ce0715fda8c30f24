"""TLS in front of the master's control plane, for programs that speak plain TCP.

torch's TCPStore (the job store, torchrun's rendezvous) has no TLS of its own. With
JOB_SECRET, the master serves it on loopback only and puts a `Gate` on MASTER_PORT: a TLS
server (secret.Identity) that relays each authenticated connection to it. Every node runs a
`Tunnel`: a loopback listener whose connections it carries to the Gate over TLS, so the
store's clients on that node (the entrypoint, torch's agent, the training processes) connect
to 127.0.0.1:<tunnel port> as to any store. A peer without the secret never gets past the
handshake: nothing it sends reaches the store. The Gate logs one line per refused peer
address (then at most one a minute for it, with the count).

A Gate may carry more than one backend: a Tunnel names the one it wants in its TLS server
name (SNI), and the Gate relays it there if it has a route by that name (`route()`); other
names go to the Gate's own backend. The per-round stores of torchrun's workers
(workerstores.py) are reached so, through MASTER_PORT's Gate.

`handshake()` is the workers' probe: it tells "not up yet" from "the master's secret differs"
and "the master takes no TLS", so a node that cannot get in says why at once.

Both run on one asyncio loop in a daemon thread (`_loop()`).
"""

from __future__ import annotations

import asyncio
import enum
import socket
import ssl
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

HANDSHAKE_TIMEOUT_S = 10.0
ROUTE_SUFFIX = ".disttrain"    # server names that only a Gate's routes answer (route())
_SNI = "disttrain_server_name"  # where the server-side SSLObject keeps the name its client asked for
REFUSAL_QUIET_S = 60.0         # one refusal line per peer address per minute
CHUNK = 1 << 16
# A Tunnel's spare connection lives this long unused: under the 3 s after which Horovod's
# HTTP server drops a connection that has sent no request (http_server.SINGLE_REQUEST_TIMEOUT).
SPARE_TTL_S = 2.0

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()
_TASKS: set = set()            # asyncio keeps only weak references to tasks: the live ones are held here


def _spawn(coro) -> None:
    task = asyncio.ensure_future(coro)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


def _loop() -> asyncio.AbstractEventLoop:
    """The process's one loop for gates and tunnels, on a daemon thread."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, daemon=True, name="tls-relay").start()
            _LOOP = loop
        return _LOOP


def _run(coro, timeout: float | None = None):
    future: Future = asyncio.run_coroutine_threadsafe(coro, _loop())
    return future.result(timeout)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass


async def _relay(a: tuple, b: tuple) -> None:
    """Carry bytes both ways until either side closes; then close both."""
    (ra, wa), (rb, wb) = a, b
    tasks = [asyncio.ensure_future(_pipe(ra, wb)), asyncio.ensure_future(_pipe(rb, wa))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        for w in (wa, wb):
            w.close()


def refusal_reason(exc: BaseException) -> str:
    """Why a peer's handshake failed, in words (server side)."""
    reason = (getattr(exc, "reason", None) or "").upper()
    if isinstance(exc, ssl.SSLCertVerificationError) or any(
            r in reason for r in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "DECRYPT")):
        return "its certificate is not this job's (a different JOB_SECRET)"
    if "DID_NOT_RETURN_A_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason:
        return "it presented no certificate (no JOB_SECRET)"
    if isinstance(exc, ssl.SSLError):
        return f"it does not speak TLS (no JOB_SECRET; {reason or type(exc).__name__})"
    if isinstance(exc, asyncio.TimeoutError):
        return f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:.0f}s"
    return f"the handshake failed ({type(exc).__name__}: {exc})"


class Refusals:
    """One line per refused address and reason, then at most one per REFUSAL_QUIET_S with the count."""

    def __init__(self, say: Callable[[str], None], quiet_s: float = REFUSAL_QUIET_S):
        self.say, self.quiet_s = say, quiet_s
        self._last: dict[tuple, float] = {}
        self._held: dict[tuple, int] = {}
        self.count = 0

    def refused(self, addr: str, why: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.count += 1
        key = (addr, why.split(" (")[0])
        last = self._last.get(key)
        if last is not None and now - last < self.quiet_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        more = f" (and {held} more like it since the last line)" if held else ""
        self._last[key] = now
        self.say(f"refused a connection from {addr} to the job's control plane: {why}{more}")


class _Listening:
    """A server on the relay loop; stop() closes its listening socket (open relays end with their peers)."""
    _server = None

    def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            _loop().call_soon_threadsafe(server.close)


def _note_server_name(ssl_object, server_name: str | None, context) -> None:
    """The server context's SNI callback: keep the name for the Gate to route by."""
    setattr(ssl_object, _SNI, server_name)


class Gate(_Listening):
    """TLS on `port` (every interface) -> plain TCP on 127.0.0.1:`backend_port`, or on the
    port routed for the server name the client asked for."""

    def __init__(self, port: int, backend_port: int, context: ssl.SSLContext, say: Callable[[str], None],
                 host: str = "0.0.0.0"):
        self.port, self.backend_port, self.context, self.host = port, backend_port, context, host
        self.refusals = Refusals(say)
        self._routes: dict[str, int] = {}
        context.sni_callback = _note_server_name

    def route(self, name: str, port: int) -> None:
        """Relay connections that ask for server name `name` (ending in ROUTE_SUFFIX) to 127.0.0.1:`port`."""
        assert name.endswith(ROUTE_SUFFIX), name
        self._routes[name] = port

    def unroute(self, name: str) -> None:
        self._routes.pop(name, None)

    def _backend_for(self, server_name: str | None) -> int | None:
        """The port for this server name: its route; None for a route that is gone (a past
        round's); the Gate's own backend for any other name."""
        if server_name and server_name.endswith(ROUTE_SUFFIX):
            return self._routes.get(server_name)
        return self.backend_port

    def start(self) -> "Gate":
        """Raises OSError when the port cannot be served."""
        gate = self

        class Held(asyncio.Protocol):
            """A fresh connection, not read from until its TLS handshake takes it over."""
            def connection_made(self, transport):
                transport.pause_reading()
                _spawn(gate._on_peer(transport))

        async def serve():
            return await asyncio.get_running_loop().create_server(Held, self.host, self.port, reuse_address=True)
        self._server = _run(serve(), 10)
        return self

    async def _on_peer(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        addr = peer[0] if peer else "?"
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        try:
            tls = await loop.start_tls(transport, protocol, self.context, server_side=True,
                                       ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except (ConnectionResetError, EOFError):
            # Closed before saying anything: a port probe (a health check, a worker without
            # a secret testing whether the port is up). Nothing reached the store; not logged.
            transport.abort()
            return
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            self.refusals.refused(addr, refusal_reason(exc))
            transport.abort()
            return
        protocol.connection_made(tls)
        writer = asyncio.StreamWriter(tls, protocol, reader, loop)
        port = self._backend_for(getattr(tls.get_extra_info("ssl_object"), _SNI, None))
        if port is None:
            writer.close()
            return
        try:
            backend = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await _relay((reader, writer), backend)


class Gated:
    """A launcher's server on the master (Launcher.serve), moved to loopback behind a Gate on
    its public port: `port` is the Gate's (announced to the nodes), `local_port` the server's
    (for the master's own processes)."""

    def __init__(self, server, port: int, context: ssl.SSLContext, say: Callable[[str], None]):
        self.server, self.local_port = server, server.port
        try:
            self.gate = Gate(port, server.port, context, say).start()
        except OSError:            # `port` is taken: the server behind it goes too
            server.stop()
            raise
        self.port = port

    def stop(self) -> None:
        self.gate.stop()
        self.server.stop()


class Tunnel(_Listening):
    """127.0.0.1:<port> (chosen free) -> TLS to host:port; `server_name`: one of the Gate's
    routes (Gate.route), else its own backend.

    `spares`: for clients that open a connection per request (Horovod's HTTP rendezvous:
    dozens of requests per worker in hvd.init), each local connection that arrives takes a
    TLS connection opened ahead (when one is ready) and has another opened behind it, so
    the handshakes of a burst of requests overlap the requests instead of preceding each.
    A spare unused for SPARE_TTL_S is closed and not replaced: outside a burst no spare
    is held, and none outlives the idle timeout of the server behind the Gate."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, server_name: str | None = None,
                 spares: int = 0):
        self.host, self.remote_port, self.context = host, port, context
        self.server_name = server_name or host
        self.port: int | None = None
        self.spares = spares
        self._spare: deque = deque()         # (reader, writer, opened at): handshaken, unused
        self._opening = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Tunnel":
        async def serve():
            return await asyncio.start_server(lambda r, w: _spawn(self._on_local(r, w)), "127.0.0.1", 0)
        self._server = _run(serve(), 10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        super().stop()
        _loop().call_soon_threadsafe(self._drop_spares, 0.0)

    async def _open(self) -> tuple:
        return await asyncio.wait_for(
            asyncio.open_connection(self.host, self.remote_port, ssl=self.context, server_hostname=self.server_name),
            HANDSHAKE_TIMEOUT_S)

    async def _on_local(self, reader, writer) -> None:
        remote = self._take_spare()
        self._open_spares()
        if remote is None:
            try:
                remote = await self._open()
            except (OSError, ssl.SSLError, asyncio.TimeoutError):
                writer.transport.abort()
                return
        await _relay((reader, writer), remote)

    def _take_spare(self) -> tuple | None:
        self._drop_spares(SPARE_TTL_S)
        while self._spare:
            remote_reader, remote_writer, _ = self._spare.popleft()
            if not (remote_writer.is_closing() or remote_reader.at_eof()):
                return remote_reader, remote_writer
            remote_writer.close()
        return None

    def _open_spares(self) -> None:
        while self._server is not None and len(self._spare) + self._opening < self.spares:
            self._opening += 1
            _spawn(self._open_spare())

    async def _open_spare(self) -> None:
        try:
            remote_reader, remote_writer = await self._open()
        except (OSError, ssl.SSLError, asyncio.TimeoutError):
            return                           # the next local connection opens its own, and tries again
        finally:
            self._opening -= 1
        if self._server is None:
            remote_writer.close()
            return
        loop = asyncio.get_running_loop()
        self._spare.append((remote_reader, remote_writer, loop.time()))
        loop.call_later(SPARE_TTL_S, self._drop_spares, SPARE_TTL_S - 0.05)   # (timers may fire early)

    def _drop_spares(self, older_than: float) -> None:
        """Close the spares opened at least `older_than` seconds ago (0: all of them)."""
        now = asyncio.get_running_loop().time()       # (called on the relay loop only)
        while self._spare and now - self._spare[0][2] >= older_than:
            self._spare.popleft()[1].close()


class Answer(enum.Enum):
    IN = "in"                       # a TLS session with this job's identity
    DOWN = "down"                   # nothing to talk to (yet): no route, refused, no name
    WRONG_SECRET = "wrong secret"   # TLS, with another job's certificate
    NO_TLS = "no tls"               # something answers, but not with TLS (a master without JOB_SECRET)
    TLS = "tls"                     # (probing without a secret) the master takes TLS only


@dataclass(frozen=True)
class Probe:
    answer: Answer
    detail: str = ""


def handshake(host: str, port: int, context: ssl.SSLContext | None, timeout: float = 5.0) -> Probe:
    """Open a connection to host:port and try a TLS handshake: with this job's `context`,
    or (None) anonymously, to learn whether the other side insists on TLS."""
    anonymous = context is None
    if anonymous:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror:
        return Probe(Answer.DOWN, f"{host!r} does not resolve (yet)")
    except OSError as exc:
        return Probe(Answer.DOWN, exc.strerror or str(exc))
    try:
        with context.wrap_socket(raw, server_hostname=host):
            return Probe(Answer.TLS if anonymous else Answer.IN)
    except ssl.SSLCertVerificationError as exc:
        return Probe(Answer.WRONG_SECRET, exc.verify_message or str(exc))
    except ssl.SSLError as exc:
        reason = (exc.reason or "").upper()
        if "ALERT" in reason and not anonymous:
            return Probe(Answer.WRONG_SECRET, exc.reason)
        return Probe(Answer.NO_TLS, exc.reason or str(exc))
    except (ConnectionError, EOFError, socket.timeout, TimeoutError, OSError) as exc:
        return Probe(Answer.NO_TLS, type(exc).__name__)
    finally:
        raw.close()
