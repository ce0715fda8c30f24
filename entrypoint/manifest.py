"""What this image carries: its manifest (/etc/disttrain/manifest.json), as one type.

Written by the build (buildsys/render.py). Outside an image, or if it is missing, the
frameworks and launchers are found by looking for their modules and programs. The
configuration (config.py) narrows its choices to what the Image offers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

DEFAULT_PATH = "/etc/disttrain/manifest.json"


@dataclass(frozen=True)
class Image:
    frameworks: tuple[str, ...]
    launchers: tuple[str, ...]
    variant: str = "unknown"
    xla: bool = False                  # carries PyTorch/XLA (the tpu variant)
    horovod_mpi: bool | None = True    # its Horovod has the MPI controller (None: ask Horovod)
    cuda: str | None = None            # the CUDA its libraries are built for (CUDA variants)
    cuda_variants: tuple[tuple[str, str], ...] = ()   # the matrix's CUDA variants: (name, CUDA)

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
    return Image(tuple(frameworks), tuple(launchers), "detected", xla=has("torch") and has("torch_xla"),
                 horovod_mpi=None)


# Horovod's module for each framework family: where its `mpi_built()` is asked.
HOROVOD_MODULES = {"pytorch": "horovod.torch", "tensorflow": "horovod.tensorflow", "mxnet": "horovod.mxnet"}


def horovod_has_mpi(image: Image, family: str) -> bool:
    """Whether the Horovod that will run has its MPI controller compiled in: the manifest
    says so in an image; outside one, Horovod's own `mpi_built()` answers, asked in a child
    process (it loads the framework and Horovod's library, which this process must not)."""
    if image.horovod_mpi is not None:
        return image.horovod_mpi
    module = HOROVOD_MODULES.get(family, "horovod.torch")
    try:
        done = subprocess.run([sys.executable, "-c", f"import {module} as h; print(h.mpi_built())"],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip().endswith("True")


def load(env: dict[str, str]) -> Image:
    path = env.get("DISTTRAIN_MANIFEST", DEFAULT_PATH)
    if not os.path.exists(path):
        return detect()
    with open(path) as f:
        data = json.load(f)
    horovod, versions = data.get("horovod") or {}, data.get("versions", {})
    return Image(tuple(data["frameworks"]), tuple(data["launchers"]), data.get("variant", "unknown"),
                 xla="torch_xla" in versions, horovod_mpi="mpi" in horovod.get("controllers", ()),
                 cuda=versions.get("cuda"), cuda_variants=tuple(sorted(data.get("cuda_variants", {}).items())))
