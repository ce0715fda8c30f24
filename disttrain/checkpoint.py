"""Checkpoints that fit the parallel layout, with one naming, atomic write and keep-last-N.

Replicated state (data parallelism: every rank holds the same model): rank 0 writes
`<CHECKPOINT_DIR>/ckpt-<step>.<ext>` with the framework's own serializer (torch.save /
torch.load, or pickle for NumPy weights) and every rank resumes from it:

    checkpoint.save(state, step, writer=torch.save, ext="pt")        # rank 0 writes
    step, state = checkpoint.load_latest(reader=torch.load)          # every rank reads

Sharded state (PARALLEL_MODE=model_parallel or hybrid: each tensor-parallel rank holds a
different shard): every rank writes its own shards with torch.distributed.checkpoint into
the folder `<CHECKPOINT_DIR>/ckpt-<step>.dcp`, and loading reshards to the layout of the
loading job, which may have another world size or TP_SIZE:

    checkpoint.save_sharded(step, model, optimizer)                  # every rank (collective)
    start = checkpoint.load_sharded(model, optimizer)                # every rank; 0 if none

Both are written under a temporary name and renamed, so a crash mid-write never leaves a
truncated 'latest', and both keep the last `keep` checkpoints of their kind. Sharded
checkpoints need CHECKPOINT_DIR on storage every node shares (the compose file's volume),
or a bucket (CHECKPOINT_DIR=s3://...: each node uploads its own ranks' shards, and the
checkpoint counts once every shard its index names is in the bucket; docs/storage.md).
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

from .env import context

NAME_RE = re.compile(r"^ckpt-(\d+)\.(\w+)$")
SHARDED_EXT = "dcp"


def checkpoints(folder: Path, ext: str | None = None) -> list[tuple[int, str]]:
    """(step, name) of the finished checkpoints in `folder`, oldest first; temporary names
    (a save in progress, or one that crashed) never match."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), m.group(2), name) for name in os.listdir(folder) if (m := NAME_RE.match(name))]
    return sorted((step, name) for step, kind, name in found if ext is None or kind == ext)


def to_remove(found: list[tuple[int, str]], keep: int) -> list[str]:
    """The names beyond the newest `keep` (keep <= 0 keeps everything)."""
    return [name for _, name in found[:-keep]] if keep > 0 else []


def latest(directory: str | None = None, ext: str | None = None) -> tuple[int, Path] | None:
    """(step, path) of the newest checkpoint (of extension `ext`, if given), or None."""
    folder = Path(directory or context().checkpoint_dir)
    found = checkpoints(folder, ext)
    return (found[-1][0], folder / found[-1][1]) if found else None


def _prune(folder: Path, keep: int, ext: str) -> None:
    for name in to_remove(checkpoints(folder, ext), keep):
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- replicated

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
    _prune(folder, keep, ext)
    return target


def load_latest(directory: str | None = None, reader: Callable[[Any], Any] | None = None) -> tuple[int, Any] | None:
    """(step, state) of the newest checkpoint file, read by every rank; None if there is none."""
    folder = Path(directory or context().checkpoint_dir)
    files = [(step, name) for step, name in checkpoints(folder) if not (folder / name).is_dir()]
    if not files:
        return None
    step, name = files[-1]
    with open(folder / name, "rb") as f:
        return step, (reader or pickle.load)(f)


# --------------------------------------------------------------------------- sharded

class _TrainState:
    """Model and optimizer as torch.distributed.checkpoint's Stateful: state dicts keyed by
    parameter name (not by optimizer slot), with DTensor shards, so DCP can reshard them."""

    def __init__(self, model, optimizer=None):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"])


def _rank() -> int | None:
    """This process's rank in the torch.distributed group, None without one."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def _barrier() -> None:
    import torch.distributed as dist

    if _rank() is not None:
        dist.barrier()


def _broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank (itself without a torch.distributed group)."""
    import torch.distributed as dist

    if _rank() is None:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_sharded(step: int, model, optimizer=None, directory: str | None = None, keep: int = 3) -> Path:
    """Every rank calls this together: each writes its own shards of `model` (and
    `optimizer`) as step `step`, and the folder is renamed into place once every rank's
    shards are written, keeping the last `keep`. Returns the checkpoint's folder.

    On a folder every node shares, rank 0 renames and prunes it; on folders of their own
    (CHECKPOINT_DIR=s3://..., where each node's folder holds its own ranks' shards and the
    mirror uploads them), each node's first local rank does it for its own."""
    import torch.distributed.checkpoint as dcp

    folder = Path(directory or context().checkpoint_dir)
    target = folder / f"ckpt-{step:08d}.{SHARDED_EXT}"
    tmp = folder / f".{target.name}.tmp"
    rank = _rank()
    # A name only this save uses: a node that cannot see rank 0's has a folder of its own.
    marker = tmp / f".saving-{_broadcast(uuid.uuid4().hex if not rank else None)}"
    if not rank:
        _fresh(tmp)                                     # drops what a save that crashed left behind
        marker.touch()
    _barrier()
    own = bool(rank) and context().local_rank == 0 and not marker.exists()
    if own:
        _fresh(tmp)
    _barrier()
    # Returns on every rank once the coordinator has written the metadata, i.e. once every
    # rank's shards are on disk.
    dcp.save({"train": _TrainState(model, optimizer)}, checkpoint_id=str(tmp))
    if not rank or own:
        marker.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)       # the same step saved again
        os.replace(tmp, target)
        _prune(folder, keep, SHARDED_EXT)
    _barrier()                                          # nobody reads 'latest' before it exists
    return target


def _fresh(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)


def load_sharded(model, optimizer=None, directory: str | None = None) -> int:
    """Every rank calls this together: load the newest sharded checkpoint into `model` (and
    `optimizer`) in place, resharded to their current layout. Returns its step, 0 if none."""
    import torch.distributed.checkpoint as dcp

    found = latest(directory, SHARDED_EXT)
    if found is None:
        return 0
    step, path = found
    dcp.load({"train": _TrainState(model, optimizer)}, checkpoint_id=str(path))
    return step
