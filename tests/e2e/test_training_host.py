"""Real multi-process training through the entrypoint, without Docker.

Two "nodes" are two entrypoint processes on distinct loopback addresses. Each run must end
with identical parameters on every rank and a lower loss.
"""

import re
import shutil
import signal
import time

import pytest

from tests.conftest import ROOT
from testing.cluster import Node, lose_a_worker, wait_for
from testing.results import check_trained, results

pytestmark = pytest.mark.e2e

PATHS = [("pytorch", "native"), ("pytorch", "horovod"), ("tensorflow", "native"), ("keras", "horovod")]
SHAPES = [(2, 1), (1, 2)]          # (nodes, processes per node)


@pytest.mark.parametrize("nodes, nproc", SHAPES, ids=["2nodes-x1", "1node-x2"])
@pytest.mark.parametrize("framework, launcher", PATHS, ids=[f"{f}-{l}" for f, l in PATHS])
def test_training_converges_and_replicas_agree(jobs, framework, launcher, nodes, nproc):
    codes, output = jobs.run(nodes, ["--steps", "40"], FRAMEWORK=framework, LAUNCHER=launcher,
                            NPROC_PER_NODE=nproc)
    assert codes == [0] * nodes, output[-4000:]
    check_trained(output, nodes * nproc)


@pytest.mark.parametrize("restarts", [0, 1], ids=["shared-store", "restarts"])
def test_fixed_size_torchrun_puts_global_rank_0_on_the_master_and_nodes_in_order(jobs, restarts):
    """The worker starts first and its address sorts first (torch's c10d would make it
    group rank 0); global ranks still follow node ranks: 0-1 on the master, 2-3 on the
    worker, with torch's shared store and with restarts enabled (the workers' own store,
    served by global rank 0's process at MASTER_ADDR)."""
    codes, output = jobs.run(2, [], timeout=180, order=[1, 0], addrs=["127.0.0.3", "127.0.0.2"],
                             NPROC_PER_NODE=2, MAX_RESTARTS=restarts,
                             ENTRYPOINT=str(ROOT / "tests/e2e/rank_placement.py"))
    assert codes == [0, 0], output[-4000:]
    placed = {int(r): (role, int(node), int(local)) for r, role, node, local in
              re.findall(r"PLACED rank=(\d+) world=4 role=(\w+) node=(\d+) local=(\d+)", output)}
    assert placed == {0: ("master", 0, 0), 1: ("master", 0, 1), 2: ("worker", 1, 0), 3: ("worker", 1, 1)}, \
        output[-4000:]


def shard_lines(output: str, kind: str, step: int) -> dict[int, tuple[str, str]]:
    """rank -> (shard digest, full digest) from the hybrid example's SAVED/RESUMED lines."""
    found = re.findall(rf"{kind} rank=(\d+) step={step} shard=(\w+) full=(\w+)", output)
    return {int(rank): (shard, full) for rank, shard, full in found}


def test_hybrid_2x2_mesh_saves_shards_resumes_exactly_and_reshards(jobs, tmp_path):
    """A (dp 2 x tp 2) mesh on 4 processes: every rank saves its own shards (DCP); a rerun
    resumes from step 20 with the saved shards and ends where the uninterrupted run did;
    the step-20 checkpoint also loads at another world size and TP_SIZE."""
    hybrid = dict(PARALLEL_MODE="hybrid", TP_SIZE=2, NPROC_PER_NODE=4)
    args = ["--steps", "40", "--checkpoint-every", "20"]
    codes, output = jobs.run(1, args, **hybrid)
    assert codes == [0], output[-4000:]
    found = results(output)
    assert len(found) == 4
    by_tp = {}
    for r in found:
        tp = r.extra.split("tp=")[1].split()[0]
        by_tp.setdefault(tp, set()).add(r.digest)
        assert r.after < 0.5 * r.before
    assert len(by_tp) == 2 and all(len(d) == 1 for d in by_tp.values()), by_tp   # dp replicas agree
    assert len(set.union(*by_tp.values())) == 2                                    # tp shards differ
    uninterrupted = {r.rank: r.digest for r in found}
    saved = shard_lines(output, "SAVED", 20)
    assert sorted(saved) == [0, 1, 2, 3] and len({full for _, full in saved.values()}) == 1, output[-3000:]

    checkpoints = tmp_path / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-00000020.dcp", "ckpt-00000040.dcp"]
    shutil.copytree(checkpoints / "ckpt-00000020.dcp", tmp_path / "resharded" / "ckpt-00000020.dcp")
    shutil.rmtree(checkpoints / "ckpt-00000040.dcp")          # as if the job had died after step 20
    codes, output = jobs.run(1, args, **hybrid)
    assert codes == [0], output[-4000:]
    assert shard_lines(output, "RESUMED", 20) == saved, output[-3000:]        # every shard as saved
    assert {r.rank: r.digest for r in results(output)} == uninterrupted        # and the same end

    # World size 4 (tp 2) -> 1 (tp 1): DCP reshards the tp shards into whole tensors.
    codes, output = jobs.run(1, args, CHECKPOINT_DIR=tmp_path / "resharded",
                            PARALLEL_MODE="model_parallel", NPROC_PER_NODE=1)
    assert codes == [0], output[-4000:]
    full_at_20 = next(iter(saved.values()))[1]
    assert shard_lines(output, "RESUMED", 20) == {0: (full_at_20, full_at_20)}, output[-3000:]
    [alone] = results(output)
    assert alone.world == 1 and alone.after < alone.before


