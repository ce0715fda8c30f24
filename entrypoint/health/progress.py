"""This node's view of its training processes' progress (what disttrain/progress.py writes).

`ProgressFolder` is the folder the node's processes report into (DISTTRAIN_PROGRESS, given
to every process the node starts): in /dev/shm where it can be written (it is a tmpfs
also under `docker run --read-only`), else the temporary folder. `read()` turns the
files of the processes still alive into `RankProgress` records, with ages measured here
(the processes and the entrypoint share the host's monotonic clock); `dump_stacks(pids)`
makes each process write every thread's Python stack (faulthandler, on STACK_SIGNAL) and
returns what each wrote.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from disttrain.progress import STACK_SIGNAL, VAR

STACK_WAIT_S = 3.0           # how long a process may take to write its stack
STACK_SETTLE_S = 0.3         # a dump is complete once its file stopped growing this long


@dataclass(frozen=True)
class RankProgress:
    """One training process, as its node saw it at one moment (a process reports from its
    first step or activity on, so every record is of a rank that has started)."""
    node: int
    host: str
    rank: int | None
    local_rank: int | None
    pid: int
    source: str                     # what counts its steps: 'torch optimizer', 'keras train batch', ...
    steps: int
    idle_s: float                   # since its last step or activity
    step_idle_s: float | None       # since its last step (None: no step yet)
    step_time: float | None         # recent seconds per step
    compute_time: float | None      # PyTorch: recent seconds from a step's end to the next backward

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict) -> "RankProgress":
        return RankProgress(**{k: data.get(k) for k in RankProgress.__dataclass_fields__})


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) is not a live rank.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _writable(folder: str) -> bool:
    return os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK)


class ProgressFolder:
    def __init__(self, node: int = 0, root: str | None = None):
        root = root or ("/dev/shm" if _writable("/dev/shm") else tempfile.gettempdir())
        self.path = tempfile.mkdtemp(prefix="disttrain-progress-", dir=root)
        self.node = node

    def env(self) -> dict[str, str]:
        return {VAR: self.path}

    def read(self) -> list[RankProgress]:
        now = time.monotonic()
        ranks = []
        for path in sorted(glob.glob(os.path.join(self.path, "*.json"))):
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue                                # being replaced, or gone with its process
            if not _alive(int(data["pid"])):
                continue
            steps = int(data.get("steps", 0))
            ranks.append(RankProgress(
                node=self.node, host=data.get("host", ""), rank=data.get("rank"), local_rank=data.get("local_rank"),
                pid=int(data["pid"]), source=data.get("source", ""), steps=steps,
                idle_s=max(0.0, now - float(data["last_event"])),
                step_idle_s=max(0.0, now - float(data["last_step"])) if steps else None,
                step_time=data.get("step_time"), compute_time=data.get("compute_time")))
        return sorted(ranks, key=lambda r: (r.rank is None, r.rank if r.rank is not None else r.pid))

    def dump_stacks(self, pids: list[int]) -> dict[int, str]:
        """Each process's stack dump (all threads); '' for one that did not answer."""
        paths = {pid: os.path.join(self.path, f"{pid}.stack") for pid in pids}
        before = {pid: _size(path) for pid, path in paths.items()}
        for pid in pids:
            try:
                os.kill(pid, STACK_SIGNAL)
            except OSError:
                pass
        deadline = time.monotonic() + STACK_WAIT_S
        last_growth, sizes = time.monotonic(), dict(before)
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now_sizes = {pid: _size(path) for pid, path in paths.items()}
            if now_sizes != sizes:
                sizes, last_growth = now_sizes, time.monotonic()
            answered = all(sizes[pid] > before[pid] for pid in pids)
            if answered and time.monotonic() - last_growth >= STACK_SETTLE_S:
                break
        dumps = {}
        for pid, path in paths.items():
            try:
                with open(path, errors="replace") as f:
                    f.seek(before[pid])
                    dumps[pid] = f.read()
            except OSError:
                dumps[pid] = ""
        return dumps

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
