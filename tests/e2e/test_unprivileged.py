"""The image under an unprivileged HPC container runtime: Charliecloud's `ch-run` (Debian's
charliecloud-runtime) runs the image's files read-only, as the calling user, with no daemon
and no root, as Apptainer and enroot do on clusters.

The image is unpacked once with `docker export` and its environment file written from the
image's config: what `ch-convert -i docker IMAGE DIR` does, without the gzip round trip
that makes ch-convert take four minutes here instead of thirty seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from testing.results import results
from tests.e2e.docker_env import docker

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

UID = 12345                             # no account of that number: the runtime must not need one


@pytest.fixture(scope="session")
def shared_dir():
    """A folder uid 12345 can reach (pytest's own are root's alone), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="dtftest-unprivileged-", dir="/var/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def image_dir(image, shared_dir) -> Path:
    if shutil.which("ch-run") is None:
        pytest.skip("ch-run not installed (apt-get install charliecloud-runtime)")
    if os.geteuid() != 0:
        pytest.skip("running as another uid needs root here (setpriv)")
    folder = shared_dir / "image"
    folder.mkdir()
    container = docker("create", image).stdout.strip()
    try:
        export = subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(folder)], stdin=export.stdout, check=True, timeout=600)
        assert export.wait(timeout=60) == 0
    finally:
        docker("rm", container, check=False)
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    (folder / "ch").mkdir(exist_ok=True)
    (folder / "ch" / "environment").write_text("".join(f"{line}\n" for line in config["Env"]))
    return folder


def ch_run(image_dir: Path, *binds: str, **env) -> subprocess.CompletedProcess:
    """`ch-run` as uid 12345 (not root, no account), the image's environment, these binds."""
    cmd = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
           "env", "-i", f"USER=u{UID}", "PATH=/usr/bin:/bin", *(f"{k}={v}" for k, v in env.items()),
           "ch-run", "--set-env", "--cd", "/app/code", "-b", f"{ROOT / 'examples'}:/app/code",
           *(arg for bind in binds for arg in ("-b", bind)), str(image_dir), "--",
           "python3", "-m", "entrypoint.main", "--steps", "20"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_charliecloud_runs_the_image_read_only_as_an_unprivileged_user(image_dir, shared_dir):
    refused = ch_run(image_dir, NPROC_PER_NODE=2)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout[-2000:] + refused.stderr[-2000:]
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"entrypoint: CHECKPOINT_DIR='/app/checkpoints': not writable by uid {UID} "), line

    checkpoints = shared_dir / "checkpoints"
    checkpoints.mkdir()
    os.chown(checkpoints, UID, UID)
    trained = ch_run(image_dir, f"{checkpoints}:/app/checkpoints", NPROC_PER_NODE=2)
    output = trained.stdout + trained.stderr
    assert trained.returncode == 0, output[-3000:]
    assert f"is not writable by uid {UID}: HOME=" in output or "HOME is not set: HOME=" in output, output[:2000]
    found = results(output)
    assert len(found) == 2 and len({r.digest for r in found}) == 1, output[-3000:]
    saved = [p for p in checkpoints.iterdir() if p.name.startswith("ckpt-")]
    assert saved and all(p.stat().st_uid == UID for p in saved)       # written as the caller, not root
