"""Upstream compatibility facts, and the checks that use them.

Every number here was read from the packages themselves (the wheels' metadata on PyPI,
`pip install --dry-run --report`), not from memory:

* torch: `Requires-Dist` of the PyPI wheel pins its CUDA runtime, cuDNN and NCCL; the
  PyPI Linux wheel of each release is built for exactly one CUDA version (`pypi_cuda`).
  Other CUDA builds exist only on download.pytorch.org, as `+cuXYZ` local versions.
* TensorFlow: the `and-cuda` extra gives the CUDA runtime, cuDNN and NCCL a release was
  built for; wheels exist for the Python versions in `python`.
* Debian: the Python 3 of each release (bookworm 3.11, trixie 3.13); trixie non-free is
  also where the builder's CUDA 12.4 toolkit (nvcc) comes from. CUDA 13's nvcc is on PyPI
  (`cuda-toolkit[nvcc]`: nvidia-cuda-nvcc, -crt, nvvm, read from the wheels' RECORD), so it
  installs on any Debian release (`CUDA_COMPILERS`).
* torch-xla: its wheels declare no torch requirement at all, yet `_XLAC` links against
  libtorch's C++ symbols: torch-xla 2.9.0 with torch 2.13 fails to import (`undefined
  symbol: _ZN5torch8autograd10deleteNodeEPNS0_4NodeE`), with torch 2.9.0 it runs. Its
  README pins the pair (`pip install torch==2.9.0 'torch_xla[tpu]==2.9.0'`), its `tpu`
  extra pins libtpu, and libtpu 0.0.21 ships cp310-cp312 wheels only (Requires-Python
  `>=3.10, <3.13`), so torch-xla 2.9's TPU support stops at Python 3.12.
* MXNet: the `mxnet` wheel's `Requires-Dist` says numpy<2, but 1.9.1 uses `np.bool`, which
  numpy 1.24 removed (`import mxnet` fails there: measured), so it needs numpy < 1.24, and
  the last such numpy (1.23.5) has wheels for CPython 3.8..3.11 only. TensorFlow's numpy
  floor is its wheels' `Requires-Dist`; torch 2.13 declares none and runs with 1.23.5
  (measured).
* One copy of each CUDA wheel: `TORCH_CUDA_WHEELS` and `TENSORFLOW_CUDA_WHEELS` below, from
  the same metadata (torch's `Requires-Dist` pins, TensorFlow's `and-cuda` extra).

Each check returns a list of problems: (field, message). Empty means compatible.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    """'2.6.0+cu124' -> (2, 6, 0). The local part after '+' is ignored."""
    public = str(text).split("+", 1)[0]
    parts = []
    for piece in public.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def minor(text: str) -> str:
    major, minor_, *_ = parse_version(text) + (0, 0)
    return f"{major}.{minor_}"


def local_tag(text: str) -> str | None:
    """'2.6.0+cu124' -> 'cu124'; '2.6.0' -> None."""
    return str(text).split("+", 1)[1] if "+" in str(text) else None


def cuda_tag(cuda: str) -> str:
    """'12.4' -> 'cu124'."""
    return "cu" + cuda.replace(".", "")


@dataclass(frozen=True)
class TorchRelease:
    python: tuple[str, str]          # lowest and highest CPython with wheels
    cuda_builds: tuple[str, ...]     # CUDA versions PyTorch publishes builds for
    pypi_cuda: str                   # the CUDA of the plain PyPI Linux wheel
    cudnn: str                       # nvidia-cudnn-cu12 pinned by the PyPI wheel
    nccl: str                        # nvidia-nccl-cu12 pinned by the PyPI wheel


TORCH: dict[str, TorchRelease] = {
    "2.6": TorchRelease(("3.9", "3.13"), ("11.8", "12.4", "12.6"), "12.4", "9.1.0.70", "2.21.5"),
    "2.7": TorchRelease(("3.9", "3.13"), ("11.8", "12.6", "12.8"), "12.6", "9.5.1.17", "2.26.2"),
    "2.8": TorchRelease(("3.9", "3.13"), ("12.6", "12.8", "12.9"), "12.8", "9.10.2.21", "2.27.3"),
    "2.9": TorchRelease(("3.10", "3.14"), ("12.6", "12.8", "13.0"), "12.8", "9.10.2.21", "2.27.5"),
    # 2.13's PyPI wheel is a CUDA 13 build (nvidia-*-cu13); only its CPU build is used here.
    "2.13": TorchRelease(("3.10", "3.14"), ("12.6", "13.0"), "13.0", "9.20.0.48", "2.29.7"),
    # 2.14.1's PyPI wheel (torch.version.cuda '13.0') pins cuda-toolkit[...]==13.0.3,
    # nvidia-cudnn-cu13 9.24.0.43, nvidia-nccl-cu13 2.30.7; cp310..cp314 wheels (PyPI's simple
    # index, 2026-12-02). download.pytorch.org's other CUDA builds were not read here.
    "2.14": TorchRelease(("3.10", "3.14"), ("13.0",), "13.0", "9.24.0.43", "2.30.7"),
}


@dataclass(frozen=True)
class Companions:
    """The torchvision and torchaudio built for one torch release (None: there is none)."""
    torchvision: str
    torchaudio: str | None


# Keyed by torch's public version: each companion wheel pins it exactly
# (`Requires-Dist: torch==2.7.1` in torchvision 0.22.1 and torchaudio 2.7.1, read from
# PyPI's wheels). torchaudio's last release on PyPI is 2.11.1: torch 2.13 has none.
# A companion must also be the same build as torch: PyPI's plain wheels are built
# against PyPI's CUDA torch, and next to a CPU torch torchvision fails at import
# ("operator torchvision::nms does not exist"); CPU torch needs its '+cpu' build.
TORCH_COMPANIONS: dict[str, Companions] = {
    "2.6.0": Companions("0.21.0", "2.6.0"),
    "2.7.1": Companions("0.22.1", "2.7.1"),
    "2.8.0": Companions("0.23.0", "2.8.0"),
    "2.13.0": Companions("0.28.0", None),
    "2.14.1": Companions("0.29.1", None),     # torchvision 0.29.1: Requires-Dist torch>=2.14.0
}


@dataclass(frozen=True)
class TensorflowRelease:
    python: tuple[str, str]
    cuda_min: str                    # CUDA runtime it was built against (needs >= this, same major)
    cudnn_min: str                   # cuDNN it was built against (needs >= this, same major)
    nccl_min: str
    keras: str                       # the Keras its `tf.keras` resolves to by default


TENSORFLOW: dict[str, TensorflowRelease] = {
    "2.15": TensorflowRelease(("3.9", "3.11"), "12.2", "8.9", "2.16.5", "keras2"),
    "2.16": TensorflowRelease(("3.9", "3.12"), "12.3", "8.9", "2.16.5", "keras3"),
    "2.17": TensorflowRelease(("3.9", "3.12"), "12.3", "8.9", "2.16.5", "keras3"),
    "2.18": TensorflowRelease(("3.9", "3.12"), "12.5", "9.3", "2.21.5", "keras3"),
    "2.19": TensorflowRelease(("3.9", "3.12"), "12.5", "9.3", "2.23.4", "keras3"),
    "2.20": TensorflowRelease(("3.9", "3.13"), "12.5", "9.3", "2.25.1", "keras3"),
    "2.21": TensorflowRelease(("3.10", "3.13"), "12.5", "9.3", "2.27.7", "keras3"),
}

@dataclass(frozen=True)
class TorchXlaRelease:
    torch: str                       # the torch minor its _XLAC is built against (README's pair)
    python: tuple[str, str]          # CPython versions with torch-xla wheels on PyPI
    libtpu: str                      # pinned by torch-xla's `tpu` extra
    libtpu_python: tuple[str, str] | None   # CPython range of that libtpu's wheels; None: py3-none


TORCH_XLA: dict[str, TorchXlaRelease] = {
    "2.7.0": TorchXlaRelease("2.7", ("3.9", "3.11"), "0.0.11.1", None),
    "2.8.0": TorchXlaRelease("2.8", ("3.10", "3.13"), "0.0.17", None),
    "2.8.1": TorchXlaRelease("2.8", ("3.10", "3.13"), "0.0.17", None),
    "2.9.0": TorchXlaRelease("2.9", ("3.10", "3.13"), "0.0.21", ("3.10", "3.12")),
}


# numpy each TensorFlow release requires (its wheels' Requires-Dist, on Python <= 3.11;
# 2.16 and 2.17 ask for >= 1.26.0 on 3.12+).
TENSORFLOW_NUMPY_MIN: dict[str, str] = {
    "2.15": "1.23.5", "2.16": "1.23.5", "2.17": "1.23.5",
    "2.18": "1.26.0", "2.19": "1.26.0", "2.20": "1.26.0", "2.21": "1.26.0",
}


@dataclass(frozen=True)
class MxnetRelease:
    python: tuple[str, str]          # CPython with wheels of a numpy it accepts
    numpy_below: str                 # the first numpy it breaks with
    cuda: str | None                 # the newest CUDA it has a GPU build for (mxnet-cuXYZ)


# MXNet is retired (Apache attic, 2023): 1.9.1 is its last release.
MXNET: dict[str, MxnetRelease] = {
    "1.9": MxnetRelease(("3.8", "3.11"), "1.24", "11.7"),
}

# The Python 3 that each Debian release ships: the image's interpreter comes from its base.
DISTRO_PYTHON: dict[str, str] = {"bookworm": "3.11", "trixie": "3.13"}

@dataclass(frozen=True)
class CudaCompiler:
    """Where the builder stage's nvcc comes from for one CUDA major. Code it compiles runs on
    any runtime of that major at least as new as it (CUDA minor-version compatibility)."""
    cuda: str                        # the nvcc's CUDA version
    source: str                      # "debian": apt, trixie non-free; "pypi": the cuda-toolkit wheels
    distros: tuple[str, ...]         # Debian releases it installs on
    host_cxx: dict[str, str]         # distro -> the C++ compiler nvcc needs, where not the default
    lowest_arch: str                 # the oldest compute capability it compiles for


CUDA_COMPILERS: dict[int, CudaCompiler] = {
    # nvcc is not published on PyPI for CUDA 12 (nvidia-cuda-nvcc-cu12 has ptxas only): Debian
    # trixie non-free ships nvidia-cuda-toolkit 12.4. nvcc 12.4 accepts GCC <= 13; trixie's
    # default is GCC 14, so CUDA code uses g++-13.
    12: CudaCompiler("12.4", "debian", ("trixie",), {"trixie": "/usr/bin/g++-13"}, "5.0"),
    # CUDA 13's wheels carry the whole compiler (bin/nvcc, crt, nvvm) under nvidia/cu13, the
    # tree torch's CUDA 13 wheels load their libraries from; nvcc 13.0 accepts GCC <= 15 and no
    # longer compiles for compute capabilities below 7.5.
    13: CudaCompiler("13.0", "pypi", ("bookworm", "trixie"), {}, "7.5"),
}


def cuda_major(version: str) -> int:
    return parse_version(version)[0]


def cuda_compiler(variant) -> CudaCompiler | None:
    """The builder's nvcc for a CUDA variant (None: not a CUDA variant, or no compiler known)."""
    return CUDA_COMPILERS.get(cuda_major(variant.cuda.version)) if variant.cuda else None


