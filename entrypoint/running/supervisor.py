"""One supervisor per container: runs a node's processes and ends them together.

It is given everything at construction: the processes, their environment, the grace
period, the log, what it watches (the job, through `Watch`) and the signals it obeys;
`run()` returns the node's Outcome.

* Each process runs in its own process group, so a signal reaches everything it started
  (torchrun's agent, mpirun's ranks); whatever escapes its group (torchrun's workers
  have sessions of their own) is found by the node token (reaper.py), also when the
  entrypoint itself is killed.
* Output lines are prefixed with the process's label ('[rank3]: ...', rank_lines.py); torchrun's
  workers prefix their own lines with their global rank, mpirun's tags become the same prefix.
* SIGTERM/SIGINT stop every group; after GRACE_PERIOD seconds, SIGKILL.
* The first critical process to fail stops the others; its outcome is the node's.
* The watch is asked about once a second whether the node must stop (another node
  failed, the master is gone, the job finished for a node that only serves): the loop
  is loop.py's, shared by every runner.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time

from . import rank_lines
from .log import Log
from .loop import Watch, supervise
from .outcome import Outcome
from .reaper import TOKEN_VAR, Sentinel, new_token, sweep
from .signals import Signals
from .specs import ProcessSpec


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the supervisor dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


class Children:
    """A node's processes: each started in its own process group with the node token, its
    output pumped to the log, and stopped together (SIGTERM, grace, SIGKILL, token sweep)."""

    def __init__(self, base_env: dict[str, str], grace_period: float, log: Log, token: str | None = None):
        self.base_env, self.grace, self.log = base_env, grace_period, log
        self.token = token or new_token()
        self.running: list[tuple[ProcessSpec, subprocess.Popen]] = []
        self._pumps: list[threading.Thread] = []
        self._sentinel: Sentinel | None = None

    def start(self, spec: ProcessSpec, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        if self._sentinel is None:
            self._sentinel = Sentinel(self.token)
        env = {**self.base_env, **spec.env, **(extra_env or {}), TOKEN_VAR: self.token}
        proc = subprocess.Popen(list(spec.argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
        self.running.append((spec, proc))
        pump = threading.Thread(target=self._pump, args=(spec, proc.stdout), daemon=True)
        pump.start()
        self._pumps.append(pump)
        return proc

    def _pump(self, spec: ProcessSpec, stream) -> None:
        own = rank_lines.prefix(spec.label)
        for raw in iter(stream.readline, b""):
            self.log.line(rank_lines.tagged(raw.decode(errors="replace"), own))
        stream.close()

    def stop(self, procs: list[tuple[ProcessSpec, subprocess.Popen]], sig: int = signal.SIGTERM) -> None:
        """Signal these processes' groups, wait up to the grace period, then SIGKILL."""
        running = [(s, p) for s, p in procs if p.poll() is None]
        for _, proc in running:
            _signal_group(proc, sig)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
            time.sleep(0.05)
        for spec, proc in running:
            if proc.poll() is None:
                self.log.say(f"{spec.label or 'process'} did not stop within GRACE_PERIOD={self.grace:g}s: SIGKILL")
                _signal_group(proc, signal.SIGKILL)
            proc.wait()
        for _, proc in procs:
            _signal_group(proc, signal.SIGKILL)

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """Every process, then whatever else carries this node's token; the sentinel ends."""
        self.stop(self.running, sig)
        sweep(self.token)
        for pump in self._pumps:
            pump.join(timeout=2)
        if self._sentinel:
            self._sentinel.close()
            self._sentinel = None


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Supervisor:
    """The runner of planned processes (loop.py's loop, with Children)."""

    def __init__(self, processes: list[ProcessSpec], base_env: dict[str, str], grace_period: float,
                 log: Log, watch: Watch | None = None, signals: Signals | None = None, token: str | None = None):
        self.processes = list(processes)
        self.log = log
        self.watch = watch
        self.signals = signals or Signals()
        self.children = Children(base_env, grace_period, log, token)

    def start(self) -> None:
        for spec in self.processes:
            self.children.start(spec)

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        self.children.stop_all(sig)

    def run(self) -> Outcome:
        """Start the processes and supervise them; returns the node's outcome."""
        self.start()
        outcome = supervise(self, self.watch, self.signals, self.log)
        self.stop_all(signal.SIGTERM)
        return outcome

    # ----------------------------------------------------------------- Supervised
    def poll(self) -> Outcome | None:
        children = self.children.running
        critical = [(s, p) for s, p in children if s.critical]
        for spec, proc in critical:
            code = proc.poll()
            if code is not None and code != 0:
                outcome = Outcome.of_process(spec.label, code)
                self.log.say(f"{outcome.reason}: stopping the others", error=True)
                return outcome
        if critical and all(p.poll() == 0 for _, p in critical):
            return Outcome.succeeded()          # servers (TF ps/workers) end with the chief
        if not critical and not (self.watch and self.watch.has_peers) and all(p.poll() is not None for _, p in children):
            return Outcome.succeeded()
        return None

    def what(self) -> str:
        return f"{len(self.children.running)} process(es)"

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)
