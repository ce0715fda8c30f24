"""The NVIDIA driver check: recorded /proc/driver/nvidia/version texts, the image's CUDA,
and the one line that stops a job whose driver is too old (entrypoint/machine/nvidia_driver.py)."""

import json

import pytest

from entrypoint.contract.config import ConfigError
from entrypoint.machine.nvidia_driver import check_driver, newest_variant, parse_driver
from entrypoint.machine.hardware import Hardware, detect
from entrypoint.contract.manifest import Image, load
from entrypoint.plan import plan_from_env

# Recorded from real hosts: the proprietary module, the open module (x86_64 and aarch64).
PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:15 UTC 2024\n"
               "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
OPEN_X86 = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:50:38 UTC 2025\nGCC version:  gcc version 11.4.0\n")
OPEN_ARM = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build  "
            "(dvs-builder@U22-I3-AE18-23-3)  Sun Jul 20 21:06:46 UTC 2025\n")
OLD = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.239.06  Wed Feb 28 09:38:34 UTC 2024\n"
VARIANTS = {"cu124": "12.4", "cu126": "12.6", "cu128": "12.8", "cu130": "13.0"}


@pytest.mark.parametrize("text, version", [(PROPRIETARY, "535.161.08"), (OPEN_X86, "570.86.15"),
                                           (OPEN_ARM, "580.65.06"), (OLD, "470.239.06"), ("", None),
                                           ("garbage", None), (None, None)])
def test_parses_the_drivers_version(text, version):
    assert parse_driver(text) == version


def test_a_driver_of_an_older_cuda_major_is_refused_naming_the_minimum_and_what_would_run():
    error, _ = check_driver("470.239.06", "12.8", "cu128", VARIANTS)
    assert error == ("NVIDIA driver 470.239.06: this image (cu128, CUDA 12.8) needs driver >= 525.60.13; "
                     "no variant of this image runs on it: update the driver")
    error, _ = check_driver("550.54.15", "13.0", "cu130", VARIANTS)
    assert "needs driver >= 580.65.06" in error and error.endswith("the newest variant that runs on it is cu128")


def test_an_older_driver_of_the_same_major_runs_with_a_warning():
    assert check_driver("535.161.08", "12.8", "cu128", VARIANTS) == \
        (None, "NVIDIA driver 535.161.08 is older than CUDA 12.8's own (570.26): it runs under CUDA's minor "
               "version compatibility, without JIT compilation of newer PTX")
    assert check_driver("570.86.15", "12.8", "cu128", VARIANTS) == (None, None)
    assert check_driver("580.65.06", "13.0", "cu130", VARIANTS) == (None, None)


def test_the_newest_variant_is_the_newest_cuda_the_driver_runs():
    assert newest_variant("580.95.05", VARIANTS) == "cu130"
    assert newest_variant("560.35.03", VARIANTS) == "cu128"
    assert newest_variant("460.1", VARIANTS) is None


def gpu_plan(driver, cuda="12.8", **env):
    hw = Hardware(gpus=2, cpus=8, shm_bytes=8 << 30, nvidia_driver=driver)
    image = Image(("pytorch",), ("native",), "cu128", cuda=cuda, cuda_variants=tuple(VARIANTS.items()))
    return plan_from_env(env, image, hw, (), python="py")


def test_the_preflight_stops_a_gpu_job_on_a_too_old_driver_and_warns_below_the_cudas_own():
    with pytest.raises(ConfigError, match=r"^NVIDIA driver 470.239.06: this image \(cu128, CUDA 12.8\) needs"):
        gpu_plan("470.239.06")
    assert any("minor version compatibility" in w for w in gpu_plan("535.161.08").warnings)
    assert not any("NVIDIA driver" in w for w in gpu_plan("570.86.15").warnings)
    # No check without GPUs in use, without a driver to read, or in an image without CUDA.
    assert gpu_plan("470.239.06", ACCELERATOR="cpu").launcher
    assert gpu_plan(None).launcher and gpu_plan("470.239.06", cuda=None).launcher


def test_the_driver_and_the_manifest_are_read(tmp_path):
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "driver" / "nvidia" / "version").write_text(OPEN_X86)
    assert detect({"CUDA_VISIBLE_DEVICES": ""}, proc_root=str(tmp_path)).nvidia_driver == "570.86.15"
    assert detect({"CUDA_VISIBLE_DEVICES": ""}, proc_root=str(tmp_path / "none")).nvidia_driver is None
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"frameworks": ["pytorch"], "launchers": ["native"], "variant": "cu128",
                                "versions": {"cuda": "12.8"}, "cuda_variants": {"cu126": "12.6", "cu128": "12.8"}}))
    image = load({"DISTTRAIN_MANIFEST": str(path)})
    assert image.cuda == "12.8" and dict(image.cuda_variants) == {"cu126": "12.6", "cu128": "12.8"}