# Horovod releases whose patches live in images/patches/horovod-<version>/.
HOROVOD_PATCHED = ("0.28.1",)


def _in_range(version: str, low: str, high: str) -> bool:
    return parse_version(low) <= parse_version(version) <= parse_version(high)


def check_python(variant) -> list[tuple[str, str]]:
    problems = []
    distro_python = DISTRO_PYTHON.get(variant.distro)
    if distro_python and variant.python != distro_python:
        problems.append(("python", f"{variant.python!r} is not the Python of Debian {variant.distro}; "
                                   f"allowed: {distro_python!r} (python: follows distro: "
                                   + ", ".join(f"{d}={p}" for d, p in DISTRO_PYTHON.items()) + ")"))
    return problems


def check_torch(variant) -> list[tuple[str, str]]:
    if variant.pytorch is None:
        return []
    version = variant.pytorch.version
    release = TORCH.get(minor(version))
    if release is None:
        return [("pytorch.version", f"{version!r} is not a known PyTorch release; allowed minors: "
                                    + ", ".join(sorted(TORCH, key=parse_version)))]
    problems = []
    if not _in_range(variant.python, *release.python):
        problems.append(("pytorch.version", f"torch {version} has no wheels for Python {variant.python}; "
                                            f"allowed: Python {release.python[0]}..{release.python[1]}"))
    tag = local_tag(version)
    if variant.accelerator == "tpu":
        return problems          # the torch <-> torch-xla pairing is check_xla's
    if variant.accelerator == "cpu":
        if tag != "cpu":
            problems.append(("pytorch.version", f"{version!r} on a cpu variant must be a CPU build; "
                                                f"allowed: '{version.split('+')[0]}+cpu' (the plain PyPI "
                                                f"wheel is a CUDA {release.pypi_cuda} build)"))
        return problems
    cuda = variant.cuda.version
    if cuda not in release.cuda_builds:
        problems.append(("cuda.version", f"torch {minor(version)} is not built for CUDA {cuda}; "
                                         f"allowed: {', '.join(release.cuda_builds)}"))
    elif tag is None and cuda != release.pypi_cuda:
        problems.append(("pytorch.version", f"the PyPI wheel of torch {version} is a CUDA {release.pypi_cuda} "
                                            f"build, not {cuda}; allowed: '{version}+{cuda_tag(cuda)}' "
                                            f"(from download.pytorch.org) or cuda.version "
                                            f"{release.pypi_cuda!r}"))
    elif tag is not None and tag != cuda_tag(cuda):
        problems.append(("pytorch.version", f"local version {tag!r} does not match CUDA {cuda}; "
                                            f"allowed: {cuda_tag(cuda)!r}"))
    if tag is None:
        # The PyPI wheel pins cuDNN and NCCL: the matrix must say what will really be installed.
        if variant.cuda.cudnn != release.cudnn:
            problems.append(("cuda.cudnn", f"{variant.cuda.cudnn!r} differs from the nvidia-cudnn-cu{cuda_major(cuda)} that "
                                           f"torch {version} pins; allowed: {release.cudnn!r}"))
        if variant.cuda.nccl != release.nccl:
            problems.append(("cuda.nccl", f"{variant.cuda.nccl!r} differs from the nvidia-nccl-cu{cuda_major(cuda)} that "
                                          f"torch {version} pins; allowed: {release.nccl!r}"))
    return problems


