"""Silent failures on loopback: a rank that stalls, with real collectives, is found within
HANG_TIMEOUT, named with its stack, and the job ends with 124 (an elastic job goes on
without the stalled node); a slowed rank is named a straggler; a healthy job with slow
parts is left alone. No training script is changed for it (bench/workloads/stall.py is
plain training code that stalls). The container test (test_containers.py) stalls a compose node.
"""

import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from entrypoint import status
from tests.conftest import ROOT
from tests.e2e.cluster import wait_for

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


def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        time.sleep(0.2)


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
    assert f'[rank 1]   File "{STALL}", line {STALL_LINE} in wait_forever' in output, output[-4000:]
    assert re.search(r"\[rank 0\] stack of rank 0 \(node 0 on .*\), pid \d+, 14 step\(s\)", output), output[-4000:]
    [incident] = (tmp_path / "checkpoints" / "diagnostics").iterdir()
    assert line.endswith(f"stacks: {incident}")
    saved = (incident / "node0.txt").read_text()
    assert f'line {STALL_LINE} in wait_forever' in saved and "stack of rank 0" in saved
    assert time.monotonic() - started < 150


def test_a_healthy_job_with_slow_parts_is_not_a_hang(jobs):
    """A first step 8 s late, a 3 s checkpoint save and a 3 s evaluation, HANG_TIMEOUT=5."""
    codes, output = jobs.run(1, [], timeout=150, NPROC_PER_NODE=2, HEALTHY="1", FIRST_S="8", SAVE_S="3",
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


def _slow_down(pid: int, stop: threading.Event) -> None:
    """What a noisy neighbour (or `docker update --cpus`) does to one rank: it runs a third
    of the time (SIGSTOP/SIGCONT, as cpulimit does)."""
    while not stop.is_set():
        try:
            subprocess.os.kill(pid, signal.SIGSTOP)
            time.sleep(0.04)
            subprocess.os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
        except ProcessLookupError:
            return


def test_a_slowed_rank_is_named_a_straggler_and_the_status_shows_the_job(jobs, tmp_path):
    status_file = tmp_path / "status.json"
    [node] = jobs.start(1, [], NPROC_PER_NODE=2, STALL_STEP="0", STEPS="100000", WORK="128", STEP_SLEEP="0",
                        STRAGGLER_WINDOW="4", DISTTRAIN_STATUS=str(status_file), **DETECT)

    def ranks() -> dict[int, dict]:
        current = status.read(str(status_file)) or {"ranks": []}
        return {r["rank"]: r for r in current["ranks"] if r["steps"] > 20}

    until(lambda: len(ranks()) == 2, 90, "both ranks step")
    shown = subprocess.run([sys.executable, "-m", "disttrain", "status", "--file", str(status_file)],
                           capture_output=True, text=True, cwd=ROOT)
    assert shown.returncode == 0 and re.search(r"^\s+0 \S+\s+\S+\s+1\s+\d+\s+\d+", shown.stdout, re.M), shown
    stop = threading.Event()
    threading.Thread(target=_slow_down, args=(ranks()[1]["pid"], stop), daemon=True).start()
    try:
        wait_for(node, "straggler: rank 1", 60)
    finally:
        stop.set()
    line = re.search(r"entrypoint: straggler: (rank 1 .*)", node.output)[1]
    assert re.match(r"rank 1 \(node 0 on .*\) takes [\d.]+s its own work \(forward and data\) per step, "
                    r"[\d.]+x the others' median [\d.]+s, for \d+s", line), line
    assert "straggler: rank 0" not in node.output
    assert node.output.count("entrypoint: straggler: rank 1") == 1     # said once, not every second
    assert ranks()[1]["compute_time"] > 1.5 * ranks()[0]["compute_time"]
    node.proc.send_signal(signal.SIGUSR1)                              # the status, in the log
    wait_for(node, "entrypoint: job as node 0 (local)", 10)
    assert "behind: rank 1" in node.output
