"""The host's NVIDIA driver against the image's CUDA: the check that stops a GPU job at
start, in one line, instead of deep inside its first CUDA call. Pure: it takes the text
of /proc/driver/nvidia/version (hardware.py reads it) and the image's manifest.

The CUDA libraries in the images come from PyPI's `nvidia-*-cu12`/`-cu13` wheels, which
run on any driver of their CUDA major version from that major's first release on (CUDA's
minor version compatibility): CUDA 12.8's libraries run on driver 525.60.13, without JIT
compilation of PTX newer than the driver. So a driver below the major's floor cannot run
the image (an error), and one below the variant's own toolkit driver runs it with that
limit (a warning). NVIDIA_REQUIRE_CUDA in the images says the same to NVIDIA's container
runtime (images/Dockerfile.j2).
"""

from __future__ import annotations

import re

# CUDA major -> the oldest Linux driver its minor version compatibility covers (CUDA's
# release notes, "CUDA Driver" table: "Minor Version Compatibility").
MAJOR_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# CUDA major.minor -> the Linux driver its toolkit was released with (the same table).
TOOLKIT_DRIVER = {"11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03",
                  "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
                  "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}

_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def parse_driver(text: str | None) -> str | None:
    """The driver's version from /proc/driver/nvidia/version ('NVRM version: NVIDIA UNIX
    x86_64 Kernel Module  550.54.15  ...', or '... Open Kernel Module for x86_64  570.86.15 ...')."""
    if not text:
        return None
    found = _VERSION.search(text)
    return found.group(1) if found else None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _major(cuda: str) -> int:
    return int(cuda.split(".")[0])


def newest_variant(driver: str, variants: dict[str, str]) -> str | None:
    """Of the matrix's CUDA variants (name -> CUDA version), the one with the newest CUDA
    whose major version the driver runs."""
    fits = [(_key(cuda), name) for name, cuda in variants.items()
            if _major(cuda) in MAJOR_FLOOR and _key(driver) >= _key(MAJOR_FLOOR[_major(cuda)])]
    return max(fits)[1] if fits else None


def check_driver(driver: str, cuda: str, variant: str, variants: dict[str, str]) -> tuple[str | None, str | None]:
    """(error, warning) for this driver and the image's CUDA; both None when it fits."""
    floor = MAJOR_FLOOR.get(_major(cuda))
    if floor and _key(driver) < _key(floor):
        other = newest_variant(driver, variants)
        instead = f"; the newest variant that runs on it is {other}" if other else \
            "; no variant of this image runs on it: update the driver"
        return (f"NVIDIA driver {driver}: this image ({variant}, CUDA {cuda}) needs driver >= {floor}{instead}",
                None)
    full = TOOLKIT_DRIVER.get(".".join(cuda.split(".")[:2]))
    if full and _key(driver) < _key(full):
        return None, (f"NVIDIA driver {driver} is older than CUDA {cuda}'s own ({full}): it runs under CUDA's "
                      f"minor version compatibility, without JIT compilation of newer PTX")
    return None, None
