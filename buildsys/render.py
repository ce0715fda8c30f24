"""Variant -> build context (Dockerfile, manifest, requirements, scripts, code). Pure.

`render_context` returns the files as data; `write_context` puts them on disk. The same
variant and repository always give the same bytes, so a re-render changes nothing and
Docker's layer cache keys stay stable.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import jinja2

from . import compat
from .matrix import Variant



def project_root() -> Path:
    """The checkout the build works on (matrix.yaml, images/, the code the images carry):
    the one this package lives in (a clone, or `pip install -e .`), else the current
    folder (after a plain `pip install .`)."""
    here = Path(__file__).resolve().parent.parent
    for root in (here, Path.cwd()):
        if (root / "images" / "Dockerfile.j2").is_file():
            return root
    return here


REPO_ROOT = project_root()
LABEL_PREFIX = "io.disttrain"
# What an image was built from: the digest of its rendered context (`context_digest`), a
# per-build label. An image whose digest differs from this checkout's render is stale.
CONTEXT_LABEL = f"{LABEL_PREFIX}.context"
PROJECT_VERSION = (REPO_ROOT / "VERSION").read_text().strip() if (REPO_ROOT / "VERSION").is_file() else "0+unknown"

# Code copied into the image under /opt/disttrain (entrypoint, in-image API, examples).
APP_DIRS = ("entrypoint", "disttrain", "examples")
APP_SUFFIXES = (".py",)


@dataclass(frozen=True)
class File:
    path: str          # relative to the context root, '/'-separated
    content: bytes
    executable: bool = False


def component_versions(v: Variant) -> dict[str, str]:
    """Every component version the image promises, by name (labels and manifest)."""
    versions = {"python": v.python, "debian": v.distro}
    if v.pytorch:
        versions["torch"] = v.pytorch.version
        versions.update(v.torch_companions())
    if v.xla:
        versions.update(torch_xla=v.xla.version, libtpu=v.xla.libtpu)
    if v.tensorflow:
        versions["tensorflow"] = v.tensorflow.version
        versions["keras"] = v.keras()
    if v.mxnet:
        versions["mxnet"] = v.mxnet.version
    if v.horovod:
        versions["horovod"] = v.horovod.version
    if v.mpi4py:
        versions["mpi4py"] = v.mpi4py
    if v.cuda:
        versions.update(cuda=v.cuda.version, cudnn=v.cuda.cudnn, nccl=v.cuda.nccl)
    return versions


def horovod_build(v: Variant) -> dict | None:
    if not v.horovod:
        return None
    ops = [op for op in v.horovod.controllers]
    if v.horovod.gpu_operations:
        ops.append(v.horovod.gpu_operations)
    return {
        "frameworks": list(v.horovod.frameworks),
        "controllers": list(v.horovod.controllers),
        "tensor_operations": ops,
        "cpu_operations": v.horovod.cpu_operations,
        "gpu_operations": v.horovod.gpu_operations,
        "patches": sorted(p.name for p in (REPO_ROOT / "images" / "patches" /
                                           f"horovod-{v.horovod.version}").glob("*.patch")),
    }


def manifest(v: Variant, cuda_variants: dict[str, str] | None = None) -> dict:
    """The image manifest at /etc/disttrain/manifest.json, read by the entrypoint.
    `cuda_variants` (the matrix's, name -> CUDA) lets a CUDA image's driver check name the
    variant that would run on an older driver (entrypoint/machine/nvidia_driver.py)."""
    return {
        "schema": 1,
        "variant": v.name,
        "project_version": PROJECT_VERSION,
        "accelerator": v.accelerator,
        "frameworks": v.frameworks(),
        "launchers": v.launchers(),
        "versions": component_versions(v),
        "horovod": horovod_build(v),
        "cuda_arch_list": list(v.cuda.arch_list) if v.cuda else [],
        "without": list(v.without),           # pinned companions this build left out
        "allocators": {"tcmalloc": TCMALLOC_LIBRARY},   # MEMORY_ALLOCATOR: the library each preloads
        **({"cuda_variants": dict(sorted(cuda_variants.items()))} if v.cuda and cuda_variants else {}),
    }


def labels(v: Variant) -> list[tuple[str, str]]:
    """Static labels (in the Dockerfile). `created` and `revision` are added at build time."""
    result = [
        ("org.opencontainers.image.title", f"distributed-training-framework ({v.name})"),
        ("org.opencontainers.image.description", v.description),
        ("org.opencontainers.image.version", PROJECT_VERSION),
        ("org.opencontainers.image.licenses", "Apache-2.0"),
        ("org.opencontainers.image.base.name", v.base_image()),
        (f"{LABEL_PREFIX}.variant", v.name),
        (f"{LABEL_PREFIX}.accelerator", v.accelerator),
        (f"{LABEL_PREFIX}.frameworks", ",".join(v.frameworks())),
        (f"{LABEL_PREFIX}.launchers", ",".join(v.launchers())),
    ]
    if v.without:
        result.append((f"{LABEL_PREFIX}.without", ",".join(v.without)))
    result += [(f"{LABEL_PREFIX}.version.{name}", value) for name, value in component_versions(v).items()]
    hvd = horovod_build(v)
    if hvd:
        result += [
            (f"{LABEL_PREFIX}.horovod.frameworks", ",".join(hvd["frameworks"])),
            (f"{LABEL_PREFIX}.horovod.controllers", ",".join(hvd["controllers"])),
            (f"{LABEL_PREFIX}.horovod.tensor-operations", ",".join(hvd["tensor_operations"])),
        ]
    return result


# DATA_DIR / CHECKPOINT_DIR in a bucket (entrypoint/storage/): boto3 (credentials, probes,
# listings) and obstore (the transfers).
STORAGE_CLIENT = "boto3>=1.34,<2\nobstore>=0.8,<1"


def requirements(v: Variant) -> dict[str, str]:
    """requirements/{runtime,runtime-nodeps,build}.txt for pip (see install-requirements.sh)."""
    runtime = ["# Installed with dependencies, in the builder and the runtime stage.", "psutil>=5.9",
               "cryptography>=42",            # JOB_SECRET: the control plane's TLS identity (entrypoint/security/secret.py)
               compat.numpy_requirement(v)]  # torch >= 2.6 no longer depends on it; training code does
    nodeps = ["# Installed with --no-deps: their declared dependencies are wrong for this image."]
    if v.pytorch:
        runtime.append(f"torch=={v.pytorch.version}")
    if v.xla:
        # torch-xla's wheels declare no torch requirement: the pin above is the pairing
        # (compat.TORCH_XLA); its `tpu` extra brings libtpu (pinned again here) and tpu-info.
        runtime += [f"torch-xla[tpu]=={v.xla.version}", f"libtpu=={v.xla.libtpu}"]
    if v.tensorflow:
        # On CUDA, TensorFlow's `and-cuda` extra resolves together with torch's pins: one copy
        # of each nvidia-*-cu12 wheel (compat.check_cuda_wheels); what torch does not pin is
        # held to the variant's CUDA.
        extra = "[and-cuda]" if v.accelerator == "cuda" else ""
        runtime.append(f"{v.tensorflow.package}{extra}=={v.tensorflow.version}")
        runtime += [f"{wheel}{spec}" for wheel, spec in compat.tensorflow_only_cuda_wheels(v).items()]
        if v.keras() == "tf-keras":
            # tf-keras requires the `tensorflow` distribution even where tensorflow-cpu
            # already provides the module.
            nodeps.append(f"tf-keras~={compat.minor(v.tensorflow.version)}.0")
    if v.mxnet:
        runtime.append(f"mxnet=={v.mxnet.version}")
    if v.horovod:
        runtime += ["cloudpickle", "pyyaml", "packaging"]
    build = ["# Builder stage only: what compiling Horovod needs.",
             "cmake>=3.18,<4", "setuptools<81", "wheel",
             "cffi>=1.4.0"]  # Horovod setup_requires
    compiler = compat.cuda_compiler(v)
    if compiler and compiler.source == "pypi":
        # CUDA's compiler from the same cuda-toolkit release torch pinned (already installed:
        # the range keeps it), into the builder's throw-away copy of the frameworks' venv.
        build.append(f"cuda-toolkit[nvcc,cccl]=={v.cuda.version}.*")
    return {"runtime.txt": "\n".join(runtime) + "\n",
            "runtime-nodeps.txt": "\n".join(nodeps) + "\n",
            "build.txt": "\n".join(build) + "\n"}


# MEMORY_ALLOCATOR=tcmalloc: gperftools' tcmalloc, preloaded into the training processes
# (Debian's package took the t64 suffix in trixie).
TCMALLOC_PACKAGE = {"bookworm": "libtcmalloc-minimal4"}
TCMALLOC_LIBRARY = "libtcmalloc_minimal.so.4"


def runtime_apt(v: Variant) -> list[str]:
    """Debian packages the runtime stage adds to the base's Python, tini and tools."""
    packages = [TCMALLOC_PACKAGE.get(v.distro, "libtcmalloc-minimal4t64")]
    if "mpi" in v.launchers():
        packages.append("openmpi-bin")
    if v.xla:
        # torch-xla's _XLAC links libpython3.X.so.1.0, which Debian's python3 does not install.
        packages.append(f"libpython{v.python}")
    if v.mxnet:
        # MXNet's wheel bundles OpenBLAS and libgfortran but links the system's OpenMP and
        # libquadmath; the builder has them through build-essential, the runtime would not.
        packages += ["libgomp1", "libquadmath0"]
    return packages


def storage_requirements() -> str:
    """storage.txt: the bucket client's layer, after the frameworks and held to what they
    installed. Outside requirements/ (which the frameworks' stage mounts), so that a newer
    client reinstalls no framework."""
    return f"# DATA_DIR / CHECKPOINT_DIR in a bucket (entrypoint/storage/).\n{STORAGE_CLIENT}\n"


def torch_extras(v: Variant) -> str | None:
    """torch-extras.txt: torchvision/torchaudio for the runtime stage's own layer. It lives
    outside requirements/, which the builder mounts: adding a companion recompiles nothing."""
    if not v.torch_companions():
        return None
    # torch pinned again, so pip can add the companions but never swap torch for another build.
    lines = ["# The companions built for this torch; installed in their own layer.", f"torch=={v.pytorch.version}"]
    lines += [f"{name}=={pin}" for name, pin in v.torch_companions().items()]
    return "\n".join(lines) + "\n"


def horovod_env(v: Variant) -> list[tuple[str, str]]:
    """The HOROVOD_* settings that build-horovod.sh compiles with."""
    hvd = v.horovod
    if not hvd:
        return []
    env = [(f"HOROVOD_{'WITH' if 'mxnet' in hvd.frameworks else 'WITHOUT'}_MXNET", "1")]
    for framework in ("pytorch", "tensorflow"):
        env.append((f"HOROVOD_{'WITH' if framework in hvd.frameworks else 'WITHOUT'}_{framework.upper()}", "1"))
    for controller in ("gloo", "mpi"):
        env.append((f"HOROVOD_{'WITH' if controller in hvd.controllers else 'WITHOUT'}_{controller.upper()}", "1"))
    env.append(("HOROVOD_CPU_OPERATIONS", hvd.cpu_operations.upper()))
    if hvd.gpu_operations:
        home = cuda_home(v)
        env += [
            ("HOROVOD_GPU_OPERATIONS", hvd.gpu_operations.upper()),
            ("HOROVOD_CUDA_HOME", home),
            ("HOROVOD_NCCL_LINK", "SHARED"),
            ("HOROVOD_BUILD_CUDA_CC_LIST", ",".join(a.replace(".", "") for a in v.cuda.arch_list)),
        ]
        compiler = compat.cuda_compiler(v)
        if compiler.host_cxx.get(v.distro):
            env.append(("CUDAHOSTCXX", compiler.host_cxx[v.distro]))
        if compiler.source == "pypi":
            # torch's extension build finds cudart under CUDA_HOME (else above the nvcc on PATH).
            env.append(("CUDA_HOME", home))
    return env


def cuda_home(v: Variant) -> str:
    """The builder's CUDA toolkit root: Debian's under /usr, or the cuda-toolkit wheels' tree
    (nvidia/cu13) in the frameworks' venv."""
    if compat.cuda_compiler(v).source == "debian":
        return "/usr"
    return f"/opt/venv/lib/python{v.python}/site-packages/nvidia/cu{compat.cuda_major(v.cuda.version)}"


def builder_apt(v: Variant) -> list[str]:
    """Debian packages of the builder stage: compilers, headers, and Debian's CUDA toolkit
    where the variant's nvcc comes from Debian."""
    packages = ["build-essential", "python3-dev", "libopenmpi-dev", "patch"]
    compiler = compat.cuda_compiler(v)
    if compiler and compiler.source == "debian":
        packages.append("nvidia-cuda-toolkit")
    return packages


def runtime_env(v: Variant) -> list[tuple[str, str]]:
    """The final image's environment, for every process in it (training, commands after the
    image, `docker exec` shells); `docker run -e` overrides each."""
    env = [("DISTTRAIN_MANIFEST", "/etc/disttrain/manifest.json"), ("DATA_DIR", "/app/data"),
           ("CHECKPOINT_DIR", "/app/checkpoints"), ("OMPI_MCA_plm_rsh_agent", "false"),
           # Open MPI refuses root; in a container root is the user's choice (`--user 0`, or a
           # root host user's `--user "$(id -u):$(id -g)"`), so mpirun and horovodrun run as it.
           ("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")]
    if v.keras() == "tf-keras":
        # One Keras: the image's Horovod and MultiWorkerMirroredStrategy need tf-keras, so
        # tf.keras is tf-keras whatever FRAMEWORK says (Keras 3 stays importable as `keras`).
        env.append(("TF_USE_LEGACY_KERAS", "1"))
    if v.cuda:
        # NVIDIA's container conventions (as in NVIDIA's CUDA images): the runtime mounts
        # every GPU and the compute libraries, and refuses a driver of an older CUDA major.
        # Not cuda>={v.cuda.version}: PyPI's CUDA libraries run on the major's first driver
        # (minor version compatibility; entrypoint/machine/nvidia_driver.py checks and warns at start).
        major = v.cuda.version.split(".")[0]
        env += [("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
                ("NVIDIA_REQUIRE_CUDA", f"cuda>={major}.0")]
    return env


def kv_lines(pairs: list[tuple[str, str]]) -> str:
    """key="value" pairs for ENV/LABEL, one per continued line, values JSON-quoted."""
    return " \\\n    ".join(f"{key}={json.dumps(value)}" for key, value in pairs)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(REPO_ROOT / "images")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["kv_lines"] = kv_lines
    return env


# The native frames of a stalled rank's stack (entrypoint/health/vigil.py), where the container
# lets it attach; one static binary, the same in every variant.
PY_SPY = "py-spy==0.4.3"


def render_dockerfile(v: Variant) -> str:
    text = _environment().get_template("Dockerfile.j2").render(v=v, labels=labels(v), horovod_env=horovod_env(v),
                                                                runtime_env=runtime_env(v), runtime_apt=runtime_apt(v),
                                                                builder_apt=builder_apt(v), torch_extras=v.torch_companions(), py_spy=PY_SPY)
    # Collapse the blank-line runs left by `{% if %}` blocks that rendered nothing.
    lines, blank = [], 0
    for line in text.splitlines():
        blank = blank + 1 if not line.strip() else 0
        if blank <= 1:
            lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"


def _tree(root: Path, dest: str, suffixes: tuple[str, ...]) -> list[File]:
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts:
            rel = path.relative_to(root).as_posix()
            files.append(File(f"{dest}/{rel}", path.read_bytes(), executable=path.suffix == ".sh"))
    return files


def render_context(v: Variant, cuda_variants: dict[str, str] | None = None) -> list[File]:
    files = [
        File("Dockerfile", render_dockerfile(v).encode()),
        File("manifest.json", (json.dumps(manifest(v, cuda_variants), indent=2, sort_keys=True) + "\n").encode()),
        File("wheelhouse/README", b"Local wheels for pip --find-links; filled by `build.py build --wheelhouse`.\n"),
    ]
    files += [File(f"requirements/{name}", text.encode()) for name, text in requirements(v).items()]
    files.append(File("storage.txt", storage_requirements().encode()))
    if torch_extras(v):
        files.append(File("torch-extras.txt", torch_extras(v).encode()))
    files += _tree(REPO_ROOT / "images" / "scripts", "scripts", (".sh",))
    files += _tree(REPO_ROOT / "images" / "patches", "patches", (".patch",))
    for name in APP_DIRS:
        files += _tree(REPO_ROOT / name, f"app/{name}", APP_SUFFIXES)
    return sorted(files, key=lambda f: f.path)


def context_digest(files: list[File]) -> str:
    """sha256 over every rendered file (path, mode, bytes): the same render, the same digest.
    The wheelhouse a build adds and the base image are build options, not in it."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        for part in (f.path.encode(), b"x" if f.executable else b"-", f.content):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return "sha256:" + digest.hexdigest()


def write_context(files: list[File], out_dir: Path) -> Path:
    """Write files into out_dir, replacing whatever a previous render left there."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    for f in files:
        target = out_dir / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.content)
        target.chmod(0o755 if f.executable else 0o644)
    return out_dir
