"""disttrain.elastic's parts in one process, and its round reports through a real job store."""

import io
import json
import signal
import time

import pytest
import torch

from disttrain import checkpoint, elastic
from entrypoint.contract.config import load_config
from entrypoint.store.tcp import TcpJobStore
from entrypoint.running.log import Log
from entrypoint.contract.manifest import Image
from entrypoint.running.signals import Signals
from entrypoint.job.watch import JobWatch
from testing.ports import free_port


def consumed(size, epoch, offset, world, batch, steps):
    """The samples `steps` steps take from `offset` at world size `world`, every rank's."""
    taken = []
    for rank in range(world):
        share = list(elastic.ResumableSampler(size, rank, world, epoch, offset))
        taken += share[:steps * batch]
    return taken


def test_a_world_size_change_mid_epoch_neither_repeats_nor_skips_a_sample():
    size, batch = 120, 4
    first = consumed(size, epoch=3, offset=0, world=2, batch=batch, steps=5)          # 40 samples
    second = consumed(size, epoch=3, offset=40, world=3, batch=batch, steps=5)        # 60 more
    third = consumed(size, epoch=3, offset=100, world=1, batch=batch, steps=5)        # the last 20
    everything = first + second + third
    assert sorted(everything) == list(range(size))
    order = elastic.ResumableSampler(size, 0, 1, 3).order().tolist()
    assert sorted(first) == sorted(order[:40])                   # positions, not indices: a resumed
    assert sorted(second) == sorted(order[40:100])               # epoch continues the same permutation


def test_ranks_get_equal_shares_and_the_uneven_tail_waits():
    shares = [list(elastic.ResumableSampler(10, r, 3, 0, 0)) for r in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]
    assert len(set(sum(shares, []))) == 9


def make_run(tmp_path, every=5):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer, elastic.Run(model=model, optimizer=optimizer, every=every, directory=str(tmp_path))


