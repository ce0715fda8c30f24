"""Silent failures on loopback: a rank that stalls, with real collectives, is found within
HANG_TIMEOUT, named with its stack, and the job ends with 124 (an elastic job goes on
without the stalled node); a healthy job with slow parts is left alone. No training script
is changed for it (bench/workloads/stall.py is plain training code that stalls). The
container tests (test_containers.py) stall a compose node, slow one down with `docker
update --cpus` (a straggler; the status view), and take native frames.
"""

import re
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

STALL = ROOT / "bench" / "workloads" / "stall.py"
STALL_LINE = next(i for i, line in enumerate(STALL.read_text().splitlines(), 1) if "time.sleep(0.1)" in line)
STALLED_AT = f"{STALL}:{STALL_LINE} in wait_forever"
DETECT = dict(ENTRYPOINT=str(STALL), HANG_TIMEOUT="5", PEER_TIMEOUT="10")

# framework, launcher -> what the rank that did not stall waits in
PATHS = {
    ("pytorch", "native"): "backward (DDP's gradient allreduce)",
    ("pytorch", "horovod"): "Horovod's synchronize",
    ("tensorflow", "native"): "a TensorFlow op",                   # MultiWorkerMirroredStrategy's all-reduce
    ("keras", "horovod"): "a TensorFlow op",                       # Horovod's all-reduce op in the train step
}


def stopping_lines(output: str) -> list[str]:
    return re.findall(r"^entrypoint: stopping: (.*)$", output, re.M)


@pytest.mark.parametrize("framework, launcher", PATHS, ids=[f"{f}-{l}" for f, l in PATHS])
def test_a_stalled_rank_is_named_with_its_stack_and_the_job_ends_with_124(jobs, tmp_path, framework, launcher):
    started = time.monotonic()
    codes, output = jobs.run(1, [], timeout=150, FRAMEWORK=framework, LAUNCHER=launcher, NPROC_PER_NODE=2,
                             **DETECT)
    assert codes == [124], output[-4000:]
    [line] = stopping_lines(output)
    assert line.startswith("no progress for "), line
    assert f"rank 1 (node 0 on " in line and f"stalled after step 14: it is at {STALLED_AT}" in line, line
    assert f"rank 0 (node 0 on " in line and f"waits in {PATHS[framework, launcher]}" in line, line
    # Every rank's stack, in the log and in CHECKPOINT_DIR/diagnostics/<incident>/node0.txt
    assert f'[rank1]:   File "{STALL}", line {STALL_LINE} in wait_forever' in output, output[-4000:]
    assert re.search(r"\[rank0\]: stack of rank 0 \(node 0 on .*\), pid \d+, 14 step\(s\)", output), output[-4000:]
    [incident] = (tmp_path / "checkpoints" / "diagnostics").iterdir()
    assert line.endswith(f"stacks: {incident}")
    saved = (incident / "node0.txt").read_text()
    assert f'line {STALL_LINE} in wait_forever' in saved and "stack of rank 0" in saved
    assert time.monotonic() - started < 150


def test_a_healthy_job_with_slow_parts_is_not_a_hang(jobs):
    """A first step 7 s late, a 3 s checkpoint save and a 3 s evaluation, HANG_TIMEOUT=5."""
    codes, output = jobs.run(1, [], timeout=150, NPROC_PER_NODE=2, HEALTHY="1", FIRST_S="7", SAVE_S="3",
                             EVAL_S="3", **DETECT)
    assert codes == [0], output[-4000:]
    assert output.count("STALL-SCRIPT done") == 2 and not stopping_lines(output), output[-4000:]


def test_an_elastic_job_goes_on_without_its_stalled_node(jobs):
    """The worker's rank stalls: its stack is dumped, it leaves with 124, and the master's
    ranks restart without it and finish."""
    job = jobs.start(2, [], MIN_NODES=1, MAX_NODES=2, MAX_RESTARTS=3, STALL_ADDR="127.0.0.2", STEPS="60",
                     **DETECT)
    master, worker = job
    assert worker.wait(150) == 124, worker.output[-4000:]
    assert master.wait(150) == 0, master.output[-4000:]
    assert f"in wait_forever" in worker.output
    [left] = stopping_lines(worker.output)
    assert "(node 1 on " in left and f"stalled after step 14: it is at {STALLED_AT}" in left, left
    assert re.search(r"entrypoint: hang: .*; node\(s\) 1 leave, and the job goes on without them", master.output)
    assert "STALL-SCRIPT done rank=0" in master.output and not stopping_lines(master.output), master.output[-4000:]
