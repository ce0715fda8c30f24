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
from dataclasses import dataclass

DEFAULT_PATH = "/etc/disttrain/manifest.json"


@dataclass(frozen=True)
class Image:
    frameworks: tuple[str, ...]
    launchers: tuple[str, ...]
    variant: str = "unknown"
    xla: bool = False                  # carries PyTorch/XLA (the tpu variant)

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
    return Image(tuple(frameworks), tuple(launchers), "detected", xla=has("torch") and has("torch_xla"))


def load(env: dict[str, str]) -> Image:
    path = env.get("DISTTRAIN_MANIFEST", DEFAULT_PATH)
    if not os.path.exists(path):
        return detect()
    with open(path) as f:
        data = json.load(f)
    return Image(tuple(data["frameworks"]), tuple(data["launchers"]), data.get("variant", "unknown"),
                 xla="torch_xla" in data.get("versions", {}))
