"""A client of an etcd v3 cluster: keys and values as bytes, over etcd's own v3 JSON gateway.

The gateway (`/v3/kv/range`, `/v3/kv/txn`, ...: etcd's gRPC API as JSON over HTTP, served
on every member's client port since etcd 3.3) needs nothing but HTTP; urllib3 carries it,
which the image already has (boto3 depends on it). etcd's v2 API, the one torch's etcd
rendezvous needs, is off by default in 3.4 and gone in 3.6; python-etcd3, the gRPC
client, was last released in 2020 and its generated code predates the protobuf that
TensorFlow installs.

Every member named is tried in turn: a member that does not answer (stopped, cut off, or
out of the quorum) is left for the next, so losing one member of three is not noticed.
A member that holds a request longer than STALL_S is left too: when the leader dies, a
follower keeps a write it had forwarded to it for etcd's request timeout (6 s with the
test cluster's timings) before it answers 503; another member takes it at once. Only
when no member answers within the operation's timeout does the store count as gone
(StoreGone). Two users sit on this: the job store (etcd.py) and torchrun's rendezvous
(launchers/torchrun/etcd_rendezvous.py).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from dataclasses import dataclass

from .transport import StoreGone

RETRY_S = 0.1                       # between two rounds over the members
STALL_S = 1.0                       # a member that holds a request longer is left for the next


class Refused(Exception):
    """A member answered, but this client cannot use it: not etcd's v3 gateway (another
    server, or etcd < 3.3), or TLS failed (a CA that did not sign it, a client certificate
    it does not take, or none where it asks for one). Trying again would not help."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


