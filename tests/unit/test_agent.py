"""torch's elastic agent inside the entrypoint (launchers/torchrun/agent.py): its configuration is torchrun's own,
its output keeps the supervisor's prefixes, its result becomes the node's outcome. Running
it (signals, failures, elastic rounds) is tested end to end: tests/e2e/test_*_host.py."""

import io
import os
import tempfile
from pathlib import Path

import pytest

from entrypoint.launchers.torchrun.agent import InProcessTorchrun, _Lines, launch_config
from entrypoint.running.log import Log
from entrypoint.running.outcome import NodeState
from entrypoint.launchers.torchrun.launch import TorchrunLaunch, rendezvous_conf

pytest.importorskip("torch")


def test_launch_config_is_the_one_torchrun_builds_from_the_same_launch():
    launch = TorchrunLaunch(nproc_per_node=2, run_id="job7", max_restarts=3, script="/app/code/train.py",
                            args=("--steps", "3"), env={}, nnodes="1:4", rdzv_endpoint="m:29500",
                            rdzv_conf=rendezvous_conf(60, True, 2, 3), local_addr="10.0.0.2")
    config, program, args = launch_config(launch, "/usr/bin/python3", grace_period=7)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (1, 4, 2)
    assert (config.rdzv_backend, config.rdzv_endpoint, config.run_id) == ("c10d", "m:29500", "job7")
    assert config.rdzv_configs["is_host"] == "0" and config.rdzv_configs["last_call_timeout"] == "2"
    assert (config.max_restarts, config.monitor_interval, config.local_addr) == (3, 0.1, "10.0.0.2")
    assert config.shutdown_timeout == 7
    assert args[:2] == ["-u", "/app/code/train.py"] and args[-2:] == ["--steps", "3"]
    assert isinstance(program, str)                          # a program: workers are subprocesses


def test_a_program_that_is_not_python_runs_as_itself():
    launch = TorchrunLaunch(nproc_per_node=1, run_id="r", max_restarts=0, script="/app/code/train.sh", args=(),
                            env={}, nnodes="2", rdzv_endpoint="m:1", rdzv_conf=rendezvous_conf(60, False, 2, 3))
    _, program, args = launch_config(launch, "python3", 5)
    assert program == "/app/code/train.sh" and args == []


def test_agent_output_is_prefixed_and_ranks_keep_their_own_prefix():
    out = io.StringIO()
    lines = _Lines(Log(out), "[torchrun]: ", "out")
    lines.write("[rank3]: hi\nagent ")
    lines.write("log\n")
    assert out.getvalue() == "[rank3]: hi\n[torchrun]: agent log\n"


class Failure:
    def __init__(self, exitcode):
        self.exitcode = exitcode


class Result:
    def __init__(self, failures):
        self.failures = failures

    def is_failed(self):
        return bool(self.failures)


def test_a_failed_worker_fails_the_node_with_its_own_exit_code():
    assert InProcessTorchrun._outcome(Result({})).ok
    outcome = InProcessTorchrun._outcome(Result({3: Failure(-9), 2: Failure(7)}))
    assert (outcome.state, outcome.code) == (NodeState.FAILED, 7) and "rank 2 exited with 7" in outcome.reason
    killed = InProcessTorchrun._outcome(Result({1: Failure(-9)}))
    assert "rank 1 was killed by SIGKILL" in killed.reason and killed.code == 137


def test_two_processes_with_the_same_address_and_pid_get_distinct_rendezvous_node_ids():
    """torch names a rendezvous node (address, PID, counter from 0); two containers on one
    host's network share the first two. Each process's counter starts apart."""
    import subprocess
    import sys

    code = ("from entrypoint.launchers.torchrun.node_ids import distinct_node_ids\n"
            "distinct_node_ids(); distinct_node_ids()\n"
            "from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr\n"
            "g = dr.DynamicRendezvousHandler._node_desc_generator\n"
            "a, b = g.generate('127.0.0.1'), g.generate('127.0.0.1')\n"
            "print(a.addr, b.local_id - a.local_id, a.local_id)\n")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
            for _ in range(2)]
    assert [o[:2] for o in outs] == [["127.0.0.1", "1"]] * 2, outs
    assert outs[0][2] != outs[1][2]


