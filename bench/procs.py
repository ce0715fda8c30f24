"""Starting the commands a benchmark compares, on this machine, with a bounded time."""

from __future__ import annotations

import os
import random
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = Path(__file__).resolve().parent / "workloads"
PY = sys.executable


_PICKER = random.Random()
_HANDED_OUT: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free now and stays free until a node binds it: one below the kernel's
    ephemeral range, which is where every port-0 bind (a node's loopback stores and tunnels)
    and every outgoing connection's own port come from, so none of them can take it in the
    seconds before the node that was given it starts serving. Never the same port twice."""
    low = _ephemeral_low()
    for _ in range(200):
        port = _PICKER.randrange(10000, low) if low > 11000 else 0
        try:
            with socket.socket() as s:
                s.bind(("0.0.0.0", port))
                port = s.getsockname()[1]
        except OSError:
            continue
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port below the ephemeral range")


KEPT = ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def child_env(**extra) -> dict[str, str]:
    """The basics of a job's process started here, for the benchmarks and the tests alike:
    the machine's PATH and friends, Open MPI allowed as root (the image runs as a user; a
    root machine must opt in for mpirun), this checkout on PYTHONPATH, then `extra`."""
    env = {k: v for k, v in os.environ.items() if k in KEPT}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def base_env(**extra) -> dict[str, str]:
    """A benchmark's process: unbuffered output, quiet TensorFlow, scratch folders."""
    defaults = dict(PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", CHECKPOINT_DIR="/tmp/disttrain-bench-ckpt",
                    DATA_DIR="/tmp/disttrain-bench-data")
    return child_env(**{**defaults, **extra})


def entrypoint(*args: str) -> list[str]:
    return [PY, "-m", "entrypoint.main", *args]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str, float]:
    """Run to completion; (exit code, output, wall seconds). Killed at the timeout."""
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


def children_cpu_seconds() -> float:
    """User + system CPU time of every descendant waited for so far (processes wait for
    their own children, so a launcher's workers count once it is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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


def stamps(output: str, tag: str) -> list[float]:
    return [float(t) for t in re.findall(rf"{tag} rank=[\d?]+ t=([\d.]+)", output)]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
