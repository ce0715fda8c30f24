"""The S3 client, from the standard AWS variables and credential chain, and its errors.

boto3 reads everything itself: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION,
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and the shared
files, web identity (EKS/IRSA: AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE), the instance's
metadata. Nothing here reads a credential, so none can reach a log line.
"""

from __future__ import annotations

import os

from ..contract.urls import BucketUrl

# Many small objects at once: one connection per transfer thread.
POOL = 96
DEFAULT_REGION = "us-east-1"     # S3-compatible stores take any; AWS S3 redirects


class StorageError(Exception):
    """A store's answer or silence, in one line (no credential in it)."""


def endpoint_of(env: dict[str, str]) -> str | None:
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def addressing_style(url: BucketUrl, style: str | None) -> str:
    return style or ("virtual" if url.scheme == "oss" else "auto")


def make_client(url: BucketUrl, env: dict[str, str], style: str | None = None, attempts: int = 6,
                connect_timeout: float = 5, read_timeout: float = 60):
    """An S3 client for `url`'s store; `attempts` per request (botocore's standard retry
    mode: backoff with jitter on throttling, 5xx and dropped connections)."""
    import boto3
    from botocore.config import Config
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    session = boto3.session.Session(region_name=region or None)
    if session.region_name is None:
        session = boto3.session.Session(region_name=DEFAULT_REGION)
    # Checksums where the store requires them only: every checkpoint file's SHA-256 is in
    # the manifest already, and botocore's default CRC32 of each upload costs a core.
    config = Config(max_pool_connections=POOL, connect_timeout=connect_timeout, read_timeout=read_timeout,
                    retries={"mode": "standard", "max_attempts": attempts}, tcp_keepalive=True,
                    s3={"addressing_style": addressing_style(url, style)},
                    request_checksum_calculation="when_required", response_checksum_validation="when_required")
    return session.client("s3", config=config)


def describe(exc: BaseException, env: dict[str, str] | None = None) -> str:
    """The store's error code and message, or what kept the request from it."""
    from botocore import exceptions as bx
    env = os.environ if env is None else env
    where = endpoint_of(env) or "AWS S3"
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {})
        code = err.get("Code") or str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?"))
        message = err.get("Message") or ""
        return f"{code}" + (f" ({message.rstrip('.')})" if message else "") + f" from {where}"
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return ("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or give the "
                "node a role (IRSA, an instance profile)")
    if isinstance(exc, (bx.ConnectTimeoutError, bx.ReadTimeoutError)):
        return f"{where} did not answer ({type(exc).__name__})"
    if isinstance(exc, bx.EndpointConnectionError):
        return f"cannot connect to {where}"
    if isinstance(exc, bx.BotoCoreError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return scrub(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}", env)[:300]


def scrub(text: str, env: dict[str, str]) -> str:
    """`text` with any credential this process holds blanked out (a client library's
    message might quote one)."""
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"):
        if len(env.get(name) or "") >= 8:
            text = text.replace(env[name], "***")
    return text