def test_a_waiting_node_reads_the_rendezvous_ten_times_a_second():
    """keep_pace on torch's own handler and c10d backend (a real TCPStore): a node that
    waits 1.5 s for a second node reads the state about every 0.1 s, not torch's 1 s, and
    still times out as torch does; past 200 nodes the pace is torch's own."""
    import subprocess
    import sys

    from entrypoint.launchers.torchrun.rendezvous_pace import pace

    assert (pace(2), pace(20), pace(100), pace(200), pace(5000)) == (0.1, 0.1, 0.5, 1.0, 1.0)
    code = """
import datetime as dt, time
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousTimeoutError
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from entrypoint.launchers.torchrun.rendezvous_pace import keep_pace
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
backend = C10dRendezvousBackend(store, "pace")
reads, get = [], backend.get_state
backend.get_state = lambda: reads.append(1) or get()
handler = dr.DynamicRendezvousHandler.from_backend(
    "pace", store, backend, min_nodes=2, max_nodes=3,
    timeout=dr.RendezvousTimeout(join=dt.timedelta(seconds=1.5)), keep_alive_interval=1)
print(keep_pace(handler, 3))
try:
    handler.next_rendezvous()
except RendezvousTimeoutError:
    print("timeout", len(reads))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = out.stdout.split("\n")
    assert lines[0] == "0.1" and lines[1].startswith("timeout "), out.stdout + out.stderr[-2000:]
    assert int(lines[1].split()[1]) >= 8, lines


def test_a_node_beats_well_within_the_time_after_which_it_is_dropped():
    """beat_often on torch's own handler and c10d backend (a real TCPStore), a node dropped
    after 2 s without a heartbeat (ELASTIC_DEAD_AFTER=2), and a store that answers in 0.3 s:
    while the agent's monitor loop asks it for waiting nodes, the heartbeat in the store
    stays under 1.5 s old. torch's own interval of 1 s let it age past 2 s (and then stop:
    the node's own view no longer named it)."""
    import subprocess
    import sys

    code = """
import datetime as dt, pickle, time
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from entrypoint.launchers.torchrun.rendezvous_pace import beat_often, keep_pace
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
backend = C10dRendezvousBackend(store, "beat")
handler = dr.DynamicRendezvousHandler.from_backend(
    "beat", store, backend, min_nodes=1, max_nodes=2, keep_alive_interval=1, keep_alive_max_attempt=2,
    timeout=dr.RendezvousTimeout(last_call=dt.timedelta(seconds=1)))
keep_pace(handler, 2)
print(beat_often(handler))
handler.next_rendezvous()
get = backend.get_state
backend.get_state = lambda: (time.sleep(0.3), get())[1]
oldest, end = 0.0, time.monotonic() + 4
while time.monotonic() < end:
    handler.num_nodes_waiting()
    beats = list(pickle.loads(get()[0]).last_heartbeats.values())
    oldest = max([oldest] + [(dt.datetime.now(dt.timezone.utc) - b).total_seconds() for b in beats])
    time.sleep(0.1)
print(oldest)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = out.stdout.split("\n")
    assert lines[0] == "0.5", out.stdout + out.stderr[-2000:]
    assert float(lines[1]) < 1.5, lines


def test_a_round_that_re_forms_completes_once_every_live_node_is_in_it():
    """reform_at_once on torch's own handler and c10d backend (a real TCPStore), last call
    4 s, a node dropped after 1 s without a heartbeat. Two nodes form a round; then:
    one stops (its heartbeat with it) and the other's next round completes about 1 s later,
    when the lost node is dropped, not 4 s later; one goes on beating and joins 1.5 s after
    the other, and the round waits for it (two nodes, not one); both re-form at the same
    time, one of them 0.5 s slow between torch's exit and join, and the other waits for it
    rather than completing the round alone; and at the job's first round the last call
    still holds for a node that starts a second later."""
    import subprocess
    import sys

    code = """
import datetime as dt, threading, time
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from entrypoint.launchers.torchrun.rendezvous_pace import keep_pace, reform_at_once
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(reform_at_once())

def nodes(run_id, max_nodes, beats=4):
    # beats: keep-alives a node may miss before it counts as lost (0.25 s each). Only the
    # lost case wants that short: elsewhere a live node's beat delayed on a loaded machine
    # drops it from the round, and it waits for a next round that never comes.
    made = []
    for _ in range(2):          # each node its own client: a waiting get holds a client's connection
        own = dist.TCPStore("127.0.0.1", store.port, is_master=False)
        h = dr.DynamicRendezvousHandler.from_backend(
            run_id, own, C10dRendezvousBackend(own, run_id), min_nodes=1, max_nodes=max_nodes,
            keep_alive_interval=0.25, keep_alive_max_attempt=beats,
            timeout=dr.RendezvousTimeout(join=dt.timedelta(seconds=30), last_call=dt.timedelta(seconds=4)))
        keep_pace(h, max_nodes)
        made.append(h)
    return made

