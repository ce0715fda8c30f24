"""TLS in front of the master's control plane, for programs that speak plain TCP.

torch's TCPStore (the job store, torchrun's rendezvous) has no TLS of its own. With
JOB_SECRET, the master serves it on loopback only and puts a `Gate` on MASTER_PORT: a TLS
server (secret.Identity) that relays each authenticated connection to it. Every node runs a
`Tunnel`: a loopback listener whose connections it carries to the Gate over TLS, so the
store's clients on that node (the entrypoint, torch's agent, the training processes) connect
to 127.0.0.1:<tunnel port> as to any store. A peer without the secret never gets past the
handshake: nothing it sends reaches the store. The Gate logs one line per refused peer
address (then at most one a minute for it, with the count, flushed each minute).

A stranger cannot wear the Gate down before a handshake: at most MAX_WAITING_PER_ADDRESS
connections from one address (and a quarter of the descriptor limit in all) wait for their
handshake at once, each for at most HANDSHAKE_TIMEOUT_S; more are closed on arrival and
counted. A peer that took the certificate and left (an anonymous handshake, the first step
of guessing the secret offline) is counted like any refusal; one that closed before saying
anything (a port probe) is not. The loop's own errors (a descriptor limit reached while
accepting) are one line a minute, not a traceback per attempt.

A Gate may carry more than one backend: a Tunnel names the one it wants in its TLS server
name (SNI), and the Gate relays it there if it has a route by that name (`route()`); other
names go to the Gate's own backend. The per-round stores of torchrun's workers
(launchers/torchrun/worker_stores.py) are reached so, through MASTER_PORT's Gate.

Clients that open a connection per HTTP request (Horovod's rendezvous: a worker polls it
every 10 ms while Gloo connects) would pay a TLS handshake per request through a Tunnel. A
`RequestTunnel` reads each request, carries it framed over one of a few TLS connections it
keeps open, and the Gate hands it to its backend on a connection of its own and returns the
whole response, framed: a request costs no handshake.

`handshake()` is the workers' probe: it tells "not up yet" from "the master's secret differs"
and "the master takes no TLS", so a node that cannot get in says why at once.

Both run on one asyncio loop in a daemon thread (`_loop()`).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import os
import random
import resource
import socket
import ssl
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from .local_peer import socket_owner

HANDSHAKE_TIMEOUT_S = 5.0
MAX_WAITING_PER_ADDRESS = 32   # connections from one address waiting for their handshake at once
ROUTE_SUFFIX = ".disttrain"    # server names that only a Gate's routes answer (route())
_SNI = "disttrain_server_name"  # where the server-side SSLObject keeps the name its client asked for
REFUSAL_QUIET_S = 60.0         # one refusal line per peer address per minute
CHUNK = 1 << 16
REQUESTS_NAME = "requests.exchange"   # the server name a RequestTunnel asks the Gate for
MAX_FRAME = 64 << 20                  # bytes in one framed request or response
EXCHANGE_TIMEOUT_S = 60.0             # the backend's whole response, once it has the request

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_ERRORS: "LoopErrors | None" = None
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


class QuietLines:
    """One line per key, then at most one per `quiet_s` for it: a line that comes sooner is
    held and counted, and told with the next one for its key (or by `flush`)."""

    def __init__(self, say: Callable[[str], None], quiet_s: float = REFUSAL_QUIET_S):
        self.say, self.quiet_s = say, quiet_s
        self._last: dict = {}
        self._held: dict = {}

    def line(self, key, text: str, now: float | None = None) -> None:
        """`text`, or held; a line after held ones ends with their count."""
        now = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and now - last < self.quiet_s:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        self.say(text + (f" (and {held} more like it since the last line)" if held else ""))

    def flush(self, told: Callable[[object, int], str], now: float | None = None) -> None:
        """The counts held for `quiet_s` or longer, each as `told(key, count)`."""
        now = time.monotonic() if now is None else now
        for key in [k for k in self._held if now - self._last[k] >= self.quiet_s]:
            self._last[key] = now
            self.say(told(key, self._held.pop(key)))


class LoopErrors(QuietLines):
    """The relay loop's exception handler: one line per kind of error a minute, with how
    many there were since the last (asyncio's default prints a traceback for each: 10,000
    in 12 s when a stranger's connections use up the descriptors)."""

    def __call__(self, loop, context: dict) -> None:
        exc = context.get("exception")
        kind = type(exc).__name__ if exc is not None else "error"
        self.line(kind, f"the control plane's relay: {context.get('message', 'error')}: {kind}"
                        f"{f' ({exc})' if exc else ''}")


def report_loop_errors(say: Callable[[str], None]) -> None:
    """The relay loop's errors go to `say`, rate-limited (the first caller's)."""
    global _LOOP_ERRORS
    if _LOOP_ERRORS is None:
        _LOOP_ERRORS = LoopErrors(say)
        _loop().call_soon_threadsafe(_loop().set_exception_handler, _LOOP_ERRORS)


def raise_descriptor_limit() -> int:
    """The soft limit on open descriptors raised to the hard one (what a stranger's
    connections would use up first); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


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


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame's bytes; None at a clean end between frames."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError("the connection ended inside a frame") from None
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_FRAME:
        raise ConnectionError(f"a frame of {size} bytes (at most {MAX_FRAME})")
    return await reader.readexactly(size)


async def read_http_request(reader: asyncio.StreamReader) -> bytes:
    """One HTTP request as its client sent it: the head, then Content-Length bytes of body.
    ValueError for what a request that is relayed whole cannot be (a chunked body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding":
            raise ValueError("a chunked request body")
    if not 0 <= length <= MAX_FRAME - len(head):
        raise ValueError(f"Content-Length {length}")
    return head + await reader.readexactly(length)


def refusal_reason(exc: BaseException) -> str:
    """Why a peer's handshake failed, in words (server side)."""
    reason = (getattr(exc, "reason", None) or "").upper()
    if isinstance(exc, ssl.SSLCertVerificationError) or any(
            r in reason for r in ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "DECRYPT")):
        return "its certificate is not this job's (a different JOB_SECRET or RUN_ID)"
    if "DID_NOT_RETURN_A_CERTIFICATE" in reason or "CERTIFICATE_REQUIRED" in reason:
        return "it presented no certificate (no JOB_SECRET)"
    if isinstance(exc, ssl.SSLError):
        return f"it does not speak TLS (no JOB_SECRET; {reason or type(exc).__name__})"
    if isinstance(exc, (asyncio.TimeoutError, ConnectionAbortedError)):     # asyncio aborts a slow handshake
        return f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:.0f}s"
    return f"the handshake failed ({type(exc).__name__}: {exc})"


