"""The job store on a real three-member etcd cluster (testing/etcd.py, Debian's etcd 3.4 on
loopback): the same answers as the master-hosted TCPStore, counters that hold under
concurrent nodes, and the store's own faults."""

import threading
import time

import pytest

from entrypoint.store.etcd import EtcdJobStore
from entrypoint.store.tcp import TcpJobStore
from entrypoint.store.transport import RendezvousError, StoreGone
from testing.etcd import EtcdCluster, etcd_binary
from testing.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(etcd_binary() is None, reason="no etcd: apt-get install etcd-server")]


@pytest.fixture
def etcd(tmp_path):
    with EtcdCluster(tmp_path) as cluster:
        yield cluster


def exercise(store) -> list:
    """One sequence of every operation the transport offers, and what each answered."""
    seen = [store.get("a"), store.has("a")]
    store.set("a", "1")
    seen += [store.get("a"), store.has("a"), store.add("n", 0), store.add("n", 2), store.add("n", 3)]
    seen += [store.compare_set("c", "", "x"), store.compare_set("c", "y", "z"), store.compare_set("c", "x", "z"),
             store.get("c"), store.compare_set("c", "", "w")]
    store.set("a", "")
    seen += [store.get("a"), store.has("a")]
    return seen


def test_etcd_answers_every_operation_as_the_master_hosted_store_does(etcd):
    port = free_port()
    tcp = TcpJobStore("127.0.0.1", port, "run-1", serve=True, timeout_s=10, op_timeout_s=5)
    tcp.connect(time.monotonic() + 10)
    on_etcd = EtcdJobStore(etcd.endpoints, "run-1", timeout_s=10, op_timeout_s=5)
    on_etcd.connect(time.monotonic() + 10)
    try:
        expected = exercise(tcp)
        assert expected == [None, False, "1", True, 0, 2, 5, "x", "x", "z", "z", "z", "", True]
        assert exercise(on_etcd) == expected
        other_job = EtcdJobStore(etcd.endpoints, "run-2", timeout_s=10, op_timeout_s=5)
        assert other_job.get("c") is None and other_job.add("n", 0) == 0, "one job's keys seen by another"
    finally:
        tcp.close()
        on_etcd.close()


def test_counters_hold_when_many_nodes_add_at_once(etcd):
    stores = [EtcdJobStore(etcd.endpoints[i % 3:] + etcd.endpoints[:i % 3], "run", 10, 5) for i in range(4)]
    seen: list[int] = []
    lock = threading.Lock()

    def node(store):
        for _ in range(25):
            n = store.add("count", 1)
            with lock:
                seen.append(n)

    threads = [threading.Thread(target=node, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 101)), "two nodes were handed the same number"


def test_an_add_whose_reply_was_lost_is_not_applied_twice(etcd):
    """The first reply to add's transaction is lost on the way back (it landed: the member
    applied it), as when a member stalls past STALL_S and the node tries the next; the
    retry finds the call's receipt instead of adding again."""
    import urllib3

    store = EtcdJobStore(etcd.endpoints, "run", timeout_s=10, op_timeout_s=5)
    assert store.add("n", 5) == 5
    real, lost = store.etcd._http.request, []

    def reply_lost_once(method, url, **kw):
        reply = real(method, url, **kw)
        if url.endswith("/v3/kv/txn") and not lost:
            lost.append(url)
            raise urllib3.exceptions.ReadTimeoutError(None, url, "the reply was lost")
        return reply

    store.etcd._http.request = reply_lost_once
    assert store.add("n", 2) == 7 and lost
    assert EtcdJobStore(etcd.endpoints, "run", 10, 5).add("n", 0) == 7


def test_losing_one_member_goes_unnoticed_and_losing_the_quorum_is_one_line(etcd):
    store = EtcdJobStore(etcd.endpoints, "run", timeout_s=10, op_timeout_s=3)
    store.connect(time.monotonic() + 10)
    store.set("k", "before")
    etcd.stop(etcd.leader())                         # the worst member to lose: a new one is elected
    t0 = time.monotonic()
    store.set("k", "after")
    assert store.get("k") == "after" and store.add("n", 1) == 1
    print(f"one member lost: the next write answered after {time.monotonic() - t0:.2f}s")
    assert time.monotonic() - t0 < 3
    etcd.stop(next(iter(etcd.procs)))                # two of three: no quorum
    t0 = time.monotonic()
    with pytest.raises(StoreGone) as gone:
        store.set("k", "lost")
    took = time.monotonic() - t0
    assert 2.5 < took < 6, took
    line = str(gone.value)
    assert "\n" not in line and line.startswith("the job store at etcd://127.0.0.1:"), line


def test_a_store_that_is_not_there_is_one_line_after_the_wait():
    port = free_port()
    store = EtcdJobStore([f"http://127.0.0.1:{port}"], "run", timeout_s=1.5, op_timeout_s=1)
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as failed:
        store.connect(time.monotonic() + 1.5)
    assert 1.4 < time.monotonic() - t0 < 4
    assert str(failed.value).startswith(f"no job store at JOB_STORE=etcd://127.0.0.1:{port} after RDZV_TIMEOUT=1.5s")


def test_a_nodes_keys_live_as_long_as_its_lease(etcd):
    """Every key a client writes is held by its lease (TTL 2 s here): kept alive while the
    client runs, gone a TTL after it stops; a lease that ran out while the node was silent
    is one line (StoreGone), and the next write takes a new lease."""
    from entrypoint.store.etcd_client import EtcdClient

    client = EtcdClient(etcd.endpoints, op_timeout_s=3, lease_ttl_s=2)
    client.put(b"a", b"1")
    time.sleep(3)
    assert client.range(b"a").value == b"1"                     # kept alive past its TTL
    client.post("/v3/lease/revoke", {"ID": client.lease()})      # as if it had run out
    assert client.range(b"a") is None
    with pytest.raises(StoreGone, match="this node's lease ran out"):
        client.put(b"b", b"2")
    client.put(b"b", b"2")
    client.close()
    time.sleep(3.5)
    assert EtcdClient(etcd.endpoints, op_timeout_s=3).range(b"b") is None
