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
], ids=["torchrun-local", "torchrun-two-nodes", "horovod-local"])
def test_a_ranks_own_exit_code_is_the_jobs(jobs, nodes, env):
    codes, out = jobs.run(nodes, ["--rank", "1", "--code", "7"], timeout=120, ENTRYPOINT=SCRIPT, **env)
    assert codes == [7] * nodes, out[-4000:]
    assert "rank 1: exiting with 7" in out and "Traceback" not in out, out[-4000:]
    if nodes == 2:
        assert "stopping: node 1: torchrun: rank 1 exited with 7" in out, out[-4000:]