def check_torch_companions(variant) -> list[tuple[str, str]]:
    if variant.pytorch is None:
        return []
    torch = variant.pytorch.version
    public = torch.split("+", 1)[0]
    known = TORCH_COMPANIONS.get(public)
    problems = []
    for name in ("torchvision", "torchaudio"):
        pin = getattr(variant.pytorch, name)
        if pin is None:
            continue
        field = f"pytorch.{name}"
        wanted = getattr(known, name) if known else None
        if known is None:
            problems.append((field, f"no {name} is known to pair with torch {public}; allowed: null, or torch "
                                    + ", ".join(TORCH_COMPANIONS)))
        elif wanted is None:
            problems.append((field, f"torch {public} has no {name} release; allowed: null"))
        else:
            same_build = wanted + (f"+{local_tag(torch)}" if local_tag(torch) else "")
            if pin.split("+", 1)[0] != wanted:
                problems.append((field, f"{pin!r} is not built for torch {public}; allowed: {same_build!r}"))
            elif local_tag(pin) != local_tag(torch):
                problems.append((field, f"{pin!r} is not the same build as torch {torch!r}; allowed: "
                                        f"{same_build!r} (another build fails at import: 'operator "
                                        f"torchvision::nms does not exist')"))
    return problems


def check_tensorflow(variant) -> list[tuple[str, str]]:
    tf = variant.tensorflow
    if tf is None:
        return []
    release = TENSORFLOW.get(minor(tf.version))
    if release is None:
        return [("tensorflow.version", f"{tf.version!r} is not a known TensorFlow release; allowed minors: "
                                       + ", ".join(sorted(TENSORFLOW, key=parse_version)))]
    problems = []
    if not _in_range(variant.python, *release.python):
        problems.append(("tensorflow.version", f"TensorFlow {tf.version} has no wheels for Python "
                                               f"{variant.python}; allowed: Python "
                                               f"{release.python[0]}..{release.python[1]}"))
    if variant.accelerator == "cuda":
        if tf.package != "tensorflow":
            problems.append(("tensorflow.package", f"{tf.package!r} has no GPU support; allowed: 'tensorflow'"))
        cuda = variant.cuda
        if not (parse_version(release.cuda_min) <= parse_version(cuda.version)
                and parse_version(cuda.version)[0] == parse_version(release.cuda_min)[0]):
            problems.append(("cuda.version", f"TensorFlow {minor(tf.version)} was built for CUDA "
                                             f"{release.cuda_min}; allowed: CUDA {release.cuda_min} or a newer "
                                             f"{parse_version(release.cuda_min)[0]}.x"))
        if not (parse_version(release.cudnn_min) <= parse_version(cuda.cudnn)
                and parse_version(cuda.cudnn)[0] == parse_version(release.cudnn_min)[0]):
            problems.append(("cuda.cudnn", f"TensorFlow {minor(tf.version)} needs cuDNN "
                                           f"{release.cudnn_min} or a newer {parse_version(release.cudnn_min)[0]}.x; "
                                           f"the variant has {cuda.cudnn}"))
        if parse_version(cuda.nccl) < parse_version(release.nccl_min):
            problems.append(("cuda.nccl", f"TensorFlow {minor(tf.version)} needs NCCL >= {release.nccl_min}; "
                                          f"the variant has {cuda.nccl}"))
    keras = tf.keras or release.keras
    if keras == "keras3" and "tensorflow" in variant.horovod_frameworks():
        problems.append(("tensorflow.keras", "Keras 3 breaks horovod.tensorflow.keras "
                                             "('Variable' object has no attribute 'ref') and "
                                             "MultiWorkerMirroredStrategy; allowed: 'tf-keras'"))
    if keras == "keras2" and release.keras == "keras3":
        problems.append(("tensorflow.keras", f"TensorFlow {minor(tf.version)} bundles Keras 3; "
                                             f"allowed: 'tf-keras', 'keras3'"))
    if keras == "tf-keras" and release.keras == "keras2":
        problems.append(("tensorflow.keras", f"TensorFlow {minor(tf.version)} already uses Keras 2; "
                                             f"allowed: 'keras2'"))
    return problems


