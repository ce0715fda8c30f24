"""Joining a job whose nodes meet on an external store (JOB_STORE, an etcd cluster): no
node is the master, none hosts anything the others need, and the first to arrive is as
good as any other.

    with PeerJob(plan, log, signals) as job:
        joined = job.join()        # the store reached (else ConfigError: exit 2), a node number

The node checks that the store answers as etcd v3, takes the next node number (the order
of arrival, for its log lines; torch's rendezvous gives the ranks, round by round) and
finds its own address: the one that routes to the store's first member, or NODE_ADDR.
Then torch's elastic agent meets the others through the same store, round by round
(launchers/torchrun/etcd_rendezvous.py), and a node's end is its own: there is no master
to wait for or to report to. What the master-hosted job store adds and this path does not
(yet): the job-wide hang verdict and straggler report (each node watches its own ranks),
and a job that stops as one when a node fails for good (here the others go on, as
torch's elastic agent does).
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlsplit

from ..contract.config import ConfigError
from ..machine import hardware
from ..running.log import Log
from ..running.signals import Signals
from ..store.etcd import EtcdJobStore
from ..store.etcd_client import EtcdTls
from ..store.transport import RendezvousError, StoreGone
from .join import JoinedJob, NotJoined
from .members import Members
from .placement import NodeInfo, Placement
from .watch import stop_outcome


def store_tls(c) -> EtcdTls | None:
    """JOB_STORE_CA (and a client certificate): TLS to etcd; ConfigError for a missing file."""
    files = {"JOB_STORE_CA": c.job_store_ca, "JOB_STORE_CERT": c.job_store_cert, "JOB_STORE_KEY": c.job_store_key}
    for name, path in files.items():
        if path is not None and not os.path.isfile(path):
            raise ConfigError(f"{name}={path!r}: no such file")
    return EtcdTls(c.job_store_ca, c.job_store_cert, c.job_store_key) if c.job_store_ca else None


class PeerJob:
    def __init__(self, plan, log: Log, signals: Signals):
        c = plan.config
        self.plan, self.config, self.log, self.signals = plan, c, log, signals
        self.store = EtcdJobStore(list(c.job_store), c.run_id, timeout_s=c.rdzv_timeout, op_timeout_s=c.peer_timeout,
                                  lease_ttl_s=c.peer_timeout, tls=store_tls(c))

    def __enter__(self) -> "PeerJob":
        return self

    def __exit__(self, *exc) -> None:
        self.store.close()

    def join(self) -> JoinedJob:
        c, launcher = self.config, self.plan.launcher
        self.log.say(f"joining the job {c.run_id} at {launcher.endpoint} (no node hosts it)")
        if c.job_store_cert is None:
            self.log.say("WARNING: anyone who reaches etcd's client port can join or stop this job: keep etcd on a "
                         "network only the job's nodes reach, or give it client certificates (JOB_STORE_CERT; "
                         "docs/rendezvous.md)")
        try:
            self.store.connect(time.monotonic() + c.rdzv_timeout, cancelled=lambda: self.signals.received is not None)
            if self.signals.received is not None:
                raise NotJoined(stop_outcome(c, self.signals.received))
            members = Members(self.store)
            node_rank = members.next_rank() - 1          # from 0: no node is kept for a master
            while not members.claim(node_rank):
                node_rank = members.next_rank() - 1
        except (RendezvousError, StoreGone) as exc:
            raise ConfigError(str(exc)) from None
        first = urlsplit(c.job_store[0]).hostname
        target = hardware.resolve(first)
        if target is None:
            raise ConfigError(f"JOB_STORE: {first!r} does not resolve")
        try:
            where = hardware.locate(target, first, c.node_addr, c.net_ifname, False, launcher.numeric_addr)
        except LookupError as exc:
            raise ConfigError(str(exc)) from None
        for warning in where.warnings:
            self.log.say(f"WARNING: {warning}")
        me = NodeInfo(node_rank, where.addr, launcher.nproc)
        nodes = f"{c.min_nodes}:{c.max_nodes}" if c.elastic else str(c.num_nodes)
        self.log.say(f"node {node_rank} (in order of arrival) of {nodes}: address {where.addr}, "
                     f"interface {where.iface or '(auto)'}, {launcher.nproc} process(es)")
        placement = Placement(node_rank, (me,), iface=where.iface, master_port=c.master_port)
        return JoinedJob(placement, None, c, self.log, self.signals)
