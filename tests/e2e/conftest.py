"""What the end-to-end tests share, as fixtures that own what they start (as
jupyter/docker-stacks' conftest does): the images under test, compose projects, and jobs
of entrypoint processes on loopback. Whatever a test starts is stopped and removed when it
ends, passed or failed.

    image        TEST_IMAGE (default distributed-training-framework:cpu), built if missing
    mxnet_image  MXNET_TEST_IMAGE (the cpu-mxnet variant); skips, saying how to build it, without
                 it or when it was built from other sources than this checkout's
    tpu_image    TPU_TEST_IMAGE (the tpu variant); likewise
    cuda_image   CUDA_TEST_IMAGE (default: the newest CUDA variant built here); likewise
    project      compose projects on compose/two-node.yml (+ overrides), removed (volumes too)
    jobs         nodes of jobs on this machine (cluster.Jobs): stopped, then killed, then waited for
    slurm        sbatch on a real two-node Slurm (tests/e2e/slurm.py): the jobs cancelled
"""

from __future__ import annotations

import os
import subprocess

import pytest

from buildsys.compat import parse_version
from buildsys.matrix import load_matrix
from entrypoint.contract.config import MXNET_VARIANT
from tests.conftest import ROOT
from testing.cluster import Jobs
from tests.e2e.docker_env import ComposeProject, ensure_image, staleness

MXNET_IMAGE = os.environ.get("MXNET_TEST_IMAGE", f"distributed-training-framework:{MXNET_VARIANT}")
TPU_IMAGE = os.environ.get("TPU_TEST_IMAGE", "distributed-training-framework:tpu")
CUDA_IMAGE = os.environ.get("CUDA_TEST_IMAGE")


def built_or_skip(image: str, how: str, variant_name: str | None = None) -> str:
    """The image, if this checkout built it (of `variant_name`); else the test skips,
    saying why and how."""
    why = staleness(image, variant_name)
    if why:
        pytest.skip(f"{why} ({how})")
    return image


@pytest.fixture(scope="session")
def image() -> str:
    """The image under test, by reference."""
    return ensure_image()


@pytest.fixture(scope="session")
def mxnet_image() -> str:
    return built_or_skip(MXNET_IMAGE, f"python build.py build {MXNET_VARIANT}; MXNET_TEST_IMAGE names another",
                         MXNET_VARIANT)


@pytest.fixture(scope="session")
def tpu_image() -> str:
    return built_or_skip(TPU_IMAGE, "python build.py build tpu (make test-tpu), or set TPU_TEST_IMAGE", "tpu")


@pytest.fixture(scope="session")
def cuda_image() -> str:
    """A CUDA variant's image, on this machine's CPU: CUDA_TEST_IMAGE, else the newest CUDA
    variant of the matrix that is built here. CI builds none (15-25 minutes each)."""
    if CUDA_IMAGE:
        return built_or_skip(CUDA_IMAGE, f"CUDA_TEST_IMAGE={CUDA_IMAGE}")
    matrix = load_matrix(ROOT / "matrix.yaml")
    cuda = sorted((v for v in matrix.variants.values() if v.cuda), key=lambda v: parse_version(v.cuda.version))
    for variant in reversed(cuda):
        name = f"{matrix.repository}:{variant.name}"
        if staleness(name, variant.name) is None:
            return name
    pytest.skip(f"no CUDA image built from this checkout is here (python build.py build {cuda[-1].name}, "
                f"or set CUDA_TEST_IMAGE)")


@pytest.fixture
def project():
    """Make compose projects: `project(*overrides, **env)`; every one is taken down afterwards."""
    made: list[ComposeProject] = []

    def make(*overrides: str, **env) -> ComposeProject:
        p = ComposeProject(*overrides, **env)
        made.append(p)
        return p

    yield make
    for p in made:
        p.down()


@pytest.fixture
def jobs(tmp_path):
    """Start jobs on loopback: `jobs.start(nodes, args, **env)`, `jobs.run(...)`, `jobs.add_node(job)`."""
    tracked = Jobs(tmp_path)
    yield tracked
    tracked.close()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The two-node Slurm: .ci/run's (SLURM_CONF), else one started here for the session."""
    from tests.e2e import slurm

    conf = os.environ.get("SLURM_CONF")
    if conf and slurm.responds(conf):
        yield conf
        return
    why = slurm.missing()
    if why:
        pytest.skip(f"no Slurm: {why}")
    folder = tmp_path_factory.mktemp("slurm")
    script = str(ROOT / "scripts" / "slurm-two-nodes.sh")
    subprocess.run([script, "start", str(folder)], check=True, capture_output=True, text=True, timeout=120)
    try:
        yield str(folder / "slurm.conf")
    finally:
        subprocess.run([script, "stop", str(folder)], check=False, timeout=60)


@pytest.fixture
def slurm(slurm_cluster):
    """Submit jobs to the two-node Slurm; every job a test submitted is cancelled when it ends."""
    from tests.e2e.slurm import Cluster

    cluster = Cluster(slurm_cluster)
    yield cluster
    cluster.cancel_all()
