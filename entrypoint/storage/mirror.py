"""CHECKPOINT_DIR=s3://...: each finished file in the node's folder is uploaded while
training goes on, deletions (keep-last-N pruning) are mirrored, and what is left is
flushed at the end.

A file counts as finished when no process has it open for writing and its size and mtime
did not change over one poll (or it was last written longer ago than that). Names with a
part starting with "." are temporary (DCP's `.metadata` aside): disttrain.checkpoint writes
`.ckpt-...tmp-<pid>` and renames it into place, as do the downloads here and most
frameworks. Finished files are uploaded oldest first; only then does the node's manifest
(manifest.py) list them, and only after the manifest stops listing a file is its object
deleted, so the bucket always holds a complete checkpoint for a resume. A sharded
checkpoint's shards come from every node: a node deletes its shards of an older one only
once the bucket (every node's manifest, read back) holds a newer complete one.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ..contract.urls import BucketUrl
from . import manifest
from .client import describe
from .resume import read_manifests, sha256_of
from .shards import shard_files
from .transfer import Transfers, lower_priority, mib

POLL_S = 1.0
NICE = 10                    # the uploads' CPU priority while training runs
BACKOFF_MAX_S = 30.0
DELETE_HOLD_S = 60.0         # deletions wait this long at most for a new file to go up first
BUCKET_VIEW_S = 5.0          # how often the other nodes' manifests are read while shards wait to be deleted


def open_for_writing(folder: str) -> set[str]:
    """The files under `folder` that some process (one this uid can see) has open for writing."""
    prefix = folder.rstrip("/") + "/"
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if not target.startswith(prefix):
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = next(int(line.split()[1], 8) for line in f if line.startswith("flags:"))
            except (OSError, StopIteration, ValueError):
                continue
            if flags & 0o3:                      # O_WRONLY or O_RDWR
                found.add(target[len(prefix):])
    return found


# Final names that start with ".": torch.distributed.checkpoint's index, written last.
KEPT_DOT_NAMES = (".metadata",)


def scan(folder: str) -> dict[str, tuple[int, int]]:
    """rel -> (size, mtime_ns) of every regular file, temporary names left out."""
    found = {}
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith(".") and name not in KEPT_DOT_NAMES:
                continue
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            found[os.path.relpath(path, folder)] = (st.st_size, st.st_mtime_ns)
    return found


@dataclass(frozen=True)
class MirrorReport:
    uploaded: int
    uploaded_bytes: int
    deleted: int
    kept: int                       # pruned shards left in the bucket: no newer complete checkpoint yet
    pending: tuple[str, ...]        # finished files not in the bucket at the end
    error: str | None               # the store's last error, if the end came with one

    @property
    def complete(self) -> bool:
        return not self.pending


class CheckpointMirror:
    def __init__(self, client, url: BucketUrl, folder: str, node: int, run_id: str,
                 say: Callable[[str], None], env: dict[str, str], poll: float = POLL_S):
        self.client, self.url, self.folder, self.node, self.run_id = client, url, folder, node, run_id
        self.say, self.env, self.poll = say, env, poll
        self.index = manifest.read_local_index(folder)          # rel -> [size, mtime_ns, sha256]
        self.owned: dict[str, manifest.Entry] = {}              # what this node's manifest lists
        self.uploaded = 0
        self.uploaded_bytes = 0
        self.deleted = 0
        self.kept = 0
        self.error: str | None = None
        self._seen: dict[str, tuple[int, int]] = {}
        self._first_seen: dict[str, float] = {}                 # rel -> when it was first waiting
        self._failures = 0
        self._bucket: tuple[float, dict[str, manifest.Entry]] | None = None   # (when read, every node's files)
        self._stop = threading.Event()
        self._lock = threading.Lock()                           # one cycle at a time
        self._thread: threading.Thread | None = None
        self._transfers = Transfers(client, url.bucket, concurrency=8)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "CheckpointMirror":
        os.makedirs(self.folder, exist_ok=True)
        try:
            body = self.client.get_object(Bucket=self.url.bucket, Key=self._manifest_key())["Body"].read()
            self.owned = manifest.decode(body)
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                self._failed(exc)
        self._thread = threading.Thread(target=self._run, name="checkpoint-mirror", daemon=True)
        self._thread.start()
        return self

    def finish(self, deadline: float) -> MirrorReport:
        """Stop watching; upload what is left (every file is finished now: the processes
        have ended) until `deadline` (time.monotonic())."""
        self._stop.set()
        if self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        while time.monotonic() < deadline:
            try:
                if not self._cycle(final=True, until=lambda: time.monotonic() >= deadline):
                    break
            except Exception as exc:
                self._failed(exc)
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        pending = tuple(sorted(rel for rel, st in scan(self.folder).items() if not self._in_bucket(rel, st)))
        return MirrorReport(self.uploaded, self.uploaded_bytes, self.deleted, self.kept, pending,
                            self.error if pending else None)

    def _run(self) -> None:
        # Behind the training for the CPU: this thread and the transfers' runtime threads
        # run at a lower priority than the ranks (again each pass: the runtime may grow).
        while not self._stop.is_set():
            lower_priority(NICE)
            try:
                self._cycle(final=False, until=self._stop.is_set)
                self._failures = 0
                wait = self.poll
            except Exception as exc:
                self._failed(exc)
                wait = min(BACKOFF_MAX_S, self.poll * 2 ** self._failures)
            self._stop.wait(wait)

    def _failed(self, exc: BaseException) -> None:
        text = describe(exc, self.env)
        if self.error is None or self._failures == 0:
            self.say(f"checkpoints: upload to {str(self.url)} failing: {text}; retrying with backoff")
        self.error = text
        self._failures += 1

    # ------------------------------------------------------------------ one pass

    def _manifest_key(self) -> str:
        return manifest.node_key(self.url.prefix, self.node)

    def _in_bucket(self, rel: str, st: tuple[int, int]) -> bool:
        known = self.index.get(rel)
        return bool(known) and tuple(known[:2]) == st

    def _cycle(self, final: bool, until: Callable[[], bool]) -> bool:
        """One pass; True if it changed anything in the bucket. New names go up first and
        are listed; then files rewritten in place (TensorFlow's `checkpoint`, a `latest.pt`),
        each listed first with its next digest beside the one the bucket holds, so that a
        resume accepts either; deletions last, and only once nothing new waits to go up."""
        with self._lock:
            now = scan(self.folder)
            writing = set() if final else open_for_writing(self.folder)
            settled_ns = time.time_ns() - int(self.poll * 1e9)
            waiting = [rel for rel, st in now.items() if not self._in_bucket(rel, st)]
            ready = [rel for rel in waiting if rel not in writing
                     and (final or self._seen.get(rel) == now[rel] or now[rel][1] < settled_ns)]
            self._seen = now
            for rel in waiting:
                self._first_seen.setdefault(rel, time.monotonic())
            ready.sort(key=lambda rel: now[rel][1])
            digests = self._digests(ready)
            fresh = [rel for rel in ready if rel in digests and rel not in self.owned]
            rewritten = [rel for rel in ready if rel in digests and rel in self.owned]
            done, failed = self._upload(fresh, digests, now, until)
            for rel in rewritten:
                old = self.owned[rel]
                self.owned[rel] = manifest.Entry(old.size, old.sha256, next_size=now[rel][0], next_sha256=digests[rel],
                                                 parts=old.parts)
            if done or rewritten:
                self._write_manifest()
            again, failed_again = self._upload(rewritten, digests, now, until)
            done += again
            failed += failed_again
            held = [rel for rel in waiting if rel not in done and rel not in self.owned
                    and time.monotonic() - self._first_seen[rel] < DELETE_HOLD_S]
            gone = [] if held or failed else self._deletable([rel for rel in self.owned if rel not in now], final)
            for rel in gone:
                del self.owned[rel]
            if again or gone:
                self._write_manifest()
            if gone:
                for rel in gone:
                    self.index.pop(rel, None)
                keys = [{"Key": self.url.key(rel)} for rel in gone]
                for i in range(0, len(keys), 1000):
                    self.client.delete_objects(Bucket=self.url.bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})
                self.deleted += len(gone)
            if done or gone:
                manifest.write_local_index(self.folder, self.index)
            for rel in done:
                self._first_seen.pop(rel, None)
            if failed and not until():
                raise failed[0][1]
            return bool(done or gone)

    def _deletable(self, gone: list[str], final: bool) -> list[str]:
        """Of the files this node no longer holds, those it may delete now (manifest.may_delete);
        the others (`kept`) wait for the other nodes' uploads."""
        if not any(manifest.sharded(rel) for rel in gone):
            self.kept = 0
            return gone
        bucket = self._bucket_view(fresh=final)
        allowed = [rel for rel in gone if manifest.may_delete(rel, bucket)]
        self.kept = len(gone) - len(allowed)
        return allowed

    def _bucket_view(self, fresh: bool) -> dict[str, manifest.Entry]:
        """Every node's files as the bucket lists them, this node's as it knows them now;
        read again at most every BUCKET_VIEW_S."""
        if fresh or self._bucket is None or time.monotonic() - self._bucket[0] >= BUCKET_VIEW_S:
            others = {key: files for key, files in read_manifests(self.client, self.url).items()
                      if key != self.node}
            self._bucket = (time.monotonic(), manifest.merge(list(others.values())))
        return manifest.merge([self._bucket[1], self.owned])

    def _write_manifest(self) -> None:
        body = manifest.encode(self.node, self.owned, self.run_id)
        self.client.put_object(Bucket=self.url.bucket, Key=self._manifest_key(), Body=body,
                               ContentType="application/json")

    def _digests(self, ready: list[str]) -> dict[str, str]:
        digests = {}
        for rel in ready:
            try:
                digests[rel] = sha256_of(os.path.join(self.folder, rel))
            except FileNotFoundError:          # rotated away since the scan (keep-last-N): nothing to send
                pass
        return digests

    def _upload(self, ready: list[str], digests: dict[str, str], now: dict[str, tuple[int, int]],
                until: Callable[[], bool]) -> tuple[list[str], list[tuple[str, BaseException]]]:
        """Upload `ready`; (the files now in the bucket, the (key, error) of the others)."""
        if not ready:
            return [], []
        failed = self._transfers.upload([(os.path.join(self.folder, rel), self.url.key(rel)) for rel in ready], until=until)
        bad = {key for key, _ in failed}
        # A file rotated away meanwhile (keep-last-N) is not a failure: the next pass drops it.
        failed = [(key, exc) for key, exc in failed
                  if os.path.exists(os.path.join(self.folder, self.url.relative(key)))]
        done = []
        for rel in ready:
            if self.url.key(rel) in bad:
                continue
            try:
                st = os.stat(os.path.join(self.folder, rel))
            except OSError:
                continue
            if (st.st_size, st.st_mtime_ns) != now[rel]:       # rewritten meanwhile: next pass
                continue
            self.index[rel] = [st.st_size, st.st_mtime_ns, digests[rel]]
            self.owned[rel] = manifest.Entry(st.st_size, digests[rel], parts=self._parts(rel))
            self.uploaded += 1
            self.uploaded_bytes += st.st_size
            done.append(rel)
        return done, failed

    def _parts(self, rel: str) -> tuple[str, ...] | None:
        """For a sharded checkpoint's index: the files it names (manifest.Entry.parts)."""
        inside = manifest.sharded(rel)
        if inside is None or os.path.basename(rel) != manifest.SHARD_METADATA:
            return None
        names = shard_files(os.path.join(self.folder, rel))
        if names is None:
            self.say(f"checkpoints: cannot read the shard names in {rel}; it counts as complete once it is up")
            return None
        top = rel.split("/", 1)[0]
        return tuple(f"{top}/{name}" for name in names)


def report_line(url: BucketUrl, folder: str, report: MirrorReport) -> str:
    sent = f"uploaded {report.uploaded} files ({mib(report.uploaded_bytes)})"
    if report.deleted:
        sent += f", removed {report.deleted} pruned"
    if report.kept:
        sent += f", kept {report.kept} pruned shards until the other nodes' newer ones are up"
    if report.complete:
        return f"checkpoints: {sent} to {str(url)}; everything finished is in the bucket"
    shown = ", ".join(report.pending[:3]) + (f" and {len(report.pending) - 3} more" if len(report.pending) > 3 else "")
    why = f": {report.error}" if report.error else " (out of time: GRACE_PERIOD)"
    return (f"checkpoints: {sent} to {str(url)}; NOT uploaded: {shown}{why}; the local copy stays in {folder}")
