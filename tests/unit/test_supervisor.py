"""The supervisor with real child processes: failure propagation, signals, grace, output."""

import io
import os
import signal
import subprocess
import sys
import threading
import time

from entrypoint.running.log import Log
from entrypoint.running.outcome import NodeState, Outcome
from entrypoint.running.specs import ProcessSpec
from entrypoint.running.signals import Signals
from entrypoint.running.supervisor import Supervisor

PY = sys.executable


def spec(label, code, critical=True):
    return ProcessSpec(label, (PY, "-u", "-c", code), {}, critical)


class FakeWatch:
    """A watch that answers from a function (the job store's side is tested end to end)."""
    has_peers = True

    def show_status(self):
        pass

    def cause_of(self, failure):
        return failure

    def __init__(self, check):
        self._check = check

    def check(self):
        return self._check()

    def stopping(self, signum):
        return Outcome.stopped(signum)


def run(specs, grace=2.0, watch=None):
    out = io.StringIO()
    sup = Supervisor(specs, dict(os.environ), grace, Log(out), watch=watch)
    started = time.monotonic()
    outcome = sup.run()
    return outcome, out.getvalue(), time.monotonic() - started, sup


def test_all_succeed():
    outcome, out, _, _ = run([spec("rank 0", "print('hello')"), spec("rank 1", "print('world')")])
    assert outcome == Outcome.succeeded()
    assert "[rank0]: hello" in out and "[rank1]: world" in out


def test_first_failure_stops_the_others_and_sets_the_exit_code():
    outcome, out, elapsed, sup = run([spec("rank 0", "import time; time.sleep(60)"),
                                      spec("rank 1", "import sys, time; time.sleep(0.5); sys.exit(7)")])
    assert (outcome.state, outcome.code) == (NodeState.FAILED, 7) and elapsed < 10
    assert "rank 1 exited with 7" in out
    assert all(p.poll() is not None for _, p in sup.children.running)


def test_child_ignoring_sigterm_is_killed_after_the_grace_period():
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    outcome, out, elapsed, _ = run([spec("rank 0", stubborn),
                                    spec("rank 1", "import sys, time; time.sleep(1); sys.exit(3)")], grace=1.0)
    assert outcome.code == 3 and elapsed < 6
    assert "did not stop within GRACE_PERIOD=1s: SIGKILL" in out


def test_grandchildren_are_stopped_with_their_group():
    # like torchrun: the child starts its own workers
    parent = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print('child', p.pid, flush=True); time.sleep(60)")
    out = io.StringIO()
    sup = Supervisor([spec("launcher", parent)], dict(os.environ), 1.0, Log(out))
    sup.start()
    for _ in range(100):
        if "child" in out.getvalue():
            break
        time.sleep(0.05)
    grandchild = int(out.getvalue().split("child")[1].split()[0])
    sup.stop_all()
    time.sleep(0.2)
    assert not alive(grandchild)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_is_forwarded_and_the_exit_code_is_143():
    script = f"""
import os, sys
sys.path.insert(0, {str(os.getcwd())!r})
from entrypoint.running.log import Log
from entrypoint.running.outcome import NodeState, Outcome
from entrypoint.running.log import Log
from entrypoint.running.specs import ProcessSpec
from entrypoint.running.signals import Signals
from entrypoint.running.supervisor import Supervisor
spec = ProcessSpec("rank 0", ({PY!r}, "-u", "-c", "import time; print('ready', flush=True); time.sleep(60)"), {{}})
sup = Supervisor([spec], dict(os.environ), 5.0, Log(), signals=Signals().install())
sys.exit(sup.run().code)
"""
    proc = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, text=True)
    assert "ready" in proc.stdout.readline()
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    assert time.monotonic() - started < 5


def test_servers_stop_when_the_critical_process_ends():
    outcome, out, elapsed, _ = run([spec("chief", "import time; time.sleep(0.5)"),
                                    spec("ps 0", "import time; time.sleep(60)", critical=False)])
    assert outcome.ok and elapsed < 10


def test_job_store_abort_stops_everything():
    calls = {"n": 0}

    def check():
        calls["n"] += 1
        return Outcome.failed("node 1 failed (exit 9)").aborting() if calls["n"] >= 2 else None

    outcome, out, elapsed, _ = run([spec("rank 0", "import time; time.sleep(60)")], watch=FakeWatch(check))
    assert (outcome.state, outcome.code) == (NodeState.ABORTED, 1)
    assert "stopping: node 1 failed (exit 9)" in out and elapsed < 10


def test_server_only_node_ends_when_the_job_finishes():
    done = threading.Event()
    threading.Timer(1.0, done.set).start()
    outcome, _, elapsed, _ = run([spec("worker 1", "import time; time.sleep(60)", critical=False)],
                                 watch=FakeWatch(lambda: Outcome.succeeded() if done.is_set() else None))
    assert outcome.ok and 0.9 < elapsed < 10


def test_output_lines_keep_torchruns_rank_prefix():
    outcome, out, _, _ = run([spec("torchrun", "print('[rank3]: hi'); print('agent log')")])
    assert "[rank3]: hi" in out and "[torchrun]: agent log" in out


