"""The job store on an etcd v3 cluster (issue 36, part 1): the same transport as tcp.py,
kept by a replicated store outside the job, so no node hosts it.

Through etcd's own v3 JSON gateway (`/v3/kv/range`, `/v3/kv/txn`, ...: etcd's gRPC API as
JSON over HTTP, served on every member's client port since etcd 3.3) with urllib3, which
the image already has (boto3 depends on it). etcd's v2 API, the one torch's etcd
rendezvous needs, is off by default in 3.4 and gone in 3.6; python-etcd3, the gRPC
client, was last released in 2020 and its generated code predates the protobuf that
TensorFlow installs. The gateway needs nothing but HTTP.

Not yet selectable: JOB_STORE, torchrun's rendezvous on it, leases for heartbeats and TLS
to etcd are the next steps of issue 36.

Every member named is tried in turn: a member that does not answer (stopped, cut off, or
out of the quorum) is left for the next, so losing one member of three is not noticed.
A member that holds a request longer than STALL_S is left too: when the leader dies, a
follower keeps a write it had forwarded to it for etcd's request timeout (6 s with the
test cluster's timings) before it answers 503; another member takes it at once. Only
when no member answers within the operation's timeout does the store count as gone.

A write retried on another member may have landed on the first after all. `set` and
`compare_set` are the same when repeated; `add` records each call's result under a key
of its own in the same transaction, so a retry finds it instead of adding twice.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Callable

from .transport import JobStore, RendezvousError, StoreGone, job_prefix

RETRY_S = 0.1                       # between two rounds over the members
STALL_S = 1.0                       # a member that holds a request longer is left for the next


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _text(b64: str) -> str:
    return base64.b64decode(b64).decode()


class EtcdJobStore(JobStore):
    def __init__(self, endpoints: list[str], run_id: str, timeout_s: float, op_timeout_s: float, identity=None):
        """endpoints: each member's client URL (http://host:port; TLS to etcd is a later step);
        timeout_s: how long to look for the store at start (RDZV_TIMEOUT); op_timeout_s:
        how long one operation may go unanswered by every member (PEER_TIMEOUT)."""
        import urllib3

        self.endpoints = list(endpoints)
        self.endpoint = ",".join(self.endpoints)
        self.prefix = job_prefix(run_id)
        self.timeout_s, self.op_timeout_s = timeout_s, op_timeout_s
        self.identity = identity
        self._at = 0                        # the member that answered last
        self._http = urllib3.PoolManager(retries=False)

    @property
    def local_endpoint(self) -> str:
        return self.endpoint

    # ------------------------------------------------------------------ the wire
    def _post(self, path: str, body: dict, deadline: float) -> dict:
        """One call, to the member that answered last, then each other in turn, until one
        answers or `deadline`; raises StoreGone naming the members and the last error."""
        import urllib3

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
                except urllib3.exceptions.HTTPError as exc:
                    last = f"{self.endpoints[at]}: {type(exc).__name__}"
                    continue
                if reply.status == 200:
                    self._at = at
                    return json.loads(reply.data)
                last = f"{self.endpoints[at]}: HTTP {reply.status} {reply.data[:200].decode(errors='replace')}"
            if time.monotonic() >= deadline:
                raise StoreGone(f"the job store (etcd at {self.endpoint}) did not answer: {last}")
            time.sleep(RETRY_S)

    def _call(self, path: str, body: dict) -> dict:
        return self._post(path, body, time.monotonic() + self.op_timeout_s)

    def _range(self, key: str) -> dict | None:
        kvs = self._call("/v3/kv/range", {"key": _b64(self.prefix + key)}).get("kvs") or []
        return kvs[0] if kvs else None

    def _txn(self, key: str, compare: dict, value: str, receipt: str | None = None) -> tuple[bool, dict | None]:
        """Put `value` if `compare` holds for the key (and under `receipt` too, if given);
        (whether it did, the key's entry if not)."""
        k = _b64(self.prefix + key)
        puts = [{"requestPut": {"key": k, "value": _b64(value)}}]
        if receipt is not None:
            puts.append({"requestPut": {"key": _b64(self.prefix + receipt), "value": _b64(value)}})
        reply = self._call("/v3/kv/txn", {"compare": [{"key": k, **compare}], "success": puts,
                                          "failure": [{"requestRange": {"key": k}}]})
        if reply.get("succeeded"):
            return True, None
        kvs = (reply.get("responses") or [{}])[0].get("response_range", {}).get("kvs") or []
        return False, kvs[0] if kvs else None

    # ---------------------------------------------------------------- the store
    def connect(self, deadline: float, cancelled: Callable[[], bool] = lambda: False) -> None:
        last = "no attempt"
        while not cancelled():
            try:
                self._post("/v3/maintenance/status", {}, min(deadline, time.monotonic() + 2.0))
                return
            except StoreGone as exc:
                last = str(exc).split(": ", 1)[-1]
            if time.monotonic() >= deadline:
                raise RendezvousError(f"no job store at JOB_STORE=etcd://{self.endpoint} after "
                                      f"RDZV_TIMEOUT={self.timeout_s:g}s (is etcd running and its client port "
                                      f"reachable?); last error: {last}")

    def close(self) -> None:
        self._http.clear()

    def has(self, key: str) -> bool:
        return self._range(key) is not None

    def get(self, key: str) -> str | None:
        found = self._range(key)
        return _text(found.get("value", "")) if found is not None else None

    def set(self, key: str, value: str) -> None:
        self._call("/v3/kv/put", {"key": _b64(self.prefix + key), "value": _b64(value)})

    def add(self, key: str, amount: int) -> int:
        """A compare-and-set on the key's revision, again until no other node came between;
        the result is also kept under a receipt of this call's own (see the module's text)."""
        receipt = f"{key}@add/{uuid.uuid4().hex}"
        while True:
            found = self._range(key)
            now = int(_text(found.get("value", ""))) if found is not None else 0
            if amount == 0:
                return now
            compare = ({"target": "MOD", "result": "EQUAL", "mod_revision": found["mod_revision"]}
                       if found is not None else {"target": "CREATE", "result": "EQUAL", "create_revision": "0"})
            done, _ = self._txn(key, compare, str(now + amount), receipt)
            if done:
                return now + amount
            landed = self.get(receipt)            # an earlier try of this call, answered too late
            if landed is not None:
                return int(landed)

    def compare_set(self, key: str, expected: str, desired: str) -> str:
        compare = ({"target": "CREATE", "result": "EQUAL", "create_revision": "0"} if expected == ""
                   else {"target": "VALUE", "result": "EQUAL", "value": _b64(expected)})
        done, found = self._txn(key, compare, desired)
        if done:
            return desired
        return _text(found.get("value", "")) if found is not None else ""
