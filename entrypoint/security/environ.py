"""The secret kept out of every environment a training process can read.

The entrypoint reads JOB_SECRET (or JOB_SECRET_FILE) once, to derive the job's identity
(secret.py); after that no process it starts needs either variable. `without_secret` is
the environment every process gets from then on: the node's ranks and agents, a rank an
outer launcher started (direct mode), a program given after the image.

Removing the variable from Python's os.environ does not remove it from what
/proc/<pid>/environ shows: that file reads the process's initial environment block, which
the kernel set up at exec and no unsetenv touches. `scrub_environ_block` overwrites the
value there, in place (through /proc/self/mem, which a process may always write for
itself), so neither the entrypoint's ranks nor anything else of the container reads it
from the entrypoint. What cannot be scrubbed from here: the environment of the process
that started the entrypoint (PID 1 in a container, tini, when the secret came as `docker
run -e JOB_SECRET`); `init_holds_secret` tells, so the node can say it, and JOB_SECRET_FILE
(a mounted secret) is the way around it.
"""

from __future__ import annotations

import os

SECRET_VARIABLES = ("JOB_SECRET", "JOB_SECRET_FILE")


def without_secret(env: dict[str, str]) -> dict[str, str]:
    """`env` without the secret's variables (the file's path too: no process needs it)."""
    return {name: value for name, value in env.items() if name not in SECRET_VARIABLES}


def _environ_block() -> tuple[int, int]:
    """Where this process's initial environment block lies in its memory (env_start and
    env_end, fields 50 and 51 of /proc/self/stat, counted after the command's name)."""
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[50 - 3]), int(fields[51 - 3])


def scrub_environ_block(name: str = "JOB_SECRET") -> bool:
    """Overwrite every value of `name` in this process's initial environment block with NUL
    bytes (its length unchanged, the other variables where they were). True when done or
    nothing was there; False where the kernel refuses (/proc/self/mem not writable)."""
    key = name.encode() + b"="
    try:
        start, end = _environ_block()
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = mem.read(end - start)
            at = 0
            while (found := block.find(key, at)) >= 0:
                value = found + len(key)
                stop = block.find(b"\0", value)
                stop = len(block) if stop < 0 else stop
                if found == 0 or block[found - 1] == 0:        # a variable's start, not inside a value
                    mem.seek(start + value)
                    mem.write(b"\0" * (stop - value))
                at = stop
    except (OSError, ValueError, IndexError):
        return False
    return True


def init_holds_secret() -> bool:
    """Whether PID 1, when it is another process (a container's init), has a JOB_SECRET
    in the environment it was started with, readable from this process."""
    if os.getpid() == 1:
        return False
    try:
        with open("/proc/1/environ", "rb") as environ:
            return any(entry.startswith(b"JOB_SECRET=") and len(entry) > len(b"JOB_SECRET=")
                       for entry in environ.read().split(b"\0"))
    except OSError:
        return False
