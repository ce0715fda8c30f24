"""The one supervision loop: what every runner of a node's processes does while they run.

As torch's elastic agent has one `_invoke_run` loop, every runner here (the Supervisor of
planned processes, torch's agent inside the entrypoint, the elastic-Horovod node) is a
`Supervised`: it says how its own processes stand (`poll`), and `supervise` does the rest,
in one order, every POLL_INTERVAL:

1. a signal (SIGTERM, SIGINT): the other nodes are told first (the watch), then the node
   stops with the signal's outcome;
2. the runner's own verdict: a process failed (and the watch says whether a node lost at
   the same moment caused it), every critical one succeeded, the agent ended, the
   driver's result is in;
3. the job watch, at most once per WATCH_INTERVAL: another node failed, the master is gone,
   the job finished for a node that only serves.

The runner then stops what it started; `supervise` only decides when and why.
"""

from __future__ import annotations

import signal
import time
from typing import Protocol

from .log import Log
from .outcome import NodeState, Outcome
from .signals import Signals

POLL_INTERVAL = 0.2
WATCH_INTERVAL = 1.0


class Watch(Protocol):
    def check(self) -> Outcome | None:
        """None while the node should go on; else the outcome that stops it."""

    def stopping(self, signum: int) -> Outcome:
        """This node got a signal: tell the others first; returns what the node reports."""

    has_peers: bool                  # other nodes share the job (JobWatch), or this node is alone

    def show_status(self) -> None:
        """SIGUSR1: the job's status, in the log (disttrain/status.py)."""

    def cause_of(self, failure: Outcome) -> Outcome:
        """This node's processes failed: `failure`, or what caused it elsewhere (a lost node)."""


class Supervised(Protocol):
    def poll(self) -> Outcome | None:
        """None while the runner's processes go on; else the node's outcome."""

    def what(self) -> str:
        """What a signal stops, for the log line: '2 process(es)', "torchrun's workers"."""

    def wait(self, seconds: float) -> None:
        """Sleep until the next poll (or until the runner has news)."""


class Runner(Protocol):
    watch: Watch | None              # what it watched: the finish goes on watching it (finish.py)

    def run(self) -> Outcome:
        """Start this node's processes, supervise them, stop them; the node's outcome."""


class WatchEverySecond:
    """Asks the job watch (if any) at most once per WATCH_INTERVAL, from a loop that polls
    faster; says why it stops the node unless the verdict is success."""

    def __init__(self, watch: Watch | None, log: Log):
        self.watch, self.log = watch, log
        self._last = 0.0

    def verdict(self) -> Outcome | None:
        now = time.monotonic()
        if self.watch is None or now - self._last < WATCH_INTERVAL:
            return None
        self._last = now
        verdict = self.watch.check()
        if verdict is not None and verdict.state is not NodeState.SUCCEEDED:
            self.log.say(f"stopping: {verdict.reason}", error=not verdict.on_purpose)
        return verdict


def consequence(path: str | None) -> str:
    """What a stopping line adds when the node's ranks' tracebacks went to a file."""
    return f" (this node's tracebacks, its consequence: {path})" if path else ""


def supervise(runner: Supervised, watch: Watch | None, signals: Signals, log: Log) -> Outcome:
    """Until something ends this node: a signal, the runner's verdict, or the job watch's."""
    every_second = WatchEverySecond(watch, log)
    while True:
        if signals.received is not None:
            signum = signals.received
            log.say(f"{signal.Signals(signum).name} received: stopping {runner.what()}")
            # Tell the other nodes first: their processes are about to lose this node's,
            # and should read that as "stopped", not as a failure.
            return watch.stopping(signum) if watch else Outcome.stopped(signum)
        if signals.take_status_request() and watch is not None:
            watch.show_status()
        if (outcome := runner.poll()) is not None:
            if watch is not None and watch.has_peers and outcome.state is NodeState.FAILED:
                outcome = watch.cause_of(outcome)
                if outcome.state is not NodeState.FAILED:      # a lost node: the ranks' tracebacks are its consequence
                    log.say(f"stopping: {outcome.reason}{consequence(log.divert())}", error=True)
            log.release()
            return outcome
        if (verdict := every_second.verdict()) is not None:
            return verdict
        runner.wait(POLL_INTERVAL)
