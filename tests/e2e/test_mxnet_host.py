"""MXNet through the entrypoint, without Docker: parameter servers (dist_sync, dist_async)
and Horovod, as two nodes on loopback or one node with two processes.

MXNet 1.9.1 needs numpy < 1.24, which TensorFlow 2.21 in the cpu venv cannot share, so
these tests run the entrypoint with a second interpreter: MXNET_PYTHON, else
.venv-mxnet/bin/python (`make mxnet-venv` builds it from the cpu-mxnet image's pins and
its Horovod wheel; `make test-mxnet` builds it and runs these). Without one they are
skipped, saying so.
"""

import os
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from testing.cluster import lose_a_worker
from testing.results import check_trained

pytestmark = pytest.mark.e2e

PYTHON = os.environ.get("MXNET_PYTHON") or str(ROOT / ".venv-mxnet" / "bin" / "python")
if not Path(PYTHON).exists():
    pytest.skip(f"no MXNet venv at {PYTHON} (run `make test-mxnet`, or set MXNET_PYTHON to a Python with "
                f"mxnet 1.9.1, torch and Horovod built with MXNet)", allow_module_level=True)

SHAPES = [(2, 1), (1, 2)]          # (nodes, processes per node)
LABELLED_RESULT = re.compile(r"^\[rank(\d+)\]: RESULT framework=\S+ rank=(\d+)", re.M)


@pytest.mark.parametrize("nodes, nproc", SHAPES, ids=["2nodes-x1", "1node-x2"])
@pytest.mark.parametrize("sync", ["sync", "async"])
def test_parameter_servers_train(jobs, sync, nodes, nproc):
    codes, output = jobs.run(nodes, ["--steps", "40"], python=PYTHON, FRAMEWORK="mxnet",
                            SYNC_MODE=sync, NPROC_PER_NODE=nproc)
    assert codes == [0] * nodes, output[-4000:]
    found = check_trained(output, nodes * nproc, agree=sync == "sync")
    assert {r.extra.split()[0] for r in found} == {f"kvstore=dist_{sync}"}
    assert "serving scheduler" in output and "serving server" in output
    # The entrypoint's RANK (the log label) is the rank MXNet's scheduler gave the worker.
    assert sorted(LABELLED_RESULT.findall(output)) == [(str(r), str(r)) for r in range(nodes * nproc)], output[-3000:]


@pytest.mark.parametrize("nodes, nproc", SHAPES, ids=["2nodes-x1", "1node-x2"])
def test_horovod_trains(jobs, nodes, nproc):
    codes, output = jobs.run(nodes, ["--steps", "40"], python=PYTHON, FRAMEWORK="mxnet",
                            LAUNCHER="horovod", NPROC_PER_NODE=nproc)
    assert codes == [0] * nodes, output[-4000:]
    found = check_trained(output, nodes * nproc)
    assert {r.framework for r in found} == {"horovod-mxnet"}
    assert "Traceback" not in output, output[-3000:]          # e.g. an op still pending at exit


@pytest.mark.parametrize("launcher", ["native", "horovod"])
def test_mxnet_trains_behind_a_secret(jobs, launcher):
    """JOB_SECRET: the job store (and Horovod's rendezvous) behind the master's Gates; MXNet's
    parameter servers and Gloo stay the data plane's (docs/security.md)."""
    secret = "3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e"
    codes, output = jobs.run(2, ["--steps", "40"], python=PYTHON, FRAMEWORK="mxnet", LAUNCHER=launcher,
                             JOB_SECRET=secret)
    assert codes == [0, 0], output[-4000:]
    check_trained(output, 2)
    assert "(TLS, JOB_SECRET)" in output and secret not in output


@pytest.mark.parametrize("launcher", ["native", "horovod"])
def test_killed_worker_ends_every_process_within_30s(jobs, launcher):
    job = jobs.start(2, ["--steps", "100000", "--step-delay", "0.01", "--checkpoint-every", "1000000"],
                    python=PYTHON, FRAMEWORK="mxnet", LAUNCHER=launcher)
    code, seconds = lose_a_worker(job)
    assert code != 0
    assert seconds < 30, job[0].output[-3000:]


def test_a_stalled_mxnet_worker_is_named_and_the_job_ends_with_124(jobs, tmp_path):
    """Parameter servers (dist_sync), 1 node x 2 workers: worker 1 stops at step 15 while
    worker 0 waits for the servers' reply; progress comes from Gluon's Trainer.step
    (disttrain/progress.py), the line names worker 1 and its frame."""
    stall = ROOT / "bench" / "workloads" / "stall.py"
    line_no = next(i for i, line in enumerate(stall.read_text().splitlines(), 1) if "time.sleep(0.1)" in line)
    codes, output = jobs.run(1, [], timeout=150, python=PYTHON, FRAMEWORK="mxnet", NPROC_PER_NODE=2,
                             ENTRYPOINT=str(stall), HANG_TIMEOUT="5")
    assert codes == [124], output[-4000:]
    [line] = re.findall(r"^entrypoint: stopping: (no progress for .*)$", output, re.M)
    assert f"rank 1 (node 0 on " in line and f"stalled after step 14: it is at {stall}:{line_no} in wait_forever" \
        in line, line
    assert re.search(r"rank 0 \(node 0 on \S+\) waits in MXNet", line), line


def test_a_workers_own_exit_code_is_the_jobs(jobs):
    """sys.exit(7) on one of MXNet's worker processes (beside its servers and scheduler)
    ends the node with 7, as under the other launchers (test_exit_codes_host.py)."""
    codes, output = jobs.run(1, ["--rank", "1", "--code", "7"], timeout=120, python=PYTHON, FRAMEWORK="mxnet",
                             NPROC_PER_NODE=2, ENTRYPOINT=str(ROOT / "tests/e2e/exit_with.py"))
    assert codes == [7], output[-4000:]
    assert "rank 1: exiting with 7" in output and "Traceback" not in output, output[-4000:]


@pytest.mark.parametrize("launcher", ["native", "horovod"])
def test_no_mxnet_process_reads_the_secret(jobs, launcher):
    """test_secret_host.py's environ probe for MXNet's workers (parameter servers, Horovod):
    neither a worker's environment nor the entrypoint's /proc environ holds JOB_SECRET."""
    secret = "9b4e1d7c3a8f2e6b0c5d9a1f7e3b8c2d"
    codes, output = jobs.run(2, [], python=PYTHON, FRAMEWORK="mxnet", LAUNCHER=launcher, JOB_SECRET=secret,
                             PROBE_REVERSED=secret[::-1], ENTRYPOINT=str(ROOT / "tests/e2e/secret_probe.py"))
    assert codes == [0, 0], output[-4000:]
    probes = re.findall(r"PROBE rank=(\d+) found=(\S+)", output)
    assert sorted(rank for rank, _ in probes) == ["0", "1"] and {found for _, found in probes} == {"nothing"}, probes
