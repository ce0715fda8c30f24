"""Finishing together: how a node's outcome becomes the job's end on every node.

When a node ends the job (a failure, a stop), it records why (job/abort). The master then
keeps the job store up until every worker has read it and stopped (at most GRACE_PERIOD +
LEAVE_WAIT_S), so that each says the master's reason in one line rather than losing the
master's store under its processes. A node whose processes fail after another node ended
the job reports that node's reason: its own failure was the consequence.

The master marks the job done once every node is done, then waits (at most LEAVE_WAIT_S)
until each worker has said it leaves, and a moment more (LEAVE_MARGIN_S) while their
processes exit, so that `compose up --abort-on-container-exit` sees the workers end first
rather than stopping them while they exit. A successful worker waits for that mark. While
they wait, nodes look for job/done and the workers' results every WAIT_INTERVAL_S, and
for failures, silence and aborts (and beat) every CHECK_INTERVAL_S, through the same
JobWatch that watched the node's processes (it knows which elastic nodes have left).
"""

from __future__ import annotations

import dataclasses
import time

from ..running.loop import consequence
from ..running.outcome import NodeState, Outcome
from ..store.transport import StoreGone
from .watch import JobWatch

LEAVE_WAIT_S = 2.0
LEAVE_MARGIN_S = 0.2
WAIT_INTERVAL_S = 0.05
CHECK_INTERVAL_S = 0.2


def finish_together(watch: JobWatch | None, outcome: Outcome) -> Outcome:
    """The node's final outcome: this one on a single node (no watch), else the job's."""
    return Finishing(watch).finish(outcome) if isinstance(watch, JobWatch) else outcome


class Finishing:
    def __init__(self, watch: JobWatch):
        self.watch = watch
        self.store, self.config, self.rank, self.log = watch.store, watch.config, watch.rank, watch.log
        self.ends, self.heartbeats = watch.ends, watch.heartbeats
        self.master = watch.master

    def finish(self, outcome: Outcome) -> Outcome:
        """Record this node's outcome. The master then waits for the workers' results, and a
        successful worker for the master's; both as long as the others' heartbeats move."""
        try:
            outcome = self._cause(outcome)
            if outcome.ends_job:
                self.ends.abort(self._signed(outcome))
            self.ends.set_exit(self.rank, outcome)
            if not outcome.ok:
                if self.master and outcome.ends_job:
                    self._let_workers_stop()
                return outcome
            return self._wait_for_workers() if self.master else self._wait_for_master()
        except StoreGone as exc:
            if self.master or outcome.state is not NodeState.FAILED:
                return outcome      # the store is gone; this node's own result still stands
            lost = self.watch.store_gone(exc)
            self.log.say(lost.reason)
            return lost

    def _cause(self, outcome: Outcome) -> Outcome:
        """This node's processes failed: because another node ended the job first (then
        this node reports that node's reason, and a stop as 143, not a failure of its own)?"""
        if outcome.state is not NodeState.FAILED:
            return outcome
        aborted = self.ends.aborted()
        if aborted is not None:
            self.log.say(f"stopping: {aborted.reason}{consequence(self.log.divert())}", error=not aborted.on_purpose)
            return aborted
        return outcome

    def _signed(self, outcome: Outcome) -> Outcome:
        """This node's own failure, as the others read it: named after this node."""
        if outcome.state is not NodeState.FAILED:
            return outcome
        who = "the master (node 0)" if self.master else f"node {self.rank}"
        return dataclasses.replace(outcome, reason=f"{who}: {outcome.reason}")

    def _let_workers_stop(self) -> None:
        """The master ended the job: its store stays up until every worker has stopped
        (its exit recorded), gone silent, or GRACE_PERIOD + LEAVE_WAIT_S have passed."""
        watch = self.watch
        deadline = time.monotonic() + self.config.grace_period + LEAVE_WAIT_S
        while time.monotonic() < deadline:
            waiting = [k for k in watch.workers() if k not in watch.gone and self.ends.exit(k) is None]
            if all(watch.silent(k) for k in waiting):
                return
            self.heartbeats.beat(self.rank)
            time.sleep(CHECK_INTERVAL_S)

    def _wait_for_workers(self) -> Outcome:
        watch, checked, workers = self.watch, 0.0, []
        while True:
            due = time.monotonic() - checked >= CHECK_INTERVAL_S
            finished = all(self.ends.exit(k) is not None for k in workers)
            if due or finished:      # who is in the job: read with the checks and before ending, not every poll
                workers = [k for k in watch.workers() if k not in watch.gone]
                finished = all(self.ends.exit(k) is not None for k in workers)
            if finished or due:
                verdict = watch.check_workers()      # a failed or silent worker ends the wait
                if verdict:
                    self.log.say(verdict.reason)
                    self.ends.abort(verdict)
                    return verdict
                self.heartbeats.beat(self.rank)
                checked = time.monotonic()
            if finished:
                self.ends.mark_done()                # every node is done: the workers may leave
                self._let_workers_leave([k for k in workers if k not in watch.gone])   # not those that left
                return Outcome.succeeded()
            if watch.signals.received is not None:
                return watch.stopping(watch.signals.received)
            time.sleep(WAIT_INTERVAL_S)

    def _let_workers_leave(self, workers: list[int]) -> None:
        deadline = time.monotonic() + LEAVE_WAIT_S
        while not all(self.ends.has_left(k) for k in workers) and time.monotonic() < deadline:
            time.sleep(WAIT_INTERVAL_S)
        time.sleep(LEAVE_MARGIN_S)

    def _wait_for_master(self) -> Outcome:
        """A worker whose processes succeeded stays until the master has seen every node
        finish (job/done), so that `compose up --abort-on-container-exit`, which stops the
        rest when one container exits, never stops a node that is still finishing. It
        waits as long as the master's heartbeat moves."""
        checked = 0.0
        while True:
            if self.ends.done():
                self.ends.leave(self.rank)
                return Outcome.succeeded()
            if self.watch.signals.received is not None:
                return Outcome.stopped(self.watch.signals.received)
            if time.monotonic() - checked >= CHECK_INTERVAL_S:
                aborted = self.ends.aborted()
                if aborted:
                    self.log.say(aborted.reason)
                    return aborted
                if self.watch.silent(0):
                    lost = Outcome.lost(f"lost the master at {self.store.endpoint}: no heartbeat for "
                                        f"PEER_TIMEOUT={self.config.peer_timeout}s")
                    self.log.say(lost.reason)
                    return lost
                self.heartbeats.beat(self.rank)
                checked = time.monotonic()
            time.sleep(WAIT_INTERVAL_S)
