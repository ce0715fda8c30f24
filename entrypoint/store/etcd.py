"""The job store on an etcd v3 cluster (issue 36): the same transport as tcp.py, kept by a
replicated store outside the job, so no node hosts it. The wire, and how a member that is
down or stalls is left for the next, is etcd_client.py's.

JOB_STORE selects it (job/peers.py), JOB_STORE_CA/_CERT/_KEY its TLS; torchrun's
rendezvous on the same cluster is launchers/torchrun/etcd_rendezvous.py.

A write retried on another member may have landed on the first after all. `set` and
`compare_set` are the same when repeated; `add` records each call's result under a key
of its own in the same transaction, so a retry finds it instead of adding twice.
"""

from __future__ import annotations

import time
import uuid
from typing import Callable

from .etcd_client import EtcdClient, EtcdTls, Refused
from .transport import JobStore, RendezvousError, StoreGone, job_prefix


class EtcdJobStore(JobStore):
    def __init__(self, endpoints: list[str], run_id: str, timeout_s: float, op_timeout_s: float, identity=None,
                 lease_ttl_s: int | None = None, tls: EtcdTls | None = None):
        """endpoints: each member's client URL (http://host:port, https:// with `tls`);
        timeout_s: how long to look for the store at start (RDZV_TIMEOUT); op_timeout_s:
        how long one operation may go unanswered by every member (PEER_TIMEOUT); lease_ttl_s:
        this node's keys vanish that long after it died (etcd_client.py); tls: etcd's CA and
        this node's client certificate (https:// endpoints)."""
        self.etcd = EtcdClient(endpoints, op_timeout_s, lease_ttl_s, tls)
        self.endpoint = self.etcd.name              # etcd://host:port,..., as JOB_STORE spells it
        self.prefix = job_prefix(run_id)
        self.timeout_s = timeout_s
        self.identity = identity

    @property
    def local_endpoint(self) -> str:
        return self.endpoint

    def _key(self, key: str) -> bytes:
        return (self.prefix + key).encode()

    def _call(self, operation, *args):
        try:
            return operation(*args)
        except StoreGone as exc:
            raise StoreGone(f"the job store at {exc}") from None

    def connect(self, deadline: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        last = "no attempt"
        while not cancelled():
            try:
                self.etcd.status(min(deadline, time.monotonic() + 2.0))
                return
            except StoreGone as exc:
                last = str(exc).split(": ", 1)[-1]
            except Refused as exc:
                raise RendezvousError(f"JOB_STORE={self.etcd.name}: {exc}") from None
            if time.monotonic() >= deadline:
                raise RendezvousError(f"no job store at JOB_STORE={self.etcd.name} after "
                                      f"RDZV_TIMEOUT={self.timeout_s:g}s (is etcd running, its client port "
                                      f"reachable, and does it want TLS: JOB_STORE_CA?); last error: {last}")

    def close(self) -> None:
        self.etcd.close()

    def has(self, key: str) -> bool:
        return self._call(self.etcd.range, self._key(key)) is not None

    def get(self, key: str) -> str | None:
        found = self._call(self.etcd.range, self._key(key))
        return found.value.decode() if found is not None else None

    def set(self, key: str, value: str) -> None:
        self._call(self.etcd.put, self._key(key), value.encode())

    def add(self, key: str, amount: int) -> int:
        """Exactly once, even when a reply is lost (see the module's text)."""
        return self._call(self.etcd.add, self._key(key), amount, self._key(f"{key}@add/{uuid.uuid4().hex}"))

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        done, found = self._call(self.etcd.compare_set, self._key(key), expected.encode(), desired.encode())
        if done:
            return desired
        return found.value.decode() if found is not None else ""
