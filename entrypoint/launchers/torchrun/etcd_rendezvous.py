"""torchrun's rendezvous on an etcd v3 cluster (issue 36, part 2): no node hosts it.

torch's dynamic rendezvous keeps its state (who joined, the round, each node's keep-alive)
through a RendezvousBackend, two calls: get the state, and set it if nobody changed it
since (a compare-and-set on a token). Here the state is one etcd key and the token its
mod_revision, compared in an etcd transaction. The agents also need a torch Store for
each round (ranks, the workers' MASTER_ADDR, the exit barrier): `EtcdStore` is one, on the
same cluster. The workers' own torch.distributed store is served by the round's global
rank 0, a new one each round (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1), so it moves with the
round: whichever node dies, first or not, the others form a new round without it.

    python -m entrypoint.launchers.torchrun.run --rdzv-backend=etcd-v3 \
        --rdzv-endpoint=http://etcd1:2379,http://etcd2:2379,http://etcd3:2379 --rdzv-id=JOB ...

With https:// endpoints, `--rdzv-conf` names the TLS files: ca_file=..., and cert_file=...,
key_file=... for an etcd that asks for a client certificate. torch unpickles the state it
reads, so whoever may write to etcd may run code in every agent: etcd's client
certificates are what keeps others out (docs/rendezvous.md).

`--rdzv-id` names the job on the cluster. Every key an agent writes is held by its lease
(etcd_client.py, TTL op_timeout): a job's keys vanish that long after its last node ended,
and a job started again under the same id within that time waits for them to go.
"""

from __future__ import annotations

import datetime as dt
import sys
import time

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, create_handler

from ...store import etcd_client as wire
from ...store.etcd_client import EtcdClient, EtcdTls, Refused
from ...store.transport import StoreGone, job_prefix

BACKEND = "etcd-v3"
POLL_S = (0.005, 0.05)          # a waiting get polls first this often, then at most this seldom


def endpoints(text: str) -> list[str]:
    """`--rdzv-endpoint`: members' client URLs, comma-separated; http:// when no scheme."""
    found = [e.strip().rstrip("/") for e in text.split(",") if e.strip()]
    return [e if "://" in e else f"http://{e}" for e in found]


def _root(run_id: str) -> bytes:
    return f"{job_prefix(run_id)}torchrun/".encode()


def _bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


class StoreLost(RendezvousConnectionError):
    """No member of the cluster answered within the operation's timeout: the node stops."""


class _Guarded:
    """The client, each call raising StoreLost (torch's own connection error) for StoreGone."""

    def __init__(self, client: EtcdClient):
        self._client = client

    def __getattr__(self, name: str):
        found = getattr(self._client, name)
        if not callable(found):
            return found

        def call(*args):
            try:
                return found(*args)
            except (StoreGone, Refused) as exc:
                raise StoreLost(f"lost the rendezvous store: {exc}") from None
        return call


class EtcdRendezvousBackend(RendezvousBackend):
    """The rendezvous state as one key; its token, the key's mod_revision."""

    def __init__(self, client: EtcdClient, run_id: str):
        self.client = _Guarded(client)
        self.key = _root(run_id) + b"state"

    @property
    def name(self) -> str:
        return BACKEND

    def get_state(self) -> tuple[bytes, int] | None:
        found = self.client.range(self.key)
        return (found.value, found.mod_revision) if found is not None else None

    def set_state(self, state: bytes, token=None) -> tuple[bytes, int, bool] | None:
        unchanged = wire.unchanged_since(self.key, token) if isinstance(token, int) else wire.absent(self.key)
        done, revision, responses = self.client.txn([unchanged], [self.client.put_op(self.key, state)],
                                                     [wire.get(self.key)])
        if done:
            return state, revision, True
        found = wire.ranged(responses)
        return (found.value, found.mod_revision, False) if found is not None else None


