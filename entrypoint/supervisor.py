"""One supervisor per container: runs a node's processes and ends them together.

* Each process runs in its own process group, so a signal reaches everything it started
  (torchrun's workers, mpirun's ranks).
* Output lines are prefixed with the process's label ('[rank 3] ...'); torchrun's workers
  prefix their own lines with their global rank.
* SIGTERM/SIGINT are forwarded to every group; after GRACE_PERIOD seconds, SIGKILL.
* The first critical process to fail stops the others; its exit code is the node's.
* `poll` (the job store) is asked about once a second whether the job must stop; it
  answers with a reason, or a (reason, exit code) pair.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, TextIO

from .plan import ProcessSpec

POLL_INTERVAL = 0.2
STORE_INTERVAL = 1.0


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the supervisor dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass


def exit_code(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes the shell's 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    def __init__(self, grace_period: float, out: TextIO = sys.stdout,
                 poll: Callable[[], tuple[str, int] | str | None] | None = None,
                 job_finished: Callable[[], int | None] | None = None,
                 on_signal: Callable[[int], None] | None = None):
        self.grace = grace_period
        self.out = out
        self.poll = poll
        self.job_finished = job_finished
        self.on_signal = on_signal
        self.children: list[tuple[ProcessSpec, subprocess.Popen]] = []
        self.signal_received: int | None = None
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    # ----------------------------------------------------------------- output
    def say(self, text: str) -> None:
        with self._lock:
            self.out.write(f"entrypoint: {text}\n")
            self.out.flush()

    def _pump(self, spec: ProcessSpec, stream) -> None:
        prefix = f"[{spec.label}] " if spec.label else ""
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            if line.startswith("[rank"):
                text = line
            else:
                text = prefix + line
            with self._lock:
                self.out.write(text if text.endswith("\n") else text + "\n")
                self.out.flush()
        stream.close()

    # ----------------------------------------------------------------- signals
    def install_signal_handlers(self) -> None:
        def handler(signum, _frame):
            self.signal_received = signum
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # ----------------------------------------------------------------- lifecycle
    def start(self, specs: list[ProcessSpec], base_env: dict[str, str]) -> None:
        for spec in specs:
            env = {**base_env, **spec.env}
            proc = subprocess.Popen(list(spec.argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_die_with_parent)
            self.children.append((spec, proc))
            pump = threading.Thread(target=self._pump, args=(spec, proc.stdout), daemon=True)
            pump.start()
            self._pumps.append(pump)

    def stop_all(self, sig: int = signal.SIGTERM) -> None:
        """Signal every running group, wait up to the grace period, then SIGKILL."""
        running = [(s, p) for s, p in self.children if p.poll() is None]
        for _, proc in running:
            self._signal_group(proc, sig)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
            time.sleep(0.05)
        for spec, proc in running:
            if proc.poll() is None:
                self.say(f"{spec.label or 'process'} did not stop within GRACE_PERIOD={self.grace:g}s: SIGKILL")
                self._signal_group(proc, signal.SIGKILL)
            proc.wait()
        # Reap whatever else the groups left behind.
        for _, proc in self.children:
            self._signal_group(proc, signal.SIGKILL)
        for pump in self._pumps:
            pump.join(timeout=2)

    @staticmethod
    def _signal_group(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def run(self, specs: list[ProcessSpec], base_env: dict[str, str]) -> int:
        """Start the processes and supervise them; returns the node's exit code."""
        self.start(specs, base_env)
        critical = [(s, p) for s, p in self.children if s.critical]
        last_store_check = 0.0
        while True:
            if self.signal_received is not None:
                name = signal.Signals(self.signal_received).name
                self.say(f"{name} received: stopping {len(self.children)} process(es)")
                if self.on_signal:
                    # Tell the other nodes first: their processes are about to lose this
                    # node's, and should read that as "stopped", not as a failure.
                    self.on_signal(self.signal_received)
                self.stop_all(signal.SIGTERM)
                # The children's codes now only echo the signal (torchrun exits 1 on SIGTERM):
                # report the signal itself, as a shell would.
                return 128 + self.signal_received
            for spec, proc in critical:
                code = proc.poll()
                if code is not None and code != 0:
                    code = exit_code(code)
                    self.say(f"{spec.label} exited with {code}: stopping the others")
                    self.stop_all(signal.SIGTERM)
                    return code
            if critical and all(p.poll() == 0 for _, p in critical):
                self.stop_all(signal.SIGTERM)      # servers (TF ps/workers) end with the chief
                return 0
            now = time.monotonic()
            if now - last_store_check >= STORE_INTERVAL:
                last_store_check = now
                if self.poll:
                    verdict = self.poll()
                    if verdict:
                        reason, code = verdict if isinstance(verdict, tuple) else (verdict, 1)
                        self.say(f"stopping: {reason}")
                        self.stop_all(signal.SIGTERM)
                        return code
                if not critical and self.job_finished:
                    finished = self.job_finished()
                    if finished is not None:
                        self.stop_all(signal.SIGTERM)
                        return 0 if finished == 0 else 1
                if not critical and not self.job_finished and all(p.poll() is not None for _, p in self.children):
                    return 0
            time.sleep(POLL_INTERVAL)
