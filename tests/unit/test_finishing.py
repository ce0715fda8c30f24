"""How a finished job ends, on a real job store: the master marks it done once every node's
result is in, and exits only after the workers have said they leave (or LEAVE_WAIT_S), so
that `compose up --abort-on-container-exit` never stops a worker that is still exiting."""

import io
import threading
import time

from entrypoint.job import finish as finish_module
from entrypoint.contract.config import load_config
from entrypoint.job.finish import finish_together
from entrypoint.store.tcp import TcpJobStore
from entrypoint.running.log import Log
from entrypoint.contract.manifest import Image
from entrypoint.running.outcome import NodeState, Outcome
from entrypoint.running.signals import Signals
from entrypoint.job.ends import Ends
from entrypoint.job.members import Members
from entrypoint.job.watch import Heartbeats, JobWatch
from testing.ports import free_port


def node(port: int, rank: int, **env) -> tuple[TcpJobStore, JobWatch]:
    config = load_config({"ROLE": "master" if rank == 0 else "worker", "NUM_NODES": "2", "TRAIN_MODE": "distributed",
                          "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RUN_ID": "t", **env},
                         Image(["pytorch"], ["native"]))
    store = TcpJobStore("127.0.0.1", port, "t", serve=rank == 0, timeout_s=10, op_timeout_s=5)
    store.connect(deadline=time.monotonic() + 10)
    assert Members(store).claim(rank)
    return store, JobWatch(store, config, rank, Log(io.StringIO()), Signals())


def finish_in_thread(watch: JobWatch, results: dict, key: str) -> threading.Thread:
    def run():
        results[key] = finish_together(watch, Outcome.succeeded())
        results[key + " at"] = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_the_master_exits_after_its_worker_has_left():
    port = free_port()
    master_store, master = node(port, 0)
    worker_store, worker = node(port, 1)
    results: dict = {}
    threads = [finish_in_thread(master, results, "master"), finish_in_thread(worker, results, "worker")]
    for t in threads:
        t.join(30)
    assert results["master"].state is NodeState.SUCCEEDED and results["worker"].state is NodeState.SUCCEEDED
    assert Ends(master_store).done() and Ends(master_store).has_left(1)
    assert results["worker at"] <= results["master at"]


def test_a_worker_that_never_says_it_leaves_delays_the_master_by_leave_wait_s_only():
    port = free_port()
    master_store, master = node(port, 0)
    worker_store, _ = node(port, 1)
    Ends(worker_store).set_exit(1, Outcome.succeeded())     # its result is in, but it never reads job/done
    start = time.monotonic()
    outcome = finish_together(master, Outcome.succeeded())
    waited = time.monotonic() - start
    assert outcome.state is NodeState.SUCCEEDED and Ends(master_store).done() and not Ends(master_store).has_left(1)
    assert waited >= finish_module.LEAVE_WAIT_S