def check_cuda_toolchain(variant) -> list[tuple[str, str]]:
    if variant.accelerator != "cuda":
        return []
    compiler = cuda_compiler(variant)
    if compiler is None:
        return [("cuda.version", f"no CUDA compiler is known for CUDA {variant.cuda.version}; allowed: CUDA "
                                 + ", ".join(f"{major}.x" for major in CUDA_COMPILERS))]
    if variant.distro not in compiler.distros:
        return [("distro", f"no CUDA {cuda_major(compiler.cuda)} compiler can be installed on Debian "
                           f"{variant.distro}; allowed: {', '.join(compiler.distros)}")]
    if parse_version(variant.cuda.version) < parse_version(compiler.cuda):
        return [("cuda.version", f"the builder's nvcc is CUDA {compiler.cuda}, newer than the runtime "
                                 f"{variant.cuda.version}; allowed: CUDA >= {compiler.cuda}")]
    too_old = [arch for arch in variant.cuda.arch_list if parse_version(arch) < parse_version(compiler.lowest_arch)]
    if too_old:
        return [("cuda.arch_list", f"nvcc {compiler.cuda} does not compile for compute capability "
                                   f"{', '.join(too_old)}; allowed: {compiler.lowest_arch} and newer")]
    return []


def check_horovod(variant) -> list[tuple[str, str]]:
    hvd = variant.horovod
    if hvd is None:
        return []
    problems = []
    if hvd.version not in HOROVOD_PATCHED:
        problems.append(("horovod.version", f"{hvd.version!r} has no patch set in images/patches; "
                                            f"allowed: {', '.join(HOROVOD_PATCHED)}"))
    installed = variant.frameworks()
    for framework in hvd.frameworks:
        if framework not in installed:
            problems.append(("horovod.frameworks", f"{framework!r} is not installed in this variant; "
                                                   f"allowed: {', '.join(installed) or 'none'}"))
    if hvd.gpu_operations and variant.accelerator != "cuda":
        problems.append(("horovod.gpu_operations", f"{hvd.gpu_operations!r} needs accelerator 'cuda'; "
                                                   f"allowed on '{variant.accelerator}': null"))
    if variant.accelerator == "cuda" and not hvd.gpu_operations:
        problems.append(("horovod.gpu_operations", "a CUDA variant must build Horovod with GPU "
                                                   "operations; allowed: 'nccl'"))
    if hvd.cpu_operations not in hvd.controllers:
        problems.append(("horovod.cpu_operations", f"{hvd.cpu_operations!r} is not a built controller; "
                                                   f"allowed: {', '.join(hvd.controllers)}"))
    return problems


