"""Hang and straggler detection's parts: the progress a real process reports (its hooks, its
stack dump), reading a dump, the diagnosis line, stragglers over time, the variables."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from entrypoint.contract.config import FRAMEWORKS, LAUNCHERS, ConfigError, load_config
from entrypoint.health.hangs import Stragglers, diagnose, past_timeout
from entrypoint.contract.manifest import Image
from entrypoint.health.progress import ProgressFolder, RankProgress
from entrypoint.health.stacks import Frame, Where, main_thread, where
from entrypoint.health.vigil import library_roots

IMAGE = Image(FRAMEWORKS, LAUNCHERS)
ROOTS = ("/usr/lib/python3.11/", "/venv/lib/python3.11/site-packages/", "/opt/disttrain/")

# What faulthandler wrote for the two ranks of a DDP job whose rank 1 stopped (tests/e2e).
WAITING = textwrap.dedent("""\
    Thread 0x00007f84e89a36c0 (most recent call first):
      File "/opt/disttrain/disttrain/progress.py", line 123 in _write_every_second
      File "/usr/lib/python3.11/threading.py", line 982 in run

    Current thread 0x00007fde56bd5b80 (most recent call first):
      File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979 in _engine_run_backward
      File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 395 in backward
      File "/opt/disttrain/disttrain/progress.py", line 180 in backward
      File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 623 in backward
      File "/app/code/train.py", line 11 in <module>
    """)
STALLED = textwrap.dedent("""\
    Current thread 0x00007f1d3bdc2b80 (most recent call first):
      File "/app/code/train.py", line 9 in wait_forever
      File "/app/code/train.py", line 20 in <module>
    """)


def rank(node, r, steps=30, idle=12.0, step_time=0.1, compute=None, pid=None):
    return RankProgress(node=node, host=f"host{node}", rank=r, local_rank=r, pid=pid or 100 + r, source="torch optimizer",
                        steps=steps, idle_s=idle, step_idle_s=idle, step_time=step_time, compute_time=compute)


# --------------------------------------------------------------------------- reading a dump

def test_the_main_thread_is_the_script_s_not_the_progress_writer():
    frames = main_thread(WAITING)
    assert frames[0] == Frame("/venv/lib/python3.11/site-packages/torch/autograd/graph.py", 979, "_engine_run_backward")
    assert frames[-1].func == "<module>"


def test_a_rank_in_backward_waits_in_the_gradient_allreduce():
    w = where(WAITING, ROOTS)
    assert w.collective == "backward (DDP's gradient allreduce)"
    assert w.user == Frame("/app/code/train.py", 11, "<module>")


def test_a_rank_in_its_own_code_is_not_waiting():
    w = where(STALLED, ROOTS)
    assert w.collective is None
    assert str(w.user) == "/app/code/train.py:9 in wait_forever"
    assert Where.from_dict(w.to_dict()) == w


# --------------------------------------------------------------------------- the line

def test_the_line_names_the_stalled_rank_and_what_the_others_do():
    ranks = [rank(0, 0), rank(1, 1)]
    wheres = {(0, 100): where(WAITING, ROOTS), (1, 101): where(STALLED, ROOTS)}
    d = diagnose(ranks, wheres, 10, stacks_at="/ckpt/diagnostics/hang-1")
    assert d.stalled_nodes == (1,) and not d.every_rank_waits
    assert "rank 1 (node 1 on host1) stalled after step 30: it is at /app/code/train.py:9 in wait_forever" in d.line
    assert "rank 0 (node 0 on host0) waits in backward (DDP's gradient allreduce) from /app/code/train.py:11" in d.line
    assert d.line.endswith("stacks: /ckpt/diagnostics/hang-1")


def test_every_rank_in_a_collective_blames_the_network_not_a_rank():
    ranks = [rank(0, 0), rank(1, 1, pid=101)]
    wheres = {(0, 100): where(WAITING, ROOTS), (1, 101): where(WAITING, ROOTS)}
    d = diagnose(ranks, wheres, 10)
    assert d.every_rank_waits and d.stalled_nodes == ()
    assert d.line.startswith("every rank (2) has made no progress for 12s (HANG_TIMEOUT=10) after step 30, all waiting")
    assert "not one rank" in d.line


def test_a_rank_without_a_stack_and_a_silent_node_count_as_stalled():
    ranks = [rank(0, 0), rank(0, 1)]
    d = diagnose(ranks, {(0, 100): where(WAITING, ROOTS), (0, 101): None}, 10, silent_nodes=(2,))
    assert "rank 1 (node 0 on host0) stalled after step 30: it gave no stack" in d.line
    assert "node 2 sent no stacks" in d.line
    assert d.stalled_nodes == (0, 2)


def test_hang_timeout_counts_from_the_last_progress_and_the_last_incident():
    ranks = [rank(0, 0, idle=4.0), rank(0, 1, idle=11.0)]
    assert [r.rank for r in past_timeout(ranks, 10)] == [1]
    assert past_timeout(ranks, 10, quiet_s=3.0) == []
    assert past_timeout(ranks, 0) == []


# --------------------------------------------------------------------------- stragglers

def test_a_straggler_is_named_once_after_its_window_and_again_when_it_catches_up():
    s = Stragglers(1.5, window_s=10)
    slow = [rank(0, 0, compute=0.1), rank(0, 1, compute=0.1), rank(1, 2, compute=0.4)]
    assert s.observe(slow, now=0.0) is None          # behind, not yet for the window
    line = s.observe(slow, now=10.0)
    assert line.startswith("straggler: rank 2 (node 1 on host1) takes 0.400s its own work")
    assert "4.0x the others' median 0.100s" in line
    assert s.observe(slow, now=11.0) is None         # said once
    even = [rank(0, 0, compute=0.1), rank(0, 1, compute=0.1), rank(1, 2, compute=0.11)]
    assert s.observe(even, now=12.0) == "straggler: none now (1 rank(s) caught up)"
    assert Stragglers(0, 10).observe(slow, now=100.0) is None


# --------------------------------------------------------------------------- the variables

@pytest.mark.parametrize("env, line", [
    ({"HANG_TIMEOUT": "3"}, "HANG_TIMEOUT='3': allowed: 0 (off) or an integer >= 5"),
    ({"HANG_TIMEOUT": "ten"}, "HANG_TIMEOUT='ten': allowed: 0 (off) or an integer >= 5"),
    ({"STRAGGLER_FACTOR": "1"}, "STRAGGLER_FACTOR='1': allowed: 0 (off) or a number > 1, like 1.5"),
    ({"STRAGGLER_WINDOW": "0"}, "STRAGGLER_WINDOW='0': must be an integer >= 1"),
])
def test_bad_detection_variables_are_one_line(env, line):
    with pytest.raises(ConfigError) as err:
        load_config(env, IMAGE)
    assert str(err.value) == line


def test_detection_defaults_and_off():
    c = load_config({}, IMAGE)
    assert (c.hang_timeout, c.straggler_factor, c.straggler_window) == (300, 1.5, 60)
    assert load_config({"HANG_TIMEOUT": "0", "STRAGGLER_FACTOR": "0"}, IMAGE).hang_timeout == 0


# --------------------------------------------------------------------------- a real process

RANK_PROCESS = textwrap.dedent("""\
    import sys, time
    from disttrain import progress
    progress.install()
    import torch

    class Distributed(torch.optim.SGD):             # as Horovod's DistributedOptimizer: a subclass whose
        def step(self, closure=None):               # step calls its base class's step
            return super().step(closure)

    model = torch.nn.Linear(4, 1)
    opt = Distributed(model.parameters(), lr=0.1)
    for _ in range(7):
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
    print("stepped", flush=True)
    def wait_here():
        time.sleep(60)
    wait_here()
    """)


def test_a_process_reports_its_steps_and_dumps_its_stack(tmp_path):
    folder = ProgressFolder(root=str(tmp_path))
    env = {**os.environ, **folder.env(), "RANK": "3", "LOCAL_RANK": "1"}
    script = tmp_path / "train.py"
    script.write_text(RANK_PROCESS)
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "stepped"
        time.sleep(1.3)                              # one write of the reporting thread
        [r] = folder.read()
        assert (r.rank, r.local_rank, r.pid, r.steps) == (3, 1, proc.pid, 7)   # a nested step counts once
        assert r.source == "torch optimizer" and r.step_time is not None and r.compute_time is not None
        dumps = folder.dump_stacks([proc.pid])
        w = where(dumps[proc.pid], library_roots())
        assert w.user == Frame(str(script), 17, "wait_here") and w.collective is None
    finally:
        proc.kill()
        proc.wait()
    assert folder.read() == []                       # a dead process is no rank
    folder.close()
    assert not os.path.exists(folder.path)


def test_the_images_own_code_counts_as_library_code():
    """Frames in the entrypoint and disttrain are never named as the user's line."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert {f"{root}/entrypoint/", f"{root}/disttrain/"} <= set(library_roots())
