"""The built image: smoke tests as its runtime user, labels, manifest, and no build-time
secrets or local wheels left in any layer."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile

import docker
import pytest

from buildsys import render, smoke
from buildsys.matrix import load_matrix
from tests.conftest import ROOT
from tests.e2e.docker_env import IMAGE, VARIANT, ensure_image

pytestmark = [pytest.mark.docker, pytest.mark.e2e]
MATRIX = load_matrix(ROOT / "matrix.yaml")


@pytest.fixture(scope="module")
def image():
    ensure_image()
    return docker.from_env().images.get(IMAGE)


def layer_files(image_ref: str):
    """(layer, path, bytes) for every regular file in every layer of the image."""
    proc = subprocess.Popen(["docker", "save", image_ref], stdout=subprocess.PIPE)
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for member in outer:
            if not member.name.endswith("layer.tar") and not member.name.startswith("blobs/"):
                continue
            data = outer.extractfile(member)
            if data is None:
                continue
            try:
                inner = tarfile.open(fileobj=io.BytesIO(data.read()), mode="r:*")
            except tarfile.ReadError:
                continue                   # config or manifest blobs
            for f in inner:
                if f.isfile():
                    yield member.name, f.name, inner.extractfile(f).read()
    proc.wait()


def test_smoke_tests_pass_as_the_runtime_user(image):
    results = smoke.run_smoke_tests(IMAGE, MATRIX.variants[VARIANT])
    failed = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert not failed, failed
    assert any(r.name == "horovodrun --check-build" for r in results)


def test_labels_and_manifest_match_the_matrix(image):
    v = MATRIX.variants[VARIANT]
    labels = image.labels
    for key, value in render.labels(v):
        assert labels.get(key) == value, key
    assert re.match(r"\d{4}-\d\d-\d\dT", labels["org.opencontainers.image.created"])
    out = docker.from_env().containers.run(IMAGE, entrypoint=["cat", "/etc/disttrain/manifest.json"], remove=True)
    assert json.loads(out) == render.manifest(v)
    assert image.attrs["Config"]["User"] == "1000:1000"
    assert image.attrs["Config"]["Entrypoint"][:3] == ["tini", "-g", "--"]


def test_no_ca_certificate_or_local_wheel_in_any_layer(image):
    ca_path = os.environ.get("BUILD_CA_CERT")
    assert ca_path, "set BUILD_CA_CERT to the CA file the image was built with"
    pem = open(ca_path, "rb").read()
    body = [line for line in pem.splitlines() if line and not line.startswith(b"-----")]
    marker = max(body, key=len)                       # one full base64 line of the certificate
    wheels = [w.encode() for w in os.listdir(os.environ.get("BUILD_WHEELHOUSE", "/nonexistent"))] \
        if os.path.isdir(os.environ.get("BUILD_WHEELHOUSE", "/nonexistent")) else []
    found_ca, found_wheels, files = [], [], 0
    for layer, path, content in layer_files(IMAGE):
        files += 1
        if marker in content:
            found_ca.append((layer, path))
        if any(w in path.encode() for w in wheels) and path.endswith(".whl"):
            found_wheels.append((layer, path))
    assert files > 1000                               # the scan really read the layers
    assert not found_ca, f"the build CA is in the image: {found_ca}"
    assert not found_wheels, f"local wheels are in the image: {found_wheels}"
    history = subprocess.run(["docker", "history", "--no-trunc", IMAGE], capture_output=True, text=True).stdout
    assert marker.decode() not in history and "ca_cert" not in json.dumps(image.attrs["Config"]["Env"])
