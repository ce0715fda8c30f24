"""Before anything starts: the store answers, the bucket exists, the credentials hold, and
this node may read the data (a listing) and write the checkpoints (a small probe object,
removed). Each failure is one ConfigError naming the variable, the URL and the store's code.
A store that does not answer yet (one started beside the job) is given STORE_WAIT_S, or
RDZV_TIMEOUT if that is shorter."""

from __future__ import annotations

import time
import uuid
from typing import Callable

from ..contract.config import ConfigError
from ..contract.urls import BucketUrl
from .client import describe

PROBE_PREFIX = ".disttrain/probe-"
STORE_WAIT_S = 20.0


def answered(request: Callable[[], object], wait: float = STORE_WAIT_S):
    """`request()`, retried while the endpoint cannot be reached, for up to `wait` seconds."""
    from botocore.exceptions import ConnectTimeoutError, EndpointConnectionError
    deadline = time.monotonic() + wait
    while True:
        try:
            return request()
        except (EndpointConnectionError, ConnectTimeoutError):
            if time.monotonic() >= deadline:
                raise
            time.sleep(1.0)


def check_readable(client, url: BucketUrl, name: str, env: dict[str, str], wait: float = STORE_WAIT_S) -> None:
    try:
        listed = answered(lambda: client.list_objects_v2(Bucket=url.bucket, Prefix=url.prefix, MaxKeys=1), wait)
    except Exception as exc:
        raise ConfigError(f"{name}={str(url)!r}: cannot list it: {describe(exc, env)}") from None
    if name == "DATA_DIR" and not listed.get("KeyCount"):
        raise ConfigError(f"{name}={str(url)!r}: no objects under this prefix (bucket {url.bucket!r} "
                          f"exists); check the prefix")


def check_writable(client, url: BucketUrl, name: str, env: dict[str, str], wait: float = STORE_WAIT_S) -> None:
    key = url.key(PROBE_PREFIX + uuid.uuid4().hex)
    try:
        answered(lambda: client.put_object(Bucket=url.bucket, Key=key, Body=b"disttrain write check\n"), wait)
    except Exception as exc:
        raise ConfigError(f"{name}={str(url)!r}: cannot write to it: {describe(exc, env)}") from None
    try:
        client.delete_object(Bucket=url.bucket, Key=key)
    except Exception as exc:
        raise ConfigError(f"{name}={str(url)!r}: can write but not delete (keep-last-N pruning needs it): "
                          f"{describe(exc, env)}") from None
