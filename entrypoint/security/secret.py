"""The job's shared secret (JOB_SECRET or JOB_SECRET_FILE) and the TLS it keys.

Every node of a job derives the same TLS identity from the secret and the job's RUN_ID:
scrypt (memory-hard, salted with the RUN_ID) turns them into an Ed25519 private key, and
that key signs one self-signed leaf certificate (not a CA: it signs nothing else). Each
side of a control-plane connection presents that certificate and trusts only it (TLS 1.3,
client certificates required), so a peer gets in only by holding the key, which only the
secret and the job's RUN_ID give. A guess at the secret costs a scrypt (about 0.07 s and
16 MiB), and what it costs serves one RUN_ID only. The cryptography is OpenSSL's (Python's
ssl and hashlib) and the `cryptography` package's; none of it is written here.

Only strong secrets are taken (`weakness`): what a generator makes (`disttrain secret`,
`openssl rand -hex 32`) passes, a word or a phrase of a few words does not. Reading the
file is the only thing here that touches the machine; `SecretError` carries the one line
naming the variable (never the secret itself).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
import re
import secrets
import ssl
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass

from ..contract.config import VARIABLES, Config, ConfigError, Secret

RULE = Secret.expected
SUGGESTION = "make one with `disttrain secret` (in the image) or `openssl rand -hex 32`"
# Fixed inputs of the derivation: changing any makes every node's identity differ from an
# older image's, so they are versioned.
KDF_SALT = b"disttrain control plane v3|run_id="
# libsodium's "interactive" scrypt limits (16 MiB): 0.07 s a guess here, paid once per node
# at start, where N=2^15 (32 MiB, 0.15 s) cost every node twice that on the start-up's
# critical path (docs/benchmarks.md). The rule above keeps secrets at 128 bits or more; the
# stretching is for those that pass it and are still guessable (a long phrase of words).
SCRYPT = dict(n=2**14, r=8, p=1, maxmem=32 * 2**20, dklen=32)
CERT_NAME = "disttrain-job"
DEFAULT_RUN_ID = next(v.default for v in VARIABLES if v.name == "RUN_ID")

_HEX = re.compile(rb"[0-9a-fA-F]+")
_BASE64 = re.compile(rb"[A-Za-z0-9+/_-]+=*")


def new_secret() -> str:
    """A secret of 256 bits from the operating system's generator, as 64 hex characters."""
    return secrets.token_hex(32)


def weakness(secret: bytes) -> str | None:
    """Why the secret is too weak to key the job, or None. The rule users can follow: what
    a generator makes (hex of 16 bytes or more, base64 of 16 bytes or more) passes; any
    other secret must be long and varied; none may be one short piece repeated."""
    distinct = len(set(secret))
    unit = (secret + secret).find(secret, 1)            # the shortest piece it is a repetition of
    if unit < len(secret):
        return f"it repeats {unit} character(s)"
    digits = secret.replace(b"-", b"").replace(b":", b"")          # a UUID's dashes, a digest's colons
    if _HEX.fullmatch(digits):
        return None if len(digits) >= 32 and len(set(digits)) >= 8 else f"{len(digits)} hex digits"
    if _BASE64.fullmatch(secret):
        body = secret.rstrip(b"=")
        mixed = all(re.search(c, body) for c in (rb"[A-Z]", rb"[a-z]", rb"[0-9]"))
        if len(body) >= 22 and mixed and distinct >= 12:
            return None
        if len(secret) < 40:
            return (f"{len(body)} base64 characters" if mixed else
                    f"{len(secret)} characters of {distinct} different ones")
    if len(secret) >= 40 and distinct >= 16:
        return None
    return f"{len(secret)} characters of {distinct} different ones"


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
        raise SecretError(f"{where}: the secret is empty; allowed: {RULE}; {SUGGESTION}")
    why = weakness(secret)
    if why is not None:
        raise SecretError(f"{where}: the secret is too weak to keep strangers out ({why}); allowed: {RULE}; "
                          f"{SUGGESTION}")
    return secret


class JobContext(ssl.SSLContext):
    """An SSLContext that also knows the job's certificate (DER): what every peer must
    present, byte for byte (tunnel.pinned)."""
    certificate: bytes = b""


@dataclass(frozen=True)
class Identity:
    """The job's TLS identity: the PEM of its key and of its one certificate."""
    key_pem: bytes
    cert_pem: bytes

    @staticmethod
    @functools.lru_cache(maxsize=8)            # a process derives its job's identity once
    def derive(secret: bytes, run_id: str = DEFAULT_RUN_ID) -> "Identity":
        """The identity of the job `run_id` (RUN_ID) keyed by `secret`: two jobs that share a
        secret but not a RUN_ID refuse each other's nodes."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.x509.oid import NameOID

        seed = hashlib.scrypt(secret, salt=KDF_SALT + run_id.encode(), **SCRYPT)
        key = Ed25519PrivateKey.from_private_bytes(seed)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CERT_NAME)])
        # Ed25519 signatures are deterministic and every field is fixed: every node builds
        # the same certificate, byte for byte.
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(1)
                .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
                .not_valid_after(dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
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
        ctx = JobContext(protocol)
        ctx.certificate = ssl.PEM_cert_to_DER_cert(self.cert_pem.decode())
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


class Deriving:
    """The job's Identity while a thread of its own derives it; used as one (its contexts
    wait for the derivation). hashlib's scrypt releases the GIL, and a node's first use of
    the contexts comes after it has imported torch (the job store's client, a second or
    more), so the scrypt runs alongside that import instead of before it. An
    error in the derivation is raised where the identity is first used."""

    def __init__(self, secret: bytes, run_id: str = DEFAULT_RUN_ID):
        self._identity: Future = Future()
        threading.Thread(target=self._derive, args=(secret, run_id), name="derive-identity", daemon=True).start()

    def _derive(self, secret: bytes, run_id: str) -> None:
        try:
            self._identity.set_result(Identity.derive(secret, run_id))
        except BaseException as exc:           # handed to whoever waits for it
            self._identity.set_exception(exc)

    def identity(self) -> Identity:
        return self._identity.result()

    def server_context(self) -> ssl.SSLContext:
        return self.identity().server_context()

    def client_context(self) -> ssl.SSLContext:
        return self.identity().client_context()
