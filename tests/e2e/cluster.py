"""Start entrypoint processes as the nodes of a job on this machine (loopback).

Node k runs `python -m entrypoint.main` with NODE_ADDR=127.0.0.(k+1); the master serves
the job store on 127.0.0.1. Every process is real: torchrun, Horovod, TensorFlow, gloo.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

# Two ranks' lines can arrive glued on one pipe: mpirun --tag-output ("...digest=ab[1,1]<stdout>:RESULT ..."),
# or a print under PYTHONUNBUFFERED=1 (the text and its newline are two writes: "...digest=abRESULT ...").
# The digest is hex, and a result's extra fields end at the next rank's tag or RESULT.
RESULT_RE = re.compile(r"RESULT framework=(\S+) rank=(\d+) world=(\d+) loss_before=([\d.]+) "
                       r"loss_after=([\d.]+) digest=([0-9a-f]+)((?:(?!\[\d+,\d+\]<std|RESULT ).)*)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Result:
    framework: str
    rank: int
    world: int
    before: float
    after: float
    digest: str
    extra: str


def results(output: str) -> list[Result]:
    return [Result(m[1], int(m[2]), int(m[3]), float(m[4]), float(m[5]), m[6], m[7].strip())
            for m in RESULT_RE.finditer(output)]


class Node:
    def __init__(self, env: dict[str, str], args: list[str], log: Path, python: str = sys.executable):
        self.log, self.env, self.args, self.python = log, env, args, python
        self.proc = self._start("w")

    def _start(self, mode: str) -> subprocess.Popen:
        return subprocess.Popen([self.python, "-m", "entrypoint.main", *self.args], env=self.env,
                                stdout=open(self.log, mode), stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    @property
    def output(self) -> str:
        return self.log.read_text()

    def tree(self) -> list:
        """The entrypoint and every process it started."""
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
            return [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def signal_tree(self, sig: int) -> None:
        import psutil

        for p in self.tree():
            try:
                p.send_signal(sig)
            except psutil.NoSuchProcess:
                pass

    def kill_tree(self) -> None:
        """The node dies: the entrypoint and every process it started (as a container would)."""
        self.signal_tree(signal.SIGKILL)


class RestartingNode(Node):
    """A node under Docker's `restart: on-failure:<limit>`: started again, after a delay that
    doubles from 0.1 s, each time it exits non-zero. Its output is every run's, appended."""

    def __init__(self, env: dict[str, str], args: list[str], log: Path, limit: int = 5,
                 python: str = sys.executable):
        super().__init__(env, args, log, python)
        self.codes: list[int] = []
        self._done, self._stopping, self._lock = threading.Event(), False, threading.Lock()
        threading.Thread(target=self._restart, args=(limit,), daemon=True).start()

    def _restart(self, limit: int) -> None:
        delay = 0.1
        while True:
            code = self.proc.wait()
            self.codes.append(code)
            if code == 0 or len(self.codes) > limit:
                break
            time.sleep(delay)
            delay *= 2
            with self._lock:
                if self._stopping:
                    break
                self.proc = self._start("a")
        self._done.set()

    def wait(self, timeout: float) -> int:
        """The last run's exit code, once the node is not restarted any more."""
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.codes[-1]

    def stop(self) -> None:
        """No more restarts; kill what runs."""
        with self._lock:
            self._stopping = True
            self.kill_tree()


def base_env(tmp: Path, **env) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR", "VIRTUAL_ENV")}
    if os.geteuid() == 0:       # the image runs as a user; a root test machine must opt in for mpirun
        keep.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return {**keep, "PYTHONPATH": str(ROOT), "ENTRYPOINT": str(ROOT / "examples" / "train.py"),
            "CHECKPOINT_DIR": str(tmp / "checkpoints"), "DATA_DIR": str(tmp / "data"), "RDZV_TIMEOUT": "90",
            "GRACE_PERIOD": "5", **{k: str(v) for k, v in env.items()}}


def start_job(tmp: Path, nodes: int, args: list[str], python: str = sys.executable, restart: bool = False,
              **env) -> list[Node]:
    """`restart`: every node restarts on failure, as under compose/restart.yml."""
    port = free_port()
    started = []
    for k in range(nodes):
        node_env = base_env(tmp, NUM_NODES=nodes, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                            HOROVOD_PORT=free_port(), **env)
        if nodes > 1:
            node_env.update(TRAIN_MODE="distributed", ROLE="master" if k == 0 else "worker",
                            NODE_ADDR=f"127.0.0.{k + 1}")
        started.append((RestartingNode if restart else Node)(node_env, args, tmp / f"node{k}.log", python=python))
    return started


def add_node(job: list[Node], tmp: Path) -> Node:
    """Another worker for a running job (elastic jobs take it in), on the next loopback address."""
    k = len(job)
    env = {**job[-1].env, "ROLE": "worker", "NODE_ADDR": f"127.0.0.{k + 1}"}
    job.append(Node(env, job[0].args, tmp / f"node{k}.log", job[0].python))
    return job[-1]


def run_job(tmp: Path, nodes: int, args: list[str], timeout: float = 240, python: str = sys.executable,
            **env) -> tuple[list[int], str]:
    job = start_job(tmp, nodes, args, python, **env)
    try:
        codes = [node.wait(timeout) for node in job]
    finally:
        for node in job:
            if node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGKILL)
    return codes, "\n".join(node.output for node in job)


def wait_for_any(job: list[Node], text: str, timeout: float) -> None:
    """`text` in any node's output: lines of global rank 0, which an elastic launcher may
    place on any node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in node.output for node in job):
            return
        if all(node.proc.poll() is not None for node in job):
            raise AssertionError(f"every node exited before {text!r}:\n{job[0].output[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not seen within {timeout}s:\n{job[0].output[-3000:]}")


def wait_for(node: Node, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in node.output:
            return
        if node.proc.poll() is not None:
            raise AssertionError(f"node exited ({node.proc.returncode}) before {text!r}:\n{node.output[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not seen within {timeout}s:\n{node.output[-3000:]}")