def train(run, model, optimizer, steps, dataset):
    for _, (x, y) in run.batches(dataset, batch_size=4, steps=steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


DATA = torch.utils.data.TensorDataset(torch.randn(30, 2, generator=torch.Generator().manual_seed(1)),
                                      torch.randn(30, 1, generator=torch.Generator().manual_seed(2)))


def test_a_run_resumes_where_it_stopped(tmp_path):
    model, optimizer, run = make_run(tmp_path)
    with run:
        train(run, model, optimizer, 12, DATA)              # 12 steps of 4 from 30 samples: epochs 0..1
    assert (run.step, run.epoch) == (12, 1) and checkpoint.latest(str(tmp_path))[0] == 12
    again_model, again_optimizer, again = make_run(tmp_path)
    with again:
        assert (again.step, again.epoch, again.offset, again.resumed_from) == (12, run.epoch, run.offset, 12)
        assert torch.equal(again_model.weight, model.weight)
        assert again_optimizer.state_dict()["state"][0]["momentum_buffer"].equal(
            optimizer.state_dict()["state"][0]["momentum_buffer"])


def test_a_failed_step_saves_the_last_completed_step(tmp_path):
    model, optimizer, run = make_run(tmp_path, every=0)
    with pytest.raises(RuntimeError, match="peer lost"):
        with run:
            for step, _ in run.batches(DATA, batch_size=4, steps=100):
                if step == 3:
                    raise RuntimeError("peer lost")
    assert checkpoint.latest(str(tmp_path))[0] == 3


def test_torchruns_sigterm_saves_at_the_step_boundary_and_leaves(tmp_path):
    model, optimizer, run = make_run(tmp_path, every=0)
    with pytest.raises(SystemExit) as leaving:
        with run:
            for step, _ in run.batches(DATA, batch_size=4, steps=100):
                if step == 2:
                    run._on_sigterm(signal.SIGTERM, None)     # what torchrun's SIGTERM does
    assert leaving.value.code == 143 and checkpoint.latest(str(tmp_path))[0] == 3


def test_rounds_reported_by_rank_0_are_logged_by_the_entrypoint(monkeypatch):
    port = free_port()
    config = load_config({"MIN_NODES": "1", "MAX_NODES": "3", "ROLE": "master", "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(port), "RUN_ID": "t"}, Image(["pytorch"], ["native"]))
    store = TcpJobStore("127.0.0.1", port, "t", serve=True, timeout_s=10, op_timeout_s=5)
    store.connect(deadline=0)
    out = io.StringIO()
    watch = JobWatch(store, config, 0, Log(out), Signals())
    monkeypatch.setenv("DISTTRAIN_JOB_STORE", f"127.0.0.1:{port}")
    monkeypatch.setenv("DISTTRAIN_JOB_PREFIX", "disttrain/t/")
    assert elastic.report_round(2, 0) and elastic.report_round(1, 40)
    assert watch.check() is None
    assert out.getvalue().splitlines() == ["entrypoint: training: world size 2, from step 0",
                                           "entrypoint: membership changed: world size 2 -> 1, resumed from step 40"]
    assert elastic.report_round(3, 75)
    late = JobWatch(store, config, 0, Log(io.StringIO()), Signals())       # a node that joins now
    assert late.rounds.current == (3, 3)


def test_reporting_without_a_job_store_is_a_no_op(monkeypatch):
    monkeypatch.delenv("DISTTRAIN_JOB_STORE", raising=False)
    assert elastic.report_round(2, 0) is False


def elastic_horovod_master(peer_timeout: str):
    """An elastic Horovod job's config on the master, and its job store (served here)."""
    port = free_port()
    config = load_config({"MIN_NODES": "1", "MAX_NODES": "3", "ROLE": "master", "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(port), "LAUNCHER": "horovod", "PEER_TIMEOUT": peer_timeout},
                         Image(["pytorch"], ["native", "horovod"]))
    store = TcpJobStore("127.0.0.1", port, "disttrain", serve=True, timeout_s=10, op_timeout_s=5)
    store.connect(deadline=0)
    return config, store


def test_horovods_host_discovery_reads_the_live_nodes_from_the_job_store():
    from entrypoint.job.ends import Ends
    from entrypoint.job.members import Members
    from entrypoint.job.watch import Heartbeats
    from entrypoint.launchers.horovod.elastic_driver import StoreDiscovery
    from entrypoint.running.outcome import Outcome
    from entrypoint.job.placement import NodeInfo

    config, store = elastic_horovod_master(peer_timeout="2")
    for rank, nproc in ((0, 2), (1, 1), (2, 4)):
        assert Members(store).claim(rank)
        Members(store).publish(NodeInfo(rank, f"10.0.0.{rank}", nproc))
    discovery = StoreDiscovery(store, config)
    assert discovery.find_available_hosts_and_slots() == {"node0": 2, "node1": 1, "node2": 4}
    Ends(store).set_exit(2, Outcome.succeeded())                       # finished: no more slots there
    assert discovery.find_available_hosts_and_slots() == {"node0": 2, "node1": 1}
    for _ in range(6):                                            # node 1 stops heartbeating
        Heartbeats(store, 2).beat(0)
        discovery.find_available_hosts_and_slots()
        time.sleep(0.5)
    assert discovery.find_available_hosts_and_slots() == {"node0": 2}


def test_a_worker_whose_processes_die_is_lost_when_its_link_closes_not_after_peer_timeout():
    """Elastic Horovod: the master holds a link to the worker's link port (job/links.py). A
    worker process that is SIGKILLed is named lost at the master's next check, and Horovod's
    discovery drops it, long before PEER_TIMEOUT (30 s) would; a worker that finished first
    closes its link too, and is not lost."""
    import subprocess
    import sys
    from pathlib import Path

    from entrypoint.job.ends import Ends
    from entrypoint.job.members import Members
    from entrypoint.job.placement import NodeInfo
    from entrypoint.launchers.horovod.elastic_driver import StoreDiscovery
    from entrypoint.running.outcome import Outcome

    config, store = elastic_horovod_master(peer_timeout="30")
    members, out = Members(store), io.StringIO()
    code = "from entrypoint.job.links import LinkPort; import time; print(LinkPort('127.0.0.1').port, flush=True); time.sleep(120)"
    workers = {}
    for rank in (0, 1, 2):
        assert members.claim(rank)
        members.publish(NodeInfo(rank, "127.0.0.1", 1))
        if rank:
            workers[rank] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                             env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
            members.publish_link(rank, int(workers[rank].stdout.readline()))
    watch = JobWatch(store, config, 0, Log(out), Signals(), worker_links=True)
    discovery = StoreDiscovery(store, config)
    try:
        assert watch.check() is None
        deadline = time.monotonic() + 5
        while not all(watch.links.held(k) for k in workers) and time.monotonic() < deadline:
            time.sleep(0.05)                                       # both links held
        assert discovery.find_available_hosts_and_slots() == {"node0": 1, "node1": 1, "node2": 1}
        Ends(store).set_exit(2, Outcome.succeeded())               # node 2 finished, then its process ends
        workers[2].kill()
        workers[1].kill()
        killed = time.monotonic()
        while "node 1 lost" not in out.getvalue() and time.monotonic() - killed < 10:
            assert watch.check() is None
            time.sleep(0.1)
        assert time.monotonic() - killed < 2.0, out.getvalue()
        assert discovery.find_available_hosts_and_slots() == {"node0": 1}
        assert out.getvalue().splitlines()[-1] == "entrypoint: node 1 lost: its connection closed; the job goes on without it"
        assert "node 2 lost" not in out.getvalue()
    finally:
        for worker in workers.values():
            worker.kill()
            worker.wait()


def test_an_order_counted_but_not_yet_written_holds_up_nobody_on_the_master(tmp_path):
    """The driver counts an order for a host, then writes it. On the master both the driver
    and the node's own poll share one job store thread: a poll that waited for the order
    between the two would keep the driver from ever writing it (CI: 'no reply within
    PEER_TIMEOUT' on the master, the elastic job failed before its first step)."""
    from entrypoint.machine.hardware import Hardware
    from entrypoint.launchers.horovod.elastic_driver import HorovodElasticNode, _order_key
    from entrypoint.job.placement import Placement
    from entrypoint.plan import plan_from_env

    port = free_port()
    script = tmp_path / "train.py"
    script.write_text("print('ordered worker ran')\n")
    env = {"MIN_NODES": "1", "MAX_NODES": "2", "ROLE": "master", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "LAUNCHER": "horovod", "ENTRYPOINT": str(script), "PEER_TIMEOUT": "2"}
    plan = plan_from_env(env, Image(["pytorch"], ["native", "horovod"]), Hardware(gpus=0, cpus=2, shm_bytes=64 << 20))
    store = TcpJobStore("127.0.0.1", port, "disttrain", serve=True, timeout_s=10, op_timeout_s=2)
    store.connect(deadline=0)
    node = HorovodElasticNode(store, plan, Placement(0), {}, Log(io.StringIO()), Signals(),
                              JobWatch(store, plan.config, 0, Log(io.StringIO()), Signals()))
    assert store.add("hvd/node0/orders", 1) == 1                 # the driver has counted order 1 ...
    started = time.monotonic()
    assert node.poll() is None and node.orders == {}             # ... the node's poll does not wait for it
    store.set(_order_key("node0", 1), json.dumps({"env": {"HOROVOD_RANK": "0"}}))   # ... and the driver writes it
    assert time.monotonic() - started < 1.0
    assert node.poll() is None and list(node.orders) == [1]       # taken at the next poll
    spec, proc = node.orders[1]
    assert proc.wait(30) == 0 and spec.label == "rank 0"


def test_horovods_rendezvous_stops_once_when_two_threads_stop_it():
    """Horovod's elastic driver stops its rendezvous from the thread that records the last
    worker's state while the job stops it from its own (CI: AttributeError on the second)."""
    import threading

    from entrypoint.launchers.horovod.rendezvous_server import HorovodRendezvous

    server = HorovodRendezvous(0, "127.0.0.1")
    server.start()
    together, errors = threading.Barrier(4), []

    def stop():
        together.wait()
        try:
            server.stop()
        except Exception as exc:         # noqa: BLE001 -- any error is the failure
            errors.append(exc)

    threads = [threading.Thread(target=stop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and server.httpd is None and not server.thread.is_alive()


def test_a_silent_node_is_reported_as_lost_after_a_time_before_its_last_heartbeat():
    """The time a lost node is reported silent since (rounds.py ends the training processes
    started before it) is the look before the one that saw its last heartbeat: the beat
    came after that look, so a process started once the node was dead is never older. The
    look that saw the beat could come a second after it, after a fast re-formed round's
    processes had started."""
    from entrypoint.job.watch import Heartbeats

    port = free_port()
    store = TcpJobStore("127.0.0.1", port, "t", serve=True, timeout_s=10, op_timeout_s=5)
    store.connect(deadline=0)
    seen = Heartbeats(store, 1)
    assert not seen.silent(1) and seen.last_moved(1) == 0.0     # seen once: no look before it
    before_beat = time.time()
    Heartbeats(store, 1).beat(1)
    time.sleep(0.3)
    saw_beat = time.time()
    assert not seen.silent(1)
    assert seen.last_moved(1) <= before_beat < saw_beat
    time.sleep(1.1)
    assert seen.silent(1) and seen.last_moved(1) <= before_beat
    store.close()
