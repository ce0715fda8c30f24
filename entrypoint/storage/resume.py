"""CHECKPOINT_DIR=s3://...: before the ranks start, each node fetches what a resume needs
(manifest.resume_set) into its local folder, checks every file's SHA-256 against the
manifest, and records them in the local index, so the mirror does not upload them again.
A fresh node, with an empty disk, resumes where the job stopped."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Callable

from ..contract.urls import BucketUrl
from . import manifest
from .client import StorageError, describe
from .transfer import Progress, Transfers, list_objects, mib

HASH_BLOCK = 4 * 2**20


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def read_manifests(client, url: BucketUrl) -> dict[int, dict[str, manifest.Entry]]:
    """node -> its files, as every node's manifest in the bucket lists them."""
    found = {}
    for obj in list_objects(client, url, manifest.NODES):
        name = obj.key.rsplit("/", 1)[-1]
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        body = client.get_object(Bucket=url.bucket, Key=obj.key)["Body"].read()
        try:
            found[int(name[:-5])] = manifest.decode(body)
        except (ValueError, KeyError, TypeError) as exc:
            raise StorageError(f"CHECKPOINT_DIR={str(url)!r}: {obj.key!r} is not a manifest ({exc})") from None
    return found


@dataclass(frozen=True)
class Resumed:
    units: tuple[str, ...]          # the checkpoints taken (top-level names), or every file's
    files: int
    fetched: int
    fetched_bytes: int
    seconds: float


def fetch_for_resume(client, url: BucketUrl, folder: str, say: Callable[[str], None], env: dict[str, str]) -> Resumed:
    os.makedirs(folder, exist_ok=True)
    try:
        listed = manifest.merge(list(read_manifests(client, url).values()))
    except StorageError:
        raise
    except Exception as exc:
        raise StorageError(f"CHECKPOINT_DIR={str(url)!r}: cannot read its manifests: {describe(exc, env)}") from None
    wanted = manifest.resume_set(listed)
    if not wanted:
        say(f"checkpoints: {str(url)} holds no complete checkpoint yet: the script starts fresh (folder {folder})")
        return Resumed((), 0, 0, 0, 0.0)
    index = manifest.read_local_index(folder)
    todo = []
    for rel, entry in sorted(wanted.items()):
        path = os.path.join(folder, rel)
        known = index.get(rel)
        try:
            st = os.stat(path)
            if known and known[:2] == [st.st_size, st.st_mtime_ns] and entry.accepts(st.st_size, known[2]):
                continue
        except OSError:
            pass
        todo.append((rel, entry))
    total = sum(e.size for _, e in todo)
    progress = Progress("checkpoints", len(todo), total, say)
    if todo:
        failed = Transfers(client, url.bucket).download([(url.key(rel), os.path.join(folder, rel)) for rel, _ in todo],
                                                        progress, sizes={url.key(rel): e.size for rel, e in todo})
        if failed:
            key, exc = failed[0]
            raise StorageError(f"CHECKPOINT_DIR={str(url)!r}: {len(failed)} of {len(todo)} files of the checkpoint "
                               f"not fetched; first {key!r}: {describe(exc, env)}")
        for rel, entry in todo:
            path = os.path.join(folder, rel)
            if not entry.accepts(os.path.getsize(path), digest := sha256_of(path)):
                os.unlink(path)
                raise StorageError(f"CHECKPOINT_DIR={str(url)!r}: {url.key(rel)!r} does not match its manifest "
                                   f"(SHA-256 {digest[:12]}..., expected {entry.sha256[:12]}...): not resumed")
            st = os.stat(path)
            index[rel] = [st.st_size, st.st_mtime_ns, digest]
        manifest.write_local_index(folder, index)
    units = tuple(sorted({rel.split("/", 1)[0] for rel in wanted}))
    shown = ", ".join(units[:4]) + (f" and {len(units) - 4} more" if len(units) > 4 else "")
    say(f"checkpoints: resuming from {str(url)}: {shown}; fetched {len(todo)} of {len(wanted)} files "
        f"({mib(total)}) in {progress.elapsed:.1f}s into {folder}")
    return Resumed(units, len(wanted), len(todo), total, progress.elapsed)
