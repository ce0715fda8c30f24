"""JOB_SECRET's pure parts and its TLS over real loopback sockets: the identity derived from
the secret, what a probe learns from each kind of master, and the refusal lines."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
import time

import pytest

from entrypoint.contract.config import ConfigError
from entrypoint.explain import control_plane
from entrypoint.security.secret import Deriving, Identity, SecretError, new_secret, read_secret, weakness
from entrypoint.security import tunnel
from entrypoint.security.tunnel import (Answer, Gate, LoopErrors, Refusals, RequestTunnel, Tunnel, handshake,
                                         refusal_reason)
from testing.plans import plan

SECRET = b"3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e"


def test_every_node_derives_the_same_identity_and_another_secret_another():
    one, again, other = Identity.derive(SECRET), Identity.derive(SECRET), Identity.derive(SECRET + b"x")
    assert one == again
    assert other.cert_pem != one.cert_pem and other.key_pem != one.key_pem


@pytest.mark.parametrize("weak, why", [
    ("passwordpassword", "it repeats 8 character(s)"),
    ("q" * 16, "it repeats 1 character(s)"),
    ("supercalifragilistic", "20 characters of 12 different ones"),       # 20 characters of one word
    ("a-test-secret-of-32-characters!!", "32 characters of 13 different ones"),
    ("0123456789abcdef", "16 hex digits"),                                 # 64 bits
    ("SupercalifragilisticExpialidocious", "34 characters of 17 different ones"),   # letters only
])
def test_weak_secrets_are_refused_in_one_line_that_says_how_to_make_one(weak, why):
    with pytest.raises(SecretError) as caught:
        read_secret(plan(JOB_SECRET=weak).config)
    text = str(caught.value)
    assert text.startswith(f"JOB_SECRET: the secret is too weak to keep strangers out ({why}); allowed: ")
    assert "disttrain secret" in text and "openssl rand -hex 32" in text and weak not in text and "\n" not in text


def test_what_generators_make_is_strong():
    import base64
    import os
    import secrets
    import subprocess
    import sys
    import uuid

    made = subprocess.run([sys.executable, "-m", "entrypoint.commands", "secret"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and len(made.stdout.strip()) == 64, made.stderr
    for strong in (made.stdout.strip(), new_secret(), secrets.token_hex(16), secrets.token_urlsafe(32),
                   str(uuid.uuid4()), base64.b64encode(os.urandom(32)).decode(),
                   "correct horse battery staple, and then some more words"):
        assert weakness(strong.encode()) is None, strong
        assert read_secret(plan(JOB_SECRET=strong).config) == strong.encode()


def test_an_identity_derived_on_a_thread_is_the_jobs_and_its_failure_reaches_its_first_user():
    """The entrypoint derives the key while it imports torch (Deriving): the contexts it
    hands out are the job's own, and a derivation that failed fails where it is used."""
    pending = Deriving(SECRET, "job-d")
    assert pending.identity() is Identity.derive(SECRET, "job-d")
    assert pending.client_context().certificate == pending.server_context().certificate != b""
    broken = Deriving("text, not bytes", "job-d")          # hashlib.scrypt takes bytes only
    with pytest.raises(TypeError):
        broken.server_context()


def test_the_identity_is_a_leaf_of_its_own_job_only():
    """Keyed by the secret and the RUN_ID: two jobs given one secret but their own RUN_IDs
    refuse each other's nodes. The certificate signs nothing else (not a CA)."""
    from cryptography import x509

    one, other_job = Identity.derive(SECRET, "job-a"), Identity.derive(SECRET, "job-b")
    assert one.key_pem != other_job.key_pem and one == Identity.derive(SECRET, "job-a")
    cert = x509.load_pem_x509_certificate(one.cert_pem)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    echo = echo_server()
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
    g = Gate(port, echo.getsockname()[1], one.server_context(), lambda line: None).start()
    try:
        assert handshake("127.0.0.1", g.port, one.client_context()).answer is Answer.IN
        assert handshake("127.0.0.1", g.port, other_job.client_context()).answer is Answer.WRONG_SECRET
    finally:
        g.stop()
        echo.close()


