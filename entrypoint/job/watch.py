"""Watching the job while this node's processes run: liveness (finishing together is finish.py's).

What ends a node, from the job's side:
* job/abort: another node failed or was stopped (its outcome, with the cause);
* the master: its processes failed, it stopped answering (no heartbeat for PEER_TIMEOUT
  seconds), or the job store cannot be reached (store operations time out after
  PEER_TIMEOUT): "lost the master", exit 1;
* on the master, a worker that failed, or (fixed-size jobs) went silent.

Elastic jobs (MIN_NODES/MAX_NODES) differ in one thing: a worker that goes silent or
leaves is not a failure. The launcher re-forms the group without it, and the master logs
it (and records a silent one as lost, for rounds.py).

Where a launcher's workers publish a link port (links.py; elastic Horovod's), the master
holds a link to each: a worker whose link closes is lost at once, as a silent one would be
PEER_TIMEOUT later (and marked so in the job store, node/<k>/cut, for the launcher).

Other rooms add their own checks through `PeerCheck` (the hang protocol, health/): they
run after liveness, each second, with this watch as their view of the job.

Keys: node/<k>/hb, node k's heartbeat counter, bumped every second (Heartbeats).
"""

from __future__ import annotations

import time
from typing import Protocol

from ..contract.config import Config
from ..running.log import Log
from ..running.outcome import NodeState, Outcome
from ..running.signals import Signals
from ..store.transport import JobStore, StoreGone
from .ends import Ends
from .links import WorkerLinks
from .members import Members
from .rounds import RoundKeys, Rounds

def stop_outcome(config: Config, signum: int) -> Outcome:
    """What a signal means for this node: an elastic worker (or peer, JOB_STORE) leaves a job that goes on;
    any other node stops the job."""
    if config.elastic and config.role in ("worker", "peer"):
        return Outcome.left(signum)
    return Outcome.stopped(signum)


class Heartbeats:
    """The nodes' heartbeat counters: this node's beat, and whose counter has stopped moving,
    as seen from here."""

    def __init__(self, store: JobStore, timeout_s: float):
        self.store, self.timeout_s = store, timeout_s
        # node -> (last heartbeat, when it changed, the wall-clock time of the look before that
        #          change (the beat came after it), the wall-clock time of the latest look)
        self._seen: dict[int, tuple[int, float, float, float]] = {}

    def beat(self, node: int) -> None:
        self.store.add(f"node/{node}/hb", 1)

    def count(self, node: int) -> int:
        return self.store.add(f"node/{node}/hb", 0)

    def silent(self, node: int) -> bool:
        """True once `node`'s heartbeat counter has not moved for timeout_s seconds."""
        now, wall = time.monotonic(), time.time()
        beats = self.count(node)
        last, since, moved_after, looked = self._seen.get(node, (-1, now, 0.0, 0.0))
        if beats != last:
            self._seen[node] = (beats, now, looked, wall)
            return False
        self._seen[node] = (last, since, moved_after, wall)
        return now - since > self.timeout_s

    def age(self, node: int) -> float | None:
        """Seconds since `node`'s heartbeat was last seen moving (None: not seen yet)."""
        seen = self._seen.get(node)
        return None if seen is None else time.monotonic() - seen[1]

    def last_moved(self, node: int) -> float:
        """A wall-clock time before `node`'s last heartbeat: the look before the one that saw
        it move (0 if there was none). The time that look saw it move could be a second after
        the beat, and so after the node died: a training process started once the others
        had re-formed without it would then count as older than the loss (rounds.py)."""
        return self._seen.get(node, (0, 0.0, 0.0, 0.0))[2]


# A node whose processes failed waits up to LOSS_WINDOW_S for the other nodes' heartbeats
# before it says why: a peer killed or cut off (docker kill, a host down) makes this node's
# ranks fail at once, in a collective, long before PEER_TIMEOUT would call it silent. A peer
# whose counter does not move in that window (it beats every second) was lost, and is named.
LOSS_WINDOW_S = 3.0
LOSS_POLL_S = 0.25


class PeerCheck(Protocol):
    """A check of another room's that runs with the job's liveness (health/hang_protocol.py)."""

    def check(self, watch: "JobWatch") -> Outcome | None: ...

    def show_status(self) -> None: ...


