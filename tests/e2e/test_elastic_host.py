"""Elastic PyTorch and node loss on loopback: entrypoint processes as nodes, real torchrun.

An elastic job (MIN_NODES=1, MAX_NODES=3), under torchrun or Horovod's elastic driver, must
go on when a worker stops, freezes or loses its entrypoint, and grow when a node joins,
resuming from the step it had reached; a job must end on every node when its master (the
job store's host) is lost; and a node whose entrypoint dies takes its processes with it.
A worker killed outright (every process, SIGKILL) is test_containers.py's
`docker kill` test, for the same three launchers; `compose up --scale` grows a job there.
"""

import signal
import time

import pytest

from testing.cluster import Node, wait_for, wait_for_any

from testing.results import changes, initial_loss, results

pytestmark = pytest.mark.e2e

ELASTIC = dict(MIN_NODES=1, MAX_NODES=3, MAX_RESTARTS=3)
LONG = ["--steps", "300", "--step-delay", "0.05", "--checkpoint-every", "1000"]
def everything(job: list[Node]) -> str:
    return "\n".join(node.output for node in job)


def wait_for_rank0(job: list[Node], launcher: str, text: str, timeout: float = 180) -> None:
    """`text` from global rank 0: on the master under Horovod (its discovery's order, patch
    0008), on any node under elastic torchrun (the rendezvous' order)."""
    wait_for_any(job, text, timeout)
    assert launcher == "native" or text in job[0].output, f"global rank 0 is not on the master:\n{job[1].output[-2000:]}"


def alive(procs) -> list:
    return [p for p in procs if p.is_running() and p.status() != "zombie"]


# torchrun (disttrain.elastic checkpoints the last completed step when a peer is lost) and
# Horovod's ElasticDriver (hvd.elastic rolls back to the last commit, every 10 steps).
LAUNCHERS = {"native": dict(ELASTIC, LAUNCHER="native"), "horovod": dict(ELASTIC, LAUNCHER="horovod", MAX_RESTARTS=0)}
# Keras through Horovod's elastic driver (hvd.elastic.KerasState, commits every 10 steps):
# losing and gaining a node, as PyTorch's paths do.
WITH_KERAS = {**LAUNCHERS, "keras-horovod": dict(ELASTIC, LAUNCHER="horovod", FRAMEWORK="keras", MAX_RESTARTS=0)}
LOSES_AT_MOST = {"native": 0, "horovod": 10, "keras-horovod": 10}          # steps lost with a node
# A gradient strategy on each path while the job grows (GRAD_COMPRESSION): torchrun starts
# new processes for the new round, whose PowerSGD state (error feedback, warm start) begins
# afresh; Horovod's processes go on, and its fp16 compression keeps no state.
STRATEGY = {"native": dict(GRAD_COMPRESSION="powersgd", POWERSGD_WARMUP=2),
            "horovod": dict(GRAD_COMPRESSION="fp16"), "keras-horovod": dict(GRAD_COMPRESSION="fp16")}


@pytest.mark.parametrize("launcher", WITH_KERAS)
def test_elastic_job_grows_when_a_node_joins(jobs, launcher):
    """With a gradient strategy (STRATEGY): applied again by every round's first rank."""
    job = jobs.start(2, LONG, **WITH_KERAS[launcher], **STRATEGY[launcher])
    wait_for_rank0(job, launcher, "step 40 loss")
    jobs.add_node(job)
    codes = [node.wait(240) for node in job]
    output = "\n".join(node.output for node in job)
    assert codes == [0, 0, 0], output[-4000:]
    [(old, new, step)] = changes(job[0].output)
    assert (old, new) == (2, 3) and step >= 40 - LOSES_AT_MOST[launcher]
    assert changes(job[2].output) == [(2, 3, step)]           # the newcomer logs the change it made
    found = results(output)
    assert sorted(r.rank for r in found) == [0, 1, 2] and len({r.digest for r in found}) == 1
    assert all(r.world == 3 and r.after < initial_loss(output) for r in found)
    said = {"native": "powersgd compression (DDP comm hook powerSGD_hook)"}.get(launcher,
                                                                              "fp16 compression (hvd.Compression.fp16)")
    assert output.count(f"disttrain: gradients: {said}") >= (2 if launcher == "native" else 1), output[-4000:]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_stopped_worker_leaves_and_the_elastic_job_goes_on(jobs, launcher):
    """SIGTERM to a worker's entrypoint (docker stop): it leaves (143), the job goes on."""
    job = jobs.start(2, LONG, **LAUNCHERS[launcher])
    master, worker = job
    wait_for_rank0(job, launcher, "step 40 loss")
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait(60) == 143, worker.output[-3000:]
    assert master.wait(240) == 0, master.output[-4000:]
    assert [(a, b) for a, b, _ in changes(master.output)] == [(2, 1)]
    assert "node 1 left the job" in master.output


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_elastic_job_goes_on_without_a_frozen_worker(jobs, launcher):
    """SIGSTOP: nothing answers and no connection resets, as when a host drops off the
    network. torchrun: the entrypoints restart the processes still waiting for it after
    PEER_TIMEOUT (from the last checkpoint, every 20 steps); Horovod: Gloo's timeout, which
    its own variable sets (30 s by default; 15 s here, as a user who wants it sooner would)."""
    gloo = dict(HOROVOD_GLOO_TIMEOUT_SECONDS=15) if launcher == "horovod" else {}
    job = jobs.start(2, LONG + ["--checkpoint-every", "20"], PEER_TIMEOUT=5, **LAUNCHERS[launcher], **gloo)
    master, worker = job
    wait_for_rank0(job, launcher, "step 40 loss")
    worker.signal_tree(signal.SIGSTOP)
    assert master.wait(240) == 0, master.output[-4000:]
    [(old, new, step)] = changes(master.output)
    assert (old, new) == (2, 1) and step >= 20, master.output[-3000:]
    [result] = results(master.output)
    assert result.world == 1 and result.after < initial_loss(everything(job))


