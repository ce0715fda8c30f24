"""torchrun's rendezvous on a real three-member etcd (testing/etcd.py), with torch's own
elastic agent as the nodes (`python -m entrypoint.launchers.torchrun.run`, three on
loopback): no node hosts the rendezvous, so losing any node, the first one included, leaves
a job that goes on with the others."""

import re
import subprocess
import sys
import time
import uuid

import pytest

from testing.cluster import Node, wait_for_any
from testing.etcd import EtcdCluster, etcd_binary
from testing.processes import ROOT, child_env

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(etcd_binary() is None, reason="no etcd: apt-get install etcd-server")]

STEPS = 160


class TorchrunNode(Node):
    """One node: torch's agent with its rendezvous on etcd, and the worker it starts."""

    def _start(self, mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "entrypoint.launchers.torchrun.run", *self.args],
                                env=self.env, cwd=str(ROOT), stdout=open(self.log, mode), stderr=subprocess.STDOUT,
                                start_new_session=True)


def torchrun_args(etcd: EtcdCluster, run_id: str, state, steps: int = STEPS, op_timeout: int = 3) -> list[str]:
    return ["--nnodes=2:3", "--nproc-per-node=1", "--max-restarts=3", "--monitor-interval=0.1",
            "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={','.join(etcd.endpoints)}", f"--rdzv-id={run_id}",
            f"--rdzv-conf=join_timeout=60,read_timeout=10,op_timeout={op_timeout},last_call_timeout=1,keep_alive_interval=1,"
            "keep_alive_max_attempt=3",
            "--local-addr=127.0.0.1", str(ROOT / "tests/e2e/elastic_steps.py"), "--steps", str(steps),
            "--state", str(state)]


@pytest.fixture
def etcd(tmp_path):
    with EtcdCluster(tmp_path / "etcd") as cluster:
        yield cluster


def start_nodes(etcd, tmp_path, count: int, first: int = 0, run_id: str = "", steps: int = STEPS,
                state: str = "step", op_timeout: int = 3) -> list[TorchrunNode]:
    """`count` nodes of the job `run_id` (a new one if not given), logs numbered from `first`."""
    env = child_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1")
    args = torchrun_args(etcd, run_id or uuid.uuid4().hex[:12], tmp_path / state, steps, op_timeout)
    return [TorchrunNode(env, args, tmp_path / f"node{k}.log") for k in range(first, first + count)]


def run_id_of(node: TorchrunNode) -> str:
    [found] = [a.split("=", 1)[1] for a in node.args if a.startswith("--rdzv-id=")]
    return found


def rank0_node(nodes) -> TorchrunNode:
    [first] = [n for n in nodes if "ROUND world=3" in n.output]
    return first


def test_losing_an_etcd_member_goes_unnoticed_and_the_job_goes_on_without_its_first_node(etcd, tmp_path):
    nodes = start_nodes(etcd, tmp_path, 3)
    try:
        wait_for_any(nodes, "STEP 10 world=3", 120)
        etcd.stop(etcd.leader())            # the worst member to lose: the others elect a new one
        wait_for_any(nodes, "STEP 30 world=3", 60)
        assert sum(n.output.count("ROUND world=") for n in nodes) == 1     # no new round for it
        first = rank0_node(nodes)           # global rank 0: it serves the round's workers' store
        killed_at = time.monotonic()
        first.kill_tree()
        survivors = [n for n in nodes if n is not first]
        wait_for_any(survivors, "world=2", 60)
        took = time.monotonic() - killed_at
        print(f"global rank 0's node killed: first step at world 2 after {took:.1f}s")
        assert [n.wait(120) for n in survivors] == [0, 0], "\n".join(n.output[-2000:] for n in survivors)
        done = "\n".join(n.output for n in survivors)
        assert f"STEP {STEPS} world=2" in done
        [round2] = re.findall(r"ROUND world=2 from=(\d+)", done)
        assert int(round2) >= 30                # resumed from the step it reached, not from 0
    finally:
        for n in nodes:
            n.kill()


def test_a_node_that_joins_later_is_taken_into_the_next_round(etcd, tmp_path):
    nodes = start_nodes(etcd, tmp_path, 2)
    try:
        wait_for_any(nodes, "STEP 20 world=2", 120)
        nodes += start_nodes(etcd, tmp_path, 1, first=2, run_id=run_id_of(nodes[0]))
        wait_for_any(nodes, "world=3", 60)
        assert [n.wait(120) for n in nodes] == [0, 0, 0], "\n".join(n.output[-2000:] for n in nodes)
        done = "\n".join(n.output for n in nodes)
        assert f"STEP {STEPS} world=3" in done and int(re.findall(r"ROUND world=3 from=(\d+)", done)[0]) >= 20
    finally:
        for n in nodes:
            n.kill()


def test_a_new_job_under_the_id_of_one_that_just_ended_waits_for_its_keys_and_runs(etcd, tmp_path):
    """A finished job's rendezvous is closed; its keys are held by its nodes' leases (TTL
    op_timeout, 12 s here), so the next job under the same id waits for them, then runs. With
    a 3 s lease, a CI machine slow to start the second job's processes (importing torch)
    found the keys gone already, and the test could not see the wait."""
    nodes = start_nodes(etcd, tmp_path, 2, steps=20, state="a", op_timeout=12)
    try:
        assert [n.wait(120) for n in nodes] == [0, 0], "\n".join(n.output[-2000:] for n in nodes)
        again = start_nodes(etcd, tmp_path, 2, first=2, run_id=run_id_of(nodes[0]), steps=20, state="b",
                            op_timeout=12)
        nodes += again
        assert [n.wait(120) for n in again] == [0, 0], "\n".join(n.output[-2000:] for n in again)
        assert "STEP 20 world=2" in "\n".join(n.output for n in again)
        assert any("belongs to a job that ended" in n.output for n in again)
    finally:
        for n in nodes:
            n.kill()