def check_xla(variant) -> list[tuple[str, str]]:
    """torch-xla <-> torch <-> libtpu <-> Python, and what a TPU variant may not carry."""
    xla = variant.xla
    if variant.accelerator != "tpu":
        return [("xla", f"torch-xla belongs on a TPU variant; allowed on '{variant.accelerator}': null "
                        f"(or accelerator 'tpu')")] if xla else []
    if xla is None:
        return [("xla", "a TPU variant needs torch-xla; allowed: {version: ..., libtpu: ...} with version "
                        "one of " + ", ".join(TORCH_XLA))]
    release = TORCH_XLA.get(xla.version)
    if release is None:
        return [("xla.version", f"{xla.version!r} is not a known torch-xla release; allowed: "
                                + ", ".join(TORCH_XLA))]
    problems = []
    if variant.pytorch is None:
        problems.append(("pytorch", f"torch-xla {xla.version} runs on torch {release.torch}; allowed: "
                                    f"{{version: '{release.torch}.0'}}"))
    else:
        version, tag = variant.pytorch.version, local_tag(variant.pytorch.version)
        if minor(version) != release.torch:
            problems.append(("pytorch.version", f"torch-xla {xla.version} is built against torch "
                                                f"{release.torch} (its _XLAC links libtorch's C++ symbols); "
                                                f"allowed: '{release.torch}.x' or '{release.torch}.x+cpu'"))
        elif tag not in (None, "cpu"):
            problems.append(("pytorch.version", f"{version!r}: a TPU variant has no use for a {tag} build; "
                                                f"allowed: '{version.split('+')[0]}' (PyPI) or "
                                                f"'{version.split('+')[0]}+cpu' (PyTorch's CPU index)"))
    if not _in_range(variant.python, *release.python):
        problems.append(("xla.version", f"torch-xla {xla.version} has no wheels for Python {variant.python}; "
                                        f"allowed: Python {release.python[0]}..{release.python[1]}"))
    if xla.libtpu != release.libtpu:
        problems.append(("xla.libtpu", f"{xla.libtpu!r} differs from the libtpu that torch-xla {xla.version}'s "
                                       f"'tpu' extra pins; allowed: {release.libtpu!r}"))
    elif release.libtpu_python and not _in_range(variant.python, *release.libtpu_python):
        problems.append(("xla.libtpu", f"libtpu {xla.libtpu} has no wheels for Python {variant.python}; "
                                       f"allowed: Python {release.libtpu_python[0]}..{release.libtpu_python[1]}"))
    if variant.tensorflow is not None:
        problems.append(("tensorflow", "torch-xla and TensorFlow's TPU build would each load libtpu, and only "
                                       "one process may hold a TPU chip; allowed on 'tpu': null"))
    if variant.horovod is not None:
        problems.append(("horovod", "Horovod has no XLA device support (torch-xla brings its own collectives, "
                                    "the 'xla' process group); allowed on 'tpu': null"))
    return problems


