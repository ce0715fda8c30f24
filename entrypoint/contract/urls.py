"""Bucket URLs in DATA_DIR and CHECKPOINT_DIR: `s3://bucket/prefix`, checked here, pure.

Every S3-compatible store takes the s3:// form (AWS S3, MinIO, SeaweedFS, Ceph RGW, and
Alibaba OSS and Google Cloud Storage through their S3-compatible endpoints, named by
AWS_ENDPOINT_URL: docs/storage.md). `oss://bucket/prefix` is the same with OSS's addressing
(virtual-hosted) as the default. A value without a scheme is a folder, as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCHEMES = ("s3", "oss")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


class UrlError(ValueError):
    """What is wrong with a URL, in words for the one-line error."""


@dataclass(frozen=True)
class BucketUrl:
    scheme: str
    bucket: str
    prefix: str            # "" or "some/prefix/" (always ending in "/")

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    def key(self, relative: str) -> str:
        """The object key of `relative` (a path under the prefix, with "/")."""
        return self.prefix + relative

    def relative(self, key: str) -> str:
        return key[len(self.prefix):]

    @property
    def local_name(self) -> str:
        """A folder name for this URL's node-local copy: bucket/prefix."""
        return f"{self.bucket}/{self.prefix}".rstrip("/")


def has_scheme(text: str) -> bool:
    return _SCHEME_RE.match(text.strip()) is not None


def parse_bucket_url(text: str) -> BucketUrl:
    """`s3://bucket[/prefix]` or `oss://...`; UrlError with what is allowed otherwise."""
    m = _SCHEME_RE.match(text.strip())
    if m is None:
        raise UrlError("not a URL")
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme not in SCHEMES:
        raise UrlError(f"scheme {scheme}:// is not supported; allowed: a folder, s3://BUCKET/PREFIX "
                       f"(any S3-compatible store, with AWS_ENDPOINT_URL), oss://BUCKET/PREFIX")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET_RE.match(bucket) or ".." in bucket:
        raise UrlError(f"bucket {bucket!r} is not a bucket name (3-63 lower-case letters, digits, '.', '-')")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts) or "//" in prefix.strip("/"):
        raise UrlError(f"prefix {prefix!r} has empty, '.' or '..' parts")
    return BucketUrl(scheme, bucket, "".join(p + "/" for p in parts))


# --------------------------------------------------------------------------- JOB_STORE
STORE_SCHEMES = ("etcd",)
_MEMBER_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):(\d{1,5})$")


def parse_store_url(text: str) -> tuple[str, ...]:
    """`etcd://HOST:PORT[,HOST:PORT...]`, an etcd v3 cluster's members: their client URLs
    (http://HOST:PORT), in the order given; UrlError with what is allowed otherwise."""
    m = _SCHEME_RE.match(text.strip())
    allowed = "allowed: etcd://HOST:PORT[,HOST:PORT...] (the client addresses of an etcd v3 cluster's members)"
    if m is None:
        raise UrlError(f"not a URL; {allowed}")
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme not in STORE_SCHEMES:
        raise UrlError(f"scheme {scheme}:// is not supported; {allowed}")
    members = [part.strip() for part in rest.rstrip("/").split(",")]
    for member in members:
        found = _MEMBER_RE.match(member)
        if found is None or not 0 < int(found.group(2)) < 65536:
            raise UrlError(f"member {member!r} is not HOST:PORT (a port 1-65535); {allowed}")
    if len(set(members)) != len(members):
        raise UrlError(f"a member is named twice; {allowed}")
    return tuple(f"http://{member}" for member in members)
