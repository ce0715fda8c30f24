"""Before anything starts: the store answers, the bucket exists, the credentials hold, and
this node may read the data (a listing) and write the checkpoints (a small probe object,
removed). Each failure is one ConfigError naming the variable, the URL and the store's code.
A store that does not answer yet (one started beside the job, or restarted with it: a
SeaweedFS whose filer is still loading) is waited for up to RDZV_TIMEOUT, as a worker waits
for its master, with a line when the wait begins and every WAIT_LINE_S after."""

from __future__ import annotations

import time
import uuid
from typing import Callable

from ..contract.config import ConfigError
from ..contract.urls import BucketUrl
from .client import describe

PROBE_PREFIX = ".disttrain/probe-"
WAIT_LINE_S = 30.0


class Wait:
    """How long a probe retries an endpoint that cannot be reached, and what it says while
    it does (once when the wait begins, then every WAIT_LINE_S)."""

    def __init__(self, seconds: float, name: str, waiting: Callable[[str], None] = lambda line: None):
        self.seconds, self.name, self.waiting = seconds, name, waiting

    def answered(self, request: Callable[[], object], env: dict[str, str]):
        """`request()`, retried while the endpoint cannot be reached, for up to `seconds`."""
        from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError
        started = time.monotonic()
        said_at = None
        while True:
            try:
                return request()
            except (EndpointConnectionError, ConnectTimeoutError) as exc:
                now = time.monotonic()
                if now - started >= self.seconds:
                    raise
                if said_at is None or now - said_at >= WAIT_LINE_S:
                    said_at = now
                    self.waiting(f"storage: {self.name}: {describe(exc, env)} yet; waiting up to "
                                 f"RDZV_TIMEOUT={self.seconds:g}s ({now - started:.0f}s so far)")
                time.sleep(1.0)


NO_WAIT = Wait(0.0, "")


def check_readable(client, url: BucketUrl, name: str, env: dict[str, str], wait: Wait = NO_WAIT) -> None:
    try:
        listed = wait.answered(lambda: client.list_objects_v2(Bucket=url.bucket, Prefix=url.prefix, MaxKeys=1), env)
    except Exception as exc:
        raise ConfigError(f"{name}={str(url)!r}: cannot list it: {describe(exc, env)}") from None
    if name == "DATA_DIR" and not listed.get("KeyCount"):
        raise ConfigError(f"{name}={str(url)!r}: no objects under this prefix (bucket {url.bucket!r} "
                          f"exists); check the prefix")


def check_writable(client, url: BucketUrl, name: str, env: dict[str, str], wait: Wait = NO_WAIT) -> None:
    key = url.key(PROBE_PREFIX + uuid.uuid4().hex)
    try:
        wait.answered(lambda: client.put_object(Bucket=url.bucket, Key=key, Body=b"disttrain write check\n"), env)
    except Exception as exc:
        raise ConfigError(f"{name}={str(url)!r}: cannot write to it: {describe(exc, env)}") from None
    try:
        client.delete_object(Bucket=url.bucket, Key=key)
    except Exception as exc:
        raise ConfigError(f"{name}={str(url)!r}: can write but not delete (keep-last-N pruning needs it): "
                          f"{describe(exc, env)}") from None
