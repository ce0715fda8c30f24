"""Joining a job: from the plan to this node's Placement (node rank, peers, interface, ports).

    with Job(plan, log, signals) as job:      # the job store (served here on the master), Horovod's server
        placement = job.join()                # or NotJoined, carrying the node's Outcome
        outcome = Supervisor(plan_processes(plan, placement), ..., watch=job.watch(...)).run()
        outcome = job.finish(outcome)

`LocalJob` is the same for one node: nothing to meet, a placement on 127.0.0.1.
"""

from __future__ import annotations

import time

from . import hardware
from .config import ConfigError
from .jobstore import JobStore, RendezvousError, StoreGone
from .log import Log
from .outcome import Outcome
from .plan import NodeInfo, NodePlan, Placement
from .signals import Signals
from .watch import JobWatch, stop_outcome

EXIT_RENDEZVOUS = 3          # this node could not join: no master within RDZV_TIMEOUT, rank taken
HEARTBEAT_CHECK_S = 2.5      # nodes bump their heartbeat every second: a live one moves within this


class NotJoined(Exception):
    """Joining ended without a placement; `outcome` is what the node reports."""

    def __init__(self, outcome: Outcome):
        super().__init__(outcome.reason)
        self.outcome = outcome


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Job:
    """This node's membership of a multi-node job."""

    def __init__(self, plan: NodePlan, log: Log, signals: Signals):
        c = plan.config
        self.plan, self.config, self.log, self.signals = plan, c, log, signals
        self.master = c.role == "master"
        self.store = JobStore(c.master_addr, c.master_port, c.run_id, serve=self.master, timeout_s=c.rdzv_timeout,
                              op_timeout_s=c.peer_timeout)
        self.placement: Placement | None = None
        self._watch: JobWatch | None = None
        self._horovod = None                 # fixed-size Horovod: its rendezvous server
        self.horovod_driver = None           # elastic Horovod: its ElasticDriver (horovod_elastic.py)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        if self._horovod:
            self._horovod.stop()
        if self.horovod_driver:
            self.horovod_driver.driver.stop()

    # ----------------------------------------------------------------- joining
    def join(self) -> Placement:
        deadline = time.monotonic() + self.config.rdzv_timeout
        try:
            self.placement = self._join(deadline)
            return self.placement
        except _Stopped as exc:
            outcome = stop_outcome(self.config, exc.signum)
            if outcome.ends_job:
                self.store.abort(outcome)
            raise NotJoined(outcome) from None
        except (RendezvousError, StoreGone) as exc:
            reason = str(exc) if isinstance(exc, RendezvousError) else \
                f"lost the job store at {self.store.endpoint} during rendezvous ({exc})"
            self.log.say(f"rendezvous failed: {reason}", error=True)
            if self._job_needs_me(exc):
                self.store.abort(Outcome.failed(f"node {self._rank_text()}: {reason}"))
            raise NotJoined(Outcome.failed(reason, EXIT_RENDEZVOUS)) from None

    def _job_needs_me(self, exc: Exception) -> bool:
        """Whether this node failing to join ends the job: not for a worker of an elastic
        job (it goes on without it), nor for a node beyond NUM_NODES."""
        if self.master:
            return True
        return not self.config.elastic and getattr(exc, "ends_job", True)

    def _rank_text(self) -> str:
        return str(self.placement.node_rank) if self.placement else "(no rank yet)"

    def _check_signals(self) -> None:
        if self.signals.received is not None:
            raise _Stopped(self.signals.received)

    def _join(self, deadline: float) -> Placement:
        c, plan, store = self.config, self.plan, self.store
        if not self.master and hardware.resolve(c.master_addr) is None:
            self.log.say(f"WARNING: MASTER_ADDR={c.master_addr!r} does not resolve (yet); retrying for up to "
                         f"RDZV_TIMEOUT={c.rdzv_timeout}s")
        self.log.say(f"{'serving' if self.master else 'joining'} the job store at {store.endpoint}")
        self._connect(deadline)
        node_rank = self._claim_rank()
        master_ip = hardware.resolve(c.master_addr)
        if master_ip is None:
            raise RendezvousError(f"MASTER_ADDR={c.master_addr!r} does not resolve")
        source_ip = hardware.route_source(master_ip)
        try:
            iface, warnings = hardware.choose_interface(master_ip, source_ip, hardware.interfaces(), c.net_ifname)
        except LookupError as exc:
            raise ConfigError(str(exc)) from None
        for warning in warnings:
            self.log.say(f"WARNING: {warning}")
        node_addr = c.node_addr or (c.master_addr if self.master and not plan.numeric_addr else source_ip)
        if plan.numeric_addr:
            node_addr = hardware.resolve(node_addr) or node_addr
        ports = (tuple(range(c.worker_port_base, c.worker_port_base + plan.ports_needed)) if c.worker_port_base
                 else tuple(hardware.free_ports(plan.ports_needed)))
        me = NodeInfo(node_rank, node_addr, plan.nproc, ports)
        store.publish(me)
        store.beat(node_rank)
        nodes_text = f"{c.min_nodes}:{c.max_nodes}" if c.elastic else str(c.num_nodes)
        self.log.say(f"node {node_rank} of {nodes_text}: address {node_addr}, interface {iface or '(auto)'}, "
                     f"{plan.nproc} process(es)")
        nodes, horovod_port, torch_port = (me,), c.horovod_port, None
        if plan.rendezvous.exchange:
            nodes = tuple(self._wait_for_nodes(node_rank, deadline))
            if self.master:
                if plan.rendezvous.horovod_server:
                    from .horovod_rendezvous import HorovodRendezvous
                    self._horovod = HorovodRendezvous.for_nodes(list(nodes), c.horovod_port)
                    horovod_port = self._horovod.port
                # torch.distributed's env:// for scripts under Horovod: rank 0 is on the master,
                # on a port of its own (MASTER_PORT is the job store's).
                torch_port = hardware.free_ports(1)[0]
                store.announce_launch(horovod_port=horovod_port if self._horovod else None, torch_port=torch_port)
            else:
                launch = self._wait_for_launch(node_rank, deadline)
                horovod_port = launch.get("horovod_port") or horovod_port
                torch_port = launch.get("torch_port")
        if plan.horovod_elastic and self.master:
            from .horovod_elastic import HorovodElasticDriver
            self.horovod_driver = HorovodElasticDriver(store, plan, self.log)
            self.horovod_driver.start()
            horovod_port = self.horovod_driver.port
        return Placement(node_rank, nodes, iface=iface, master_port=torch_port or c.master_port,
                         horovod_addr=c.master_addr, horovod_port=horovod_port)

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
            self.store.disconnect()
            if time.monotonic() > deadline:
                raise RendezvousError(f"the job at {self.store.endpoint} was still ending after "
                                      f"RDZV_TIMEOUT={self.config.rdzv_timeout}s")
            time.sleep(1.0)

    def _job_state(self) -> str:
        """'open': the job has room for this node; 'full': it runs with all NUM_NODES nodes
        alive (this one is beyond NUM_NODES: _claim_rank refuses it); 'ending': it is aborting,
        or one of its nodes stopped heartbeating (this node comes back in its place). Elastic
        jobs always take a node in."""
        store, c = self.store, self.config
        if c.elastic:
            return "open"
        if store.aborted() is not None:
            return "ending"
        claimed = [k for k in range(c.num_nodes) if store.claimed(k)]
        if len(claimed) < c.num_nodes:
            return "open"
        before = {k: store.heartbeat(k) for k in claimed}
        time.sleep(HEARTBEAT_CHECK_S)
        return "full" if all(store.heartbeat(k) != before[k] for k in claimed) else "ending"

    def _claim_rank(self) -> int:
        """Rank 0 for the master, NODE_RANK if given, else the next free one (elastic
        jobs hand out fresh ranks to nodes that replace lost ones)."""
        c, store = self.config, self.store
        wanted = 0 if self.master else c.node_rank
        if wanted is not None:
            if not store.claim(wanted):
                raise RendezvousError(f"NODE_RANK={wanted} is already taken by another node at "
                                      f"{store.endpoint}; give each node its own NODE_RANK")
            return wanted
        while True:
            candidate = store.next_rank()
            if not c.elastic and candidate >= c.num_nodes:
                raise RendezvousError(f"more nodes joined {store.endpoint} than NUM_NODES={c.num_nodes}; "
                                      f"this one would be node {candidate}", ends_job=False)
            if store.claim(candidate):
                return candidate

    def _wait(self, node_rank: int, deadline: float, ready, timeout_text) -> None:
        while not ready():
            self._check_signals()
            aborted = self.store.aborted()
            if aborted:
                raise RendezvousError(f"job aborted during rendezvous: {aborted.reason}")
            if time.monotonic() > deadline:
                raise RendezvousError(timeout_text())
            self.store.beat(node_rank)
            time.sleep(0.2)

    def _wait_for_nodes(self, node_rank: int, deadline: float) -> list[NodeInfo]:
        count, store = self.config.num_nodes, self.store
        found: dict[int, NodeInfo] = {}

        def ready() -> bool:
            for k in range(count):
                if k not in found and (info := store.node_info(k)) is not None:
                    found[k] = info
            return len(found) == count

        def timeout_text() -> str:
            missing = [str(k) for k in range(count) if k not in found]
            return (f"only {len(found)} of {count} nodes joined MASTER_ADDR:MASTER_PORT={store.endpoint} within "
                    f"RDZV_TIMEOUT={self.config.rdzv_timeout}s; missing node(s) {', '.join(missing)}")

        self._wait(node_rank, deadline, ready, timeout_text)
        return [found[k] for k in range(count)]

    def _wait_for_launch(self, node_rank: int, deadline: float) -> dict:
        self._wait(node_rank, deadline, lambda: self.store.launch() is not None,
                   lambda: f"the master at {self.store.endpoint} did not start the job within "
                           f"RDZV_TIMEOUT={self.config.rdzv_timeout}s")
        return self.store.launch()

    # ----------------------------------------------------------------- running and finishing
    def watch(self, serverless: bool, token: str | None = None, agent_in_process: bool = False) -> JobWatch:
        """What the supervisor watches while this node's processes run. `serverless`: the
        node has no process of its own to wait for (TF servers, MPI hosts); `token`: the
        node token of its processes, for elastic torchrun (watch.py); `agent_in_process`:
        torch's agent runs in the entrypoint (agent.py)."""
        self._watch = JobWatch(self.store, self.config, self.placement.node_rank, self.log, self.signals,
                               serverless=serverless, token=token, agent_in_process=agent_in_process)
        return self._watch

    def finish(self, outcome: Outcome) -> Outcome:
        return self._watch.finish(outcome)


class LocalJob:
    """One node: nothing to meet. Horovod's rendezvous server runs here when needed."""

    def __init__(self, plan: NodePlan):
        self.plan = plan
        self._horovod = None

    def __enter__(self) -> "LocalJob":
        return self

    def __exit__(self, *exc) -> None:
        if self._horovod:
            self._horovod.stop()

    def join(self) -> Placement:
        plan = self.plan
        nodes = (NodeInfo(0, "127.0.0.1", plan.nproc, tuple(hardware.free_ports(plan.ports_needed, "127.0.0.1"))),)
        if plan.rendezvous and plan.rendezvous.horovod_server:
            from .horovod_rendezvous import HorovodRendezvous
            self._horovod = HorovodRendezvous.for_nodes(list(nodes), 0, "127.0.0.1")
        return Placement(0, nodes, iface=None, master_port=hardware.free_ports(1, "127.0.0.1")[0],
                         horovod_addr="127.0.0.1", horovod_port=self._horovod.port if self._horovod else None)

    def watch(self, serverless: bool, token: str | None = None, agent_in_process: bool = False) -> None:
        return None

    def finish(self, outcome: Outcome) -> Outcome:
        return outcome
