"""A real etcd v3 cluster on loopback for tests: Debian's `etcd-server` (3.4), one process a
member, each on its own client and peer port; members can be stopped and started again."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

from .ports import free_port


def etcd_binary() -> str | None:
    return shutil.which("etcd")


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files in
    `folder`: {"ca", "server_cert", "server_key", "client_cert", "client_key"}."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool, usage=None, ips=()):
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if usage:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        if ips:
            builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(i))
                                                                         for i in ips]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    files = {}

    def write(label: str, obj) -> None:
        path = folder / f"{label}.pem"
        if hasattr(obj, "private_bytes"):
            path.write_bytes(obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        else:
            path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
        files[label] = path

    ca_key = ec.generate_private_key(ec.SECP256R1())
    write("ca", cert("test etcd CA", ca_key, "test etcd CA", ca_key, True))
    # etcd's v3 gateway dials its own gRPC server with the member's certificate: with
    # --client-cert-auth that one needs clientAuth beside serverAuth (else HTTP 503).
    for who, usage, ips in (("server", [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                             ("127.0.0.1",)),
                            ("client", [ExtendedKeyUsageOID.CLIENT_AUTH], ())):
        key = ec.generate_private_key(ec.SECP256R1())
        write(f"{who}_cert", cert(f"test etcd {who}", key, "test etcd CA", ca_key, False, usage, ips))
        write(f"{who}_key", key)
    return files


class EtcdCluster:
    def __init__(self, folder: Path, members: int = 3, tls: bool = False):
        """`tls`: clients speak TLS and must show a certificate from the cluster's CA
        (`certificates`: make_certificates' files)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.certificates = make_certificates(self.folder) if tls else None
        self.names = [f"m{i}" for i in range(members)]
        self.client = {n: free_port() for n in self.names}
        self.peer = {n: free_port() for n in self.names}
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def endpoints(self) -> list[str]:
        scheme = "https" if self.certificates else "http"
        return [f"{scheme}://127.0.0.1:{self.client[n]}" for n in self.names]

    def start(self, name: str | None = None) -> "EtcdCluster":
        """Every member (or one stopped member again), then wait until the cluster answers."""
        cluster = ",".join(f"{n}=http://127.0.0.1:{self.peer[n]}" for n in self.names)
        scheme = "https" if self.certificates else "http"
        tls = []
        if self.certificates:
            c = self.certificates
            tls = ["--cert-file", str(c["server_cert"]), "--key-file", str(c["server_key"]),
                   "--trusted-ca-file", str(c["ca"]), "--client-cert-auth"]
        for n in [name] if name else self.names:
            log = open(self.folder / f"{n}.log", "ab")
            self.procs[n] = subprocess.Popen(
                ["etcd", "--name", n, "--data-dir", str(self.folder / n),
                 "--listen-client-urls", f"{scheme}://127.0.0.1:{self.client[n]}",
                 "--advertise-client-urls", f"{scheme}://127.0.0.1:{self.client[n]}",
                 "--listen-peer-urls", f"http://127.0.0.1:{self.peer[n]}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer[n]}",
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--heartbeat-interval", "50", "--election-timeout", "500", *tls],
                stdout=log, stderr=subprocess.STDOUT)
        self.wait_healthy()
        return self

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for url in self.endpoints:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=1, context=self.client_context()) as r:
                        if b'"true"' in r.read():
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"etcd at {self.endpoints} not healthy after {timeout}s; see {self.folder}/*.log")

    def leader(self) -> str:
        """The name of the member that leads now."""
        import json
        for name in self.procs:
            url = f"{self.endpoints[self.names.index(name)]}/v3/maintenance/status"
            try:
                with urllib.request.urlopen(urllib.request.Request(url, data=b"{}"), timeout=2,
                                            context=self.client_context()) as r:
                    status = json.loads(r.read())
            except OSError:
                continue
            if status.get("leader") == status["header"]["member_id"]:
                return name
        raise RuntimeError("no member leads")

    def client_context(self):
        """An ssl context with the client certificate (None without TLS)."""
        if not self.certificates:
            return None
        import ssl
        c = self.certificates
        context = ssl.create_default_context(cafile=str(c["ca"]))
        context.load_cert_chain(str(c["client_cert"]), str(c["client_key"]))
        return context

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
