"""Many objects at once, in parallel, through one connection pool (obstore: Rust's
object_store for Python), with boto3's credential chain; one progress line at most every
few seconds. Listings are obstore's too (size and ETag), boto3's paginator where
object_store will not take a key as a path."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..contract.urls import BucketUrl

CONCURRENCY = 64
PART = 16 * 2**20            # multipart threshold and part size
STREAMS_PER_FILE = 5         # parts of one file in flight at once (s5cmd's default too)
CHUNK = 2**20                # a part's bytes are written as they come, this much at a time
WRITE_SLICE = 256 * 1024     # one pwrite's most: the file's lock is held this long at a time
EVERY_S = 5.0                # at most one progress line this often


@dataclass(frozen=True)
class Obj:
    key: str
    size: int
    etag: str


def list_objects(client, url: BucketUrl, under: str = "") -> list[Obj]:
    """Every object under the URL's prefix (+ `under`), folder markers left out, through
    boto3 (any key; Transfers.list is faster where object_store takes the keys)."""
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


def open_store(client, bucket: str):
    """An obstore S3Store for `bucket` that reaches the store as `client` does: its
    endpoint, region and addressing style, and boto3's credential chain for the keys."""
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider
    from obstore.store import S3Store

    meta = client.meta
    endpoint = meta.endpoint_url
    custom = not endpoint.endswith(".amazonaws.com")
    style = (meta.config.s3 or {}).get("addressing_style", "auto")
    options = {"connect_timeout": "5s", "timeout": "600s", "pool_max_idle_per_host": str(CONCURRENCY),
               "allow_http": endpoint.startswith("http://")}
    if os.environ.get("AWS_CA_BUNDLE"):                  # a private CA, as boto3 reads it
        try:
            with open(os.environ["AWS_CA_BUNDLE"], "rb") as f:
                options["root_certificate"] = f.read()
        except OSError:
            pass
    provider = Boto3CredentialProvider(boto3.session.Session(region_name=meta.region_name))
    return S3Store(bucket, endpoint=endpoint if custom else None, region=meta.region_name,
                   virtual_hosted_style_request=style == "virtual" or (style == "auto" and not custom),
                   client_options=options, retry_config={"max_retries": 5}, credential_provider=provider)


def lower_priority(nice: int) -> None:
    """This thread, and obstore's runtime threads (tokio's), behind the training for the CPU."""
    ids = [threading.get_native_id()]
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().startswith("tokio"):
                    ids.append(int(task))
    except OSError:
        pass
    for tid in ids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS, tid)))
        except OSError:
            pass


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """All of `data` at `offset`, WRITE_SLICE at a time. A buffered write holds the file's
    inode lock for its whole length, and every part of a file writes to the same inode:
    five streams into one 1 GiB object took 1.98 s with 1 MiB writes, 1.13 s with 256 KiB
    writes (s5cmd, whose writes are small, 1.0 s)."""
    while data:
        n = os.pwrite(fd, data[:WRITE_SLICE], offset)
        data, offset = data[n:], offset + n


class Cancelled(Exception):
    """The transfer was stopped (the end came first)."""


class _Landing:
    """One file being downloaded: its temporary name, opened once whichever part comes
    first, renamed into place when the last part has landed, removed if any part failed."""

    def __init__(self, key: str, path: str, size: int | None, part: int):
        self.key, self.path, self.size = key, path, size
        self.parts = [(s, min(s + part, size)) for s in range(0, size, part)] \
            if size is not None and size > part else [(None, None)]
        self.unstarted = list(self.parts)
        self.left = len(self.parts)
        self.error: BaseException | None = None
        self.tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.part-{os.getpid()}")
        self._fd: int | None = None
        self._lock = threading.Lock()

    def open(self) -> int:
        with self._lock:
            if self._fd is None:
                self._fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                if self.size is not None and len(self.parts) > 1:
                    os.ftruncate(self._fd, self.size)
            return self._fd

    def part_done(self, error: BaseException | None) -> bool:
        """Count a part (from the waiting thread); True when the file is settled."""
        if error is not None and self.error is None:
            self.error = error
        self.left -= 1
        if self.left:
            return False
        if self._fd is not None:
            os.close(self._fd)
        try:
            if self.error is None:
                if self._fd is None:                 # an empty object: no chunk came
                    open(self.tmp, "wb").close()
                os.replace(self.tmp, self.path)
            elif self._fd is not None:
                os.unlink(self.tmp)
        except OSError as exc:
            self.error = self.error or exc
        return True


