"""JOB_SECRET on loopback: a two-node job whose control plane takes only its own nodes.

Real strangers against a running job: a raw TCPStore client that writes the job's abort
record, claims a node rank and plants a pickle in torchrun's rendezvous state; nodes with
another secret or none. The job trains to the end, the master names each refusal, and no
stranger's write lands. Without a secret the stranger's pickle runs in torchrun's agents (the
control that shows the test can fail)."""

from __future__ import annotations

import base64
import datetime as dt
import pickle
import re
import time
from collections import Counter

import psutil
import pytest

from entrypoint.running.outcome import Outcome
from entrypoint.store.transport import job_prefix
from tests.conftest import ROOT
from testing.census import described, listeners, reachable
from testing.cluster import Node, wait_for, wait_for_any
from testing.results import changes, check_trained, results

pytestmark = pytest.mark.e2e

SECRET = "3f9a1c7e5b2d8f4a6c0e9b7d5f3a1c8e"
STEPS = ["--steps", "80", "--step-delay", "0.25"]     # ~20 s of training: time for the strangers


class Planted:
    """Unpickling this creates `path`: the side effect a code-running payload would have."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def stranger(host: str, port: int, run_id: str, planted: str) -> list[str]:
    """What someone who can reach MASTER_PORT does with a plain TCPStore client; the
    writes that went through."""
    from torch.distributed import TCPStore

    try:
        store = TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=dt.timedelta(seconds=2))
    except (RuntimeError, ValueError):
        return []
    prefix = job_prefix(run_id)
    store.set(prefix + "job/abort", Outcome.failed("a stranger says stop").aborting().to_json())
    store.compare_set(prefix + "node/1/claim", "", "stranger")
    plant(store, run_id, planted)
    return ["abort", "claim", "rendezvous state"]


def plant(store, run_id: str, planted: str) -> None:
    """Replace torchrun's rendezvous state (c10d: base64 of a pickle, under this key) with a
    payload: every agent unpickles the state when it next syncs (its keep-alives, its end)."""
    store.set(f"torch.rendezvous.{run_id}", base64.b64encode(pickle.dumps(Planted(planted))))


# No node on 127.0.0.1, where each node's private ports are: what the census finds on any
# other address, another host could reach (testing/census.py).
NODE_ADDRS = ["127.0.0.11", "127.0.0.12"]


def census(job: list[Node]) -> Counter:
    """What other hosts can reach while the job runs, counted by what it is."""
    master = job[0].env
    gates = {int(master["MASTER_PORT"]): "MASTER_PORT", int(master["HOROVOD_PORT"]): "HOROVOD_PORT"}
    return described(listeners(job), [node.env["NODE_ADDR"] for node in job], gates)


def reachable_as_documented(*gates: str, ranks_everywhere: int = 0, peer_links: int = 0) -> Counter:
    """docs/security.md's list for a launcher: the master's Gates, what each rank opens
    on every interface (elastic Horovod's notification service, TensorFlow's gRPC server),
    and each link port (an elastic torchrun node's, an elastic Horovod worker's: TLS with the job's certificate).
    Gloo's pair listeners bind NET_IFNAME's address, 127.0.0.1 on loopback, so they show only
    in containers (test_containers.py counts them there)."""
    return (Counter({f"Gate on {gate}": 1 for gate in gates}) + Counter({"rank, every interface": ranks_everywhere})
            + Counter({"peer link, its node's address": peer_links}))


def start_two(jobs, tmp, **env) -> list[Node]:
    return jobs.start(2, STEPS, FRAMEWORK="pytorch", RUN_ID="guarded", **env)


def test_a_job_with_a_secret_trains_while_strangers_and_other_secrets_are_refused(jobs, tmp_path):
    """The job's nodes read the secret from a file (a mounted secret), the intruders get theirs as JOB_SECRET."""
    secret_file = tmp_path / "job_secret"
    secret_file.write_text(SECRET + "\n")
    job = start_two(jobs, tmp_path, JOB_SECRET_FILE=str(secret_file), addrs=NODE_ADDRS)
    master, worker = job
    wait_for(master, "TRAINING rank=0", 120)
    port = int(master.env["MASTER_PORT"])
    assert census(job) == reachable_as_documented("MASTER_PORT")
    # Another secret; this job's secret under another RUN_ID (another job given the same
    # Kubernetes Secret); no secret.
    intruders = [jobs.track(Node({**worker.env, "JOB_SECRET_FILE": "", "JOB_SECRET": secret, "NODE_ADDR": "127.0.0.9",
                                  "RUN_ID": run_id}, STEPS, tmp_path / f"intruder{k}.log"))
                 for k, (secret, run_id) in enumerate([("9b1d3f5a7c2e4b6d8f0a1c3e5b7d9f2a", "guarded"),
                                                       (SECRET, "another-job"), ("", "guarded")])]
    planted = tmp_path / "planted"
    assert stranger("127.0.0.1", port, "guarded", str(planted)) == []
    codes = [node.wait(120) for node in job]
    output = "\n".join(node.output for node in job)
    assert codes == [0, 0], output[-4000:]
    check_trained(output, 2)
    assert not planted.exists()
    for node, says in zip(intruders, ["holds a different JOB_SECRET or RUN_ID"] * 2
                          + ["takes only nodes that hold its JOB_SECRET"]):
        assert node.wait(60) == 3, node.output[-2000:]
        failed = [line for line in node.output.splitlines() if "rendezvous failed" in line]
        assert len(failed) == 1 and says in failed[0], node.output[-2000:]
        # Joining, why it failed, the verdict: no C++ traces of TCPStore's retries (260 lines).
        told = [line for line in node.output.splitlines() if not line.startswith("entrypoint: preflight")]
        assert len(told) <= 3, node.output[-3000:]
    refusals = [line for line in master.output.splitlines() if "refused a connection from 127.0.0." in line]
    for why in ("does not speak TLS", "not this job's", "presented no certificate"):
        assert any(why in line for line in refusals), refusals
    assert SECRET not in output


def test_without_a_secret_a_stranger_runs_code_in_the_agents_and_stops_the_job(jobs, tmp_path):
    """The control: the same stranger against the same job without JOB_SECRET."""
    from torch.distributed import TCPStore

    job = start_two(jobs, tmp_path)
    master = job[0]
    wait_for(master, "TRAINING rank=0", 120)
    assert "WARNING: no JOB_SECRET" in master.output
    port, planted = int(master.env["MASTER_PORT"]), tmp_path / "planted"
    store = TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=dt.timedelta(seconds=5))
    plant(store, "guarded", str(planted))
    deadline = time.monotonic() + 30
    while not planted.exists() and time.monotonic() < deadline and master.proc.poll() is None:
        time.sleep(0.2)
    assert planted.exists(), "torchrun's agents did not unpickle the planted state"
    codes = [node.wait(120) for node in job]
    assert codes != [0, 0], master.output[-3000:]


