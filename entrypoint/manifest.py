"""The image manifest (/etc/disttrain/manifest.json): what this image carries.

Written by the build (buildsys/render.py). Outside an image, or if it is missing, the
frameworks and launchers are found by looking for their modules and programs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from dataclasses import dataclass

DEFAULT_PATH = "/etc/disttrain/manifest.json"


@dataclass(frozen=True)
class Manifest:
    frameworks: list[str]
    launchers: list[str]
    variant: str = "unknown"
    xla: bool = False                  # carries PyTorch/XLA (the tpu variant)


def detect() -> Manifest:
    def has(module: str) -> bool:
        return importlib.util.find_spec(module) is not None

    frameworks = (["pytorch"] if has("torch") else []) + (["tensorflow", "keras"] if has("tensorflow") else []) \
        + (["mxnet"] if has("mxnet") else [])
    launchers = ["native"] + (["horovod"] if has("horovod") else []) + (["mpi"] if shutil.which("mpirun") else [])
    return Manifest(frameworks, launchers, "detected", xla=has("torch") and has("torch_xla"))


def load(env: dict[str, str]) -> Manifest:
    path = env.get("DISTTRAIN_MANIFEST", DEFAULT_PATH)
    if not os.path.exists(path):
        return detect()
    with open(path) as f:
        data = json.load(f)
    return Manifest(list(data["frameworks"]), list(data["launchers"]), data.get("variant", "unknown"),
                    xla="torch_xla" in data.get("versions", {}))
