"""A job whose nodes meet on etcd (JOB_STORE), through the entrypoint: three nodes on
loopback, none of them a master, the bundled elastic example. Losing the node that runs
global rank 0 leaves a job that goes on with the other two, from the step it reached;
bad store addresses are one line, exit 2, before anything starts."""

import http.server
import re
import threading
import time
import uuid

import pytest

from testing.cluster import Node, base_env, wait_for_any
from testing.etcd import EtcdCluster, etcd_binary
from testing.ports import free_port
from testing.processes import ROOT, entrypoint, run
from testing.results import results

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(etcd_binary() is None, reason="no etcd: apt-get install etcd-server")]

LONG = ["--steps", "300", "--step-delay", "0.05", "--checkpoint-every", "1000"]


@pytest.fixture
def etcd(tmp_path):
    with EtcdCluster(tmp_path / "etcd") as cluster:
        yield cluster


def store_url(etcd: EtcdCluster) -> str:
    return "etcd://" + ",".join(e.split("://")[1] for e in etcd.endpoints)


def peers(jobs, tmp_path, etcd, count: int, **env) -> list[Node]:
    """`count` nodes of one job on etcd, each alike: no ROLE, no MASTER_ADDR, no NODE_RANK."""
    settings = dict(ENTRYPOINT=str(ROOT / "examples" / "pytorch_elastic.py"), JOB_STORE=store_url(etcd),
                    RUN_ID=f"job-{uuid.uuid4().hex[:8]}", MIN_NODES="2", MAX_NODES="3", MAX_RESTARTS="3")
    node_env = {k: v for k, v in base_env(tmp_path, **{**settings, **env}).items() if v != ""}
    return [jobs.track(Node(node_env, LONG, tmp_path / f"node{k}.log")) for k in range(count)]


@pytest.mark.parametrize("lost", ["global rank 0", "a worker"])
def test_a_job_on_etcd_goes_on_without_any_one_node(jobs, tmp_path, etcd, lost):
    """The node that runs global rank 0 (which serves the round's workers' store), or another."""
    job = peers(jobs, tmp_path, etcd, 3)
    wait_for_any(job, "step 40 loss", 180)
    [first] = [n for n in job if "step 40 loss" in n.output]      # rank 0 prints its steps
    killed = first if lost == "global rank 0" else next(n for n in job if n is not first)
    killed.kill_tree()
    survivors = [n for n in job if n is not killed]
    assert [n.wait(240) for n in survivors] == [0, 0], "\n".join(n.output[-3000:] for n in survivors)
    output = "\n".join(n.output for n in survivors)
    [resumed] = re.findall(r"ELASTIC first step at world size 2 \(resumed from step (\d+)\)", output)
    assert int(resumed) >= 40
    found = results(output)
    assert sorted(r.rank for r in found) == [0, 1] and all(r.world == 2 for r in found)
    assert len(re.findall(r"rendezvous: 2 node\(s\), this one has group rank \d \(was 3: a node left or was lost\)",
                          output)) == 2                  # the loss, one line on each survivor
    assert "master" not in output.lower(), output[-3000:]


class NotEtcd(http.server.BaseHTTPRequestHandler):
    """Some other HTTP server where JOB_STORE points: 404 for every path."""

    def do_POST(self):
        self.send_error(404)

    def log_message(self, *args):
        pass


@pytest.fixture
def not_etcd():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotEtcd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def start_one(tmp_path, store: str) -> tuple[int, str, float]:
    env = base_env(tmp_path, ENTRYPOINT=str(ROOT / "examples" / "pytorch_elastic.py"), JOB_STORE=store,
                   MIN_NODES="1", MAX_NODES="2", MAX_RESTARTS="1", RDZV_TIMEOUT="2")
    return run(entrypoint(), env, timeout=60)


def test_a_store_that_is_not_there_or_not_etcd_v3_is_one_line_and_exit_2(tmp_path, not_etcd):
    closed = f"127.0.0.1:{free_port()}"
    for store, why in ((f"etcd://{closed}", f"no job store at JOB_STORE=etcd://{closed} after RDZV_TIMEOUT=2s"),
                       (f"etcd://{not_etcd}", "answers HTTP 404: not etcd's v3 API")):
        t0 = time.monotonic()
        code, output, _ = start_one(tmp_path, store)
        errors = [line for line in output.splitlines() if why in line]
        assert code == 2 and len(errors) == 1, output
        assert "starting" not in output and time.monotonic() - t0 < 30, output


def test_losing_etcds_quorum_stops_every_node_in_one_line_and_the_job_resumes_once_it_is_back(jobs, tmp_path, etcd):
    job = peers(jobs, tmp_path, etcd, 2, PEER_TIMEOUT="3")
    wait_for_any(job, "step 40 loss", 180)
    down = [name for name in list(etcd.procs)[:2]]
    for name in down:                                 # two of three: no quorum
        etcd.stop(name)
    codes = [n.wait(90) for n in job]
    output = "\n".join(n.output for n in job)
    assert all(code != 0 for code in codes), output[-3000:]
    lost = re.findall(r"lost the rendezvous store: etcd://\S+ did not answer for \d+s", output)
    assert len(lost) == 2, output[-4000:]             # one line on each node
    for name in down:
        etcd.start(name)
    again = [jobs.track(Node(n.env, LONG, tmp_path / f"again{k}.log")) for k, n in enumerate(job)]
    assert [n.wait(240) for n in again] == [0, 0], "\n".join(n.output[-3000:] for n in again)
    [resumed] = re.findall(r"ELASTIC first step at world size 2 \(resumed from step (\d+)\)",
                           "\n".join(n.output for n in again))
    assert int(resumed) >= 40                         # from the checkpoint the stopped job left


def test_a_fixed_size_job_meets_on_etcd_over_tls_with_client_certificates(jobs, tmp_path):
    """etcd with --client-cert-auth (testing/etcd.py's CA and certificates): two nodes with
    JOB_STORE_CA/_CERT/_KEY train to the end; a node without a client certificate is one
    line and exit 2 at once."""
    with EtcdCluster(tmp_path / "etcd-tls", members=1, tls=True) as etcd:
        c = etcd.certificates
        tls = dict(JOB_STORE_CA=str(c["ca"]), JOB_STORE_CERT=str(c["client_cert"]), JOB_STORE_KEY=str(c["client_key"]))
        job = peers(jobs, tmp_path, etcd, 2, MIN_NODES="", MAX_NODES="", MAX_RESTARTS="0", NUM_NODES="2",
                    ENTRYPOINT=str(ROOT / "examples" / "pytorch_ddp.py"), **tls)
        assert [n.wait(180) for n in job] == [0, 0], "\n".join(n.output[-3000:] for n in job)
        found = results("\n".join(n.output for n in job))
        assert sorted(r.rank for r in found) == [0, 1] and len({r.digest for r in found}) == 1
        assert "WARNING: anyone who reaches" not in job[0].output
        code, output, took = run(entrypoint(), {**job[0].env, "JOB_STORE_CERT": "", "JOB_STORE_KEY": ""}, timeout=60)
        assert code == 2 and took < 20, output
        assert len([line for line in output.splitlines() if "TLS with https://127.0.0.1:" in line]) == 1, output