# Fixed-size Horovod's rendezvous (served with the launch) and elastic Horovod's (its
# ElasticDriver's, hvd.elastic): both behind a Gate on HOROVOD_PORT.
HOROVOD_JOBS = {"fixed": {}, "elastic": dict(MIN_NODES=2, MAX_NODES=2)}


@pytest.mark.parametrize("kind", HOROVOD_JOBS)
def test_horovod_behind_a_secret_trains_and_refuses_a_stranger_at_its_http_rendezvous(jobs, tmp_path, kind):
    import urllib.error
    import urllib.request

    job = jobs.start(2, ["--steps", "40", "--step-delay", "0.1"], FRAMEWORK="pytorch", LAUNCHER="horovod",
                     JOB_SECRET=SECRET, addrs=NODE_ADDRS, **HOROVOD_JOBS[kind])
    master = job[0]
    wait_for(master, "TRAINING rank=0", 120)
    # Elastic: also each rank's notification service, which Horovod's driver calls, and the
    # worker's link port, where the master holds a link to it.
    assert census(job) == reachable_as_documented("MASTER_PORT", "HOROVOD_PORT",
                                                  ranks_everywhere=2 if kind == "elastic" else 0,
                                                  peer_links=1 if kind == "elastic" else 0)
    planted = tmp_path / "planted"
    request = urllib.request.Request(f"http://127.0.0.1:{master.env['HOROVOD_PORT']}/global/rank_0",
                                     data=pickle.dumps(Planted(str(planted))), method="PUT")
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        urllib.request.urlopen(request, timeout=5)
    codes = [node.wait(120) for node in job]
    output = "\n".join(node.output for node in job)
    assert codes == [0, 0], output[-4000:]
    check_trained(output, 2)
    assert not planted.exists()
    assert any("refused a connection from 127.0.0.1" in line and "HTTP_REQUEST" in line
               for line in master.output.splitlines()), master.output[-3000:]


