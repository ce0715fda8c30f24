"""JOB_SECRET's pure parts and its TLS over real loopback sockets: the identity derived from
the secret, what a probe learns from each kind of master, and the refusal lines."""

from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest

from entrypoint.config import ConfigError
from entrypoint.explain import control_plane
from entrypoint.secret import MIN_SECRET_CHARS, Identity, SecretError, read_secret
from entrypoint.tunnel import Answer, Gate, Refusals, Tunnel, handshake, refusal_reason
from tests.unit.test_plan import plan

SECRET = b"a-test-secret-of-32-characters!!"


def test_every_node_derives_the_same_identity_and_another_secret_another():
    one, again, other = Identity.derive(SECRET), Identity.derive(SECRET), Identity.derive(SECRET + b"x")
    assert one == again
    assert other.cert_pem != one.cert_pem and other.key_pem != one.key_pem


@pytest.mark.parametrize("env, says", [
    ({"JOB_SECRET": "short"}, f"JOB_SECRET: the secret has 5 characters; allowed: at least {MIN_SECRET_CHARS}"),
    ({"JOB_SECRET_FILE": "/nonexistent/secret"}, "JOB_SECRET_FILE='/nonexistent/secret': cannot read it"),
    ({"JOB_SECRET_FILE": "/dev/null"}, "JOB_SECRET_FILE='/dev/null': the secret is empty"),
    ({"JOB_SECRET": "x" * 20, "JOB_SECRET_FILE": "/dev/null"}, "JOB_SECRET and JOB_SECRET_FILE are both set"),
])
def test_a_bad_secret_is_one_line_that_never_shows_it(env, says):
    with pytest.raises(SecretError) as caught:
        read_secret(plan(**env).config)
    text = str(caught.value)
    assert text.startswith(says) and "\n" not in text
    assert "'short'" not in text and "xxxxxxxx" not in text
    assert isinstance(caught.value, ConfigError)


def test_a_secret_file_loses_its_trailing_newline(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    assert read_secret(plan(JOB_SECRET_FILE=str(path)).config) == SECRET == \
        read_secret(plan(JOB_SECRET=SECRET.decode()).config)
    assert read_secret(plan().config) is None


def test_the_secret_never_shows_in_the_config_or_the_dry_run():
    p = plan(JOB_SECRET=SECRET.decode(), NUM_NODES=2, ROLE="master", MASTER_ADDR="10.0.0.1")
    assert SECRET.decode() not in repr(p.config)
    line = control_plane(p)
    assert line.startswith("TLS with JOB_SECRET") and SECRET.decode() not in line
    assert control_plane(plan(NUM_NODES=2, ROLE="master", MASTER_ADDR="10.0.0.1")).startswith("open: no JOB_SECRET")


def test_the_dry_run_names_what_a_secret_leaves_open_per_launcher():
    """torchrun's workers meet in a store per round behind the Gate, fixed-size and elastic
    alike (workerstores.py); elastic Horovod's notification services stay open."""
    common = dict(JOB_SECRET=SECRET.decode(), NUM_NODES=2, ROLE="master", MASTER_ADDR="10.0.0.1")
    for elastic in ({}, {"MIN_NODES": "1", "MAX_NODES": "3", "MAX_RESTARTS": "3"}):
        assert "not covered" not in control_plane(plan(**common, **elastic))
    horovod = control_plane(plan(**common, LAUNCHER="horovod", MIN_NODES="1", MAX_NODES="3"))
    assert "not covered: " in horovod and "notification services" in horovod
    mpi = control_plane(plan(**common, LAUNCHER="mpi", HOSTFILE="/etc/hosts"))
    assert "not covered: Open MPI's out-of-band channel" in mpi


def echo_server(answer=lambda data: data) -> socket.socket:
    """A plain TCP server on loopback that sends back `answer(data)` for what it reads."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(answer(data))

    threading.Thread(target=serve, daemon=True).start()
    return server


@pytest.fixture
def gate():
    """A Gate (this job's identity) in front of a plain echo server; its refusal lines."""
    echo = echo_server()
    said: list[str] = []
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]       # a free port (the socket closes)
    g = Gate(port, echo.getsockname()[1], Identity.derive(SECRET).server_context(), said.append).start()
    yield g, said
    g.stop()
    echo.close()


def test_a_tunnel_carries_bytes_only_for_the_same_secret(gate):
    g, said = gate
    good = Tunnel("127.0.0.1", g.port, Identity.derive(SECRET).client_context()).start()
    with socket.create_connection(("127.0.0.1", good.port), timeout=5) as conn:
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
    other = Identity.derive(b"another-secret-of-32-characters!").client_context()
    wrong = Tunnel("127.0.0.1", g.port, other).start()
    with socket.create_connection(("127.0.0.1", wrong.port), timeout=5) as conn:
        conn.sendall(b"ping")
        assert conn.recv(16) == b""                        # closed, nothing echoed
    assert not said or "not this job's" in said[-1]      # the tunnel may drop it before its alert is read
    handshake("127.0.0.1", g.port, other)                # a node with that secret probing: it says why
    time.sleep(0.3)
    assert said and all("refused a connection from 127.0.0.1" in line for line in said), said
    assert "not this job's" in said[-1]


def test_a_gate_relays_a_routed_server_name_to_its_own_backend_and_a_past_route_nowhere(gate):
    """The per-round stores of torchrun's workers (workerstores.py): one Gate, several
    backends, chosen by the name a Tunnel asks for in its TLS handshake."""
    g, _ = gate
    shout = echo_server(bytes.upper)                         # a second backend: answers in capitals
    context = Identity.derive(SECRET).client_context()

    def ask(server_name: str | None) -> bytes:
        tunnel = Tunnel("127.0.0.1", g.port, context, server_name=server_name).start()
        try:
            with socket.create_connection(("127.0.0.1", tunnel.port), timeout=5) as conn:
                conn.sendall(b"ping")
                return conn.recv(16)
        finally:
            tunnel.stop()

    g.route("round-1.disttrain", shout.getsockname()[1])
    assert ask("round-1.disttrain") == b"PING"
    assert ask(None) == b"ping" and ask("master.example") == b"ping"   # other names: the Gate's own backend
    g.unroute("round-1.disttrain")
    assert ask("round-1.disttrain") == b""                   # a past round's name reaches nothing
    shout.close()


class StampingServer:
    """A threaded TCP server on loopback, as Horovod's rendezvous: each request is answered
    with when its connection was accepted; a connection idle for `idle_s` is closed."""

    def __init__(self, idle_s: float = 3.0):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.idle_s, self.open = idle_s, 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, time.monotonic()), daemon=True).start()

    def _serve(self, conn, accepted):
        self.open += 1
        conn.settimeout(self.idle_s)
        with conn:
            try:
                while conn.recv(1024):
                    conn.sendall(repr(accepted).encode())
            except OSError:
                pass
        self.open -= 1


