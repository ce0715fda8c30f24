"""The job's shared secret (JOB_SECRET or JOB_SECRET_FILE) and the TLS it keys.

Every node of a job derives the same TLS identity from the secret: HKDF-SHA256 turns it into
an Ed25519 private key, and that key signs one self-signed certificate. Each side of a
control-plane connection presents that certificate and trusts only it (TLS 1.3, client
certificates required), so a peer gets in only by holding the key, which only the secret
gives. The cryptography is OpenSSL's (Python's ssl) and the `cryptography` package's; none
of it is written here.

Reading the file is the only thing here that touches the machine; `SecretError` carries the
one line naming the variable (never the secret itself).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import ssl
import tempfile
from dataclasses import dataclass

from ..contract.config import VARIABLES, Config, ConfigError

MIN_SECRET_CHARS = next(v.kind.low for v in VARIABLES if v.name == "JOB_SECRET")
SUGGESTION = "e.g. `openssl rand -hex 32`"
# Fixed inputs of the derivation: changing either makes every node's identity differ from
# an older image's, so they are versioned.
HKDF_SALT = b"disttrain control plane"
HKDF_INFO = b"ed25519 identity v1"
CERT_NAME = "disttrain-job"


class SecretError(ConfigError):
    """A bad JOB_SECRET or JOB_SECRET_FILE: one line, exit 2."""


def read_secret(config: Config) -> bytes | None:
    """The job's secret, or None when neither variable is set."""
    if config.job_secret is not None and config.job_secret_file is not None:
        raise SecretError("JOB_SECRET and JOB_SECRET_FILE are both set; set one of them")
    if config.job_secret_file is not None:
        path = config.job_secret_file
        try:
            with open(path, "rb") as f:
                text = f.read()
        except OSError as exc:
            raise SecretError(f"JOB_SECRET_FILE={path!r}: cannot read it ({exc.strerror or exc}); mount the "
                              f"secret there (compose/Swarm `secrets:`, a Kubernetes Secret volume)") from None
        return _checked(text.rstrip(b"\r\n"), f"JOB_SECRET_FILE={path!r}")
    if config.job_secret is not None:
        return _checked(config.job_secret.encode(), "JOB_SECRET")
    return None


def _checked(secret: bytes, where: str) -> bytes:
    if not secret.strip():
        raise SecretError(f"{where}: the secret is empty; allowed: at least {MIN_SECRET_CHARS} characters "
                          f"({SUGGESTION})")
    if len(secret) < MIN_SECRET_CHARS:
        raise SecretError(f"{where}: the secret has {len(secret)} characters; allowed: at least "
                          f"{MIN_SECRET_CHARS} ({SUGGESTION})")
    return secret


@dataclass(frozen=True)
class Identity:
    """The job's TLS identity: the PEM of its key and of its one certificate."""
    key_pem: bytes
    cert_pem: bytes

    @staticmethod
    def derive(secret: bytes) -> "Identity":
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
        from cryptography.x509.oid import NameOID

        seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=HKDF_SALT, info=HKDF_INFO).derive(secret)
        key = Ed25519PrivateKey.from_private_bytes(seed)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CERT_NAME)])
        # Ed25519 signatures are deterministic and every field is fixed: every node builds
        # the same certificate, byte for byte.
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(1)
                .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
                .not_valid_after(dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .sign(key, None))
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return Identity(key_pem, cert.public_bytes(serialization.Encoding.PEM))

    # Each context is made once (it loads the key from a file): a worker probes its master
    # every 0.2 s until it answers, and one SSLContext serves any number of connections.
    @functools.cached_property
    def _server(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    @functools.cached_property
    def _client(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def server_context(self) -> ssl.SSLContext:
        return self._server

    def client_context(self) -> ssl.SSLContext:
        return self._client

    def _context(self, protocol: int) -> ssl.SSLContext:
        ctx = ssl.SSLContext(protocol)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False             # the peer is whoever holds the key, under any address
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=self.cert_pem.decode())
        # ssl loads a key only from a file: a private one in memory-backed /dev/shm where it
        # exists, removed as soon as it is read.
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="disttrain-tls-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.key_pem + self.cert_pem)
            ctx.load_cert_chain(path)
        finally:
            os.unlink(path)
        return ctx
