"""The job's exit code is the failed rank's own: a script that calls sys.exit(7) on rank 1
ends every node with 7, and the master names the node and the rank in one line."""

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

SCRIPT = str(ROOT / "tests/e2e/exit_with.py")


@pytest.mark.parametrize("nodes,env", [
    (1, {"NPROC_PER_NODE": 2}),                                   # torchrun, a subprocess
    (2, {"NPROC_PER_NODE": 1}),                                   # torch's agent in the entrypoint
    (1, {"NPROC_PER_NODE": 2, "LAUNCHER": "horovod"}),
    (1, {"NPROC_PER_NODE": 2, "FRAMEWORK": "tensorflow"}),       # TF_CONFIG processes
], ids=["torchrun-local", "torchrun-two-nodes", "horovod-local", "tensorflow-local"])
def test_a_ranks_own_exit_code_is_the_jobs(jobs, nodes, env):
    codes, out = jobs.run(nodes, ["--rank", "1", "--code", "7"], timeout=120, ENTRYPOINT=SCRIPT, **env)
    assert codes == [7] * nodes, out[-4000:]
    assert "rank 1: exiting with 7" in out and "Traceback" not in out, out[-4000:]
    if nodes == 2:
        assert "stopping: node 1: torchrun: rank 1 exited with 7" in out, out[-4000:]


def test_a_failures_reason_and_verdict_share_stderr_so_no_pipe_reorders_them(tmp_path):
    import subprocess

    from testing.cluster import base_env
    from testing.processes import entrypoint

    env = base_env(tmp_path, ENTRYPOINT=SCRIPT, NPROC_PER_NODE=2)
    done = subprocess.run(entrypoint("--rank", "0", "--code", "5"), env=env, cwd=str(ROOT), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 5, done.stdout[-2000:] + done.stderr[-2000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("entrypoint: ")]
    assert len(ours) >= 2 and "exited with 5: stopping the others" in ours[-2], done.stderr
    assert ours[-1].startswith("entrypoint: done: exit 5 after "), done.stderr
    assert "done: exit" not in done.stdout and "starting 2 training processes: torchrun" in done.stdout


def test_a_stopped_torchrun_job_says_so_in_a_line_with_no_traceback(jobs):
    """`docker stop` (SIGTERM) of a one-node PyTorch job: torchrun's SignalException used to
    print a 30-line traceback, and its agent a warning for each worker it stopped."""
    import signal

    from testing.cluster import wait_for

    [node] = jobs.start(1, ["--rank", "9"], ENTRYPOINT=SCRIPT, NPROC_PER_NODE=2)
    wait_for(node, "rank 1: waiting", 60)
    wait_for(node, "rank 0: waiting", 10)
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait(60) == 143, node.output[-3000:]
    lines = node.output.splitlines()
    assert "Traceback" not in node.output and "closing signal" not in node.output, node.output[-3000:]
    assert "torchrun: stopped by SIGTERM" in node.output and len(lines) <= 8, node.output[-3000:]
