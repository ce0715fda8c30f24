"""Watching the job while this node's processes run (finishing together is finish.py's).

What ends a node, from the job's side:
* job/abort: another node failed or was stopped (its outcome, with the cause);
* the master: its processes failed, it stopped answering (no heartbeat for PEER_TIMEOUT
  seconds), or the job store cannot be reached (store operations time out after
  PEER_TIMEOUT): "lost the master", exit 1;
* on the master, a worker that failed, or (fixed-size jobs) went silent.

Hangs and stragglers (vigil.py): every node publishes its ranks' progress with its
heartbeat and answers a hang with its stacks; the master judges the whole job.

Elastic jobs (MIN_NODES/MAX_NODES) differ in one thing: a worker that goes silent or
leaves is not a failure. The launcher re-forms the group without it, and the master logs
it (and records a silent one as lost, for rounds.py).
"""

from __future__ import annotations

import time

from ..contract.config import Config
from ..health.progress import RankProgress
from ..health.vigil import Decider, Vigil
from ..running.log import Log
from ..running.outcome import NodeState, Outcome
from ..running.signals import Signals
from ..store.tcp import JobStore, StoreGone
from .rounds import Rounds

def stop_outcome(config: Config, signum: int) -> Outcome:
    """What a signal means for this node: an elastic worker leaves a job that goes on;
    any other node stops the job."""
    if config.elastic and config.role == "worker":
        return Outcome.left(signum)
    return Outcome.stopped(signum)


class Heartbeats:
    """Whose heartbeat counter has stopped moving, as seen from here."""

    def __init__(self, store: JobStore, timeout_s: float):
        self.store, self.timeout_s = store, timeout_s
        self._seen: dict[int, tuple[int, float, float]] = {}    # node -> (last heartbeat, when it changed,
                                                                 #          the same on the wall clock)

    def silent(self, node: int) -> bool:
        """True once `node`'s heartbeat counter has not moved for timeout_s seconds."""
        now = time.monotonic()
        beats = self.store.heartbeat(node)
        last, since, _ = self._seen.get(node, (-1, now, 0.0))
        if beats != last:
            self._seen[node] = (beats, now, time.time())
            return False
        return now - since > self.timeout_s

    def age(self, node: int) -> float | None:
        """Seconds since `node`'s heartbeat was last seen moving (None: not seen yet)."""
        seen = self._seen.get(node)
        return None if seen is None else time.monotonic() - seen[1]

    def last_moved(self, node: int) -> float:
        """Wall-clock time at which `node`'s heartbeat was last seen moving."""
        return self._seen.get(node, (0, 0.0, time.time()))[2]


