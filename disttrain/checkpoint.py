"""Checkpoints that only rank 0 writes and every rank can resume from.

Files are `<CHECKPOINT_DIR>/ckpt-<step>.<ext>`, written to a temporary name and renamed,
so a crash mid-write never leaves a truncated 'latest'. The framework's own serializer is
passed in (torch.save / torch.load, or pickle for NumPy weights).
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any, Callable

from .env import context

NAME_RE = re.compile(r"^ckpt-(\d+)\.(\w+)$")


def latest(directory: str | None = None) -> tuple[int, Path] | None:
    """(step, path) of the newest checkpoint, or None."""
    folder = Path(directory or context().checkpoint_dir)
    if not folder.is_dir():
        return None
    found = [(int(m.group(1)), folder / name) for name in os.listdir(folder) if (m := NAME_RE.match(name))]
    return max(found) if found else None


def save(state: Any, step: int, directory: str | None = None, rank: int | None = None,
         writer: Callable[[Any, Any], None] | None = None, ext: str = "pkl", keep: int = 3) -> Path | None:
    """Write `state` as step `step` on rank 0; other ranks return None. Keeps the last `keep`."""
    rank = context().rank if rank is None else rank
    if rank != 0:
        return None
    folder = Path(directory or context().checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"ckpt-{step:08d}.{ext}"
    tmp = folder / f".{target.name}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        (writer or pickle.dump)(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    old = sorted((int(m.group(1)), name) for name in os.listdir(folder) if (m := NAME_RE.match(name)))
    for _, name in old[:-keep] if keep > 0 else []:
        (folder / name).unlink(missing_ok=True)
    return target


def load_latest(directory: str | None = None, reader: Callable[[Any], Any] | None = None) -> tuple[int, Any] | None:
    """(step, state) of the newest checkpoint, read by every rank; None if there is none."""
    found = latest(directory)
    if found is None:
        return None
    step, path = found
    with open(path, "rb") as f:
        return step, (reader or pickle.load)(f)