GROUP_SCRIPT = """
import os, psutil, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
everywhere = [c.laddr.port for c in psutil.Process().net_connections(kind="tcp")
              if c.status == psutil.CONN_LISTEN and c.laddr.ip in ("0.0.0.0", "::")]
print(f"GROUP rank={dist.get_rank()} world={dist.get_world_size()} store={os.environ['MASTER_ADDR']} "
      f"client_only={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')} open={everywhere}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_torch_distributed_under_horovod_with_a_secret_forms_its_group_on_the_job_store(jobs, tmp_path):
    """Rank 0 serves no store of its own on every interface: the group meets on the job
    store, through each node's tunnel."""
    script = tmp_path / "group.py"
    script.write_text(GROUP_SCRIPT)
    codes, output = jobs.run(2, [], FRAMEWORK="pytorch", LAUNCHER="horovod", JOB_SECRET=SECRET, ENTRYPOINT=str(script))
    assert codes == [0, 0], output[-4000:]
    for rank in (0, 1):
        assert f"GROUP rank={rank} world=2 store=127.0.0.1 client_only=True open=[]" in output, output[-3000:]


def test_a_restarted_torchrun_job_behind_a_secret_meets_in_a_fresh_store(jobs, tmp_path):
    """MAX_RESTARTS=1: a rank fails in the first attempt, and torch's agents start every rank
    again. The second attempt's group forms in that round's own store (workerstores.py), not
    among the first attempt's keys in one long-lived store, and nothing but the Gate listens
    on every interface."""
    codes, output = jobs.run(2, [], timeout=180, NPROC_PER_NODE=2, MAX_RESTARTS=1, JOB_SECRET=SECRET,
                             FAIL_ONCE_DIR=tmp_path, ENTRYPOINT=str(ROOT / "tests/e2e/fail_once.py"))
    assert codes == [0, 0], output[-4000:]
    assert "FAILING rank=3" in output
    passed = sorted(int(r) for r in re.findall(r"PASSED rank=(\d+) world=4 sum=10", output))
    assert passed == [0, 1, 2, 3], output[-4000:]


ELASTIC = dict(MIN_NODES=1, MAX_NODES=3, MAX_RESTARTS=3, JOB_SECRET=SECRET)