class JobWatch:
    def __init__(self, store: JobStore, config: Config, node_rank: int, log: Log, signals: Signals,
                 serverless: bool = False, token: str | None = None, agent_in_process: bool = False,
                 vigil: Vigil | None = None):
        """token: the node token of this node's processes (reaper.py); given for elastic
        torchrun nodes, whose training processes are restarted when a node is lost silently
        (`agent_in_process`: torch's agent runs in this process, launchers/torchrun_agent.py).
        vigil: this node's ranks' progress (vigil.py); None: nothing reports progress."""
        self.store, self.config, self.rank, self.log, self.signals = store, config, node_rank, log, signals
        self.master = node_rank == 0
        self.serverless = serverless
        self._heartbeats = Heartbeats(store, config.peer_timeout)
        self.gone: set[int] = set()                         # elastic: nodes that left
        self._joined: set[int] = set()                      # elastic: nodes the master has logged
        self._started = time.monotonic()
        self.rounds = Rounds(store, log, token, agent_in_process) if config.elastic else None
        self.vigil = vigil
        self.decider = Decider(config, log, vigil, "master") if vigil and self.master else None
        self._verdicts: set[str] = set()

    has_peers = True

    # ----------------------------------------------------------------- while running
    def check(self) -> Outcome | None:
        """About once a second: None while all is well, else the outcome that stops this node."""
        try:
            self.store.beat(self.rank)
            aborted = self.store.aborted()
            if aborted:
                return aborted
            if self.rounds:
                self.rounds.follow()
            verdict = self.check_workers() if self.master else self._check_master()
            if verdict is None and self.vigil:
                verdict = self._judge_progress() if self.master else self._report_progress()
            return verdict
        except StoreGone as exc:
            return self.store_gone(exc)

    # ----------------------------------------------------------------- hangs (vigil.py)
    def _report_progress(self) -> Outcome | None:
        """A worker: publish its ranks' progress; answer a hang with their stacks; leave an
        elastic job when the master says its ranks stalled."""
        self.store.publish_progress(self.rank, [r.to_dict() for r in self.vigil.ranks()])
        hang = self.store.hang()
        if hang is None:
            return None
        if hang["id"] not in self.vigil.answered:
            self.store.report_stacks(hang["id"], self.rank, self.vigil.answer(hang["id"]))
        if self.config.elastic and hang["id"] not in self._verdicts:
            verdict = self.store.verdict(hang["id"])
            if verdict is not None:
                self._verdicts.add(hang["id"])
                if self.rank in verdict["leave"]:
                    return Outcome.left_hung(verdict["line"])
                self.log.say(f"hang: {verdict['line']}")
        return None

    def _live_workers(self) -> list[int]:
        return [k for k in self.workers() if k not in self.gone and self.store.exit(k) is None]

    def _judge_progress(self) -> Outcome | None:
        """The master: stragglers and status; a hang's incident, from its start to its line."""
        workers = self._live_workers()
        decider = self.decider
        if decider.incident is None:
            ranks = self.vigil.ranks() + [RankProgress.from_dict(d) for k in workers for d in self.store.progress(k)]
            ages = {k: a for k in [0, *workers] if (a := self._heartbeats.age(k)) is not None}
            ages[0] = 0.0
            past = decider.observe(ranks, ages)
            if past:
                incident = decider.begin(ranks)
                self.store.announce_hang({"id": incident.id})
                self.log.say(f"no progress from {', '.join(r.name for r in past)} for HANG_TIMEOUT="
                             f"{self.config.hang_timeout}s: every node dumps its ranks' stacks")
            return None
        incident = decider.incident
        for k in workers:
            if k not in incident.reports and (report := self.store.stacks(incident.id, k)) is not None:
                incident.reports[k] = report
        concluded = decider.conclude([0, *workers])
        if concluded is None:
            return None
        line, stalled = concluded
        if self.config.elastic and stalled and 0 not in stalled:
            self.store.announce_verdict(incident.id, {"line": line, "leave": list(stalled)})
            self.log.say(f"hang: {line}; node(s) {', '.join(map(str, stalled))} leave, and the job goes on "
                         f"without them")
            return None
        return Outcome.hung(line)

    def show_status(self) -> None:
        if self.decider:
            self.decider.show_status()
        elif self.vigil:
            for r in self.vigil.ranks():
                self.log.say(f"status: {r.name} pid {r.pid}: {r.steps} step(s), idle {r.idle_s:.0f}s "
                             f"(the master has the whole job's view)")

    def stopping(self, signum: int) -> Outcome:
        outcome = stop_outcome(self.config, signum)
        if outcome.ends_job:
            self.store.abort(outcome)
        return outcome

    def store_gone(self, exc: Exception) -> Outcome:
        if self.master:
            return Outcome.failed(f"the job store failed: {exc}")
        return Outcome.lost(f"lost the master at {self.store.endpoint} ({exc}); it stopped or its host is "
                            f"unreachable, and the job ends with it")

    def _check_master(self) -> Outcome | None:
        master = self.store.exit(0)
        if master is not None and not master.ok:
            return master.aborting()
        if master is not None and self.serverless:
            return Outcome.succeeded("the master finished")
        if self.silent(0):
            return Outcome.lost(f"lost the master at {self.store.endpoint}: no heartbeat for "
                                f"PEER_TIMEOUT={self.config.peer_timeout}s")
        return None

    def check_workers(self) -> Outcome | None:
        """Why the master must stop, from the workers' side: too few joined, one failed,
        or one went silent. None while all is well."""
        c = self.config
        if not c.elastic and time.monotonic() - self._started > c.rdzv_timeout:
            joined = len(self.workers()) + 1
            if joined < c.num_nodes:
                return Outcome.failed(f"only {joined} of {c.num_nodes} nodes joined MASTER_ADDR:MASTER_PORT="
                                      f"{self.store.endpoint} within RDZV_TIMEOUT={c.rdzv_timeout}s")
        for k in self.workers():
            if k in self.gone:
                continue
            if c.elastic and k not in self._joined:
                self._joined.add(k)
                self.log.say(f"node {k} joined the job")
            outcome = self.store.exit(k)
            if outcome is not None:
                if outcome.state is NodeState.LEFT:
                    self._leave(k, f"node {k} left the job ({outcome.reason})")
                elif not outcome.ok:
                    return outcome.aborting()
                continue
            if self.silent(k):
                if c.elastic:        # the launcher re-forms the group without it
                    self._leave(k, f"node {k} lost: no heartbeat for PEER_TIMEOUT={c.peer_timeout}s; "
                                   f"the job goes on without it")
                    self.store.report_lost(k, self._heartbeats.last_moved(k))
                    continue
                return Outcome.lost(f"node {k} stopped answering (no heartbeat for {c.peer_timeout}s)")
        return None

    def _leave(self, node: int, text: str) -> None:
        self.gone.add(node)
        self.log.say(text)

    def workers(self) -> list[int]:
        return self.store.claimed_workers(self.config.most_nodes)

    def silent(self, node: int) -> bool:
        return self._heartbeats.silent(node)