def numpy_requirement(variant) -> str:
    """The numpy line of the image's requirements: bounded where a framework needs it."""
    if variant.mxnet and minor(variant.mxnet.version) in MXNET:
        return f"numpy<{MXNET[minor(variant.mxnet.version)].numpy_below}"
    return "numpy"


def check_mxnet(variant) -> list[tuple[str, str]]:
    mx = variant.mxnet
    if mx is None:
        return []
    release = MXNET.get(minor(mx.version))
    if release is None:
        return [("mxnet.version", f"{mx.version!r} is not a known MXNet release; allowed minors: "
                                  + ", ".join(sorted(MXNET, key=parse_version)))]
    problems = []
    if variant.accelerator != "cpu":
        problems.append(("mxnet.version", f"MXNet {mx.version} runs on CPU here (its GPU wheels stop at CUDA "
                                          f"{release.cuda}); allowed: accelerator 'cpu'"))
    if not _in_range(variant.python, *release.python):
        problems.append(("mxnet.version", f"MXNet {mx.version} needs numpy < {release.numpy_below}, which has no "
                                          f"wheels for Python {variant.python}; allowed: Python "
                                          f"{release.python[0]}..{release.python[1]}"))
    tf = variant.tensorflow
    if tf is not None:
        floor = TENSORFLOW_NUMPY_MIN.get(minor(tf.version))
        if floor and parse_version(floor) >= parse_version(release.numpy_below):
            problems.append(("tensorflow.version", f"TensorFlow {tf.version} needs numpy >= {floor}, MXNet "
                                                   f"{mx.version} needs numpy < {release.numpy_below}; allowed "
                                                   f"with MXNet: TensorFlow " + ", ".join(
                                                       m for m, f in TENSORFLOW_NUMPY_MIN.items()
                                                       if parse_version(f) < parse_version(release.numpy_below))))
    if variant.pytorch is None:
        problems.append(("pytorch", "the entrypoint's job store (multi-node rendezvous) is torch.distributed's "
                                    "TCPStore, so an MXNet variant needs torch too; allowed: a pytorch version"))
    return problems


# --------------------------------------------------------------------------- one copy of each CUDA wheel
#
# torch's PyPI wheel pins (==) every nvidia-*-cu12 wheel it loads. TensorFlow's `and-cuda`
# extra names the ones it loads: exact pins up to 2.19, ranges from 2.20 on. In one image
# pip installs one copy of each wheel, so torch's pin must lie in TensorFlow's range: the
# image then carries the newer of the two (TensorFlow was built with CUDA 12.5 and cuDNN
# 9.3 and runs on newer 12.x / 9.x libraries). A wheel that only TensorFlow asks for
# (nvidia-cuda-nvcc-cu12: ptxas and libdevice for XLA) is held to the variant's CUDA minor.

