"""What the bucket holds of the checkpoints, and what a resume takes from it: pure.

Each node writes its own manifest, `<prefix>/.disttrain/nodes/<node>.json`, after the files
it lists are in the bucket, and before any object it no longer lists is deleted: so every
file a manifest lists is complete in the bucket, and a crash or preemption mid-upload leaves
the manifest as it was (the previous checkpoint). A resume reads every node's manifest.

With the project's naming (disttrain/checkpoint.py: `ckpt-<step>.<ext>`, a file, or a folder
of shards `ckpt-<step>.dcp` with its `.metadata`), a resume takes only the newest complete
checkpoint of each kind; otherwise every listed file.

A sharded checkpoint's shards come from every node (each uploads its own ranks'), and its
`.metadata` (on rank 0's node) names them all: its entry lists them (`parts`), and the
checkpoint is complete once every part is listed by some node's manifest. A node deletes
the shards of an older one (keep-last-N pruning) only once a newer one is complete, so the
bucket never holds fewer than one complete sharded checkpoint between the nodes' uploads.

The node's folder keeps a local index (`.disttrain-mirror.json`): each file's size, mtime
and SHA-256 as uploaded or fetched, so that neither is done twice.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from disttrain.checkpoint import NAME_RE, SHARDED_EXT

META = ".disttrain/"
NODES = META + "nodes/"
LOCAL_INDEX = ".disttrain-mirror.json"
SHARD_METADATA = ".metadata"       # torch.distributed.checkpoint writes it last
SKIPPED_TOP = ("diagnostics",)     # hang diagnostics: uploaded, never fetched for a resume


@dataclass(frozen=True)
class Entry:
    """A file as the bucket holds it; `next_*`: the content a rewrite in place is putting
    there (listed before that upload starts), which a resume accepts as well; `parts`: for
    a sharded checkpoint's `.metadata`, the files of the checkpoint it names (relative to
    the prefix), None when they are not known."""
    size: int
    sha256: str
    next_size: int | None = None
    next_sha256: str | None = None
    parts: tuple[str, ...] | None = None

    def as_json(self) -> dict:
        extra = {"next_size": self.next_size, "next_sha256": self.next_sha256} if self.next_sha256 else {}
        if self.parts is not None:
            extra["parts"] = list(self.parts)
        return {"size": self.size, "sha256": self.sha256, **extra}

    def accepts(self, size: int, sha256: str) -> bool:
        return (size, sha256) in ((self.size, self.sha256), (self.next_size, self.next_sha256))


def node_key(prefix: str, node: int) -> str:
    return f"{prefix}{NODES}{node}.json"


def encode(node: int, files: dict[str, Entry], run_id: str) -> bytes:
    return json.dumps({"version": 1, "node": node, "run_id": run_id,
                       "files": {rel: e.as_json() for rel, e in sorted(files.items())}}, indent=1).encode()


def decode(body: bytes) -> dict[str, Entry]:
    data = json.loads(body)
    return {rel: Entry(int(e["size"]), str(e["sha256"]),
                       int(e["next_size"]) if e.get("next_size") is not None else None, e.get("next_sha256"),
                       tuple(str(p) for p in e["parts"]) if e.get("parts") is not None else None)
            for rel, e in data.get("files", {}).items()}


def merge(manifests: list[dict[str, Entry]]) -> dict[str, Entry]:
    """Every node's files in one listing (a file two nodes list: the last manifest's)."""
    merged: dict[str, Entry] = {}
    for files in manifests:
        merged.update(files)
    return merged


def unit_of(rel: str) -> tuple[int, str, str] | None:
    """(step, ext, top-level name) when `rel` is, or is inside, a project checkpoint."""
    top = rel.split("/", 1)[0]
    m = NAME_RE.match(top)
    return (int(m.group(1)), m.group(2), top) if m else None


def complete_units(files: dict[str, Entry]) -> dict[str, list[tuple[int, str]]]:
    """ext -> [(step, top-level name)] of the complete checkpoints, oldest first: a file
    checkpoint is complete when listed; a sharded one when its metadata is, and every part
    the metadata names (`files`: every node's manifests merged)."""
    units: dict[str, set[tuple[int, str]]] = {}
    for rel, entry in files.items():
        u = unit_of(rel)
        if u is None:
            continue
        step, ext, top = u
        if ext == SHARDED_EXT:
            if rel == f"{top}/{SHARD_METADATA}" and all(part in files for part in entry.parts or ()):
                units.setdefault(ext, set()).add((step, top))
        elif rel == top:
            units.setdefault(ext, set()).add((step, top))
    return {ext: sorted(found) for ext, found in units.items()}


def sharded(rel: str) -> tuple[int, str] | None:
    """(step, ext) when `rel` is inside a sharded project checkpoint."""
    u = unit_of(rel)
    return (u[0], u[1]) if u and u[1] == SHARDED_EXT and rel != u[2] else None


def may_delete(rel: str, bucket: dict[str, Entry]) -> bool:
    """Whether a node may delete `rel`, which it no longer holds, from the bucket (`bucket`:
    every node's manifests merged). Only one node lists a file checkpoint, which it removes
    once its newer ones are up; the shards of a sharded one wait for a newer complete one,
    which takes every node's uploads."""
    inside = sharded(rel)
    if inside is None:
        return True
    step, ext = inside
    return any(newer > step for newer, _ in complete_units(bucket).get(ext, []))


def resume_set(files: dict[str, Entry]) -> dict[str, Entry]:
    """What a resume fetches: the newest complete project checkpoint of each kind and every
    file outside the project's naming; with no project checkpoint, every file."""
    wanted_tops = {found[-1][1] for found in complete_units(files).values()}
    chosen = {}
    for rel, entry in files.items():
        top = rel.split("/", 1)[0]
        if top in SKIPPED_TOP:
            continue
        if unit_of(rel) is None or top in wanted_tops:
            chosen[rel] = entry
    return chosen


# --------------------------------------------------------------------------- the local index

def read_local_index(folder: str) -> dict[str, list]:
    """rel -> [size, mtime_ns, sha256] of the files this node uploaded or fetched."""
    try:
        with open(os.path.join(folder, LOCAL_INDEX)) as f:
            return {k: list(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def write_local_index(folder: str, index: dict[str, list]) -> None:
    tmp = os.path.join(folder, f".{LOCAL_INDEX}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(index, f)
    os.replace(tmp, os.path.join(folder, LOCAL_INDEX))