def test_pytorch_async_local_sgd(jobs):
    codes, output = jobs.run(2, ["--steps", "40"], SYNC_MODE="async", SYNC_PERIOD=4)
    assert codes == [0, 0], output[-4000:]
    found = check_trained(output, 2)
    assert all("sync=async" in r.extra for r in found)


def test_tensorflow_async_parameter_servers(jobs):
    codes, output = jobs.run(2, ["--steps", "40"], FRAMEWORK="tensorflow", SYNC_MODE="async")
    assert codes == [0, 0], output[-4000:]
    [chief] = results(output)
    assert chief.framework == "tensorflow-ps" and chief.world == 2 and chief.after < 0.5 * chief.before
    assert "serving ps 0" in output and "serving worker 1" in output


def test_mpi_launcher_single_node(jobs):
    codes, output = jobs.run(1, ["--steps", "40"], LAUNCHER="mpi", NPROC_PER_NODE=2)
    assert codes == [0], output[-4000:]
    check_trained(output, 2)


@pytest.mark.parametrize("secret", [False, True], ids=["plain", "secret"])
def test_mpi_launcher_across_two_hosts_trains_pytorch(jobs, tmp_path, secret):
    """mpirun on the master starts a rank on each host of HOSTFILE through its launch agent
    (ssh in production; here tests/e2e/launch_agent_here.sh). The ranks form torch's env://
    group on a port the master picks: MASTER_PORT is the job store's, where rank 0 used to
    fail with EADDRINUSE."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 slots=1\n127.0.0.2 slots=1\n")
    more = {"JOB_SECRET": "3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e"} if secret else {}
    codes, output = jobs.run(2, ["--steps", "40"], LAUNCHER="mpi", HOSTFILE=str(hosts),
                             OMPI_MCA_plm_rsh_agent=str(ROOT / "tests" / "e2e" / "launch_agent_here.sh"), **more)
    assert codes == [0, 0], output[-4000:]
    check_trained(output, 2)
    assert ("(TLS, JOB_SECRET)" in output) == secret
    if secret:
        assert "WARNING: JOB_SECRET does not cover the ranks' own torch.distributed store" in output


def test_ranks_are_assigned_at_rendezvous_without_node_rank(jobs):
    codes, output = jobs.run(3, ["--steps", "20"], LAUNCHER="horovod")
    assert codes == [0, 0, 0], output[-4000:]
    assert {"node 1 of 3", "node 2 of 3"} <= {line.split(": ", 1)[1][:11] for line in output.splitlines()
                                               if line.startswith("entrypoint: node ")}
    check_trained(output, 3)


@pytest.mark.parametrize("framework, launcher", PATHS, ids=[f"{f}-{l}" for f, l in PATHS])
def test_killed_worker_ends_every_process_within_30s(jobs, framework, launcher):
    job = jobs.start(2, ["--steps", "100000", "--step-delay", "0.01", "--checkpoint-every", "1000000"],
                    FRAMEWORK=framework, LAUNCHER=launcher)
    code, seconds = lose_a_worker(job)
    assert code != 0
    assert seconds < 30, job[0].output[-3000:]
    # The master names the lost node, not only its own rank's failure in a collective, in
    # at most 3 lines after its ranks' progress; their tracebacks (the consequence) go to
    # the diagnostics folder, which the line names. Progress is the ranks' loss lines and
    # Keras's warning that the script's --step-delay callback is slow (printed while it
    # trains, at a time of its own).
    lines = job[0].output.splitlines()
    # TensorFlow's C++ logging says once, at a time of its own, that it writes to stderr until
    # absl's log is initialized (CI met it after the training had started).
    progress = (r"\[rank\d+\]: (step \d+ loss|WARNING:tensorflow:Callback method `on_train_batch_end` is slow"
                r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR)")
    told = [line for line in lines[max(i for i, line in enumerate(lines) if "TRAINING" in line) + 1:]
            if not re.match(progress, line)]
    assert len(told) <= 3 and "lost node 1 at 127.0.0.2: no heartbeat" in told[-2], told
    path = re.search(r"this node's tracebacks, its consequence: (\S+)\)", told[-2]).group(1)
    kept = open(path).read()
    assert "[rank0]: " in kept and ("Traceback" in kept or "Connection reset" in kept), kept[-2000:]


def test_sigterm_stops_the_node_within_the_grace_period(jobs):
    [node] = jobs.start(1, ["--steps", "100000", "--step-delay", "0.01"], NPROC_PER_NODE=2,
                       GRACE_PERIOD=5)
    wait_for(node, "TRAINING", 120)
    sent = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    code = node.wait(timeout=30)
    assert code == 143 and time.monotonic() - sent < 5 + 3, node.output[-2000:]
    assert "SIGTERM received" in node.output


def test_master_that_never_started_is_a_clear_error_after_rdzv_timeout(jobs):
    job = jobs.start(2, [], RDZV_TIMEOUT=6)
    worker = job[1]
    job[0].kill_tree()                                  # the master never comes up
    started = time.monotonic()
    code = worker.wait(timeout=60)
    elapsed = time.monotonic() - started
    assert code == 3 and 5 <= elapsed < 20, worker.output
    assert "127.0.0.1:" in worker.output and "RDZV_TIMEOUT=6s" in worker.output
    told = [line for line in worker.output.splitlines() if not line.startswith("entrypoint: preflight")]
    assert len(told) <= 3, told         # joining, why it failed, the verdict


def test_a_rank_crashing_at_exit_never_strands_its_peer(jobs):
    """The job store sees the crashed node and stops the other at once: no 300 s wait. The
    crashed rank says where its Python was (PYTHONFAULTHANDLER, on by default)."""
    started = time.monotonic()
    codes, output = jobs.run(2, [], timeout=120, ENTRYPOINT=str(ROOT / "tests/e2e/crash_at_exit.py"))
    elapsed = time.monotonic() - started
    assert output.count("ALLREDUCED") == 2, output[-3000:]
    assert codes[1] != 0 and codes[0] != 0, codes
    assert elapsed < 40, elapsed
    assert "Fatal Python error: Aborted" in output and 'crash_at_exit.py", line 19' in output, output[-3000:]


def resumed_steps(output: str) -> dict[int, int]:
    return {int(rank): int(step) for rank, step in re.findall(r"RESUMED rank=(\d+) step=(\d+)", output)}


def test_killed_keras_horovod_worker_restarted_on_failure_resumes_from_the_backup(jobs):
    """compose/restart.yml on loopback: the worker node dies mid-training, the master's
    processes fail, both nodes are started again (exit != 0), and the job continues from
    the last backup (Keras BackupAndRestore, written by rank 0), not from step 0."""
    job = jobs.start(2, ["--steps", "150", "--step-delay", "0.04", "--checkpoint-every", "20"],
                    restart=True, FRAMEWORK="keras", LAUNCHER="horovod")
    master, worker = job
    wait_for(master, "step 60 ", 180)
    worker.kill_tree()
    codes = [node.wait(240) for node in job]
    output = master.output + worker.output
    assert codes == [0, 0] and master.codes[0] != 0 and worker.codes[0] == -9, \
        (master.codes, worker.codes, output[-4000:])
    resumed = resumed_steps(output)
    assert sorted(resumed) == [0, 1] and len(set(resumed.values())) == 1, output[-4000:]
    assert 60 <= resumed[0] < 150 and resumed[0] % 20 == 0, resumed     # the last backup before the kill
    check_trained(output, 2)


@pytest.mark.parametrize("framework", ["tensorflow", "pytorch"])
def test_restarted_worker_arriving_while_its_job_still_runs_joins_the_next_start(jobs, tmp_path, framework):
    """The race compose's restart policy creates: the dead worker's replacement reaches
    the master before the master has noticed the loss (the old worker is frozen here: no
    heartbeat, no connection reset). It waits (no exit 3, no wasted restart), the master
    fails and is restarted, and the job resumes from its last checkpoint (PyTorch) or Keras
    backup (TensorFlow)."""
    args = ["--steps", "300", "--step-delay", "0.04", "--checkpoint-every", "20"]
    master, worker = jobs.start(2, args, restart=True, FRAMEWORK=framework, PEER_TIMEOUT=30)
    wait_for(master, "step 60 ", 240)
    worker.signal_tree(signal.SIGSTOP)
    replacement = jobs.track(Node(worker.env, args, tmp_path / "replacement.log"))
    wait_for(replacement, "is ending", 60)
    worker.stop()
    assert replacement.wait(240) == 0 and master.wait(60) == 0, replacement.output[-4000:]
    assert master.codes[0] == 1 and len(master.codes) == 2, master.codes
    output = master.output + replacement.output
    resumed = resumed_steps(output)
    assert sorted(resumed) == [0, 1] and len(set(resumed.values())) == 1, output[-4000:]
    assert 60 <= resumed[0] < 300 and resumed[0] % 20 == 0, resumed
    check_trained(output, 2)
