"""DATA_DIR=s3://...: the prefix staged into this node's folder in CACHE_DIR before its ranks
start, once per node.

An index beside the files (size and ETag of each object as it was fetched) lets a restarted,
requeued or elastic-joining node fetch only what it lacks or what changed; files the bucket
no longer has are removed. Free space is checked against the listing first. Two nodes on one
host that share CACHE_DIR stage one after the other (a lock), the second fetching nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import posixpath
import shutil
from dataclasses import dataclass
from typing import Callable

from ..contract.config import ConfigError
from ..contract.urls import BucketUrl
from .client import StorageError, describe
from .transfer import Obj, Progress, Transfers, mib

INDEX = ".disttrain-cache.json"
LOCK = ".disttrain-cache.lock"
SPARE = 64 * 2**20          # left free on the cache's disk beyond the data


@dataclass(frozen=True)
class StagePlan:
    fetch: tuple[tuple[str, Obj], ...]      # (relative path, object) to download
    kept: tuple[tuple[str, Obj], ...]       # already cached, same size and ETag
    remove: tuple[str, ...]                 # cached files the bucket no longer has

    @property
    def fetch_bytes(self) -> int:
        return sum(o.size for _, o in self.fetch)

    @property
    def kept_bytes(self) -> int:
        return sum(o.size for _, o in self.kept)


def relative_path(url: BucketUrl, key: str) -> str:
    """The key's path under the prefix; StorageError for one that would leave the folder."""
    rel = url.relative(key)
    norm = posixpath.normpath(rel)
    if rel.startswith("/") or norm.startswith("..") or norm in (".", "") or norm in (INDEX, LOCK):
        raise StorageError(f"object {key!r} cannot be a file under the data folder")
    return norm


def plan_stage(url: BucketUrl, listing: list[Obj], index: dict[str, list], on_disk: Callable[[str], int | None]) -> StagePlan:
    """What to fetch, keep and remove: pure. `index`: relative path -> [size, etag] as
    fetched before; `on_disk(rel)`: the cached file's size, or None."""
    fetch, kept, seen = [], [], set()
    for obj in listing:
        rel = relative_path(url, obj.key)
        seen.add(rel)
        cached = index.get(rel)
        if cached and cached == [obj.size, obj.etag] and on_disk(rel) == obj.size:
            kept.append((rel, obj))
        else:
            fetch.append((rel, obj))
    return StagePlan(tuple(fetch), tuple(kept), tuple(sorted(set(index) - seen)))


@dataclass(frozen=True)
class Staged:
    files: int
    fetched: int
    fetched_bytes: int
    kept: int
    seconds: float


def _read_index(folder: str) -> dict[str, list]:
    try:
        with open(os.path.join(folder, INDEX)) as f:
            data = json.load(f)
        return {k: list(v) for k, v in data.get("files", {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _write_index(folder: str, url: BucketUrl, files: dict[str, list]) -> None:
    tmp = os.path.join(folder, f".{INDEX}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"url": str(url), "files": files}, f)
    os.replace(tmp, os.path.join(folder, INDEX))


def _size(folder: str, rel: str) -> int | None:
    try:
        return os.stat(os.path.join(folder, rel)).st_size
    except OSError:
        return None


def stage_data(client, url: BucketUrl, folder: str, say: Callable[[str], None], env: dict[str, str],
               until: Callable[[], bool] | None = None) -> Staged:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, LOCK), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _stage_locked(client, url, folder, say, env, until)


def _stage_locked(client, url, folder, say, env, until) -> Staged:
    transfers = Transfers(client, url.bucket)
    try:
        listing = transfers.list(url)
    except Exception as exc:
        raise StorageError(f"DATA_DIR={str(url)!r}: cannot list it: {describe(exc, env)}") from None
    index = _read_index(folder)
    plan = plan_stage(url, listing, index, lambda rel: _size(folder, rel))
    free = shutil.disk_usage(folder).free
    if plan.fetch_bytes + SPARE > free:
        raise ConfigError(f"CACHE_DIR={folder!r}: {mib(free)} free, DATA_DIR={str(url)!r} needs "
                          f"{mib(plan.fetch_bytes)} more; mount a larger volume at CACHE_DIR")
    for rel in plan.remove:
        try:
            os.unlink(os.path.join(folder, rel))
        except FileNotFoundError:
            pass
    files = {rel: [o.size, o.etag] for rel, o in plan.kept}
    progress = Progress("data", len(plan.fetch), plan.fetch_bytes, say)
    if plan.fetch:
        say(f"data: staging {str(url)} into {folder}: {len(plan.fetch)} files, {mib(plan.fetch_bytes)} to fetch, "
            f"{len(plan.kept)} already cached")
        failed = transfers.download([(o.key, os.path.join(folder, rel)) for rel, o in plan.fetch],
                                                        progress, until, sizes={o.key: o.size for _, o in plan.fetch})
        bad = {key for key, _ in failed}
        files.update({rel: [o.size, o.etag] for rel, o in plan.fetch if o.key not in bad})
        _write_index(folder, url, files)
        if failed:
            key, exc = failed[0]
            raise StorageError(f"DATA_DIR={str(url)!r}: {len(failed)} of {len(plan.fetch)} objects not fetched; "
                               f"first {key!r}: {describe(exc, env)}")
    else:
        _write_index(folder, url, files)
    staged = Staged(len(listing), len(plan.fetch), plan.fetch_bytes, len(plan.kept), progress.elapsed)
    rate = f", {plan.fetch_bytes / max(staged.seconds, 1e-6) / 1e6:.1f} MB/s" if plan.fetch else ""
    say(f"data: {str(url)} staged in {folder}: {staged.files} files, fetched {staged.fetched} "
        f"({mib(staged.fetched_bytes)}) in {staged.seconds:.1f}s{rate}, {staged.kept} already cached")
    return staged