TORCH_CUDA_WHEELS: dict[str, dict[str, str]] = {
    "2.6": {"nvidia-cublas-cu12": "12.4.5.8", "nvidia-cuda-cupti-cu12": "12.4.127",
            "nvidia-cuda-nvrtc-cu12": "12.4.127", "nvidia-cuda-runtime-cu12": "12.4.127",
            "nvidia-cudnn-cu12": "9.1.0.70", "nvidia-cufft-cu12": "11.2.1.3", "nvidia-curand-cu12": "10.3.5.147",
            "nvidia-cusolver-cu12": "11.6.1.9", "nvidia-cusparse-cu12": "12.3.1.170",
            "nvidia-cusparselt-cu12": "0.6.2", "nvidia-nccl-cu12": "2.21.5", "nvidia-nvjitlink-cu12": "12.4.127",
            "nvidia-nvtx-cu12": "12.4.127"},
    "2.7": {"nvidia-cublas-cu12": "12.6.4.1", "nvidia-cuda-cupti-cu12": "12.6.80",
            "nvidia-cuda-nvrtc-cu12": "12.6.77", "nvidia-cuda-runtime-cu12": "12.6.77",
            "nvidia-cudnn-cu12": "9.5.1.17", "nvidia-cufft-cu12": "11.3.0.4", "nvidia-cufile-cu12": "1.11.1.6",
            "nvidia-curand-cu12": "10.3.7.77", "nvidia-cusolver-cu12": "11.7.1.2",
            "nvidia-cusparse-cu12": "12.5.4.2", "nvidia-cusparselt-cu12": "0.6.3", "nvidia-nccl-cu12": "2.26.2",
            "nvidia-nvjitlink-cu12": "12.6.85", "nvidia-nvtx-cu12": "12.6.77"},
    "2.8": {"nvidia-cublas-cu12": "12.8.4.1", "nvidia-cuda-cupti-cu12": "12.8.90",
            "nvidia-cuda-nvrtc-cu12": "12.8.93", "nvidia-cuda-runtime-cu12": "12.8.90",
            "nvidia-cudnn-cu12": "9.10.2.21", "nvidia-cufft-cu12": "11.3.3.83", "nvidia-cufile-cu12": "1.13.1.3",
            "nvidia-curand-cu12": "10.3.9.90", "nvidia-cusolver-cu12": "11.7.3.90",
            "nvidia-cusparse-cu12": "12.5.8.93", "nvidia-cusparselt-cu12": "0.7.1", "nvidia-nccl-cu12": "2.27.3",
            "nvidia-nvjitlink-cu12": "12.8.93", "nvidia-nvtx-cu12": "12.8.90"},
    "2.9": {"nvidia-cublas-cu12": "12.8.4.1", "nvidia-cuda-cupti-cu12": "12.8.90",
            "nvidia-cuda-nvrtc-cu12": "12.8.93", "nvidia-cuda-runtime-cu12": "12.8.90",
            "nvidia-cudnn-cu12": "9.10.2.21", "nvidia-cufft-cu12": "11.3.3.83", "nvidia-cufile-cu12": "1.13.1.3",
            "nvidia-curand-cu12": "10.3.9.90", "nvidia-cusolver-cu12": "11.7.3.90",
            "nvidia-cusparse-cu12": "12.5.8.93", "nvidia-cusparselt-cu12": "0.7.1", "nvidia-nccl-cu12": "2.27.5",
            "nvidia-nvjitlink-cu12": "12.8.93", "nvidia-nvshmem-cu12": "3.3.20", "nvidia-nvtx-cu12": "12.8.90"},
}


def _tf_and_cuda(nccl: str, exact: bool) -> dict[str, str]:
    """TensorFlow 2.18-2.21's `and-cuda` extra: the CUDA 12.5 / cuDNN 9.3 wheels it was built
    with, pinned (==, up to 2.19) or as the lowest version of the same major (2.20 on)."""
    built_with = {"nvidia-cublas-cu12": ("12.5.3.2", "13.0"), "nvidia-cuda-cupti-cu12": ("12.5.82", "13.0"),
                  "nvidia-cuda-nvcc-cu12": ("12.5.82", "13.0"), "nvidia-cuda-nvrtc-cu12": ("12.5.82", "13.0"),
                  "nvidia-cuda-runtime-cu12": ("12.5.82", "13.0"), "nvidia-cudnn-cu12": ("9.3.0.75", "10.0"),
                  "nvidia-cufft-cu12": ("11.2.3.61", "12.0"), "nvidia-curand-cu12": ("10.3.6.82", "11.0"),
                  "nvidia-cusolver-cu12": ("11.6.3.83", "12.0"), "nvidia-cusparse-cu12": ("12.5.1.3", "13.0"),
                  "nvidia-nccl-cu12": (nccl, "3.0"), "nvidia-nvjitlink-cu12": ("12.5.82", "13.0")}
    return {wheel: f"=={low}" if exact else f">={low},<{below}" for wheel, (low, below) in built_with.items()}


TENSORFLOW_CUDA_WHEELS: dict[str, dict[str, str]] = {
    "2.18": _tf_and_cuda("2.21.5", exact=True),
    "2.19": _tf_and_cuda("2.23.4", exact=True),
    "2.20": _tf_and_cuda("2.25.1", exact=False),
    "2.21": _tf_and_cuda("2.27.7", exact=False),
}

