"""Elastic Horovod's machinery (launcher: elastic.py): Horovod's own ElasticDriver, fed by the job store.

`horovodrun --host-discovery-script` runs horovod.runner.elastic.driver.ElasticDriver on
the launching machine: it asks a HostDiscovery for the hosts, serves the elastic
rendezvous, tells the workers (through their notification service) when hosts come or
go, and starts a worker process for each new slot with its `create_worker_fn`, over SSH.
Here the master's entrypoint runs the same driver with two pieces of its own, in the two
places horovod.ray.elastic also plugs in (RayHostDiscovery, its worker function):

* StoreDiscovery: the hosts are the job's live nodes in the job store (`node<k>` with its
  process count); a node is gone once the master's link to it closes (its processes all
  ended: job/links.py, held by the master's JobWatch), or, where nothing closes (a host
  that stops, a network that parts), once it stops heartbeating for PEER_TIMEOUT;
* HorovodElasticDriver.start_worker (the create_worker_fn): instead of SSH, an order in
  the job store for the node, whose entrypoint (HorovodElasticNode, on every node, the
  master too) starts the process and reports its exit code.

Keys (job store, under the job's prefix):
    hvd/<host>/orders            counter of the orders for a host
    hvd/<host>/order/<i>         {"env": {...}}: one worker process to start
    hvd/<host>/order/<i>/exit    its exit code
    hvd/<host>/order/<i>/stop    the driver wants it stopped (the host left the job)
    hvd/result                   the driver's end (Outcome JSON): every node then finishes
"""

from __future__ import annotations

import json
import threading
import time

from horovod.runner.elastic.discovery import HostDiscovery

from ...contract.config import Config
from ...job.ends import Ends
from ...job.links import LinkPort
from ...job.members import Members
from ...job.watch import Heartbeats, JobWatch
from ...running.log import Log
from ...running.loop import POLL_INTERVAL, supervise
from ...running.outcome import Outcome
from ...running.signals import Signals
from ...running.specs import ProcessSpec
from ...running.supervisor import Children
from ...security.tunnel import Gated, RequestTunnel
from ...store.transport import JobStore, StoreGone, read_json
from .fixed import gloo_env, host_name, node_rank_of, slot_env
from .rendezvous_server import HorovodRendezvous

PENDING_JOIN_S = 3.0     # a discovered host unassigned this long is announced to rank 0 again


def _order_key(host: str, i: int) -> str:
    return f"hvd/{host}/order/{i}"


class StoreDiscovery(HostDiscovery):
    """Horovod's HostDiscovery over the job store: every node that has joined, published
    its process count, not finished, and still heartbeats, in node-rank order. Horovod ranks
    hosts found together in that order (patch 0008), so global rank 0, Horovod's
    coordinator, is on the master, which the job cannot outlive anyway."""

    def __init__(self, store: JobStore, config: Config):
        super().__init__()
        self.config = config
        self.members, self.ends = Members(store), Ends(store)
        self.heartbeats = Heartbeats(store, config.peer_timeout)

    def alive(self, rank: int) -> bool:
        return self.ends.exit(rank) is None and not self.members.cut(rank) and not self.heartbeats.silent(rank)

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        found = {}
        for k in range(self.members.highest_rank(self.config.most_nodes) + 1):
            info = self.members.node_info(k) if self.members.claimed(k) else None
            if info is not None and self.alive(k):
                found[host_name(k)] = info.nproc
        return found


