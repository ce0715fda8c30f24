"""A node's processes end with the node, even when its entrypoint is killed outright.

Every process the supervisor starts carries DISTTRAIN_NODE_TOKEN=<token> in its
environment, and so does everything those start: torchrun's workers too, which torchrun
puts in sessions of their own, out of reach of its process group. A sentinel process
holds the read end of a pipe from the entrypoint; when the pipe closes (the entrypoint
exited, or was killed, even by SIGKILL) it kills every process that carries the token.
The supervisor sweeps the same way after stopping its processes.

    python -m entrypoint.running.reaper TOKEN      (the sentinel; started by Sentinel)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

TOKEN_VAR = "DISTTRAIN_NODE_TOKEN"


def new_token() -> str:
    return uuid.uuid4().hex


def carriers(token: str) -> list:
    """Every process of ours whose environment carries the token (not this one)."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TOKEN_VAR) == token:
                found.append(proc)
        except (psutil.Error, OSError):
            continue              # gone, a zombie, or another user's
    return found


def stale(token: str, before: float, spare_children: bool = True) -> list:
    """The processes carrying the token that started before wall-clock time `before`,
    except this process's own children when they are the launchers the supervisor started
    (`spare_children`; not when torch's agent runs in this process: its children are the
    training processes)."""
    import psutil

    own = {child.pid for child in psutil.Process().children()} if spare_children else set()
    found = []
    for proc in carriers(token):
        try:
            if proc.pid not in own and started_at(proc) < before:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def started_at(proc) -> float:
    """When `proc` started, on time.time()'s clock. psutil's create_time() counts from the
    boot time in /proc/stat, whole seconds that drift from the wall clock: here it read
    0.83 s early, so a process started just after a node was lost counted as started before
    it. The kernel's start time counts from boot on CLOCK_BOOTTIME, which is exact."""
    import psutil

    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + proc.create_time() - psutil.boot_time()


def end(procs: list, grace: float = 2.0) -> None:
    """SIGTERM, then SIGKILL what is left after `grace` seconds. Never waits for them as
    their parent would: where they are this process's children, another thread (torch's
    agent) waits for them and must get their exit codes (a child reaped here would read
    as exit 0 to its Popen, and a stopped training process as a finished one)."""
    import psutil

    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [proc for proc in alive if _running(proc)]
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass


def _running(proc) -> bool:
    """Still running: not gone, and not a zombie (ended, its exit code kept for its parent)."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sweep(token: str, sig: int = signal.SIGKILL) -> int:
    """Signal every process that carries the token; returns how many there were."""
    found = carriers(token)
    for proc in found:
        try:
            proc.send_signal(sig)
        except Exception:        # psutil.NoSuchProcess and friends: it went by itself
            pass
    return len(found)


class Sentinel:
    """The watcher of one node's processes, in a session of its own (signals sent to the
    entrypoint's group do not reach it)."""

    def __init__(self, token: str):
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        self.proc = subprocess.Popen([sys.executable, "-m", "entrypoint.running.reaper", token], stdin=subprocess.PIPE,
                                     env=env, start_new_session=True, close_fds=True)

    def close(self) -> None:
        """Normal end: the sentinel sweeps once more (nothing should be left) and exits."""
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str]) -> int:
    token = argv[0]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):      # blocks until the entrypoint's end of the pipe closes
        pass
    sweep(token)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