# torchrun puts its workers in sessions of their own: out of reach of its process group.
ESCAPING = ("import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "print('child', p.pid, flush=True); time.sleep(60)")


def _wait_for_child(out) -> int:
    for _ in range(200):
        if "child" in out.getvalue():
            return int(out.getvalue().split("child")[1].split()[0])
        time.sleep(0.05)
    raise AssertionError(out.getvalue())


def test_processes_that_left_their_group_are_stopped_too():
    out = io.StringIO()
    sup = Supervisor([spec("launcher", ESCAPING)], dict(os.environ), 1.0, Log(out))
    sup.start()
    escaped = _wait_for_child(out)
    sup.stop_all()
    time.sleep(0.2)
    assert not alive(escaped)


def test_a_killed_entrypoint_takes_its_processes_with_it():
    """SIGKILL to the supervising process alone (not its group): the sentinel ends
    everything the node started, including processes in sessions of their own."""
    script = f"""
import os, sys
sys.path.insert(0, {str(os.getcwd())!r})
from entrypoint.running.log import Log
from entrypoint.running.specs import ProcessSpec
from entrypoint.running.supervisor import Supervisor
spec = ProcessSpec("launcher", ({PY!r}, "-u", "-c", {ESCAPING!r}), {{}})
Supervisor([spec], dict(os.environ), 5.0, Log()).run()
"""
    proc = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    line = proc.stdout.readline()
    assert "child" in line, line
    escaped = int(line.split("child")[1].split()[0])
    launcher = [p for p in _children_of(proc.pid) if p != escaped]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (alive(escaped) or any(alive(p) for p in launcher)):
        time.sleep(0.1)
    assert not alive(escaped) and not any(alive(p) for p in launcher)


def test_processes_ended_as_stale_keep_their_exit_code_for_their_parent():
    """rounds.py ends the training processes of a round that counts on a lost node. When
    torch's agent runs in the entrypoint they are its children, which its Popen waits for:
    reaped here, they read as exit 0, and the agent took a stopped job for a finished one
    (seen in compose: a master that exited 0 at step 249 of 300)."""
    import psutil

    from entrypoint.running import reaper

    token = reaper.new_token()
    before = time.time()
    time.sleep(0.1)
    child = subprocess.Popen([PY, "-c", "import signal, sys, time\n"
                              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\nprint('up', flush=True)\n"
                              "time.sleep(60)"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, reaper.TOKEN_VAR: token})
    assert child.stdout.readline().strip() == "up"
    # Started 0.1 s after `before`: not stale (the kernel counts in ticks of 10 ms; psutil's
    # own create_time() read 0.83 s early on the machine that found this).
    assert reaper.stale(token, before=before, spare_children=False) == []
    assert abs(reaper.started_at(psutil.Process(child.pid)) - before) < 0.5
    stale = reaper.stale(token, before=time.time() + 0.05, spare_children=False)
    assert [p.pid for p in stale] == [child.pid]
    reaper.end(stale)
    assert child.wait(10) == 143


def _children_of(pid: int) -> list[int]:
    import psutil
    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


class Scripted:
    """A Supervised whose verdicts are a script: None until `after` polls, then `outcome`."""

    def __init__(self, outcome, after: int):
        self.outcome, self.after, self.polls = outcome, after, 0

    def poll(self):
        self.polls += 1
        return self.outcome if self.polls > self.after else None

    def what(self) -> str:
        return "scripted"

    def wait(self, seconds: float) -> None:
        time.sleep(0.001)


class CountingWatch:
    has_peers = False

    def __init__(self, verdict=None):
        self.checks, self.verdict = 0, verdict

    def check(self):
        self.checks += 1
        return self.verdict

    def stopping(self, signum):
        return Outcome.stopped(signum)


def test_one_loop_asks_the_runner_every_poll_and_the_watch_once_a_second():
    from entrypoint.running.loop import supervise

    runner, watch = Scripted(Outcome.succeeded(), after=50), CountingWatch()
    assert supervise(runner, watch, Signals(), Log(io.StringIO())).state is NodeState.SUCCEEDED
    assert runner.polls == 51 and watch.checks == 1            # 50 polls of 1 ms: one watch check


def test_a_signal_comes_first_and_the_watch_is_told():
    import signal as signals_module

    from entrypoint.running.loop import supervise

    got = Signals()
    got.received = signals_module.SIGTERM
    out = io.StringIO()
    outcome = supervise(Scripted(Outcome.failed("never seen"), after=0), CountingWatch(), got, Log(out))
    assert outcome.state is NodeState.STOPPED and outcome.code == 143
    assert "SIGTERM received: stopping scripted" in out.getvalue()


def test_the_watch_verdict_stops_a_runner_that_goes_on():
    from entrypoint.running.loop import supervise

    out = io.StringIO()
    outcome = supervise(Scripted(None, after=0), CountingWatch(Outcome.lost("lost the master")), Signals(), Log(out))
    assert outcome.state is NodeState.LOST and "stopping: lost the master" in out.getvalue()