class HorovodElasticDriver:
    """On the master: Horovod's ElasticDriver, its elastic rendezvous server on
    HOROVOD_PORT, and the job's result in the job store when it ends."""

    def __init__(self, store: JobStore, plan, log: Log):
        from horovod.runner.elastic.driver import ElasticDriver
        from horovod.runner.elastic.rendezvous import create_rendezvous_handler

        c = plan.config
        self.store, self.config, self.log = store, c, log
        self.min_np, self.max_np = c.min_nodes * plan.nproc, c.max_nodes * plan.nproc
        self.discovery = StoreDiscovery(store, c)
        gated = store.identity is not None
        # Behind JOB_SECRET, as fixed-size Horovod's (tunnel.Gated): Horovod's HTTP server on
        # loopback (it has no authentication, and its handlers unpickle request bodies), a
        # Gate on HOROVOD_PORT, the master's own workers on `local_port`.
        self.server = HorovodRendezvous(0, "127.0.0.1") if gated else HorovodRendezvous(c.horovod_port)
        self.driver = ElasticDriver(self.server, self.discovery, self.min_np, self.max_np, timeout=c.rdzv_timeout)
        self.gated, self.local_port = None, None
        try:            # OSError: HOROVOD_PORT is taken (Job says so); nothing is left running
            self.port = self.server.start(create_rendezvous_handler(self.driver))
            if gated:
                self.gated = Gated(self.server, c.horovod_port, store.identity.server_context(), log.say)
                self.port, self.local_port = self.gated.port, self.gated.local_port
        except OSError:
            self.driver.stop()
            self.server.stop()
            raise
        self.thread = threading.Thread(target=self._run, name="horovod-elastic-driver", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.driver.stop()
        if self.gated is not None:
            self.gated.stop()

    def _run(self) -> None:
        try:
            hosts = self.driver.wait_for_available_slots(self.min_np)
            time.sleep(self.config.elastic_last_call)         # more nodes may be on their way
            hosts = self.driver.wait_for_available_slots(self.min_np) or hosts
            self.driver.start(min(self.max_np, hosts.count_available_slots()), self.start_worker)
            threading.Thread(target=self._retell_missed_joins, name="horovod-elastic-joins", daemon=True).start()
            outcome = self._outcome(self.driver.get_results())
        except Exception as exc:       # the driver's own errors (timeouts, no hosts left) end the job
            outcome = Outcome.failed(f"Horovod's elastic driver: {exc}")
        finally:
            self.driver.stop()
        try:
            self.store.set("hvd/result", outcome.to_json())
        except StoreGone:
            pass

    def _retell_missed_joins(self) -> None:
        """Horovod's driver tells rank 0 about a new host once, when discovery first sees it,
        and only if rank 0's notification service has registered by then (driver.py,
        _notify_workers_host_changes: 'no coordinator client, skipping'). A node that joins
        while rank 0 is still starting (importing torch: seconds in a container) would then
        wait for a reset that never comes. A host that stays discovered but unassigned for
        PENDING_JOIN_S is told again, at most every PENDING_JOIN_S."""
        from horovod.runner.elastic.discovery import HostUpdateResult

        driver, pending_since, told = self.driver, None, 0.0
        while not driver.finished():
            time.sleep(1.0)
            with driver._wait_hosts_cond:           # as the driver's own discovery thread
                hosts = driver._host_manager.current_hosts
                assigned = sum(len(slots) for slots in driver.host_assignments.values())
                waiting = bool(set(hosts.available_hosts) - set(driver.host_assignments)) and assigned < self.max_np
                now = time.monotonic()
                pending_since = (pending_since or now) if waiting else None
                if waiting and now - pending_since >= PENDING_JOIN_S and now - told >= PENDING_JOIN_S:
                    driver._notify_workers_host_changes(hosts, HostUpdateResult.added)
                    told = now

    @staticmethod
    def _outcome(results) -> Outcome:
        if results.error_message:
            return Outcome.failed(f"Horovod's elastic driver: {results.error_message}")
        failed = sorted((timestamp, name, code) for name, (code, timestamp) in results.worker_results.items()
                        if code != 0)
        if failed:
            _, name, code = failed[0]
            return Outcome.failed(f"Horovod worker {name} exited with {code}", code)
        return Outcome.succeeded()

    def start_worker(self, slot_info, events) -> tuple[int, float]:
        """Horovod's create_worker_fn: one worker process on slot_info's host; returns its
        exit code and when it ended, as the SSH-based one does."""
        host, c = slot_info.hostname, self.config
        # No RANK/WORLD_SIZE: the world changes size by design, and Horovod refreshes its own
        # HOROVOD_* variables at every reset (disttrain.context() reads those).
        env = {**slot_env(slot_info), **gloo_env(c.master_addr, self.port), "HOROVOD_ELASTIC": "1"}
        node, stop_sent = node_rank_of(host), False
        try:
            key = _order_key(host, self.store.add(f"hvd/{host}/orders", 1))
            self.store.set(key, json.dumps({"env": env}))
            while True:
                code = self.store.get(f"{key}/exit")
                if code is not None:
                    return int(code), time.time()
                if not stop_sent and any(event.is_set() for event in events):
                    self.store.set(f"{key}/stop", "1")
                    stop_sent = True
                if not self.discovery.alive(node):
                    return 1, time.time()             # the node is gone, and its process with it
                time.sleep(POLL_INTERVAL)
        except StoreGone:
            return 1, time.time()


class HorovodElasticNode:
    """On every node: starts the Horovod workers the driver orders for this node, reports
    their exits, and ends with the driver's result (or when the job says so)."""

    def __init__(self, store: JobStore, plan, placement, base_env: dict[str, str], log: Log,
                 signals: Signals, watch: JobWatch):
        self.store, self.plan, self.placement = store, plan, placement
        self.log, self.signals, self.watch = log, signals, watch
        self.host = host_name(placement.node_rank)
        self.children = Children(base_env, plan.config.grace_period, log)
        self.orders: dict[int, tuple[ProcessSpec, object]] = {}
        self.reported: set[int] = set()
        self.tunnel: RequestTunnel | None = None
        self.link = self._link_port() if plan.config.role != "master" else None

    def _link_port(self) -> LinkPort | None:
        """A worker's link port (job/links.py), published for the master, which learns at once
        when this node's processes are gone. It stays open until this process ends: closing it
        before this node's exit is in the job store would read as a loss."""
        rank, members = self.placement.node_rank, Members(self.store)
        try:
            info = members.node_info(rank)
            port = LinkPort(info.addr if info else "", self.store.identity)
            members.publish_link(rank, port.port)
            return port
        except (OSError, StoreGone) as exc:
            self.log.say(f"no link port ({exc}): if this node is lost, the master notices after PEER_TIMEOUT")
            return None

    def run(self) -> Outcome:
        try:
            outcome = supervise(self, self.watch, self.signals, self.log)
            self.children.stop_all()
            return outcome
        finally:
            if self.tunnel is not None:
                self.tunnel.stop()

    def _rendezvous(self, order_env: dict[str, str]) -> tuple[str, int] | None:
        """Where this node's workers reach the driver's rendezvous behind JOB_SECRET: on the
        master its loopback port (the placement's), elsewhere this node's tunnel to the Gate
        on the port the driver gave (one tunnel for the node's life). None: as ordered."""
        if self.store.identity is None:
            return None
        if self.plan.config.role == "master":
            return self.placement.server_addr, self.placement.server_port
        if self.tunnel is None:
            port = int(order_env["HOROVOD_GLOO_RENDEZVOUS_PORT"])
            self.tunnel = RequestTunnel(self.plan.config.master_addr, port,
                                        self.store.identity.client_context()).start()
        return "127.0.0.1", self.tunnel.port

    # ----------------------------------------------------------------- Supervised
    def poll(self) -> Outcome | None:
        try:
            self._take_orders()
            self._report_exits()
            result = self.store.get("hvd/result")
            if result is not None:
                return Outcome.from_json(result)
        except StoreGone as exc:
            return self.watch.check() or Outcome.lost(f"lost the job store: {exc}")
        return None

    def what(self) -> str:
        return f"{len(self.children.running)} process(es)"

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def _take_orders(self) -> None:
        """The driver counts an order, then writes it: one counted but not yet written is
        taken at the next poll (on the master, waiting for it here would hold up the job
        store's one thread, which the driver needs to write it)."""
        count = self.store.add(f"hvd/{self.host}/orders", 0)
        for i in range(len(self.orders) + 1, count + 1):
            order = read_json(self.store, _order_key(self.host, i))
            if order is None:
                return
            spec = self.plan.launcher.ordered(self.plan, self.placement, order["env"], self._rendezvous(order["env"]))
            self.orders[i] = (spec, self.children.start(spec))

    def _report_exits(self) -> None:
        for i, (spec, proc) in self.orders.items():
            if i in self.reported:
                continue
            code = proc.poll()
            if code is not None:
                self.store.set(f"{_order_key(self.host, i)}/exit", str(code))
                self.reported.add(i)
            elif self.store.has(f"{_order_key(self.host, i)}/stop"):
                self.children.stop([(spec, proc)])