def test_elastic_torchrun_behind_a_secret_goes_on_through_its_rounds_with_only_the_gate_open(jobs):
    """A node joins (round 2, world 3), then a worker is killed (round 3, world 2): each round's
    workers meet in a store of their own behind the master's Gate, so at every point the only
    port open on every interface is MASTER_PORT's, and the job trains to the end."""
    job = jobs.start(2, ["--steps", "400", "--step-delay", "0.05", "--checkpoint-every", "1000"], addrs=NODE_ADDRS,
                     **ELASTIC)
    master, worker = job
    wait_for_any(job, "step 40 loss", 180)
    assert census(job) == reachable_as_documented("MASTER_PORT", peer_links=2)
    jobs.add_node(job)
    wait_for(master, "world size 2 -> 3", 120)
    wait_for_any(job, "ROUND rank=0 world=3", 60)
    assert census(job) == reachable_as_documented("MASTER_PORT", peer_links=3)
    worker.kill_tree()
    wait_for(master, "world size 3 -> 2", 120)
    codes = [node.wait(240) for node in (master, job[2])]
    output = master.output + job[2].output
    assert codes == [0, 0], output[-4000:]
    assert [(a, b) for a, b, _ in changes(master.output)] == [(2, 3), (3, 2)], master.output[-3000:]
    found = results(output)
    assert sorted(r.rank for r in found) == [0, 1] and len({r.digest for r in found}) == 1, output[-3000:]
    assert SECRET not in output


# The launchers not trained behind a secret above (PyTorch with torchrun and with Horovod,
# fixed-size and elastic, are): TensorFlow's TF_CONFIG strategies, Keras through Horovod, and
# Keras through Horovod's elastic driver. MXNet's are in test_mxnet_host.py.
TRAINED_BEHIND_A_SECRET = {"tensorflow-native": dict(FRAMEWORK="tensorflow"),
                           "keras-horovod": dict(FRAMEWORK="keras", LAUNCHER="horovod"),
                           "keras-horovod-elastic": dict(FRAMEWORK="keras", LAUNCHER="horovod", MIN_NODES=2,
                                                         MAX_NODES=2)}
# TensorFlow's tasks each serve gRPC (every interface); elastic Horovod's ranks each a
# notification service, and its worker a link port (the master holds a link to it).
REACHABLE_BEHIND_A_SECRET = {"tensorflow-native": reachable_as_documented("MASTER_PORT", ranks_everywhere=2),
                             "keras-horovod": reachable_as_documented("MASTER_PORT", "HOROVOD_PORT"),
                             "keras-horovod-elastic": reachable_as_documented("MASTER_PORT", "HOROVOD_PORT",
                                                                              ranks_everywhere=2, peer_links=1)}


@pytest.mark.parametrize("path", TRAINED_BEHIND_A_SECRET)
def test_every_launcher_trains_behind_a_secret_and_opens_only_what_the_docs_list(jobs, path):
    job = jobs.start(2, ["--steps", "60", "--step-delay", "0.1"], JOB_SECRET=SECRET, addrs=NODE_ADDRS,
                     **TRAINED_BEHIND_A_SECRET[path])
    wait_for_any(job, "step 20 loss", 180)
    assert census(job) == REACHABLE_BEHIND_A_SECRET[path]
    codes = [node.wait(240) for node in job]
    output = "\n".join(node.output for node in job)
    assert codes == [0, 0], output[-4000:]
    check_trained(output, 2)
    assert f"serving the job store at {NODE_ADDRS[0]}:" in output and "(TLS, JOB_SECRET)" in output
    assert SECRET not in output


@pytest.mark.parametrize("secret", ["plain", "secret", "elastic-secret"])
def test_a_taken_horovod_port_ends_the_job_in_one_line_on_both_nodes(jobs, secret):
    """Something else holds HOROVOD_PORT on the master: the master says so in one line and
    ends the job (no traceback), and the worker gives the master's reason, not a lost store."""
    import socket

    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        extra = {"JOB_SECRET": SECRET} if "secret" in secret else {}
        if secret.startswith("elastic"):                  # elastic Horovod's driver serves it
            extra.update(MIN_NODES=2, MAX_NODES=2)
        master, worker = jobs.start(2, [], LAUNCHER="horovod", HOROVOD_PORT=port, **extra)
        codes = [master.wait(120), worker.wait(120)]
    line = f"cannot serve Horovod's rendezvous on HOROVOD_PORT={port}: Address already in use"
    # A fixed-size worker is still meeting the master (exit 3, a failed rendezvous); an
    # elastic one already waits for the driver's orders, and stops as a running node (exit 1).
    assert codes == [3, 1 if secret.startswith("elastic") else 3], master.output[-3000:] + worker.output[-3000:]
    assert line in master.output and "Traceback" not in master.output, master.output[-3000:]
    assert line in worker.output and "lost" not in worker.output, worker.output[-3000:]


