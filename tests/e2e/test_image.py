"""The built image: smoke tests as its runtime user, labels, manifest, and no build-time
secrets or local wheels left in any layer."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import tarfile
from dataclasses import dataclass

import docker
import pytest

from buildsys import render, smoke
from buildsys.matrix import load_matrix
from tests.conftest import ROOT
from tests.e2e.docker_env import IMAGE, VARIANT, staleness

pytestmark = [pytest.mark.docker, pytest.mark.e2e]
MATRIX = load_matrix(ROOT / "matrix.yaml")


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


def test_smoke_tests_pass_as_the_runtime_user(image, layer_scan):
    results = smoke.run_smoke_tests(image, MATRIX.variants[VARIANT], shared_objects=layer_scan.shared_objects)
    failed = [f"{r.name}: {r.detail}" for r in results if not r.ok]
    assert not failed, failed
    assert any(r.name == "horovodrun --check-build" for r in results)
    assert any(r.name.startswith("each shared library once") for r in results)


@pytest.mark.parametrize("name", list(MATRIX.variants))
def test_each_shared_library_once_in_every_built_variant(name):
    """Every variant whose image is on this engine (TEST_IMAGE's repository, the variant's
    tag) that this checkout built: each soname stored once across all of its layers. CI
    builds cpu only."""
    ref = f"{IMAGE.rpartition(':')[0]}:{name}"
    if name == VARIANT:
        pytest.skip(f"{ref}: checked by its smoke tests (test_smoke_tests_pass_as_the_runtime_user)")
    why = staleness(ref, name)
    if why:
        pytest.skip(why)
    ok, detail = smoke.check_duplicates(smoke.SmokeRunner(ref).shared_objects())
    assert ok, detail


def built_variant():
    """The matrix's variant as this build made it: BUILD_WITHOUT leaves companions out."""
    return MATRIX.variants[VARIANT].leaving_out(x for x in os.environ.get("BUILD_WITHOUT", "").split(",") if x)


