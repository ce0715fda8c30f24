"""One rank prefix for every launcher, pure: `[rank3]: ...`, the prefix torch itself puts
on its workers' lines (torchrun's tee, c10d's tracebacks), on the lines of the processes
the entrypoint starts too, and in place of the launchers' own tags:

    supervised process 'rank 3'      'loss 0.4'                   -> '[rank3]: loss 0.4'
    mpirun --tag-output              '[1,3]<stdout>:loss 0.4'     -> '[rank3]: loss 0.4'
    horovodrun's Gloo tag            '[3]<stderr>:loss 0.4'       -> '[rank3]: loss 0.4'
    torch's prefix inside torchrun's '[rank3]: [rank3]: Traceback' -> '[rank3]: Traceback'
    a process that is not a rank     'ps 0', 'torchrun'           -> '[ps0]: ', '[torchrun]: '
"""

from __future__ import annotations

import re

_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ")
_LAUNCHER_TAG = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>: ?")


def prefix(label: str) -> str:
    """The prefix of a process's lines from its label ('rank 3' -> '[rank3]: ')."""
    return f"[{label.replace(' ', '')}]: " if label else ""


def tagged(line: str, own: str) -> str:
    """`line` with one rank prefix: a launcher's tag becomes it, a doubled one is said
    once, and a line without one gets the process's own (`own`, from `prefix`)."""
    if (tag := _LAUNCHER_TAG.match(line)) is not None:
        line = f"[rank{tag.group(1)}]: {line[tag.end():]}"
    if (first := _RANK_PREFIX.match(line)) is not None:
        rest = line[first.end():]
        while rest.startswith(first.group(0)):
            rest = rest[first.end():]
        return first.group(0) + rest
    return own + line