NOT_PINNED = "its certificate verifies but is not the job's own, byte for byte"
TOOK_THE_CERTIFICATE = "it left after taking the certificate (an anonymous handshake, or a node whose JOB_SECRET differs)"


def too_many_waiting(limit: int, per_address: bool) -> str:
    where = "from this address" if per_address else "in all"
    return f"{limit} connections {where} already wait for their handshake"


class Refusals(QuietLines):
    """One line per refused address and reason, then at most one per REFUSAL_QUIET_S with
    the count; `flush()` says the counts held longer than that, even without a new refusal."""

    count = 0

    def refused(self, addr: str, why: str, now: float | None = None) -> None:
        self.count += 1
        self.line((addr, why.split(" (")[0]),
                  f"refused a connection from {addr} to the job's control plane: {why}", now)

    def flush(self, now: float | None = None) -> None:
        super().flush(lambda key, held: f"refused {held} more connection(s) from {key[0]} to the job's control "
                                        f"plane since the last line: {key[1]}", now)


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
    if (peer := _PEER.get()) is not None:
        peer.said_hello = True


def pinned(ssl_object, context: ssl.SSLContext) -> bool:
    """Whether the peer's certificate is, byte for byte, the job's one certificate (the
    context's, secret.JobContext): checked after every handshake, on top of the chain's
    verification, so no other certificate the job's key might sign is ever taken."""
    peer = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    expected = getattr(context, "certificate", None)
    return peer is not None and bool(expected) and peer == expected


class _Peer:
    """One connection's handshake, as the server name callback sees it."""
    said_hello = False


# The connection whose ClientHello the server name callback is reading. asyncio runs a
# transport's reads in a copy of the context its reading was resumed in, which start_tls
# does from the Gate's task for this connection: the callback finds that connection's _Peer.
_PEER: contextvars.ContextVar[_Peer | None] = contextvars.ContextVar("disttrain_gate_peer", default=None)


