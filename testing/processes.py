"""A job's processes on this machine: their environment, and running them with a time limit."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

KEPT = ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def child_env(**extra) -> dict[str, str]:
    """The basics of a job's process started here, for the benchmarks and the tests alike:
    the machine's PATH and friends, Open MPI allowed as root (the image runs as a user; a
    root machine must opt in for mpirun), this checkout on PYTHONPATH (before the caller's
    own PYTHONPATH, where one is set), then `extra`."""
    env = {k: v for k, v in os.environ.items() if k in KEPT}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def entrypoint(*args: str, python: str = PY) -> list[str]:
    """The command of one node: this checkout's entrypoint."""
    return [python, "-m", "entrypoint.main", *args]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str, float]:
    """Run to completion; (exit code, output, wall seconds). Killed at the timeout (124)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=str(ROOT))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out, time.perf_counter() - start
    return proc.returncode, out, time.perf_counter() - start


def run_many(cmds: list[tuple[list[str], dict[str, str]]],
             timeout: float = 300) -> tuple[list[int], str, float, float]:
    """Start several commands at once (the nodes of a job); wait for all. Returns the exit
    codes, the output, the wall-clock start and the seconds until the last one ended."""
    start = time.time()
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True, cwd=str(ROOT)) for c, e in cmds]
    outputs, codes = [], []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            p.returncode = 124
        outputs.append(out)
        codes.append(p.returncode)
    return codes, "\n".join(outputs), start, time.time() - start


def children_cpu_seconds() -> float:
    """User + system CPU time of every descendant waited for so far (processes wait for
    their own children, so a launcher's workers count once it is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