def test_tf_keras_is_tf_keras_in_every_process_whatever_framework_says(image):
    """One Keras: a command after the image, under the default FRAMEWORK=pytorch, gets
    tf-keras as tf.keras (Horovod's own TensorFlow suites need it); the user's value wins."""
    if MATRIX.variants[VARIANT].keras() != "tf-keras":
        pytest.skip(f"{VARIANT} carries no tf-keras")
    probe = "import tensorflow as tf; print(tf.keras.__name__)"

    def keras(*env: str) -> str:
        done = subprocess.run(["docker", "run", "--rm", *env, image, "python", "-c", probe],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    assert keras().startswith("tf_keras")
    assert keras("-e", "FRAMEWORK=pytorch").startswith("tf_keras")
    assert not keras("-e", "TF_USE_LEGACY_KERAS=0").startswith("tf_keras")


def test_labels_and_manifest_match_the_matrix(image):
    built = docker.from_env().images.get(image)
    v = built_variant()
    labels = built.labels
    for key, value in render.labels(v):
        assert labels.get(key) == value, key
    assert re.match(r"\d{4}-\d\d-\d\dT", labels["org.opencontainers.image.created"])
    out = docker.from_env().containers.run(image, entrypoint=["cat", "/etc/disttrain/manifest.json"], remove=True)
    assert json.loads(out) == render.manifest(v)
    assert built.attrs["Config"]["User"] == "1000:1000"
    assert built.attrs["Config"]["Entrypoint"][:3] == ["tini", "-g", "--"]


def ca_markers() -> list[bytes]:
    """One full base64 line from each certificate in BUILD_CA_CERT (empty if none was used)."""
    path = os.environ.get("BUILD_CA_CERT")
    if not path:
        return []
    markers = []
    for block in open(path, "rb").read().split(b"-----END CERTIFICATE-----"):
        lines = [line for line in block.splitlines() if line and not line.startswith(b"-----")]
        if lines:
            markers.append(max(lines, key=len))
    return markers


@dataclass
class LayerScan:
    """What one pass over every file of every layer found."""
    paths: list[tuple[str, str]]                 # (layer, path) of every regular file
    hits: list[tuple[str, str]]                  # files whose bytes hold a build CA marker
    markers: list[bytes]
    shared_objects: list[smoke.SharedObject]     # for the smoke tests' duplicate check


@pytest.fixture(scope="module")
def layer_scan(image) -> LayerScan:
    """One `docker save` pass (a minute for the cpu image) for every check of the layers."""
    scan = LayerScan([], [], ca_markers(), [])
    for layer, path, content in layer_files(image):
        scan.paths.append((layer, path))
        scan.hits += [(layer, path) for m in scan.markers if m in content]
        if smoke.SHARED_OBJECT_RE.search(path) and (soname := smoke.elf_soname(content)):
            scan.shared_objects.append(smoke.SharedObject(layer, path, soname, len(content)))
    return scan


def test_no_build_ca_certificate_in_any_layer(image, layer_scan):
    paths, hits, markers = layer_scan.paths, layer_scan.hits, layer_scan.markers
    if not markers:
        pytest.skip("the image was built without --ca-cert (BUILD_CA_CERT): nothing to look for")
    assert len(paths) > 1000                          # the scan really read the layers
    assert not hits, f"the build CA is in the image: {hits}"
    history = subprocess.run(["docker", "history", "--no-trunc", image], capture_output=True, text=True).stdout
    assert not any(m.decode() in history for m in markers)
    assert "ca_cert" not in json.dumps(docker.from_env().images.get(image).attrs["Config"]["Env"])


def test_no_local_wheel_and_no_compiler_in_any_layer(image, layer_scan):
    paths = layer_scan.paths
    wheelhouse = os.environ.get("BUILD_WHEELHOUSE")
    local = set(os.listdir(wheelhouse)) if wheelhouse and os.path.isdir(wheelhouse) else set()
    names = [p.rsplit("/", 1)[-1] for _, p in paths if p.endswith(".whl")]
    # Debian's ensurepip wheels (/usr/share/python-wheels) belong to python3-venv; the
    # local wheelhouse and the builder's own wheels must not be there.
    leaked = [n for n in names if n in local or n.startswith(("horovod-", "mpi4py-", "torch-"))]
    assert not leaked, f"build-time wheels left in the image: {leaked}"
    compilers = [p for _, p in paths if p.rsplit("/", 1)[-1] in ("gcc", "g++", "cc1plus", "nvcc")]
    assert not compilers, compilers


def documented_derived_image() -> str:
    """docs/images.md's Dockerfile under "Add your own dependencies"."""
    page = (ROOT / "docs" / "images.md").read_text()
    return re.search(r"## Add your own dependencies\n.*?```dockerfile\n(.*?)```", page, re.S).group(1)


def test_the_documented_derived_image_adds_a_package_and_keeps_the_frameworks(image, tmp_path):
    """The page's Dockerfile as written (FROM the image under test), einops from PyPI, the
    build farm's CA (BUILD_CA_CERT) as its secret: the package imports as uid 1000, torch is
    the base image's, /tmp holds what the base's does; `disttrain-pip` as uid 1000 says what to do in one line."""
    from buildsys.docker_build import build_env, find_docker_cli

    dockerfile = documented_derived_image()
    assert dockerfile.startswith("FROM distributed-training-framework:cpu\n"), dockerfile
    (tmp_path / "Dockerfile").write_text(dockerfile.replace("distributed-training-framework:cpu", image, 1))
    (tmp_path / "requirements.txt").write_text("einops\n")
    cli = find_docker_cli()
    tag = f"disttrain-derived-test:{os.getpid()}"
    cmd = [cli.path, *(["buildx", "build", "--load"] if cli.buildx else ["build"]), "-t", tag, str(tmp_path)]
    if os.environ.get("BUILD_CA_CERT"):
        cmd[-1:-1] = ["--secret", f"id=ca_cert,src={os.path.abspath(os.environ['BUILD_CA_CERT'])}"]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=build_env(cli))
    try:
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        probe = ("import einops, os, torch; "
                 "print(os.getuid(), torch.__version__, sorted(os.listdir('/tmp')), einops.__name__)")
        ran = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python3", tag, "-c", probe],
                             capture_output=True, text=True, timeout=120)
        base = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python3", image, "-c",
                               "import os, torch; print(torch.__version__, sorted(os.listdir('/tmp')))"],
                              capture_output=True, text=True, timeout=120)
        assert ran.stdout.strip() == f"1000 {base.stdout.strip()} einops", ran.stdout + ran.stderr
        refused = subprocess.run(["docker", "run", "--rm", "--entrypoint", "disttrain-pip", tag, "install", "einops"],
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and refused.stderr.strip().startswith(
            "disttrain-pip: /opt/venv belongs to root, not uid 1000: put USER root before this RUN"), refused.stderr
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_memory_allocator_tcmalloc_reaches_a_program_after_the_image(image):
    """MEMORY_ALLOCATOR=tcmalloc: the process gets tcmalloc mapped (the plan's LD_PRELOAD);
    by default, and for a value the image does not carry, the C library's malloc."""
    probe = "print('tcmalloc' if any('libtcmalloc' in l for l in open('/proc/self/maps')) else 'glibc')"

    def allocator(*env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "run", "--rm", *env, image, "python", "-c", probe], capture_output=True,
                              text=True, timeout=300)

    assert allocator().stdout.strip() == "glibc"
    assert allocator("-e", "MEMORY_ALLOCATOR=tcmalloc").stdout.strip() == "tcmalloc"
    refused = allocator("-e", "MEMORY_ALLOCATOR=jemalloc")
    assert refused.returncode == 2 and refused.stderr.strip() == \
        "entrypoint: MEMORY_ALLOCATOR='jemalloc': allowed: system, tcmalloc", refused.stderr