class Gate(_Listening):
    """TLS on `port` (every interface) -> plain TCP on 127.0.0.1:`backend_port`, or on the
    port routed for the server name the client asked for."""

    def __init__(self, port: int, backend_port: int, context: ssl.SSLContext, say: Callable[[str], None],
                 host: str = "0.0.0.0", quiet_s: float = REFUSAL_QUIET_S):
        self.port, self.backend_port, self.context, self.host = port, backend_port, context, host
        self.refusals = Refusals(say, quiet_s)
        self._routes: dict[str, int] = {}
        self._waiting: Counter[str] = Counter()    # connections per address waiting for their handshake
        self.max_waiting = max(MAX_WAITING_PER_ADDRESS, raise_descriptor_limit() // 4)
        context.sni_callback = _note_server_name
        report_loop_errors(say)

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
            server = await asyncio.get_running_loop().create_server(Held, self.host, self.port, reuse_address=True)
            _spawn(self._flush_refusals(server))
            return server
        self._server = _run(serve(), 10)
        return self

    async def _flush_refusals(self, server) -> None:
        """The counts held back, each minute while the Gate serves (the rest at stop())."""
        while server.is_serving():
            await asyncio.sleep(self.refusals.quiet_s / 6)
            self.refusals.flush()

    def stop(self) -> None:
        """Stop serving; the counts still held back are said now."""
        super().stop()

        async def flush():
            self.refusals.flush(now=float("inf"))
        try:
            _run(flush(), 2)
        except Exception:           # a loop too busy to answer: the counts go unsaid
            pass

    def _admit(self, addr: str) -> str | None:
        """Why a new connection from `addr` may not wait for a handshake now; None: it may."""
        if self._waiting[addr] >= MAX_WAITING_PER_ADDRESS:
            return too_many_waiting(MAX_WAITING_PER_ADDRESS, per_address=True)
        if self._waiting.total() >= self.max_waiting:
            return too_many_waiting(self.max_waiting, per_address=False)
        return None

    async def _on_peer(self, transport: asyncio.Transport) -> None:
        peer = transport.get_extra_info("peername")
        addr = peer[0] if peer else "?"
        if (full := self._admit(addr)) is not None:
            transport.abort()
            self.refusals.refused(addr, full)
            return
        self._waiting[addr] += 1
        try:
            done = await self._handshake(transport, addr)
        finally:
            self._waiting[addr] -= 1
            if not self._waiting[addr]:
                del self._waiting[addr]
        if done is None:
            return
        tls, reader, writer = done
        server_name = getattr(tls.get_extra_info("ssl_object"), _SNI, None)
        if server_name == REQUESTS_NAME:
            await self._exchange_requests(reader, writer)
            return
        port = self._backend_for(server_name)
        if port is None:
            writer.close()
            return
        try:
            backend = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await _relay((reader, writer), backend)

    async def _handshake(self, transport: asyncio.Transport, addr: str):
        """The TLS transport and its reader and writer; None when refused (counted) or probed."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        peer = _Peer()
        _PEER.set(peer)
        try:
            tls = await loop.start_tls(transport, protocol, self.context, server_side=True,
                                       ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
        except (ConnectionResetError, EOFError):
            # Closed before the handshake's end. Before its ClientHello: a port probe (a
            # health check, a worker testing whether the port is up), not logged. After it
            # (the server name callback ran): the peer has the certificate and left.
            if peer.said_hello:
                self.refusals.refused(addr, TOOK_THE_CERTIFICATE)
            transport.abort()
            return None
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            self.refusals.refused(addr, refusal_reason(exc))
            transport.abort()
            return None
        if tls is None:
            # Closed cleanly while its handshake ran: asyncio (3.11.2, the image's) then
            # hands back no transport. A port probe (compose's health check connects and
            # closes), not logged.
            transport.abort()
            return None
        if not pinned(tls.get_extra_info("ssl_object"), self.context):
            self.refusals.refused(addr, NOT_PINNED)
            tls.abort()
            return None
        protocol.connection_made(tls)
        return tls, reader, asyncio.StreamWriter(tls, protocol, reader, loop)

    async def _exchange_requests(self, reader, writer) -> None:
        """A RequestTunnel's connection: framed requests, one after another, each handed to
        the backend on a connection of its own, its whole response sent back framed (the
        backend closes each connection after its response, as HTTP/1.0 servers do)."""
        try:
            while (request := await read_frame(reader)) is not None:
                backend_reader, backend_writer = await asyncio.open_connection("127.0.0.1", self.backend_port)
                try:
                    backend_writer.write(request)
                    await backend_writer.drain()
                    response = await asyncio.wait_for(backend_reader.read(), EXCHANGE_TIMEOUT_S)
                finally:
                    backend_writer.close()
                writer.write(frame(response))
                await writer.drain()
        except (ConnectionError, OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()


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
    routes (Gate.route), else its own backend."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext, server_name: str | None = None):
        self.host, self.remote_port, self.context = host, port, context
        self.server_name = server_name or host
        self.port: int | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Tunnel":
        async def serve():
            return await asyncio.start_server(lambda r, w: _spawn(self._admit(r, w)), "127.0.0.1", 0)
        self._server = _run(serve(), 10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _admit(self, reader, writer) -> None:
        """Only a socket of this process's uid is carried with the job's identity
        (local_peer.py); another user's is closed. One whose owner the kernel does not tell
        (neither netlink nor /proc/net/tcp) is carried: docs/security.md says so."""
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        owner = socket_owner(peer[:2], local[:2]) if peer and local else None
        if owner is not None and owner != os.getuid():
            writer.transport.abort()
            return
        await self._on_local(reader, writer)

    async def _open(self) -> tuple:
        """A TLS connection to the Gate. One reset before the handshake's end (the Gate
        closes what arrives while too many wait: a burst of this node's own, or a stranger's)
        is tried again after a short, growing, jittered pause, within HANDSHAKE_TIMEOUT_S."""
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + HANDSHAKE_TIMEOUT_S, 0.02
        while True:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.remote_port, ssl=self.context,
                                            server_hostname=self.server_name),
                    max(0.1, deadline - loop.time()))
            except ConnectionResetError:
                if loop.time() + pause >= deadline:
                    raise
                await asyncio.sleep(pause * random.uniform(0.5, 1.5))
                pause = min(2 * pause, 0.5)
                continue
            if not pinned(writer.get_extra_info("ssl_object"), self.context):
                writer.transport.abort()
                raise ssl.SSLError(NOT_PINNED)
            return reader, writer

    async def _on_local(self, reader, writer) -> None:
        try:
            remote = await self._open()
        except (OSError, ssl.SSLError, asyncio.TimeoutError):
            writer.transport.abort()
            return
        await _relay((reader, writer), remote)


class RequestTunnel(Tunnel):
    """A Tunnel for HTTP clients that open a connection per request (Horovod's rendezvous):
    each local connection brings one request, which travels framed over a TLS connection to
    the Gate kept open between requests (as many as requests come at once), and gets the
    backend's whole response, then the local connection is closed, as the backend closes it."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext):
        super().__init__(host, port, context, server_name=REQUESTS_NAME)
        self._idle: list[tuple] = []        # TLS connections between two requests

    def stop(self) -> None:
        super().stop()
        _loop().call_soon_threadsafe(self._close_idle)

    def _close_idle(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def _on_local(self, reader, writer) -> None:
        try:
            request = await read_http_request(reader)
        except (ValueError, ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            writer.transport.abort()
            return
        response = await self._exchange(request)
        if response is None:
            writer.transport.abort()
            return
        writer.write(response)
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        writer.close()

    async def _exchange(self, request: bytes) -> bytes | None:
        """The response, over a kept connection (once more over a new one when the kept one
        turns out closed); None when the Gate cannot be reached."""
        while True:
            kept = bool(self._idle)
            try:
                remote = self._idle.pop() if kept else await self._open()
            except (OSError, ssl.SSLError, asyncio.TimeoutError):
                return None
            remote_reader, remote_writer = remote
            try:
                remote_writer.write(frame(request))
                await remote_writer.drain()
                response = await read_frame(remote_reader)
            except (ConnectionError, OSError, ssl.SSLError, asyncio.IncompleteReadError):
                response = None
            if response is None:
                remote_writer.close()
                if kept:
                    continue
                return None
            if self._server is not None:
                self._idle.append(remote)
            else:
                remote_writer.close()
            return response


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
        with context.wrap_socket(raw, server_hostname=host) as tls:
            if anonymous:
                return Probe(Answer.TLS)
            return Probe(Answer.IN) if pinned(tls, context) else Probe(Answer.WRONG_SECRET, NOT_PINNED)
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