def test_a_killed_entrypoint_takes_its_processes_and_the_elastic_job_goes_on(jobs):
    """Only the worker's entrypoint is killed (SIGKILL): its torchrun and training process
    must die with it, and the master must count the node as lost, not wait for it."""
    job = jobs.start(2, LONG, **ELASTIC)
    master, worker = job
    wait_for(worker, "TRAINING", 180)
    processes = worker.tree()
    assert len(processes) >= 3, processes           # entrypoint, torchrun, training process (+ sentinel)
    worker.proc.kill()
    deadline = time.monotonic() + 10
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(processes), [p.cmdline()[:4] for p in alive(processes)]
    assert master.wait(240) == 0, master.output[-4000:]
    assert [(a, b) for a, b, _ in changes(master.output)] == [(2, 1)]


def test_a_node_beyond_num_nodes_is_refused_and_the_job_goes_on(jobs):
    job = jobs.start(2, ["--steps", "200", "--step-delay", "0.02"])
    wait_for(job[0], "TRAINING", 180)
    extra = jobs.add_node(job)
    assert extra.wait(60) == 3, extra.output[-2000:]
    assert [node.wait(120) for node in job[:2]] == [0, 0], job[0].output[-3000:]
    assert "more nodes joined" in extra.output and "than NUM_NODES=2" in extra.output


def test_a_killed_entrypoint_ends_a_fixed_size_job(jobs):
    job = jobs.start(2, ["--steps", "100000", "--step-delay", "0.02", "--checkpoint-every", "1000000"],
                    PEER_TIMEOUT=5)
    master, worker = job
    wait_for(master, "TRAINING", 180)
    processes = worker.tree()
    killed = time.monotonic()
    worker.proc.kill()
    code = master.wait(60)
    elapsed = time.monotonic() - killed
    time.sleep(1)
    assert not alive(processes), [p.cmdline()[:4] for p in alive(processes)]
    assert code != 0 and elapsed < 5 + 10, (code, elapsed, master.output[-3000:])


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_losing_the_master_stops_every_worker_within_peer_timeout_and_grace(jobs, how):
    """killed: its processes die (connections reset). frozen (SIGSTOP): nothing answers
    and nothing resets, as when its host drops off the network."""
    peer_timeout, grace = 5, 3
    job = jobs.start(2, LONG + ["--steps", "100000"], PEER_TIMEOUT=peer_timeout, GRACE_PERIOD=grace,
                    **ELASTIC)
    master, worker = job
    wait_for(worker, "TRAINING", 180)
    time.sleep(2)
    lost_at = time.monotonic()
    master.signal_tree(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    code = worker.wait(60)
    elapsed = time.monotonic() - lost_at
    port = master.env["MASTER_PORT"]
    lines = [line for line in worker.output.splitlines() if f"lost the master at 127.0.0.1:{port}" in line]
    assert code == 1 and len(lines) == 1, worker.output[-3000:]
    assert elapsed < peer_timeout + grace + 3, (elapsed, worker.output[-3000:])