def test_a_stranger_holding_hundreds_of_connections_keeps_no_node_out(jobs, tmp_path):
    """The master's process at 256 descriptors; a stranger (127.0.0.9) holds 400 silent
    connections and 100 half ClientHellos on MASTER_PORT, and another (.10) takes the
    certificate and leaves: a holder of the secret gets in within 2 s, the worker joins and the job trains,
    and the master says it in a few lines with the counts."""
    import socket
    import sys

    from entrypoint.security.secret import Identity
    from entrypoint.security.tunnel import handshake
    from tests.unit.test_secret import client_hello, reset

    python = tmp_path / "python-256-descriptors"
    python.write_text(f'#!/bin/sh\nif [ "$ROLE" = master ]; then ulimit -n 256; fi\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    job = jobs.start(2, STEPS, python=str(python), order=[0, 1], FRAMEWORK="pytorch", RUN_ID="guarded",
                     JOB_SECRET=SECRET)
    master, port = job[0], int(job[0].env["MASTER_PORT"])
    node = Identity.derive(SECRET.encode(), "guarded").client_context()
    deadline = time.monotonic() + 60
    while handshake("127.0.0.1", port, node, timeout=1).answer.value != "in":
        assert time.monotonic() < deadline and master.proc.poll() is None, master.output[-2000:]
        time.sleep(0.2)

    def stranger(send: bytes = b"", addr: str = "127.0.0.9") -> socket.socket | None:
        conn = socket.socket()
        conn.bind((addr, 0))
        try:
            conn.connect(("127.0.0.1", port))
            conn.sendall(send)
        except OSError:             # closed at once: the Gate keeps no more from this address
            conn.close()
            return None
        return conn

    hello = client_hello()
    held = [stranger() for _ in range(400)] + [stranger(hello[:len(hello) // 2]) for _ in range(100)]
    anonymous = stranger(hello, addr="127.0.0.10")        # from an address the Gate still waits for
    anonymous.settimeout(5)
    assert len(anonymous.recv(65536)) > 300
    reset(anonymous)
    started = time.monotonic()
    assert handshake("127.0.0.1", port, node, timeout=5).answer.value == "in"
    assert time.monotonic() - started < 2
    codes = [n.wait(120) for n in job]
    for conn in held:
        if conn is not None:
            conn.close()
    assert codes == [0, 0], master.output[-3000:]
    check_trained("\n".join(n.output for n in job), 2)
    said = [line for line in master.output.splitlines() if line.startswith("entrypoint: ")]
    assert len(said) < 50, "\n".join(said)
    refusals = [line for line in said if "127.0.0.9 " in line]
    assert any("already wait for their handshake" in line for line in refusals), said
    assert any("no TLS handshake within 5s" in line for line in refusals), said
    assert any("127.0.0.10 " in line and "left after taking the certificate" in line for line in said), said
    counted = sum(int(n) for line in refusals for n in re.findall(r"(?:and |refused )(\d+) more", line))
    assert counted + len(refusals) >= 400, said


PROBE_PATHS = {"torchrun": (2, dict(FRAMEWORK="pytorch")),
               "horovod": (2, dict(FRAMEWORK="pytorch", LAUNCHER="horovod")),
               "tensorflow": (2, dict(FRAMEWORK="tensorflow")),
               "mpi": (1, dict(FRAMEWORK="pytorch", LAUNCHER="mpi", NPROC_PER_NODE=2))}


@pytest.mark.parametrize("path", PROBE_PATHS)
def test_no_training_process_reads_the_secret(jobs, path):
    """Neither a rank's environment nor the entrypoint's /proc environ (which os.environ.pop
    leaves as it was) holds JOB_SECRET's value."""
    nodes, env = PROBE_PATHS[path]
    codes, output = jobs.run(nodes, [], RUN_ID="probed", JOB_SECRET=SECRET, PROBE_REVERSED=SECRET[::-1],
                             ENTRYPOINT=str(ROOT / "tests/e2e/secret_probe.py"), **env)
    assert codes == [0] * nodes, output[-3000:]
    probes = re.findall(r"PROBE rank=(\d+) found=(\S+)", output)
    assert sorted(rank for rank, _ in probes) == ["0", "1"] and {found for _, found in probes} == {"nothing"}, probes


def test_no_secret_in_a_program_after_the_image_or_a_rank_mpirun_started(tmp_path):
    """A program given after the image, and ranks an outer mpirun started (direct mode), get
    no JOB_SECRET; rank 0 says what the secret does not cover there."""
    import subprocess

    from testing.processes import child_env, entrypoint

    env = child_env(JOB_SECRET=SECRET, PROBE_REVERSED=SECRET[::-1], RUN_ID="probed")
    probe = str(ROOT / "tests/e2e/secret_probe.py")
    after = subprocess.run(entrypoint(sys_python(), probe), env=env, cwd=str(ROOT), capture_output=True,
                           text=True, timeout=120)
    assert after.returncode == 0 and "PROBE rank=0 found=nothing" in after.stdout, after.stdout + after.stderr
    direct = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "JOB_SECRET",
                             "-x", "PROBE_REVERSED", "-x", "RUN_ID", "-x", "ENTRYPOINT", "-x", "MASTER_ADDR",
                             *entrypoint()], env={**env, "ENTRYPOINT": probe, "MASTER_ADDR": "127.0.0.1"},
                            cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    output = direct.stdout + direct.stderr
    assert direct.returncode == 0, output[-3000:]
    assert sorted(re.findall(r"PROBE rank=(\d+) found=nothing", output)) == ["0", "1"], output[-3000:]
    assert output.count("JOB_SECRET unused: a rank that mpirun started") == 1, output[-3000:]


def sys_python() -> str:
    import sys
    return sys.executable


def test_an_oversized_length_to_a_ranks_notification_service_leaves_its_memory_flat(jobs):
    """Elastic Horovod's driver calls each rank's notification service, a port open on
    every interface that checks Horovod's HMAC only after reading the body whose length the
    peer announced. A stranger announces 2 GiB and sends 256 MiB: with patch 0009 the rank
    reads nothing past the length and closes; unpatched it would hold every byte sent."""
    import socket
    import struct

    short = ["--steps", "48", "--step-delay", "0.25"]      # the probe takes a second or two after step 20
    job = jobs.start(2, short, FRAMEWORK="pytorch", LAUNCHER="horovod", JOB_SECRET=SECRET, MIN_NODES=2, MAX_NODES=2,
                     addrs=NODE_ADDRS)
    wait_for_any(job, "step 20 loss", 120)
    services = [found for found in reachable(job) if found.node == 1 and not found.entrypoint and found.everywhere]
    assert len(services) == 1, reachable(job)
    rank = psutil.Process(services[0].pid)
    before, sent, chunk = rank.memory_info().rss, 0, bytes(2**20)
    with socket.create_connection(("127.0.0.1", services[0].port), timeout=10) as conn:
        try:
            conn.sendall(bytes(32) + struct.pack("i", 2**31 - 1))     # a digest, then the length
            while sent < 256 * 2**20:
                conn.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        time.sleep(1.0)
        grown = rank.memory_info().rss - before
    print(f"notification service: {sent / 2**20:.0f} MiB sent after a 2 GiB length, the rank's RSS "
          f"{grown / 2**20:+.1f} MiB")
    assert sent < 256 * 2**20, "the rank read all 256 MiB of a body it should have refused at its length"
    assert grown < 32 * 2**20, (sent, grown)
    codes = [node.wait(120) for node in job]
    assert codes == [0, 0], "\n".join(node.output for node in job)[-4000:]