# Conditions of a transaction on one key (etcd's Compare), as the gateway spells them.
def absent(key: bytes) -> dict:
    return {"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}


def unchanged_since(key: bytes, mod_revision: int) -> dict:
    return {"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}


def holds(key: bytes, value: bytes) -> dict:
    return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(value)}


def get(key: bytes) -> dict:
    return {"requestRange": {"key": b64(key)}}


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd: the CA that signed the members' certificates, and this node's client
    certificate and key where etcd asks for one (--client-cert-auth); PEM files."""
    ca: str
    cert: str | None = None
    key: str | None = None

    def pool_options(self) -> dict:
        return {"cert_reqs": "CERT_REQUIRED", "ca_certs": self.ca, "cert_file": self.cert, "key_file": self.key}


class Entry:
    """A key's value and the revision that last changed it (etcd's KeyValue)."""

    def __init__(self, kv: dict):
        self.value = unb64(kv.get("value", ""))
        self.mod_revision = int(kv["mod_revision"])


class EtcdClient:
    """`lease_ttl_s`: every key this client writes is held by a lease of its own, which a
    thread keeps alive every third of that time; when the process dies (or freezes) for
    that long, etcd deletes its keys. So a job's keys outlive it by that long at most, and
    the same RUN_ID can name a new job after it. Leases are never revoked on purpose: a
    node that leaves may have written a key the others still read (torch's rendezvous
    state), which they rewrite with their own lease within a keep-alive interval."""

    def __init__(self, endpoints: list[str], op_timeout_s: float, lease_ttl_s: int | None = None,
                 tls: EtcdTls | None = None):
        """endpoints: each member's client URL (http://host:port, https:// with `tls`);
        op_timeout_s: how long one operation may go unanswered by every member before StoreGone."""
        import urllib3

        self.lease_ttl_s = lease_ttl_s
        self._lease: str | None = None
        self._lease_lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._closed = threading.Event()
        self.endpoints = list(endpoints)
        self.endpoint = ",".join(self.endpoints)
        self.name = "etcd://" + ",".join(e.split("://", 1)[-1] for e in self.endpoints)   # as JOB_STORE spells it
        self.op_timeout_s = op_timeout_s
        self._at = 0                        # the member that answered last
        self._http = urllib3.PoolManager(retries=False, **(tls.pool_options() if tls else {}))

    def post(self, path: str, body: dict, deadline: float | None = None) -> dict:
        """One call, to the member that answered last, then each other in turn, until one
        answers or `deadline` (default: the operation's timeout from now)."""
        import urllib3

        started = time.monotonic()
        deadline = deadline if deadline is not None else started + self.op_timeout_s
        last = "no attempt"
        payload = json.dumps(body).encode()
        while True:
            for i in range(len(self.endpoints)):
                at = (self._at + i) % len(self.endpoints)
                wait = max(0.1, min(STALL_S, deadline - time.monotonic()))
                try:
                    reply = self._http.request("POST", self.endpoints[at] + path, body=payload,
                                               headers={"Content-Type": "application/json"},
                                               timeout=urllib3.Timeout(connect=min(1.0, wait), read=wait))
                except urllib3.exceptions.SSLError as exc:
                    reason = str(exc.__context__ or exc).splitlines()[0][:300]
                    raise Refused(f"TLS with {self.endpoints[at]} failed: {reason}") from None
                except urllib3.exceptions.HTTPError as exc:
                    last = f"{self.endpoints[at]}: {type(exc).__name__}"
                    continue
                if reply.status == 200:
                    self._at = at
                    return json.loads(reply.data)
                if reply.status == 404 and b"lease not found" in reply.data:
                    self._lease = None           # the next write asks for a new one
                    raise StoreGone(f"{self.name}: this node's lease ran out (it was silent longer than its "
                                    f"TTL, {self.lease_ttl_s}s), and its keys with it")
                if reply.status == 404:
                    raise Refused(f"{self.endpoints[at]}{path} answers HTTP 404: not etcd's v3 API (etcd 3.3 or "
                                  f"later serves it on each member's client port)")
                last = f"{self.endpoints[at]}: HTTP {reply.status} {reply.data[:200].decode(errors='replace')}"
            if time.monotonic() >= deadline:
                raise StoreGone(f"{self.name} did not answer for {time.monotonic() - started:.0f}s "
                                f"(quorum lost, or cut off?); last: {last}")
            time.sleep(RETRY_S)

    def range(self, key: bytes) -> Entry | None:
        kvs = self.post("/v3/kv/range", {"key": b64(key)}).get("kvs") or []
        return Entry(kvs[0]) if kvs else None

    # ------------------------------------------------------------------ leases
    def lease(self) -> str | None:
        """This client's lease ID, granted (and kept alive) at the first write; None without a TTL."""
        if self.lease_ttl_s is None:
            return None
        with self._lease_lock:
            if self._lease is None:
                self._lease = self.post("/v3/lease/grant", {"TTL": self.lease_ttl_s})["ID"]
                if self._keeper is None:
                    self._keeper = threading.Thread(target=self._keep_alive, name="etcd-lease", daemon=True)
                    self._keeper.start()
            return self._lease

    def _keep_alive(self) -> None:
        while not self._closed.wait(self.lease_ttl_s / 3):
            lease = self._lease
            if lease is None:
                continue
            try:
                reply = self.post("/v3/lease/keepalive", {"ID": lease}).get("result", {})
            except (StoreGone, Refused):
                continue                         # the next tick tries again, until the TTL runs out
            if int(reply.get("TTL", 0)) <= 0:    # expired (this process froze longer): its keys are gone
                with self._lease_lock:
                    if self._lease == lease:
                        self._lease = None       # the next write asks for a new one

    def put_op(self, key: bytes, value: bytes) -> dict:
        """A put, for a transaction's branch, held by this client's lease."""
        request = {"key": b64(key), "value": b64(value)}
        lease = self.lease()
        return {"requestPut": {**request, "lease": lease} if lease else request}

    def put(self, key: bytes, value: bytes) -> None:
        self.post("/v3/kv/put", self.put_op(key, value)["requestPut"])

    def delete(self, key: bytes) -> int:
        """How many keys it deleted (0 or 1)."""
        return int(self.post("/v3/kv/deleterange", {"key": b64(key)}).get("deleted", 0))

    def count(self, prefix: bytes) -> int:
        """How many keys start with `prefix`."""
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        return int(self.post("/v3/kv/range", {"key": b64(prefix), "range_end": b64(end),
                                              "count_only": True}).get("count", 0))

    def txn(self, compare: list[dict], success: list[dict], failure: list[dict]) -> tuple[bool, int, list[dict]]:
        """(whether every comparison held, the store's revision after it, the responses of
        the branch taken)."""
        reply = self.post("/v3/kv/txn", {"compare": compare, "success": success, "failure": failure})
        return bool(reply.get("succeeded")), int(reply["header"]["revision"]), reply.get("responses") or []

    # ------------------------------------------------------- counters and claims
    def add(self, key: bytes, amount: int, receipt: bytes | None = None) -> int:
        """Add to a decimal counter (0 if unset) and return its new value: a compare-and-set
        on the key's revision, again until no other writer came between. With `receipt` (a
        key of this call's own) the result is also written there in the same transaction,
        so a try whose reply was lost after it landed is found instead of added twice."""
        while True:
            found = self.range(key)
            now = int(found.value) if found is not None else 0
            if amount == 0:
                return now
            value = str(now + amount).encode()
            unchanged = unchanged_since(key, found.mod_revision) if found is not None else absent(key)
            puts = [self.put_op(key, value)] + ([self.put_op(receipt, value)] if receipt is not None else [])
            done, _, _ = self.txn([unchanged], puts, [])
            if done:
                return now + amount
            landed = self.range(receipt) if receipt is not None else None
            if landed is not None:                  # an earlier try of this call, answered too late
                return int(landed.value)

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> tuple[bool, Entry | None]:
        """Set `desired` if the key holds `expected` (b"": the key is unset); (whether it
        did, the key's entry when it did not)."""
        condition = absent(key) if expected == b"" else holds(key, expected)
        done, _, responses = self.txn([condition], [self.put_op(key, desired)], [get(key)])
        return done, None if done else ranged(responses)

    def status(self, deadline: float) -> dict:
        return self.post("/v3/maintenance/status", {}, deadline)

    def close(self) -> None:
        """Stop keeping the lease alive (its keys go TTL later) and drop the connections."""
        self._closed.set()
        self._http.clear()


def ranged(responses: list[dict], index: int = 0) -> Entry | None:
    """The entry a transaction's `get` at `index` found, or None."""
    if len(responses) <= index:
        return None
    kvs = responses[index].get("response_range", {}).get("kvs") or []
    return Entry(kvs[0]) if kvs else None