class Transfers:
    """Many objects at once for one bucket: obstore (Rust's object_store, one connection
    pool), credentials from boto3's chain. Downloads stream into a temporary name and are
    renamed into place when complete."""

    def __init__(self, client, bucket: str, concurrency: int = CONCURRENCY, part: int = PART):
        self.store = open_store(client, bucket)
        self.client, self.bucket, self.concurrency, self.part = client, bucket, concurrency, part

    def list(self, url: BucketUrl) -> list[Obj]:
        """Every object under the URL's prefix, folder markers left out: obstore's listing,
        its XML parsed in Rust (boto3's paginator took 0.2-0.3 s of Python for 2,000 keys).
        Where object_store refuses a key as a path ('a//b', a '.' part), or the listing
        fails, boto3 lists (and says what is wrong, as the store does)."""
        import obstore
        found = []
        try:
            for batch in obstore.list(self.store, prefix=url.prefix.rstrip("/") or None, chunk_size=1000):
                for meta in batch:
                    if not meta["path"].endswith("/"):
                        found.append(Obj(meta["path"], int(meta["size"]), (meta.get("e_tag") or "").strip('"')))
        except Exception:
            return list_objects(self.client, url)
        return found

    def download(self, items: list[tuple[str, str]], progress: Progress | None = None,
                 until: Callable[[], bool] | None = None,
                 sizes: dict[str, int] | None = None) -> list[tuple[str, BaseException]]:
        """(key, local path) each; returns the (key, error) of those that failed. `sizes`
        (from a listing): objects larger than a part are fetched in parts at once.

        On a pool of `concurrency` threads, each calling obstore's blocking API (which
        releases the GIL while Rust fetches): for 2,000 files of 256 KiB on 16 cores this
        took 0.47 s against 0.80 s for the same requests on one asyncio loop, whose own
        work per file was the limit. Each part is a task; a file is renamed into place
        when its last part has landed. At most STREAMS_PER_FILE parts of one file are in
        flight: its parts all write to one inode, whose lock they would queue on (one
        1 GiB object with 1 MiB writes: 64 streams 1.2-3.2 s here, five 1.98 s; see
        _pwrite_all for the rest), while other files' parts keep the pool busy."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        for folder in {os.path.dirname(path) for _, path in items}:
            os.makedirs(folder, exist_ok=True)
        sizes = sizes or {}
        files = [_Landing(key, path, sizes.get(key), self.part) for key, path in items]
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="fetch") as pool:
            pending = {}

            def submit(f: _Landing) -> None:
                start, end = f.unstarted.pop(0)
                pending[pool.submit(self._fetch, f, start, end, progress, until)] = f

            for _ in range(STREAMS_PER_FILE):            # round-robin: every file's first parts first
                for f in files:
                    if f.unstarted:
                        submit(f)
            while pending:
                done, _ = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    f = pending.pop(future)
                    if f.unstarted:
                        submit(f)
                    if f.part_done(future.exception()) and progress and f.error is None:
                        progress.file_done()
                if progress:
                    progress.tick()
        return [(f.key, f.error) for f in files if f.error is not None]

    def _fetch(self, f: "_Landing", start: int | None, end: int | None, progress: Progress | None, until) -> None:
        """One part of a file (start None: the whole object), streamed into its place."""
        import obstore
        if f.error is not None:
            return
        if until is not None and until():
            raise Cancelled(f.key)
        options = {"range": (start, end)} if start is not None else None
        response = obstore.get(self.store, f.key, options=options)
        fd = f.open()
        at = start or 0
        for chunk in response.stream(min_chunk_size=CHUNK):      # no part-sized buffer
            if until is not None and until():
                raise Cancelled(f.key)
            _pwrite_all(fd, memoryview(chunk), at)
            at += len(chunk)
            if progress:
                progress.add(len(chunk))

    def upload(self, items: list[tuple[str, str]], progress: Progress | None = None,
               until: Callable[[], bool] | None = None) -> list[tuple[str, BaseException]]:
        """(local path, key) each; returns the (key, error) of those that failed."""
        return self._run([(key, self._put(path, key, progress, until)) for path, key in items], progress)

    async def _put(self, path: str, key: str, progress: Progress | None, until) -> None:
        import obstore
        from pathlib import Path
        if until is not None and until():
            raise Cancelled(key)
        size = os.path.getsize(path)
        await obstore.put_async(self.store, key, Path(path), use_multipart=size > self.part,
                                chunk_size=self.part, max_concurrency=8)
        if progress:
            progress.add(size)
            progress.file_done()

    def _run(self, jobs, progress: Progress | None) -> list[tuple[str, BaseException]]:
        import asyncio

        async def all_of() -> list[tuple[str, BaseException]]:
            gate = asyncio.Semaphore(self.concurrency)
            failed: list[tuple[str, BaseException]] = []

            async def one(key, job):
                async with gate:
                    try:
                        await job
                    except Exception as exc:
                        failed.append((key, exc))

            ticker = asyncio.create_task(self._tick(progress))
            await asyncio.gather(*(one(key, job) for key, job in jobs))
            ticker.cancel()
            return failed

        return asyncio.run(all_of())

    @staticmethod
    async def _tick(progress: Progress | None) -> None:
        import asyncio
        while progress:
            progress.tick()
            await asyncio.sleep(0.5)
