"""The files a torch.distributed.checkpoint folder consists of, read from its `.metadata`
without torch and without unpickling it.

DCP's FileSystemWriter pickles its Metadata into `.metadata` once every rank has written
its shards; each shard's `_StorageInfo.relative_path` names the file that holds it
(`__<rank>_<n>.distcp`, one or more per rank). Those names are plain strings in the
pickle's opcodes, which pickletools reads without running any of it: nothing in a file
someone else uploaded is executed here.
"""

from __future__ import annotations

import pickletools

SHARD_SUFFIX = ".distcp"


def shard_files(path: str) -> tuple[str, ...] | None:
    """The shard files (names inside the checkpoint's folder) that the `.metadata` at
    `path` refers to, or None when it is not a pickle this can read."""
    names = set()
    try:
        with open(path, "rb") as f:
            for _, arg, _ in pickletools.genops(f):
                if isinstance(arg, str) and arg.endswith(SHARD_SUFFIX) and _plain(arg):
                    names.add(arg)
    except (OSError, ValueError, EOFError):
        return None
    return tuple(sorted(names))


def _plain(name: str) -> bool:
    """A file name in the folder itself: nothing that would reach outside it."""
    return "/" not in name and "\\" not in name and name not in (".", "..") and not name.startswith(".")
