"""The cpu-mxnet image: its smoke tests, and two containers training with MXNet's
parameter servers and with Horovod (compose/two-node.yml). The cpu image refuses
FRAMEWORK=mxnet in one line that names the variant which has it.

MXNET_TEST_IMAGE (default distributed-training-framework:cpu-mxnet) must have been built
(`python build.py build cpu-mxnet`, or `make test-mxnet`, which also runs them); without
it these tests are skipped, saying so.
"""

from __future__ import annotations

import subprocess

import pytest

from buildsys import smoke
from buildsys.matrix import load_matrix
from entrypoint.contract.config import MXNET_VARIANT
from tests.conftest import ROOT
from testing.results import results

pytestmark = [pytest.mark.docker, pytest.mark.e2e]


def test_smoke_tests_pass(mxnet_image):
    variant = load_matrix(ROOT / "matrix.yaml").variants[MXNET_VARIANT]
    checks = smoke.run_smoke_tests(mxnet_image, variant)
    failed = [f"{r.name}: {r.detail}" for r in checks if not r.ok]
    assert not failed, failed
    names = {r.name for r in checks}
    assert "horovod mxnet allreduce (gloo, 2 processes)" in names
    assert any(name.startswith("mxnet kvstore dist_sync") for name in names)


@pytest.mark.parametrize("launcher", ["native", "horovod"])
def test_compose_two_nodes_train_and_agree(mxnet_image, project, launcher):
    job = project(IMAGE=mxnet_image, FRAMEWORK="mxnet", LAUNCHER=launcher, TRAIN_ARGS="--steps 40")
    run = job.compose("up", "--abort-on-container-exit", timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert set(job.exit_codes().values()) == {0}, job.exit_codes()
    found = results(job.logs())
    assert sorted(r.rank for r in found) == [0, 1], job.logs()[-3000:]
    assert len({r.digest for r in found}) == 1 and all(r.after < 0.5 * r.before for r in found), found


def test_an_image_without_mxnet_names_the_variant_that_has_it(image):
    if MXNET_VARIANT in image.rsplit(":", 1)[-1]:
        pytest.skip(f"TEST_IMAGE {image} is the MXNet variant")
    run = subprocess.run(["docker", "run", "--rm", "-e", "FRAMEWORK=mxnet", image], capture_output=True,
                         text=True, timeout=120)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stdout + run.stderr
    assert lines[0].startswith("entrypoint: FRAMEWORK='mxnet': ") and f"the {MXNET_VARIANT} variant" in lines[0]
