"""The supervisor with real child processes: failure propagation, signals, grace, output."""

import io
import os
import signal
import subprocess
import sys
import threading
import time

from entrypoint.plan import ProcessSpec
from entrypoint.supervisor import Supervisor

PY = sys.executable


def spec(label, code, critical=True):
    return ProcessSpec(label, (PY, "-u", "-c", code), {}, critical)


def run(specs, grace=2.0, **kwargs):
    out = io.StringIO()
    sup = Supervisor(grace, out=out, **kwargs)
    started = time.monotonic()
    code = sup.run(specs, dict(os.environ))
    return code, out.getvalue(), time.monotonic() - started, sup


def test_all_succeed():
    code, out, _, _ = run([spec("rank 0", "print('hello')"), spec("rank 1", "print('world')")])
    assert code == 0
    assert "[rank 0] hello" in out and "[rank 1] world" in out


def test_first_failure_stops_the_others_and_sets_the_exit_code():
    code, out, elapsed, sup = run([spec("rank 0", "import time; time.sleep(60)"),
                                   spec("rank 1", "import sys, time; time.sleep(0.5); sys.exit(7)")])
    assert code == 7 and elapsed < 10
    assert "rank 1 exited with 7" in out
    assert all(p.poll() is not None for _, p in sup.children)


def test_child_ignoring_sigterm_is_killed_after_the_grace_period():
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    code, out, elapsed, _ = run([spec("rank 0", stubborn), spec("rank 1", "import sys, time; time.sleep(1); sys.exit(3)")],
                                grace=1.0)
    assert code == 3 and elapsed < 6
    assert "did not stop within GRACE_PERIOD=1s: SIGKILL" in out


def test_grandchildren_are_stopped_with_their_group():
    # like torchrun: the child starts its own workers
    parent = ("import subprocess, sys, time; "
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print('child', p.pid, flush=True); time.sleep(60)")
    out = io.StringIO()
    sup = Supervisor(1.0, out=out)
    sup.start([spec("launcher", parent)], dict(os.environ))
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
from entrypoint.plan import ProcessSpec
from entrypoint.supervisor import Supervisor
sup = Supervisor(5.0)
sup.install_signal_handlers()
spec = ProcessSpec("rank 0", ({PY!r}, "-u", "-c", "import time; print('ready', flush=True); time.sleep(60)"), {{}})
sys.exit(sup.run([spec], dict(os.environ)))
"""
    proc = subprocess.Popen([PY, "-c", script], stdout=subprocess.PIPE, text=True)
    assert "ready" in proc.stdout.readline()
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 143
    assert time.monotonic() - started < 5


def test_servers_stop_when_the_critical_process_ends():
    code, out, elapsed, _ = run([spec("chief", "import time; time.sleep(0.5)"),
                                 spec("ps 0", "import time; time.sleep(60)", critical=False)])
    assert code == 0 and elapsed < 10


def test_job_store_abort_stops_everything():
    calls = {"n": 0}

    def poll():
        calls["n"] += 1
        return "node 1 failed (exit 9)" if calls["n"] >= 2 else None

    code, out, elapsed, _ = run([spec("rank 0", "import time; time.sleep(60)")], poll=poll)
    assert code == 1 and "stopping: node 1 failed (exit 9)" in out and elapsed < 10


def test_server_only_node_ends_when_the_job_finishes():
    done = threading.Event()
    threading.Timer(1.0, done.set).start()
    code, _, elapsed, _ = run([spec("worker 1", "import time; time.sleep(60)", critical=False)],
                              job_finished=lambda: 0 if done.is_set() else None)
    assert code == 0 and 0.9 < elapsed < 10


def test_output_lines_keep_torchruns_rank_prefix():
    code, out, _, _ = run([spec("torchrun", "print('[rank3]: hi'); print('agent log')")])
    assert "[rank3]: hi" in out and "[torchrun] agent log" in out
