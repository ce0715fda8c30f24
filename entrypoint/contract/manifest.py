"""What this image carries: its manifest (/etc/disttrain/manifest.json), as one type.

Written by the build (buildsys/render.py). Outside an image, or if it is missing, the
frameworks and launchers are found by looking for their modules and programs. The
configuration (config.py) narrows its choices to what the Image offers.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import struct
from dataclasses import dataclass

DEFAULT_PATH = "/etc/disttrain/manifest.json"
TCMALLOC = "libtcmalloc_minimal.so.4"     # outside an image: MEMORY_ALLOCATOR=tcmalloc where this is installed


@dataclass(frozen=True)
class Image:
    frameworks: tuple[str, ...]
    launchers: tuple[str, ...]
    variant: str = "unknown"
    xla: bool = False                  # carries PyTorch/XLA (the tpu variant)
    horovod_mpi: bool | None = True    # its Horovod has the MPI controller (None: ask Horovod)
    cuda: str | None = None            # the CUDA its libraries are built for (CUDA variants)
    cuda_variants: tuple[tuple[str, str], ...] = ()   # the matrix's CUDA variants: (name, CUDA)
    allocator_libraries: tuple[tuple[str, str], ...] = ()   # MEMORY_ALLOCATOR: (name, library to preload)

    @property
    def allocators(self) -> tuple[str, ...]:
        """What MEMORY_ALLOCATOR may name here: the C library's malloc, and what the image carries."""
        return ("system",) + tuple(name for name, _ in self.allocator_libraries)

    def allocator_library(self, name: str) -> str | None:
        return dict(self.allocator_libraries).get(name)

    @property
    def accelerators(self) -> tuple[str, ...]:
        """What ACCELERATOR may name here: TPUs need PyTorch/XLA."""
        return ("auto", "cpu", "gpu") + (("tpu",) if self.xla else ())


def detect() -> Image:
    def has(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    frameworks = (["pytorch"] if has("torch") else []) + (["tensorflow", "keras"] if has("tensorflow") else []) \
        + (["mxnet"] if has("mxnet") else [])
    launchers = ["native"] + (["horovod"] if has("horovod") else []) + (["mpi"] if shutil.which("mpirun") else [])
    # Where Debian's and Red Hat's packages put it (ldconfig -p would cost every start a process).
    tcmalloc = glob.glob(f"/usr/lib*/{TCMALLOC}") + glob.glob(f"/usr/lib/*-linux-gnu/{TCMALLOC}")
    return Image(tuple(frameworks), tuple(launchers), "detected", xla=has("torch") and has("torch_xla"),
                 horovod_mpi=None, allocator_libraries=(("tcmalloc", TCMALLOC),) if tcmalloc else ())


def horovod_has_mpi(image: Image, family: str) -> bool:
    """Whether the Horovod that will run has its MPI controller compiled in: the manifest
    says so in an image. Outside one, its framework extension answers: a Horovod built
    with MPI links Open MPI's library (what Horovod's own `mpi_built()` reports, without
    loading the framework and the extension, which costs a start seconds)."""
    if image.horovod_mpi is not None:
        return image.horovod_mpi
    spec = importlib.util.find_spec("horovod")
    folder = os.path.dirname(spec.origin) if spec and spec.origin else None
    if folder is None:
        return False
    sub = {"pytorch": "torch", "tensorflow": "tensorflow", "mxnet": "mxnet"}.get(family, "torch")
    for lib in sorted(glob.glob(os.path.join(folder, sub, "mpi_lib*.so"))):
        return any(name.startswith("libmpi") for name in needed_libraries(lib))
    return False


def needed_libraries(path: str) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared library: its PT_DYNAMIC
    segment's entries, the names read from its string table (found through PT_LOAD)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return []
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            segments = [struct.unpack_from("<IIQQQQQQ", table, i * phentsize) for i in range(phnum)]
            dynamic = next((s for s in segments if s[0] == 2), None)          # PT_DYNAMIC
            if dynamic is None:
                return []
            f.seek(dynamic[2])
            raw = f.read(dynamic[5])
            entries = [struct.unpack_from("<qQ", raw, i) for i in range(0, len(raw) - 15, 16)]
            strtab = next((v for tag, v in entries if tag == 5), None)         # DT_STRTAB (an address)
            size = next((v for tag, v in entries if tag == 10), 0)             # DT_STRSZ
            load = next((s for s in segments if s[0] == 1 and s[3] <= (strtab or -1) < s[3] + s[5]), None)
            if strtab is None or load is None:
                return []
            f.seek(strtab - load[3] + load[2])
            strings = f.read(size)
    except OSError:
        return []
    return [strings[v:strings.index(b"\0", v)].decode(errors="replace") for tag, v in entries if tag == 1]


def load(env: dict[str, str]) -> Image:
    path = env.get("DISTTRAIN_MANIFEST", DEFAULT_PATH)
    if not os.path.exists(path):
        return detect()
    with open(path) as f:
        data = json.load(f)
    horovod, versions = data.get("horovod") or {}, data.get("versions", {})
    return Image(tuple(data["frameworks"]), tuple(data["launchers"]), data.get("variant", "unknown"),
                 xla="torch_xla" in versions, horovod_mpi="mpi" in horovod.get("controllers", ()),
                 cuda=versions.get("cuda"), cuda_variants=tuple(sorted(data.get("cuda_variants", {}).items())),
                 allocator_libraries=tuple(sorted(data.get("allocators", {}).items())))