class EtcdStore(dist.Store):
    """A torch Store on etcd, for the agents' keys of a round (torch prefixes them per round)."""

    def __init__(self, client: EtcdClient, run_id: str, timeout: dt.timedelta):
        super().__init__()
        self.client = _Guarded(client)
        self.root = _root(run_id) + b"kv/"
        self.set_timeout(timeout)

    def _key(self, key: str) -> bytes:
        return self.root + key.encode()

    def set(self, key: str, value) -> None:
        self.client.put(self._key(key), _bytes(value))

    def get(self, key: str) -> bytes:
        return self._wait_for([key])[key]

    def add(self, key: str, amount: int) -> int:
        return self.client.add(self._key(key), amount)

    def compare_set(self, key: str, expected, desired) -> bytes:
        """TCPStore's answer: `desired` if set; else what is stored, or `expected` for a
        missing key that was expected to hold something."""
        expected, desired = _bytes(expected), _bytes(desired)
        done, found = self.client.compare_set(self._key(key), expected, desired)
        if done:
            return desired
        return found.value if found is not None else expected

    def check(self, keys: list[str]) -> bool:
        return all(self.client.range(self._key(k)) is not None for k in keys)

    def wait(self, keys: list[str], timeout: dt.timedelta | None = None) -> None:
        self._wait_for(keys, timeout)

    def _wait_for(self, keys: list[str], timeout: dt.timedelta | None = None) -> dict[str, bytes]:
        """Each key's value once every one is set, polling; DistStoreError after the timeout."""
        limit = (timeout or self.timeout).total_seconds()
        deadline, pause = time.monotonic() + limit, POLL_S[0]
        found: dict[str, bytes] = {}
        while True:
            for k in keys:
                if k not in found and (entry := self.client.range(self._key(k))) is not None:
                    found[k] = entry.value
            if len(found) == len(keys):
                return found
            if time.monotonic() >= deadline:
                missing = [k for k in keys if k not in found]
                raise dist.DistStoreError(f"wait timeout after {limit:g}s for key(s) {missing} in the etcd store "
                                          f"at {self.client.name}")
            time.sleep(pause)
            pause = min(POLL_S[1], pause * 2)

    def delete_key(self, key: str) -> bool:
        return self.client.delete(self._key(key)) > 0

    def num_keys(self) -> int:
        return self.client.count(self.root)

    # torch's binding asks a Python store for these two under their C++ names.
    deleteKey = delete_key
    getNumKeys = num_keys


def wait_for_an_ended_job(backend: EtcdRendezvousBackend, wait_s: float) -> None:
    """A rendezvous that ended (a job that finished under the same id) stays closed until
    the last lease that holds it runs out: a node starting within that time waits for it
    (at most `wait_s`, one line) rather than failing with torch's RendezvousClosedError."""
    import pickle

    deadline, said = time.monotonic() + wait_s, False
    while time.monotonic() < deadline:
        found = backend.get_state()
        if found is None or not getattr(pickle.loads(found[0]), "closed", False):
            return
        if not said:
            print(f"torchrun: the rendezvous {backend.key.decode()} on etcd belongs to a job that ended; waiting up "
                  f"to {wait_s:g}s for its keys to expire", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.5)


def create_etcd_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's dynamic rendezvous (its timeouts, keep-alives and rounds) on etcd.
    `read_timeout`: how long an agent waits for another's key of the round; `op_timeout`:
    how long a call may go unanswered by every member before the store counts as lost."""
    read_timeout = params.get_as_int("read_timeout", 60)
    op_timeout = params.get_as_int("op_timeout", 10)
    ca = params.get("ca_file")
    tls = EtcdTls(ca, params.get("cert_file"), params.get("key_file")) if ca else None
    client = EtcdClient(endpoints(params.endpoint), op_timeout_s=op_timeout, lease_ttl_s=max(2, op_timeout), tls=tls)
    store = EtcdStore(client, params.run_id, dt.timedelta(seconds=read_timeout))
    backend = EtcdRendezvousBackend(client, params.run_id)
    wait_for_an_ended_job(backend, client.lease_ttl_s + 2)
    return create_handler(store, backend, params)


def register() -> None:
    """Make `--rdzv-backend=etcd-v3` known to torch's agent in this process (again: no-op)."""
    rendezvous_handler_registry.register(BACKEND, create_etcd_handler)