def test_a_master_that_ends_the_job_waits_for_its_worker_which_says_the_masters_reason():
    """The master's rank failed: it records why and keeps the job store up until the
    worker has stopped; the worker, whose ranks then fail too, reports the master's reason
    (no 'lost the master'), in one line, and the master's exit code path is unchanged."""
    port = free_port()
    master_store, master = node(port, 0)
    worker_store, worker = node(port, 1)
    worker_log = io.StringIO()
    worker.log = Log(worker_log)
    results: dict = {}

    def run(watch, outcome, key, delay=0.0):
        time.sleep(delay)
        results[key] = finish_together(watch, outcome)
        results[key + " at"] = time.monotonic()

    threads = [threading.Thread(target=run, args=(master, Outcome.failed("torchrun: rank 0 exited with 3"),
                                                  "master")),
               threading.Thread(target=run, args=(worker, Outcome.failed("rank 1 exited with code 1"), "worker",
                                                  0.5))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results["master"].reason == "torchrun: rank 0 exited with 3" and results["master"].code == 1
    assert results["worker"].reason == "the master (node 0): torchrun: rank 0 exited with 3"
    assert results["worker"].code == 1 and results["worker at"] <= results["master at"]
    assert worker_log.getvalue() == "entrypoint: stopping: the master (node 0): torchrun: rank 0 exited with 3\n"
    assert "lost the master" not in worker_log.getvalue()


def test_a_master_that_ends_the_job_waits_at_most_grace_period_plus_leave_wait_s():
    port = free_port()
    master_store, master = node(port, 0, GRACE_PERIOD="1")
    worker_store, _ = node(port, 1)
    Heartbeats(worker_store, 5).beat(1)                                # joined, alive, never reads the abort
    start = time.monotonic()
    outcome = finish_together(master, Outcome.failed("node 0: rank 0 exited with code 3"))
    waited = time.monotonic() - start
    assert outcome.reason == "node 0: rank 0 exited with code 3" and Ends(master_store).aborted() is not None
    assert 1 + finish_module.LEAVE_WAIT_S - 0.5 <= waited <= 1 + finish_module.LEAVE_WAIT_S + 2, waited


WORKER_BEHIND_A_TUNNEL = """
import os, sys, time
from entrypoint.job.ends import Ends
from entrypoint.security.secret import Identity
from entrypoint.store.tcp import TcpJobStore
store = TcpJobStore("127.0.0.1", int(sys.argv[1]), "t", serve=False, timeout_s=10, op_timeout_s=5,
                 identity=Identity.derive(sys.argv[2].encode()))
store.connect(deadline=time.monotonic() + 10)
Ends(store).leave(1)
store.close()
os._exit(0)                       # as a node ends: nothing after close() waits for the relay
"""


def test_a_workers_last_write_through_its_tunnel_reaches_the_master_before_it_exits():
    """TCPStore's set does not wait for a reply: behind JOB_SECRET its bytes pass through the
    worker's own Tunnel, so a worker that wrote `left` and exited at once could take them
    with it, and the master would wait LEAVE_WAIT_S for nothing (every job with a secret
    ended 2 s late so)."""
    import subprocess
    import sys

    from entrypoint.security.secret import Identity

    secret = "3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e"
    port = free_port()
    master = TcpJobStore("127.0.0.1", port, "t", serve=True, timeout_s=10, op_timeout_s=5,
                      identity=Identity.derive(secret.encode()), say=lambda line: None)
    master.connect(deadline=time.monotonic() + 10)
    try:
        for _ in range(5):
            master.store.delete_key(master.prefix + "node/1/left")
            subprocess.run([sys.executable, "-c", WORKER_BEHIND_A_TUNNEL, str(port), secret], check=True, timeout=60)
            deadline = time.monotonic() + 1.0
            while not Ends(master).has_left(1) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert Ends(master).has_left(1)
    finally:
        master.close()


MASTER_BEHIND_A_GATE = """
import sys, time
from entrypoint.job.ends import Ends
from entrypoint.security.secret import Identity
from entrypoint.store.tcp import TcpJobStore
store = TcpJobStore("127.0.0.1", int(sys.argv[1]), "t", serve=True, timeout_s=10, op_timeout_s=5,
                 identity=Identity.derive(sys.argv[2].encode()), say=lambda line: None)
store.connect(deadline=time.monotonic() + 10)
print("SERVING", flush=True)
time.sleep(600)
"""

WORKER_CLOSING_WHEN_TOLD = """
import os, sys, time
from entrypoint.job.ends import Ends
from entrypoint.security.secret import Identity
from entrypoint.store.tcp import TcpJobStore
store = TcpJobStore("127.0.0.1", int(sys.argv[1]), "t", serve=False, timeout_s=10, op_timeout_s=20,
                 identity=Identity.derive(sys.argv[2].encode()))
store.connect(deadline=time.monotonic() + 10)
Ends(store).leave(1)
print("CONNECTED", flush=True)
sys.stdin.readline()
start = time.monotonic()
store.close()
print(f"CLOSED {time.monotonic() - start:.3f}", flush=True)
os._exit(0)                       # its store's thread may still wait for the frozen master
"""


def test_a_frozen_master_holds_up_a_closing_worker_no_longer_than_the_master_would_wait():
    """close()'s round trip is bounded by LEAVE_WAIT_S, not PEER_TIMEOUT (20 s here)."""
    import signal
    import subprocess
    import sys

    from entrypoint.store.tcp import CLOSE_ROUND_TRIP_S

    assert finish_module.LEAVE_WAIT_S == CLOSE_ROUND_TRIP_S
    secret = "3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e"
    port = free_port()
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    master = subprocess.Popen([sys.executable, "-c", MASTER_BEHIND_A_GATE, str(port), secret], **pipes)
    worker = None
    try:
        assert master.stdout.readline().strip() == "SERVING"
        worker = subprocess.Popen([sys.executable, "-c", WORKER_CLOSING_WHEN_TOLD, str(port), secret], **pipes)
        assert worker.stdout.readline().strip() == "CONNECTED"
        master.send_signal(signal.SIGSTOP)
        worker.stdin.write("close\n")
        worker.stdin.flush()
        said, _ = worker.communicate(timeout=60)
        assert said.startswith("CLOSED ") and float(said.split()[1]) < CLOSE_ROUND_TRIP_S + 1.0, said
    finally:
        master.send_signal(signal.SIGCONT)
        for p in (master, worker):
            if p is not None:
                p.kill()
                p.wait()
