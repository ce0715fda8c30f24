"""Joining a job: from the plan to a JoinedJob (the job store and this node's Placement:
node rank, peers, interface, ports).

    with Job(plan, log, signals) as job:      # the job store (served here on the master), the launcher's servers
        joined = job.join()                   # or NotJoined, carrying the node's Outcome
        runner = plan.launcher.runner(plan, joined, env, log, signals)   # watches through health.watching(joined)
        outcome = finish_together(runner.watch, runner.run())           # finish.py

`LocalJob` is the same for one node: nothing to meet, a placement on 127.0.0.1. Where the
node is (its address and interface) is hardware.locate's. The launcher brings its own part
of the meeting through its class (launchers/base.py): whether the nodes exchange addresses,
what it serves on the master and on which port, how a worker reaches that server, the
per-rank variables it announces. This module names no framework.

`plan` is the NodePlan (plan.py, a layer above this one, not imported here).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

from ..contract.config import Config, ConfigError
from ..machine import hardware
from ..running.log import Log
from ..running.outcome import Outcome
from ..running.signals import Signals
from ..security.secret import Deriving
from ..store.tcp import TcpJobStore
from ..store.transport import JobStore, RendezvousError, StoreGone
from .ends import Ends
from .finish import LEAVE_WAIT_S, WAIT_INTERVAL_S
from .members import Launch, Members
from .placement import NodeInfo, Placement
from .watch import Heartbeats, stop_outcome

EXIT_RENDEZVOUS = 3          # this node could not join: no master within RDZV_TIMEOUT, rank taken
HEARTBEAT_CHECK_S = 2.5      # nodes bump their heartbeat every second: a live one moves within this
WAIT_BLOCK_S = 0.5           # the longest one wait on the store while joining (signals, an abort, beats between)


@dataclass(frozen=True)
class Meeting:
    """What joining the other nodes gave this node (Job._meet)."""
    nodes: tuple[NodeInfo, ...]
    server_addr: str                       # where this node's processes reach the launcher's server on the master
    server_port: int | None
    torch_port: int | None = None          # torch's env:// store for launchers whose processes form a group
    launch_env: tuple[dict[str, str], ...] = ()


class NotJoined(Exception):
    """Joining ended without a placement; `outcome` is what the node reports."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.reason)
        self.outcome = outcome


