"""The arguments after the image name: a command to run, or the training script's arguments. Pure.

    docker run IMAGE                        train: ENTRYPOINT (/app/code/train.py)
    docker run IMAGE --epochs 10            train, with these script arguments
    docker run IMAGE train.py --epochs 10   the same: the script's own name is dropped
    docker run IMAGE bash                   run bash: the first argument names a program on PATH
    docker run IMAGE ./tools/prep.sh        run it: a path to an executable file
    docker run IMAGE -- test                train, with the script argument 'test' (`--` forces)
    docker run IMAGE --dry-run [...]        print what would run, start nothing

The rule, in order: `--dry-run` first is taken off; then `--` makes everything after it
script arguments; an option (`-x`, `--x`) starts script arguments; the training script's
own name or path is dropped and the rest are its arguments; a path to an executable file,
or a name that is a program on PATH, is a command; anything else is a script argument,
as before commands existed. So a script argument that is also a program's name (`test`,
`yes`) needs `--` in front of it.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Invocation:
    dry_run: bool
    command: tuple[str, ...] | None      # a program and its arguments; None: train
    script_args: tuple[str, ...] = ()
    program: str | None = None           # the command's program, resolved


def is_executable_file(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def names_the_script(word: str, script: str, cwd: str) -> bool:
    """'train.py', './train.py' or '/app/code/train.py' for ENTRYPOINT=/app/code/train.py."""
    return word == os.path.basename(script) or \
        os.path.normpath(os.path.join(cwd, word)) == os.path.normpath(script)


def parse_arguments(args: list[str], script: str, cwd: str,
                    which: Callable[[str], str | None] = shutil.which,
                    executable: Callable[[str], bool] = is_executable_file) -> Invocation:
    dry_run = bool(args) and args[0] == "--dry-run"
    rest = list(args[1:] if dry_run else args)
    if not rest:
        return Invocation(dry_run, None)
    first = rest[0]
    if first == "--":
        return Invocation(dry_run, None, tuple(rest[1:]))
    if first.startswith("-"):
        return Invocation(dry_run, None, tuple(rest))
    if names_the_script(first, script, cwd):
        return Invocation(dry_run, None, tuple(rest[1:]))
    if "/" in first:
        path = os.path.normpath(os.path.join(cwd, first))
        program = path if executable(path) else None
    else:
        program = which(first)
    if program:
        return Invocation(dry_run, tuple(rest), program=program)
    return Invocation(dry_run, None, tuple(rest))