@pytest.mark.parametrize("env, says", [
    ({"JOB_SECRET": "short"}, "JOB_SECRET: the secret is too weak to keep strangers out (5 characters of 5 "),
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


def closed_unanswered(conn: socket.socket) -> bool:
    """The other side closed (or reset) the connection without a byte of answer."""
    try:
        return conn.recv(16) == b""
    except ConnectionResetError:
        return True


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
        assert closed_unanswered(conn)
    # The tunnel may leave before the Gate reads its alert: taking the certificate and leaving.
    assert not said or "not this job's" in said[-1] or "left after taking the certificate" in said[-1]
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


class CountingProxy:
    """TCP on loopback between a tunnel and its Gate: counts the connections (each a TLS
    handshake) and can cut them all, as a restarted Gate or a network blip would."""

    def __init__(self, port: int):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port, self.target, self.connections, self.open = self.sock.getsockname()[1], port, 0, []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.open += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        for s in self.open:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.open = []

    def close(self):
        self.cut()
        self.sock.close()


@pytest.fixture
def horovod_behind_a_gate():
    """Horovod's own rendezvous server (its KV store) on loopback behind a Gate, as a master
    runs it with JOB_SECRET, and a counting proxy in front of the Gate."""
    from entrypoint.launchers.horovod.rendezvous_server import HorovodRendezvous
    from entrypoint.security.tunnel import Gated

    server = HorovodRendezvous(0, "127.0.0.1")
    server.start()
    port = socket.create_server(("127.0.0.1", 0)).getsockname()[1]
    said: list[str] = []
    gated = Gated(server, port, Identity.derive(SECRET).server_context(), said.append)
    proxy = CountingProxy(port)
    yield proxy, said
    proxy.close()
    gated.stop()


def put_and_get(port: int, key: str, value: bytes) -> bytes:
    """Horovod's own client, as its elastic workers use it: a new connection per request."""
    from horovod.runner.http.http_client import put_data_into_kvstore, read_data_from_kvstore

    put_data_into_kvstore("127.0.0.1", port, "scope", key, value)
    return read_data_from_kvstore("127.0.0.1", port, "scope", key)


def test_a_request_tunnel_carries_horovods_requests_over_one_kept_connection(horovod_behind_a_gate):
    from horovod.runner.http.http_client import read_data_from_kvstore
    proxy, _ = horovod_behind_a_gate
    tunnel = RequestTunnel("127.0.0.1", proxy.port, Identity.derive(SECRET).client_context()).start()
    try:
        for i in range(20):
            assert put_and_get(tunnel.port, f"k{i}", f"value {i}".encode()) == f"value {i}".encode()
        big = bytes(range(256)) * 4096                            # 1 MiB, as a pickled host list may grow
        assert put_and_get(tunnel.port, "big", big) == big
        with pytest.raises(RuntimeError, match="404"):            # a key not put: Horovod's answer, 404
            read_data_from_kvstore("127.0.0.1", tunnel.port, "scope", "never-put")
        assert proxy.connections == 1                             # 43 requests, one TLS handshake
    finally:
        tunnel.stop()
    plain = Tunnel("127.0.0.1", proxy.port, Identity.derive(SECRET).client_context()).start()
    try:
        put_and_get(plain.port, "k", b"v")
        assert proxy.connections == 1 + 2                         # the control: one per request
    finally:
        plain.stop()


def test_requests_at_once_each_get_their_own_answer(horovod_behind_a_gate):
    proxy, _ = horovod_behind_a_gate
    tunnel = RequestTunnel("127.0.0.1", proxy.port, Identity.derive(SECRET).client_context()).start()
    answers: dict[int, bytes] = {}

    def worker(i):
        for j in range(10):
            answers[i * 100 + j] = put_and_get(tunnel.port, f"w{i}-{j}", f"{i}:{j}".encode() * (i + 1))

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert answers == {i * 100 + j: f"{i}:{j}".encode() * (i + 1) for i in range(8) for j in range(10)}
        assert 1 <= proxy.connections <= 8                        # at most one per request in flight
    finally:
        tunnel.stop()


def test_a_kept_connection_that_was_cut_is_replaced_and_the_request_answered(horovod_behind_a_gate):
    proxy, _ = horovod_behind_a_gate
    tunnel = RequestTunnel("127.0.0.1", proxy.port, Identity.derive(SECRET).client_context()).start()
    try:
        assert put_and_get(tunnel.port, "before", b"1") == b"1"
        proxy.cut()
        time.sleep(0.2)
        assert put_and_get(tunnel.port, "after", b"2") == b"2"
        assert proxy.connections == 2
    finally:
        tunnel.stop()


def test_a_request_tunnel_with_another_secret_gets_no_answer(horovod_behind_a_gate):
    proxy, said = horovod_behind_a_gate
    other = Identity.derive(b"another-secret-of-32-characters!").client_context()
    tunnel = RequestTunnel("127.0.0.1", proxy.port, other).start()
    try:
        # The local connection is aborted: Horovod's client says so (RuntimeError) or
        # http.client does (RemoteDisconnected, a ConnectionError).
        with pytest.raises((RuntimeError, ConnectionError)):
            put_and_get(tunnel.port, "k", b"v")
        assert not said or "not this job's" in said[-1] or "left after taking the certificate" in said[-1]
        assert proxy.connections >= 1
    finally:
        tunnel.stop()


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


def test_held_refusal_counts_are_said_after_a_quiet_minute_without_a_new_refusal():
    lines: list[str] = []
    r = Refusals(lines.append, quiet_s=60)
    for t in range(4):
        r.refused("10.0.0.7", "no TLS handshake within 5s", now=float(t))
    r.flush(now=30.0)
    assert len(lines) == 1
    r.flush(now=61.0)
    assert len(lines) == 2 and lines[-1].startswith("refused 3 more connection(s) from 10.0.0.7") \
        and lines[-1].endswith("no TLS handshake within 5s")
    r.flush(now=200.0)
    assert len(lines) == 2


def test_the_relay_loops_errors_are_one_line_a_minute_per_kind():
    lines: list[str] = []
    errors = LoopErrors(lines.append, quiet_s=60)
    for _ in range(1000):
        errors(None, {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")})
    errors(None, {"message": "Task exception was never retrieved", "exception": ValueError("x")})
    assert len(lines) == 2 and "Too many open files" in lines[0] and "ValueError" in lines[1]


def test_refusal_reasons_in_words():
    assert refusal_reason(ConnectionAbortedError("SSL handshake is taking longer than 5.0 seconds: aborting the "
                                                 "connection")) == "no TLS handshake within 5s"
    assert "different JOB_SECRET" in refusal_reason(ssl.SSLCertVerificationError("certificate verify failed"))
    wrong_version = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    wrong_version.reason = "WRONG_VERSION_NUMBER"
    assert refusal_reason(wrong_version).startswith("it does not speak TLS")


def client_hello() -> bytes:
    """The first flight of a TLS client that checks nothing: what a stranger sends to get the certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    outgoing = ssl.MemoryBIO()
    client = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="stranger")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def reset(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def test_an_anonymous_handshake_that_takes_the_certificate_is_counted_and_a_port_probe_is_not(gate):
    g, said = gate
    socket.create_connection(("127.0.0.1", g.port)).close()                  # a port probe
    with socket.create_connection(("127.0.0.1", g.port), timeout=5) as conn:
        conn.sendall(client_hello())
        assert len(conn.recv(65536)) > 300                                     # the server's flight, its certificate in it
        reset(conn)
    deadline = time.monotonic() + 5
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said == ["refused a connection from 127.0.0.1 to the job's control plane: "
                    "it left after taking the certificate (an anonymous handshake, or a node whose JOB_SECRET differs)"]
    assert g.refusals.count == 1


def test_connections_past_the_waiting_cap_are_closed_at_once_and_a_tunnel_tries_again(gate):
    """An address holding MAX_WAITING_PER_ADDRESS silent connections gets no more; a node's
    Tunnel from that address gets in once one of them goes (its reset is tried again)."""
    g, said = gate
    silent = [socket.create_connection(("127.0.0.1", g.port)) for _ in range(tunnel.MAX_WAITING_PER_ADDRESS)]
    time.sleep(0.3)
    with socket.create_connection(("127.0.0.1", g.port), timeout=5) as extra:
        assert closed_unanswered(extra)                                        # closed on arrival
    good = Tunnel("127.0.0.1", g.port, Identity.derive(SECRET).client_context()).start()
    threading.Timer(0.5, lambda: [conn.close() for conn in silent]).start()
    with socket.create_connection(("127.0.0.1", good.port), timeout=5) as conn:
        conn.sendall(b"ping")
        assert conn.recv(16) == b"ping"
    good.stop()
    assert any(f"{tunnel.MAX_WAITING_PER_ADDRESS} connections from this address already wait" in line
               for line in said), said


def same_key_other_certificate(identity: Identity) -> bytes:
    """A certificate that the job's key signs but that is not the job's (serial 2): PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(identity.key_pem, None)
    mine = x509.load_pem_x509_certificate(identity.cert_pem)
    builder = (x509.CertificateBuilder().subject_name(mine.subject).issuer_name(mine.issuer)
               .public_key(key.public_key()).serial_number(2)
               .not_valid_before(mine.not_valid_before_utc).not_valid_after(mine.not_valid_after_utc))
    for extension in mine.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return builder.sign(key, None).public_bytes(serialization.Encoding.PEM)


def test_only_the_jobs_own_certificate_bytes_are_taken(gate, tmp_path):
    """Pinned: the peer's certificate must be the job's, byte for byte, not merely one its
    key signed (refused at verification, as the job's is no CA, or by the pin)."""
    g, said = gate
    identity = Identity.derive(SECRET)
    other = same_key_other_certificate(identity)

    class Held:
        def __init__(self, der):
            self.der = der

        def getpeercert(self, binary_form=False):
            return self.der

    context = identity.client_context()
    assert tunnel.pinned(Held(ssl.PEM_cert_to_DER_cert(identity.cert_pem.decode())), context)
    assert not tunnel.pinned(Held(ssl.PEM_cert_to_DER_cert(other.decode())), context)
    assert not tunnel.pinned(Held(None), context)
    chain = tmp_path / "other.pem"
    chain.write_bytes(identity.key_pem + other)
    forged = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    forged.check_hostname, forged.verify_mode = False, ssl.CERT_REQUIRED
    forged.load_verify_locations(cadata=identity.cert_pem.decode())
    forged.load_cert_chain(chain)
    handshake("127.0.0.1", g.port, forged)
    time.sleep(0.3)
    assert said and ("not this job's" in said[-1] or "byte for byte" in said[-1]), said


NOBODY = 65534
# A client in bash (readable by any user, unlike the test's venv): "ping" through the
# tunnel, then whatever comes back within 3 s.
PING = 'exec 3<>/dev/tcp/127.0.0.1/{port}; printf ping >&3; timeout 3 head -c 4 <&3'


@pytest.mark.skipif(os.getuid() != 0, reason="starting a process of another uid needs root")
def test_a_tunnel_carries_only_its_own_users_connections(gate):
    """Another uid in the node's network namespace (a sidecar, a --network host neighbour)
    cannot use a worker's tunnel to reach the master with the job's identity."""
    import subprocess

    g, _ = gate
    good = Tunnel("127.0.0.1", g.port, Identity.derive(SECRET).client_context()).start()
    try:
        mine = subprocess.run(["bash", "-c", PING.format(port=good.port)], capture_output=True, text=True,
                              timeout=30)
        other = subprocess.run(["bash", "-c", PING.format(port=good.port)], capture_output=True, text=True,
                               timeout=30, user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
        assert mine.stdout == "ping", mine.stdout + mine.stderr
        assert other.stdout == "", other.stdout + other.stderr
    finally:
        good.stop()


def test_the_owner_of_a_loopback_socket_is_the_kernels_answer_by_netlink_and_by_its_table():
    from entrypoint.security.local_peer import _diag_owner, _table_owner, socket_owner

    server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        with accepted:
            ends = client.getsockname(), server.getsockname()
            assert socket_owner(*ends) == _diag_owner(*ends) == _table_owner(*ends) == os.getuid()
            assert socket_owner(("127.0.0.1", 1), server.getsockname()) is None