def together(*calls):
    out, threads = {}, []
    for i, (delay, h) in enumerate(calls):
        def go(i=i, delay=delay, h=h):
            time.sleep(delay)
            start = time.monotonic()
            out[i] = (h.next_rendezvous().world_size, round(time.monotonic() - start, 1))
        threads.append(threading.Thread(target=go)); threads[-1].start()
    for t in threads: t.join()
    return [out[i] for i in range(len(calls))]

a, b = nodes("lost", 2)
together((0, a), (0, b))
b._stop_heartbeats()
print("lost", together((0, a)))
a, b = nodes("late", 2, beats=20)
together((0, a), (0, b))
print("late", together((0, a), (1.5, b)))
torch_run = b._op_executor.run
def slow_between_exit_and_join(op, *args, **kwargs):   # as a loaded machine may be
    done = torch_run(op, *args, **kwargs)
    if isinstance(op, dr._RendezvousExitOp):
        time.sleep(0.5)
    return done
b._op_executor.run = slow_between_exit_and_join
print("again", together((0, a), (0, b)))
a, b = nodes("first", 3, beats=20)
print("first", together((0, a), (1, b)))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    got = {line.split(" ", 1)[0]: eval(line.split(" ", 1)[1]) if " " in line else line
           for line in out.stdout.strip().split("\n")}
    assert got.get("True") == "True" and {"lost", "late", "again", "first"} <= set(got), out.stdout + out.stderr[-3000:]
    (size, took), = got["lost"]
    assert size == 1 and took < 2.5, got
    (size_a, took_a), (size_b, _) = got["late"]
    assert size_a == size_b == 2 and took_a < 3.5, got
    (size_a, took_a), (size_b, took_b) = got["again"]
    assert size_a == size_b == 2 and max(took_a, took_b) < 3.5, got
    (size_a, took_a), (size_b, _) = got["first"]
    assert size_a == size_b == 2 and took_a >= 3.5, got


def test_a_node_whose_processes_are_killed_is_dropped_when_its_connection_closes():
    """peer_links on torch's own handler and c10d backend (a real TCPStore): two nodes, two
    processes, form a round; one is SIGKILLed. The other's next round holds it alone about
    when the kill happened, not when the lost node's keep-alive ages out (4 s here), and
    a node that never linked (LINKS=0) still waits for it to age out."""
    import subprocess
    import sys

    code = """
import datetime as dt, os, signal, subprocess, sys, time
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from entrypoint.launchers.torchrun.peer_links import PeerLinks
from entrypoint.launchers.torchrun.rendezvous_pace import keep_pace, reform_at_once
reform_at_once()
port, links = (int(sys.argv[1]), sys.argv[2] == "1") if len(sys.argv) > 1 else (0, True)
store = dist.TCPStore("127.0.0.1", port, is_master=not port, wait_for_workers=False)
if not port:
    other = subprocess.Popen([sys.executable, __file__, str(store.port), os.environ["LINKS"]])
h = dr.DynamicRendezvousHandler.from_backend(
    "links", store, C10dRendezvousBackend(store, "links"), min_nodes=1, max_nodes=2, local_addr="127.0.0.1",
    keep_alive_interval=1, keep_alive_max_attempt=4, timeout=dr.RendezvousTimeout(last_call=dt.timedelta(seconds=4)))
keep_pace(h, 2)
peers = PeerLinks(h) if links else None
h.next_rendezvous()
if peers:
    peers.follow(list(h._state_holder.state.participants))
if port:
    time.sleep(60)
time.sleep(1)
other.send_signal(signal.SIGKILL)
start = time.monotonic()
info = h.next_rendezvous()
print(info.world_size, round(time.monotonic() - start, 1))
"""
    script = Path(tempfile.mkdtemp()) / "links.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    got = {}
    for links in ("1", "0"):
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                             env=dict(env, LINKS=links))
        got[links] = out.stdout.split()
        assert len(got[links]) == 2, out.stdout + out.stderr[-2000:]
    assert got["1"][0] == got["0"][0] == "1", got
    assert float(got["1"][1]) < 2.0 <= 3.0 < float(got["0"][1]), got
