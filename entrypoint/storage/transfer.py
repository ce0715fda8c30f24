"""Many objects at once, in parallel and in parts (s3transfer, boto3's own transfer engine),
with one progress line at most every few seconds and a summary."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..contract.urls import BucketUrl

CONCURRENCY = 32
PART = 16 * 2**20            # multipart threshold and part size
EVERY_S = 5.0                # at most one progress line this often


@dataclass(frozen=True)
class Obj:
    key: str
    size: int
    etag: str


def list_objects(client, url: BucketUrl, under: str = "") -> list[Obj]:
    """Every object under the URL's prefix (+ `under`), folder markers left out."""
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=url.prefix + under):
        for o in page.get("Contents", []):
            if not o["Key"].endswith("/"):
                found.append(Obj(o["Key"], int(o["Size"]), o.get("ETag", "").strip('"')))
    return found


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


class Progress:
    """Counts bytes and files across the transfer threads; `say` gets a line at most every
    EVERY_S seconds (files, bytes, MB/s, ETA)."""

    def __init__(self, what: str, files: int, total: int, say: Callable[[str], None], every: float = EVERY_S):
        self.what, self.files, self.total, self.say, self.every = what, files, total, say, every
        self.done_files = 0
        self.done_bytes = 0
        self.started = time.monotonic()
        self._last = self.started
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done_bytes += n

    def file_done(self) -> None:
        with self._lock:
            self.done_files += 1

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def rate(self) -> float:
        return self.done_bytes / max(self.elapsed, 1e-6)

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last < self.every:
            return
        self._last = now
        rate = self.rate()
        eta = (self.total - self.done_bytes) / rate if rate > 0 else float("inf")
        eta_text = f"{eta:.0f}s" if eta != float("inf") else "?"
        self.say(f"{self.what}: {self.done_files}/{self.files} files, {mib(self.done_bytes)}/{mib(self.total)}, "
                 f"{rate / 1e6:.1f} MB/s, ETA {eta_text}")


class _Counting:
    """An s3transfer subscriber feeding a Progress."""

    def __init__(self, progress: Progress | None):
        self.progress = progress

    def on_queued(self, **kwargs) -> None:
        pass

    def on_progress(self, bytes_transferred: int = 0, **kwargs) -> None:
        if self.progress:
            self.progress.add(bytes_transferred)

    def on_done(self, future=None, **kwargs) -> None:
        if self.progress:
            self.progress.file_done()


class Transfers:
    """One s3transfer TransferManager for a node: downloads and uploads of many files."""

    def __init__(self, client, concurrency: int = CONCURRENCY, part: int = PART):
        from s3transfer.manager import TransferConfig, TransferManager
        config = TransferConfig(multipart_threshold=part, multipart_chunksize=part,
                                max_request_concurrency=concurrency, max_submission_concurrency=8,
                                num_download_attempts=5, io_chunksize=256 * 1024)
        self.client = client
        self.manager = TransferManager(client, config)

    def download(self, bucket: str, items: list[tuple[str, str]], progress: Progress | None = None,
                 until: Callable[[], bool] | None = None) -> list[tuple[str, BaseException]]:
        """(key, local path) each; returns the (key, error) of those that failed. The files
        appear under their names only when complete (s3transfer renames into place)."""
        for _, path in items:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        futures = [(key, self.manager.download(bucket, key, path, subscribers=[_Counting(progress)]))
                   for key, path in items]
        return self._wait(futures, progress, until)

    def upload(self, bucket: str, items: list[tuple[str, str]], progress: Progress | None = None,
               until: Callable[[], bool] | None = None) -> list[tuple[str, BaseException]]:
        """(local path, key) each; returns the (key, error) of those that failed."""
        futures = [(key, self.manager.upload(path, bucket, key, subscribers=[_Counting(progress)]))
                   for path, key in items]
        return self._wait(futures, progress, until)

    def _wait(self, futures, progress: Progress | None, until) -> list[tuple[str, BaseException]]:
        failed = []
        for key, future in futures:
            while not future.done():
                if until is not None and until():
                    future.cancel()
                    break
                if progress:
                    progress.tick()
                time.sleep(0.05)
            try:
                future.result()
            except BaseException as exc:     # CancelledError too: counted as not transferred
                failed.append((key, exc))
        return failed

    def close(self) -> None:
        self.manager.shutdown(cancel=True)