class JobWatch:
    def __init__(self, store: JobStore, config: Config, node_rank: int, log: Log, signals: Signals,
                 serverless: bool = False, token: str | None = None, agent_in_process: bool = False,
                 peer_check: PeerCheck | None = None, worker_links: bool = False):
        """token: the node token of this node's processes (reaper.py); given for elastic
        torchrun nodes, whose training processes are restarted when a node is lost silently
        (`agent_in_process`: torch's agent runs in this process, launchers/torchrun/agent.py).
        peer_check: what else to check every second (the hang protocol), or None.
        worker_links: on the master, hold a link to each worker that publishes one."""
        self.store, self.config, self.rank, self.log, self.signals = store, config, node_rank, log, signals
        self.master = node_rank == 0
        self.serverless = serverless
        self.members, self.ends = Members(store), Ends(store)
        self.heartbeats = Heartbeats(store, config.peer_timeout)
        self.gone: set[int] = set()                         # elastic: nodes that left
        self._joined: set[int] = set()                      # elastic: nodes the master has logged
        self._started = time.monotonic()
        self.rounds = Rounds(store, log, token, agent_in_process) if config.elastic else None
        self.peer_check = peer_check
        self.links = WorkerLinks(store.identity, self.members.mark_cut) if worker_links and self.master else None

    has_peers = True

    # ----------------------------------------------------------------- while running
    def check(self) -> Outcome | None:
        """About once a second: None while all is well, else the outcome that stops this node."""
        try:
            self.heartbeats.beat(self.rank)
            aborted = self.ends.aborted()
            if aborted:
                return aborted
            if self.rounds:
                self.rounds.follow()
            verdict = self.check_workers() if self.master else self._check_master()
            if verdict is None and self.peer_check:
                verdict = self.peer_check.check(self)
            return verdict
        except StoreGone as exc:
            return self.store_gone(exc)

    def cause_of(self, failure: Outcome) -> Outcome:
        """This node's processes failed: the outcome to report. Another node lost at the same
        moment is the likelier cause, and is named with its address; another node's failure
        that ended the job first is that node's; else `failure` itself. Returns as soon as
        every peer's heartbeat has moved (about a second), or after LOSS_WINDOW_S."""
        if self.config.elastic:
            return failure                   # the group re-forms without a lost node
        peers = self.live_workers() if self.master else [0]
        try:
            first = {k: self.heartbeats.count(k) for k in peers}
            alive: set[int] = set()
            deadline = time.monotonic() + LOSS_WINDOW_S
            while len(alive) < len(peers) and time.monotonic() < deadline:
                time.sleep(LOSS_POLL_S)
                self.heartbeats.beat(self.rank)
                if (aborted := self.ends.aborted()) is not None and not aborted.on_purpose:
                    return aborted
                alive |= {k for k in peers if k not in alive and
                          (self.heartbeats.count(k) != first[k] or self.ends.exit(k) is not None)}
        except StoreGone as exc:
            return self.store_gone(exc) if not self.master else failure
        lost = [k for k in peers if k not in alive]
        if not lost:
            return failure
        where = ", ".join(f"node {k}" + (f" at {info.addr}" if (info := self._info(k)) else "") for k in lost)
        return Outcome.lost(f"lost {where}: no heartbeat for {LOSS_WINDOW_S:g}s (its container or host is gone, or "
                            f"cut off); {failure.reason}, in a collective with it")

    def _info(self, node: int):
        try:
            return self.members.node_info(node)
        except StoreGone:
            return None

    def live_workers(self) -> list[int]:
        """The workers that have neither left nor finished."""
        return [k for k in self.workers() if k not in self.gone and self.ends.exit(k) is None]

    def show_status(self) -> None:
        if self.peer_check:
            self.peer_check.show_status()

    def stopping(self, signum: int) -> Outcome:
        outcome = stop_outcome(self.config, signum)
        if outcome.ends_job:
            self.ends.abort(outcome)
        return outcome

    def store_gone(self, exc: Exception) -> Outcome:
        if self.master:
            return Outcome.failed(f"the job store failed: {exc}")
        return Outcome.lost(f"lost the master at {self.store.endpoint} ({exc}); it stopped or its host is "
                            f"unreachable, and the job ends with it")

    def _check_master(self) -> Outcome | None:
        master = self.ends.exit(0)
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
            outcome = self.ends.exit(k)
            if outcome is not None:
                if outcome.state is NodeState.LEFT:
                    self._leave(k, f"node {k} left the job ({outcome.reason})")
                elif not outcome.ok:
                    return outcome.aborting()
                continue
            cut = self._linked(k)
            if cut or self.silent(k):
                why = "its connection closed" if cut else f"no heartbeat for PEER_TIMEOUT={c.peer_timeout}s"
                if c.elastic:        # the launcher re-forms the group without it
                    self._leave(k, f"node {k} lost: {why}; the job goes on without it")
                    RoundKeys(self.store).report_lost(k, self.heartbeats.last_moved(k))
                    continue
                return Outcome.lost(f"node {k} stopped answering ({why})")
        return None

    def _linked(self, node: int) -> bool:
        """Whether node's link closed; first, a link to it once it has published its port."""
        if self.links is None:
            return False
        if not self.links.following(node):
            port, info = self.members.link_port(node), self._info(node)
            if port is not None and info is not None:
                self.links.follow(node, info.addr, port)
        return self.links.cut(node)

    def _leave(self, node: int, text: str) -> None:
        self.gone.add(node)
        if self.links is not None:
            self.links.let_go(node)
        self.log.say(text)

    def workers(self) -> list[int]:
        return self.members.claimed_workers(self.config.most_nodes)

    def silent(self, node: int) -> bool:
        return self.heartbeats.silent(node)
