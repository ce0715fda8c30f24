"""Start entrypoint processes as the nodes of a job on this machine (loopback).

Node k runs `python -m entrypoint.main` with NODE_ADDR=127.0.0.(k+1); the master serves
the job store on 127.0.0.1. Every process is real: torchrun, Horovod, TensorFlow, gloo.
Tests get them through the `jobs` fixture (tests/e2e/conftest.py), a `Jobs` that stops
every node it started when the test ends, passed or failed.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.procs import child_env, free_port
from tests.conftest import ROOT

# Two ranks' lines can arrive glued on one pipe: mpirun --tag-output ("...digest=ab[1,1]<stdout>:RESULT ..."),
# or a print under PYTHONUNBUFFERED=1 (the text and its newline are two writes: "...digest=abRESULT ...").
# The digest is hex, and a result's extra fields end at the next rank's tag or RESULT.
RESULT_RE = re.compile(r"RESULT framework=(\S+) rank=(\d+) world=(\d+) loss_before=([\d.]+) "
                       r"loss_after=([\d.]+) digest=([0-9a-f]+)((?:(?!\[\d+,\d+\]<std|RESULT ).)*)")


@dataclass
class Result:
    framework: str
    rank: int
    world: int
    before: float
    after: float
    digest: str
    extra: str


# Lines the elastic jobs write: the entrypoint's membership changes, rank 0's training rounds.
CHANGE_RE = re.compile(r"entrypoint: membership changed: world size (\d+) -> (\d+), resumed from step (\d+)")
ROUND_RE = re.compile(r"ROUND rank=0 world=(\d+) from_step=(\d+) loss=([\d.]+)")


def changes(output: str) -> list[tuple[int, int, int]]:
    return [(int(a), int(b), int(s)) for a, b, s in CHANGE_RE.findall(output)]


def initial_loss(output: str) -> float:
    first = [float(loss) for _, step, loss in ROUND_RE.findall(output) if step == "0"]
    assert first, output[-3000:]
    return first[0]


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
        """Its exit code; a node still running after `timeout` fails the test with its output."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node still running after {timeout}s:\n{self.output[-3000:]}") from None

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

    def stop_restarting(self) -> None:
        with self._lock:
            self._stopping = True

    def stop(self) -> None:
        """No more restarts; kill what runs."""
        with self._lock:
            self._stopping = True
            self.kill_tree()


def base_env(tmp: Path, **env) -> dict[str, str]:
    """A node's environment: the machine's basics (bench.procs.child_env), this checkout's
    example script, and the test's own folders."""
    defaults = dict(ENTRYPOINT=str(ROOT / "examples" / "train.py"), CHECKPOINT_DIR=str(tmp / "checkpoints"),
                    DATA_DIR=str(tmp / "data"), RDZV_TIMEOUT="90", GRACE_PERIOD="5")
    return child_env(**{**defaults, **env})


class Jobs:
    """Every node a test starts, stopped when it ends (`close`): SIGTERM to each node's
    process tree, GRACE_S to exit, then SIGKILL, then wait, so that nothing outlives a
    test that failed half-way."""

    GRACE_S = 5.0

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.nodes: list[Node] = []

    def start(self, nodes: int, args: list[str], python: str = sys.executable, restart: bool = False,
              order: list[int] | None = None, addrs: list[str] | None = None, **env) -> list[Node]:
        """`nodes` nodes of one job. `restart`: every node restarts on failure, as under
        compose/restart.yml. `order`: the node ranks in the order they start (default: the
        master first); `addrs`: each node's NODE_ADDR (default 127.0.0.<k+1>)."""
        port = free_port()
        started: dict[int, Node] = {}
        addrs = addrs or [f"127.0.0.{k + 1}" for k in range(nodes)]
        for k in order or range(nodes):
            node_env = base_env(self.tmp, NUM_NODES=nodes, MASTER_ADDR=addrs[0], MASTER_PORT=port,
                                **{"HOROVOD_PORT": free_port(), **env})
            if nodes > 1:
                node_env.update(TRAIN_MODE="distributed", ROLE="master" if k == 0 else "worker", NODE_ADDR=addrs[k])
            kind = RestartingNode if restart else Node
            started[k] = kind(node_env, args, self.tmp / f"node{k}.log", python=python)
            if order and k != order[-1]:
                time.sleep(1.0)                     # this one is well on its way before the next starts
        job = [started[k] for k in range(nodes)]
        self.nodes += job
        return job

    def add_node(self, job: list[Node]) -> Node:
        """Another worker for a running job (elastic jobs take it in), on the next loopback address."""
        k = len(job)
        env = {**job[-1].env, "ROLE": "worker", "NODE_ADDR": f"127.0.0.{k + 1}"}
        job.append(Node(env, job[0].args, self.tmp / f"node{k}.log", job[0].python))
        self.nodes.append(job[-1])
        return job[-1]

    def track(self, node: Node) -> Node:
        """A node the test started by itself, stopped with the others."""
        self.nodes.append(node)
        return node

    def run(self, nodes: int, args: list[str], timeout: float = 240, python: str = sys.executable,
            **env) -> tuple[list[int], str]:
        """A job to its end: every node's exit code, and their output (`start`'s keywords too)."""
        job = self.start(nodes, args, python, **env)
        codes = [node.wait(timeout) for node in job]
        return codes, "\n".join(node.output for node in job)

    def close(self) -> None:
        for node in self.nodes:
            if isinstance(node, RestartingNode):
                node.stop_restarting()
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)     # as `docker stop`: the entrypoint stops its processes
                node.signal_tree(signal.SIGCONT)          # a node a test froze sees it too
        deadline = time.monotonic() + self.GRACE_S
        while time.monotonic() < deadline and any(node.proc.poll() is None for node in self.nodes):
            time.sleep(0.1)
        for node in self.nodes:
            node.kill_tree()
            try:
                node.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


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
