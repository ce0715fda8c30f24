"""Multi-node training in real containers: docker run, compose two-node, and faults.

The image is the one build.py built (TEST_IMAGE); the code is this repository's
examples/, mounted at /app/code exactly as a user mounts theirs.
"""

from __future__ import annotations

import os
import time

import pytest
from testcontainers.core.container import DockerContainer

from tests.conftest import ROOT
from tests.e2e.cluster import results
from tests.e2e.docker_env import ComposeProject, ensure_image

pytestmark = [pytest.mark.docker, pytest.mark.e2e]


@pytest.fixture(scope="module")
def image():
    return ensure_image()


@pytest.fixture
def project():
    """The tracked compose project: whatever a test starts is removed afterwards."""
    projects = []

    def make(**env) -> ComposeProject:
        p = ComposeProject(**env)
        projects.append(p)
        return p

    yield make
    for p in projects:
        p.down()


def assert_replicas_agree(output: str, world: int) -> None:
    found = results(output)
    assert sorted(r.rank for r in found) == list(range(world)), output[-4000:]
    assert len({r.digest for r in found}) == 1, [(r.rank, r.digest) for r in found]
    assert all(r.after < 0.5 * r.before for r in found), found


def test_docker_run_local_two_processes_writes_one_checkpoint(image, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    os.chmod(checkpoints, 0o777)                      # the image runs as uid 1000
    container = (DockerContainer(image)
                 .with_env("FRAMEWORK", "pytorch").with_env("TRAIN_MODE", "local").with_env("NPROC_PER_NODE", "2")
                 .with_volume_mapping(str(ROOT / "examples"), "/app/code", "ro")
                 .with_volume_mapping(str(checkpoints), "/app/checkpoints", "rw")
                 .with_command("--steps 40 --checkpoint-every 1000"))
    container.start()
    try:
        wrapped = container.get_wrapped_container()
        status = wrapped.wait(timeout=300)
        output = wrapped.logs().decode()
    finally:
        container.stop()
    assert status["StatusCode"] == 0, output[-3000:]
    assert_replicas_agree(output, 2)
    assert [p.name for p in checkpoints.iterdir()] == ["ckpt-00000040.pt"]      # rank 0 only, once


PATHS = [("pytorch", "native"), ("pytorch", "horovod"), ("tensorflow", "native"), ("keras", "horovod")]


@pytest.mark.parametrize("framework, launcher", PATHS, ids=[f"{f}-{l}" for f, l in PATHS])
def test_compose_two_nodes_train_agree_and_resume(image, project, framework, launcher):
    job = project(FRAMEWORK=framework, LAUNCHER=launcher, TRAIN_ARGS="--steps 40")
    run = job.compose("up", "--abort-on-container-exit", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert set(job.exit_codes().values()) == {0}, job.exit_codes()
    assert_replicas_agree(job.logs(), 2)

    again = job.compose("up", "--abort-on-container-exit", timeout=600, TRAIN_ARGS="--steps 60")
    assert again.returncode == 0, again.stdout[-3000:]
    output = job.logs()
    assert set(job.exit_codes().values()) == {0}
    resumed = [line for line in output.splitlines() if "RESUMED" in line and "step=40" in line]
    assert resumed, output[-3000:]
    second = results(output)[-2:]
    assert len({r.digest for r in second}) == 1


def test_scale_workers_with_ranks_from_rendezvous(image, project):
    job = project(LAUNCHER="horovod", NUM_NODES=3, TRAIN_ARGS="--steps 30")
    run = job.compose("up", "--scale", "worker=2", "--abort-on-container-exit", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert set(job.exit_codes().values()) == {0} and len(job.exit_codes()) == 3
    assert_replicas_agree(job.logs(), 3)


def test_killed_worker_container_fails_the_master_within_60s(image, project):
    job = project(TRAIN_ARGS="--steps 100000 --step-delay 0.02 --checkpoint-every 1000000")
    job.compose("up", "-d", check=True)
    job.wait_for_log("TRAINING", 180, service="master")
    time.sleep(3)
    killed = time.monotonic()
    job.compose("kill", "worker", check=True)
    job.wait_exited(90)
    elapsed = time.monotonic() - killed
    codes = job.exit_codes()
    master = next(code for name, code in codes.items() if "master" in name)
    assert master != 0 and elapsed < 60, (elapsed, codes, job.logs()[-3000:])


def test_compose_stop_stops_both_cleanly_within_the_grace_period(image, project):
    job = project(TRAIN_ARGS="--steps 100000 --step-delay 0.02 --checkpoint-every 1000000")
    job.compose("up", "-d", check=True)
    job.wait_for_log("TRAINING", 180, service="worker")
    started = time.monotonic()
    job.compose("stop", check=True, timeout=120)
    elapsed = time.monotonic() - started
    codes = job.exit_codes()
    assert elapsed < 20, elapsed                          # stop_grace_period: no SIGKILL needed
    assert set(codes.values()) <= {143}, (codes, job.logs()[-3000:])
    assert "SIGTERM received" in job.logs()


def test_worker_started_20s_before_the_master_still_joins(image, project):
    job = project(TRAIN_ARGS="--steps 30")
    job.compose("up", "-d", "--no-deps", "worker", check=True)
    time.sleep(20)
    job.compose("up", "-d", "master", check=True)
    job.wait_exited(300)
    assert set(job.exit_codes().values()) == {0}, (job.exit_codes(), job.logs()[-3000:])
    assert_replicas_agree(job.logs(), 2)
