"""The nodes of one job on this machine (loopback), as separate processes.

Node k runs `python -m entrypoint.main` with NODE_ADDR=127.0.0.(k+1); the master serves
the job store on 127.0.0.1. Every process is real: torchrun, Horovod, TensorFlow, gloo.
`Jobs` tracks every node it started and stops them all at `close()` (the tests' `jobs`
fixture, tests/e2e/conftest.py); the benchmarks use `loopback_env` and `Node` alike.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .ports import free_port
from .processes import ROOT, child_env, entrypoint


def loopback_env(k: int, nodes: int, master_port: int, addrs: list[str] | None = None, **env) -> dict[str, str]:
    """Node k's own variables in a job of `nodes` nodes on loopback (`addrs`: each node's
    NODE_ADDR, default 127.0.0.<k+1>; the first is the master's)."""
    addrs = addrs or [f"127.0.0.{i + 1}" for i in range(max(nodes, k + 1))]
    mine = dict(NUM_NODES=nodes, MASTER_ADDR=addrs[0], MASTER_PORT=master_port, **env)
    if nodes > 1:
        mine.update(TRAIN_MODE="distributed", ROLE="master" if k == 0 else "worker", NODE_ADDR=addrs[k])
    return {name: str(value) for name, value in mine.items()}


def base_env(tmp: Path, **env) -> dict[str, str]:
    """A node's environment: the machine's basics (processes.child_env), this checkout's
    example script, and the test's own folders."""
    defaults = dict(ENTRYPOINT=str(ROOT / "examples" / "train.py"), CHECKPOINT_DIR=str(tmp / "checkpoints"),
                    DATA_DIR=str(tmp / "data"), RDZV_TIMEOUT="90", GRACE_PERIOD="5")
    return child_env(**{**defaults, **env})


class Node:
    def __init__(self, env: dict[str, str], args: list[str], log: Path, python: str = sys.executable):
        self.log, self.env, self.args, self.python = log, env, args, python
        self.proc = self._start("w")

    def _start(self, mode: str) -> subprocess.Popen:
        return subprocess.Popen(entrypoint(*self.args, python=self.python), env=self.env, cwd=str(ROOT),
                                stdout=open(self.log, mode), stderr=subprocess.STDOUT, start_new_session=True)

    def wait(self, timeout: float) -> int:
        """Its exit code; a node still running after `timeout` fails the test with its output."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node still running after {timeout}s:\n{self.output[-3000:]}") from None

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

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

    def kill(self) -> None:
        """kill_tree, then reap the entrypoint."""
        self.kill_tree()
        self.proc.wait()


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
        master first); `addrs`: each node's NODE_ADDR (default 127.0.0.<k+1>). "{node}" in
        a value becomes the node's rank (a folder of its own: CACHE_DIR=.../cache{node})."""
        port = free_port()
        started: dict[int, Node] = {}
        for k in order or range(nodes):
            mine = {name: str(value).replace("{node}", str(k)) for name, value in env.items()}
            node_env = base_env(self.tmp, **loopback_env(k, nodes, port, addrs, **{"HOROVOD_PORT": free_port(), **mine}))
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


def lose_a_worker(job: list[Node], timeout: float = 60) -> tuple[int, float]:
    """Once the master trains, every process of the last node dies at once (SIGKILL, as
    `docker kill`): the master's exit code, and the seconds from the kill to its end."""
    master, worker = job[0], job[-1]
    wait_for(master, "TRAINING", 120)
    time.sleep(2)
    killed_at = time.monotonic()
    worker.kill_tree()
    code = master.wait(timeout=timeout)
    return code, time.monotonic() - killed_at


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