# Wheels whose version is the CUDA toolkit's own (nvidia-cuda-nvcc-cu12 12.6.85 is CUDA 12.6):
# the only ones a variant can hold to its CUDA minor when torch does not pin them.
CUDA_VERSIONED_WHEELS = ("nvidia-cublas-cu12", "nvidia-cuda-cupti-cu12", "nvidia-cuda-nvcc-cu12",
                         "nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12", "nvidia-nvjitlink-cu12")


def _torch_cuda_pins(variant) -> dict[str, str]:
    return TORCH_CUDA_WHEELS.get(minor(variant.pytorch.version), {}) if variant.pytorch else {}


def tensorflow_only_cuda_wheels(variant) -> dict[str, str]:
    """CUDA wheels that TensorFlow's `and-cuda` asks for and torch does not pin, each held to
    the variant's CUDA minor: {'nvidia-cuda-nvcc-cu12': '==12.6.*'}. Empty without TF on CUDA."""
    if variant.tensorflow is None or variant.accelerator != "cuda":
        return {}
    wanted = TENSORFLOW_CUDA_WHEELS.get(minor(variant.tensorflow.version), {})
    pins = _torch_cuda_pins(variant)
    return {wheel: f"=={variant.cuda.version}.*" for wheel in sorted(wanted) if wheel not in pins}


def _fits(spec: str, pin: str) -> bool:
    return SpecifierSet(spec).contains(pin, prereleases=True)


def _cuda_minor_fits(spec: str, cuda: str) -> bool:
    """Some release of CUDA `cuda` (12.6.0 .. 12.6.999) satisfies spec."""
    return _fits(spec, f"{cuda}.0") or _fits(spec, f"{cuda}.999")


def check_cuda_wheels(variant) -> list[tuple[str, str]]:
    """torch and TensorFlow on CUDA share one copy of each nvidia-*-cu12 wheel."""
    tf = variant.tensorflow
    if tf is None or variant.accelerator != "cuda":
        return []
    tf_minor = minor(tf.version)
    wanted = TENSORFLOW_CUDA_WHEELS.get(tf_minor)
    if wanted is None:
        return [("tensorflow.version", f"TensorFlow {tf_minor}'s CUDA wheels (its and-cuda extra) are not "
                                       f"recorded in buildsys/compat.py; allowed on CUDA: "
                                       f"{', '.join(sorted(TENSORFLOW_CUDA_WHEELS, key=parse_version))}")]
    if variant.pytorch is not None:
        torch = variant.pytorch.version
        if local_tag(torch) is not None or minor(torch) not in TORCH_CUDA_WHEELS:
            return [("pytorch.version", f"the CUDA wheels that torch {torch} pins are not recorded in "
                                        f"buildsys/compat.py, so one copy next to TensorFlow cannot be "
                                        f"checked; allowed: the PyPI wheel of torch "
                                        f"{', '.join(sorted(TORCH_CUDA_WHEELS, key=parse_version))}")]
    pins = _torch_cuda_pins(variant)
    for wheel, spec in sorted(wanted.items()):
        if wheel in pins and not _fits(spec, pins[wheel]):
            torch_ok = [m for m, p in sorted(TORCH_CUDA_WHEELS.items(), key=lambda kv: parse_version(kv[0]))
                        if all(w not in p or _fits(s, p[w]) for w, s in wanted.items())]
            tf_ok = [m for m, w in sorted(TENSORFLOW_CUDA_WHEELS.items(), key=lambda kv: parse_version(kv[0]))
                     if all(x not in w or _fits(w[x], p) for x, p in pins.items())]
            allowed = ([f"torch {', '.join(torch_ok)} with TensorFlow {tf_minor}"] if torch_ok else []) + \
                      ([f"TensorFlow {', '.join(tf_ok)} with torch {minor(variant.pytorch.version)}"] if tf_ok else []) + \
                      ["one variant per framework"]
            return [("tensorflow.version", f"TensorFlow {tf_minor} needs {wheel}{spec} but torch "
                                           f"{variant.pytorch.version} pins =={pins[wheel]}: one copy cannot "
                                           f"serve both; allowed: {'; '.join(allowed)}")]
        if wheel not in pins and not (wheel in CUDA_VERSIONED_WHEELS
                                      and _cuda_minor_fits(spec, variant.cuda.version)):
            return [("cuda.version", f"TensorFlow {tf_minor} needs {wheel}{spec}, which nothing in this "
                                     f"variant pins and CUDA {variant.cuda.version} does not satisfy; "
                                     f"allowed: a pytorch that pins it, or a CUDA in that range")]
    return []


CHECKS = (check_python, check_torch, check_torch_companions, check_tensorflow, check_mxnet, check_cuda_toolchain,
          check_horovod, check_xla, check_cuda_wheels)


def check_variant(variant) -> list[tuple[str, str]]:
    problems = []
    for check in CHECKS:
        problems.extend(check(variant))
    return problems