@dataclass(frozen=True)
class JoinedJob:
    """This node, in its job: the job store (None on one node) and where the node stands.
    What a runner watches while its processes run is health.watching(joined)'s."""
    placement: Placement
    store: JobStore | None = None
    config: Config | None = None
    log: Log | None = None
    signals: Signals | None = None
    progress: Any = None        # health.progress.ProgressFolder: where this node's processes report progress


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Job:
    """This node's membership of a multi-node job."""

    def __init__(self, plan, log: Log, signals: Signals, identity: Deriving | None = None):
        """`identity`: the job's secret (secret.py), or None for an open control plane."""
        c = plan.config
        self.plan, self.config, self.log, self.signals = plan, c, log, signals
        self.master = c.role == "master"
        self.store: JobStore = TcpJobStore(c.master_addr, c.master_port, c.run_id, serve=self.master,
                                           timeout_s=c.rdzv_timeout, op_timeout_s=c.peer_timeout, identity=identity,
                                           say=log.say)
        self.members, self.ends = Members(self.store), Ends(self.store)
        self.heartbeats = Heartbeats(self.store, c.peer_timeout)
        self.node_rank: int | None = None
        self.server = None                   # what the launcher serves on the master (Launcher.serve)
        self.tunnels: list = []              # to the master's servers behind JOB_SECRET (Launcher.reach_server)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        if self.server:
            self.server.stop()
        for tunnel in self.tunnels:
            tunnel.stop()
        self.store.close()

    # ----------------------------------------------------------------- joining
    def join(self) -> JoinedJob:
        deadline = time.monotonic() + self.config.rdzv_timeout
        try:
            placement = self._join(deadline)
            return JoinedJob(placement, self.store, self.config, self.log, self.signals)
        except _Stopped as exc:
            outcome = stop_outcome(self.config, exc.signum)
            if outcome.ends_job:
                self.ends.abort(outcome)
            raise NotJoined(outcome) from None
        except (RendezvousError, StoreGone) as exc:
            reason = str(exc) if isinstance(exc, RendezvousError) else \
                f"lost the job store at {self.store.endpoint} during rendezvous ({exc})"
            self.log.say(f"rendezvous failed: {reason}", error=True)
            if self._job_needs_me(exc):
                self.ends.abort(Outcome.failed(f"node {self._rank_text()}: {reason}"))
            outcome = Outcome.failed(reason, EXIT_RENDEZVOUS)
            self._leave_rendezvous(outcome)
            raise NotJoined(outcome) from None

    def _leave_rendezvous(self, outcome: Outcome) -> None:
        """Failing to join, as finishing together does for a running job: a worker records
        its exit; the master keeps the store up until the workers that claimed a rank have
        read why the job ends and recorded theirs (at most LEAVE_WAIT_S), so that each says
        the master's reason rather than losing its store mid-rendezvous."""
        if self.node_rank is None:
            return
        try:
            if not self.master:
                self.ends.set_exit(self.node_rank, outcome)
                return
            joined = self.members.claimed_workers(self.config.most_nodes)
            deadline = time.monotonic() + LEAVE_WAIT_S
            while time.monotonic() < deadline and any(self.ends.exit(k) is None for k in joined):
                time.sleep(WAIT_INTERVAL_S)
        except StoreGone:
            pass

    def _job_needs_me(self, exc: Exception) -> bool:
        """Whether this node failing to join ends the job: not for a worker of an elastic
        job (it goes on without it), nor for a node beyond NUM_NODES."""
        if self.master:
            return True
        return not self.config.elastic and getattr(exc, "ends_job", True)

    def _rank_text(self) -> str:
        return str(self.node_rank) if self.node_rank is not None else "(no rank yet)"

    def _check_signals(self) -> None:
        if self.signals.received is not None:
            raise _Stopped(self.signals.received)

    def _join(self, deadline: float) -> Placement:
        c, launcher, store = self.config, self.plan.launcher, self.store
        if not self.master and hardware.resolve(c.master_addr) is None:
            self.log.say(f"WARNING: MASTER_ADDR={c.master_addr!r} does not resolve (yet); retrying for up to "
                         f"RDZV_TIMEOUT={c.rdzv_timeout}s")
        tls = " (TLS, JOB_SECRET)" if store.identity else ""
        self.log.say(f"{'serving' if self.master else 'joining'} the job store at {store.endpoint}{tls}")
        if self.master and store.identity is None:
            self.log.say(f"WARNING: no JOB_SECRET: anyone who can reach MASTER_PORT={c.master_port} can join, stop or "
                         f"run code in this job; set JOB_SECRET (or JOB_SECRET_FILE) on every node "
                         f"(docs/security.md)")
        elif self.master:
            for what in launcher.open_despite_secret():
                self.log.say(f"WARNING: JOB_SECRET does not cover {what}")
        self._connect(deadline)
        node_rank = self.node_rank = self._claim_rank()
        master_ip = hardware.resolve(c.master_addr)
        if master_ip is None:
            raise RendezvousError(f"MASTER_ADDR={c.master_addr!r} does not resolve")
        try:
            where = hardware.locate(master_ip, c.master_addr, c.node_addr, c.net_ifname, self.master,
                                    launcher.numeric_addr)
        except LookupError as exc:
            raise ConfigError(str(exc)) from None
        for warning in where.warnings:
            self.log.say(f"WARNING: {warning}")
        me = NodeInfo(node_rank, where.addr, launcher.nproc,
                      hardware.node_ports(launcher.ports_needed(self.master), c.worker_port_base))
        self.members.publish(me)
        self.heartbeats.beat(node_rank)
        nodes_text = f"{c.min_nodes}:{c.max_nodes}" if c.elastic else str(c.num_nodes)
        self.log.say(f"node {node_rank} of {nodes_text}: address {where.addr}, interface {where.iface or '(auto)'}, "
                     f"{launcher.nproc} process(es)")
        met = self._meet(me, deadline)
        return Placement(node_rank, met.nodes, iface=where.iface, master_port=met.torch_port or c.master_port,
                         server_addr=met.server_addr, server_port=met.server_port, launch_env=met.launch_env,
                         store_endpoint=store.local_endpoint if store.identity else None)

    def _meet(self, me: NodeInfo, deadline: float) -> "Meeting":
        """The launcher's part of joining: the other nodes' addresses when it exchanges them,
        its server on the master (announced with the port of torch's env:// store for
        launchers whose processes form their own group, and its per-rank variables), or the
        master's announcement. Where the master starts every rank (mpirun), that port is the
        master's alone to pick."""
        c, launcher = self.config, self.plan.launcher
        met = Meeting((me,), c.master_addr, launcher.server_port)
        if launcher.exchange:
            met = dataclasses.replace(met, nodes=tuple(self._wait_for_nodes(me.node_rank, deadline)))
        if self.master:
            return self._host_meeting(met)
        if launcher.exchange:
            launch = self._wait_for_launch(me.node_rank, deadline)
            met = dataclasses.replace(met, torch_port=launch.torch_port, launch_env=launch.launch_env)
            if launch.server_port:
                addr, port, tunnel = launcher.reach_server(c.master_addr, launch.server_port, self.store.identity)
                if tunnel is not None:
                    self.tunnels.append(tunnel)
                met = dataclasses.replace(met, server_addr=addr, server_port=port)
        return met

    def _host_meeting(self, met: "Meeting") -> "Meeting":
        """The master's side: the launcher's server, then the launch announcement."""
        c, launcher, store = self.config, self.plan.launcher, self.store
        try:
            self.server = launcher.serve(self.plan, list(met.nodes), store, self.log)
        except OSError as exc:           # its port is taken
            raise RendezvousError(f"cannot serve {launcher.server_text}: "
                                  f"{os.strerror(exc.errno) if exc.errno else exc}") from None
        if self.server:
            # Behind JOB_SECRET the server listens on loopback (tunnel.Gated): the master's
            # own processes reach it there.
            local = getattr(self.server, "local_port", None)
            met = dataclasses.replace(met, server_addr="127.0.0.1" if local else c.master_addr,
                                      server_port=local or self.server.port)
        if launcher.exchange:
            # torch.distributed's env:// for the processes' own group: rank 0 is on the
            # master, on a port of its own (MASTER_PORT is the job store's).
            met = dataclasses.replace(met, torch_port=hardware.free_ports(1)[0],
                                      launch_env=launcher.launch_env(list(met.nodes)))
            self.members.announce_launch(Launch(self.server.port if self.server else None, met.torch_port,
                                                met.launch_env))
        elif launcher.ranks_own_store:
            met = dataclasses.replace(met, torch_port=hardware.free_ports(1)[0])
        return met

    def _connect(self, deadline: float) -> None:
        """Reach the job store. A node restarted after a failure (compose `restart:
        on-failure`) may find the job it left still ending: it waits for the master's next
        start (a fresh job store) instead of failing and spending a restart."""
        waited = False
        while True:
            self.store.connect(deadline, cancelled=lambda: self.signals.received is not None)
            self._check_signals()
            if self.master:
                return
            try:
                if self._job_state() != "ending":
                    return
            except StoreGone:             # the ending job's master exited while we looked
                pass
            if not waited:
                self.log.say(f"the job at {self.store.endpoint} is ending (it lost a node, maybe this one's "
                             f"previous run); waiting for the master's next start to join it")
                waited = True
            if time.monotonic() > deadline:
                raise RendezvousError(f"the job at {self.store.endpoint} was still ending after "
                                      f"RDZV_TIMEOUT={self.config.rdzv_timeout}s")
            time.sleep(1.0)

    def _job_state(self) -> str:
        """'open': the job has room for this node; 'full': it runs with all NUM_NODES nodes
        alive (this one is beyond NUM_NODES: _claim_rank refuses it); 'ending': it is aborting,
        or one of its nodes stopped heartbeating (this node comes back in its place). Elastic
        jobs always take a node in."""
        c = self.config
        if c.elastic:
            return "open"
        if self.ends.aborted() is not None:
            return "ending"
        claimed = [k for k in range(c.num_nodes) if self.members.claimed(k)]
        if len(claimed) < c.num_nodes:
            return "open"
        before = {k: self.heartbeats.count(k) for k in claimed}
        time.sleep(HEARTBEAT_CHECK_S)
        return "full" if all(self.heartbeats.count(k) != before[k] for k in claimed) else "ending"

    def _claim_rank(self) -> int:
        """Rank 0 for the master, NODE_RANK if given, else the next free one (elastic
        jobs hand out fresh ranks to nodes that replace lost ones)."""
        c, store, members = self.config, self.store, self.members
        wanted = 0 if self.master else c.node_rank
        if wanted is not None:
            if not members.claim(wanted):
                raise RendezvousError(f"NODE_RANK={wanted} is already taken by another node at "
                                      f"{store.endpoint}; give each node its own NODE_RANK")
            return wanted
        while True:
            candidate = members.next_rank()
            if not c.elastic and candidate >= c.num_nodes:
                raise RendezvousError(f"more nodes joined {store.endpoint} than NUM_NODES={c.num_nodes}; "
                                      f"this one would be node {candidate}", ends_job=False)
            if members.claim(candidate):
                return candidate

    def _wait(self, node_rank: int, deadline: float, ready, block, timeout_text) -> None:
        """Until ready(): block(seconds) waits on the store for what ready() still lacks, at
        most WAIT_BLOCK_S at a time; between waits, signals and an abort are seen, and this
        node beats once a second (as the watch does). A wait is one request, answered when the
        key is set: behind a secret every request goes through two TLS relays, and polling
        for the other nodes was most of what the secret cost a job's start on few cores."""
        beat_at = 0.0
        while not ready():
            self._check_signals()
            aborted = self.ends.aborted()
            if aborted:
                raise RendezvousError(f"job aborted during rendezvous: {aborted.reason}")
            now = time.monotonic()
            if now > deadline:
                raise RendezvousError(timeout_text())
            if now - beat_at >= 1.0:
                self.heartbeats.beat(node_rank)
                beat_at = now
            block(max(0.0, min(WAIT_BLOCK_S, deadline - now)))

    def _wait_for_nodes(self, node_rank: int, deadline: float) -> list[NodeInfo]:
        count, store = self.config.num_nodes, self.store
        found: dict[int, NodeInfo] = {}

        def missing() -> list[int]:
            return [k for k in range(count) if k not in found]

        def ready() -> bool:
            for k in missing():
                if (info := self.members.node_info(k)) is None:
                    return False
                found[k] = info
            return True

        def timeout_text() -> str:
            return (f"only {len(found)} of {count} nodes joined MASTER_ADDR:MASTER_PORT={store.endpoint} within "
                    f"RDZV_TIMEOUT={self.config.rdzv_timeout}s; missing node(s) {', '.join(map(str, missing()))}")

        self._wait(node_rank, deadline, ready, lambda s: self.members.await_info(missing()[0], s), timeout_text)
        return [found[k] for k in range(count)]

    def _wait_for_launch(self, node_rank: int, deadline: float) -> Launch:
        launch: list[Launch] = []

        def ready() -> bool:
            launch[:] = [found] if (found := self.members.launch()) is not None else []
            return bool(launch)

        self._wait(node_rank, deadline, ready, self.members.await_launch,
                   lambda: f"the master at {self.store.endpoint} did not start the job within "
                           f"RDZV_TIMEOUT={self.config.rdzv_timeout}s")
        return launch[0]



class LocalJob:
    """One node: nothing to meet. The launcher's server runs here when it has one."""

    def __init__(self, plan, log: Log):
        self.plan, self.log = plan, log
        self.server = None

    def __enter__(self) -> "LocalJob":
        return self

    def __exit__(self, *exc) -> None:
        if self.server:
            self.server.stop()

    def join(self) -> JoinedJob:
        launcher = self.plan.launcher
        nodes = (NodeInfo(0, "127.0.0.1", launcher.nproc,
                          tuple(hardware.free_ports(launcher.ports_needed(True), "127.0.0.1"))),)
        self.server = launcher.serve(self.plan, list(nodes), None, self.log)
        placement = Placement(0, nodes, iface=None, master_port=hardware.free_ports(1, "127.0.0.1")[0],
                              server_addr="127.0.0.1", server_port=self.server.port if self.server else None,
                              launch_env=launcher.launch_env(list(nodes)))
        return JoinedJob(placement, None, self.plan.config, self.log)