def spare_gate(server):
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
    return Gate(port, server.sock.getsockname()[1], Identity.derive(SECRET).server_context(), print).start()


def request(tunnel) -> float:
    """One request on a new connection, as Horovod's client makes each: when the server
    accepted the connection that answered it."""
    with socket.create_connection(("127.0.0.1", tunnel.port), timeout=5) as conn:
        conn.sendall(b"GET")
        return float(conn.recv(64))


def test_a_tunnel_with_spares_answers_a_burst_on_connections_opened_ahead_then_lets_them_go(monkeypatch):
    monkeypatch.setattr("entrypoint.tunnel.SPARE_TTL_S", 0.6)
    server = StampingServer()
    g = spare_gate(server)
    tunnel = Tunnel("127.0.0.1", g.port, Identity.derive(SECRET).client_context(), spares=2).start()
    plain = Tunnel("127.0.0.1", g.port, Identity.derive(SECRET).client_context()).start()
    try:
        request(tunnel)                                   # the burst's first request opens the spares
        time.sleep(0.3)
        for _ in range(3):
            asked = time.monotonic()
            assert request(tunnel) < asked                # its connection was there before it asked
            time.sleep(0.1)
        asked = time.monotonic()
        assert request(plain) > asked                     # the control: without spares, opened on demand
        time.sleep(0.6 + 1.0)
        assert server.open == 0                           # unused spares closed, none opened again
    finally:
        tunnel.stop(), plain.stop(), g.stop()
        server.sock.close()


def test_a_spare_the_server_dropped_is_passed_over(monkeypatch):
    """A spare held past the server's idle timeout (closed by it) is not used: the request
    gets a fresh connection and its answer."""
    monkeypatch.setattr("entrypoint.tunnel.SPARE_TTL_S", 5.0)
    server = StampingServer(idle_s=0.3)
    g = spare_gate(server)
    tunnel = Tunnel("127.0.0.1", g.port, Identity.derive(SECRET).client_context(), spares=2).start()
    try:
        request(tunnel)
        time.sleep(0.8)                                   # the spares are open, and the server dropped them
        asked = time.monotonic()
        assert request(tunnel) > asked
    finally:
        tunnel.stop(), g.stop()
        server.sock.close()


def test_probes_tell_a_wrong_secret_from_no_tls_and_from_nothing_there(gate):
    g, _ = gate
    assert handshake("127.0.0.1", g.port, Identity.derive(SECRET).client_context()).answer is Answer.IN
    other = Identity.derive(b"another-secret-of-32-characters!").client_context()
    assert handshake("127.0.0.1", g.port, other).answer is Answer.WRONG_SECRET
    assert handshake("127.0.0.1", g.port, None).answer is Answer.TLS
    plain = socket.create_server(("127.0.0.1", 0))             # accepts and says nothing, as a TCPStore
    assert handshake("127.0.0.1", plain.getsockname()[1], Identity.derive(SECRET).client_context(),
                     timeout=1).answer is Answer.NO_TLS
    port = plain.getsockname()[1]
    plain.close()
    assert handshake("127.0.0.1", port, None).answer is Answer.DOWN


def test_refusals_are_one_line_per_address_and_reason_then_one_a_minute():
    lines: list[str] = []
    r = Refusals(lines.append, quiet_s=60)
    for t in range(5):
        r.refused("10.0.0.7", "it does not speak TLS (no JOB_SECRET; WRONG_VERSION_NUMBER)", now=float(t))
    r.refused("10.0.0.8", "it does not speak TLS (no JOB_SECRET; HTTP_REQUEST)", now=5.0)
    r.refused("10.0.0.7", "its certificate is not this job's (a different JOB_SECRET)", now=6.0)
    assert len(lines) == 3 and r.count == 7
    r.refused("10.0.0.7", "it does not speak TLS (no JOB_SECRET; WRONG_VERSION_NUMBER)", now=61.0)
    assert len(lines) == 4 and "(and 4 more like it since the last line)" in lines[-1]


def test_refusal_reasons_in_words():
    assert "different JOB_SECRET" in refusal_reason(ssl.SSLCertVerificationError("certificate verify failed"))
    wrong_version = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    wrong_version.reason = "WRONG_VERSION_NUMBER"
    assert refusal_reason(wrong_version).startswith("it does not speak TLS")
