"""Which accelerator this node's processes use, and what PyTorch/XLA must be told. Pure.

`choose(config, hw, xla)` picks CPU, GPU or TPU from ACCELERATOR and the detected
hardware, and the PJRT device (`PJRT_DEVICE`) when PyTorch/XLA runs: TPU on a TPU host, or
CPU (XLA's CPU client) when the user sets `PJRT_DEVICE=CPU` in the tpu variant.

TPU hosts run one process per host, as PJRT expects: the script calls torch_xla.launch
(disttrain.torch.launch), which starts one process per chip. Across hosts, torch_xla and
libtpu learn the slice from TPU_WORKER_ID and TPU_WORKER_HOSTNAMES (or the instance
metadata): `tpu_worker_env` derives both from the job store's placement, so a host's node
rank must be its TPU worker number.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.config import Config, ConfigError

PJRT_DEVICES = ("CPU", "TPU")
TPU_WORKER_VARIABLES = ("TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES")


@dataclass(frozen=True)
class Accelerator:
    kind: str                        # cpu | gpu | tpu
    pjrt_device: str | None = None   # PJRT_DEVICE for the processes: PyTorch/XLA runs
    warnings: tuple[str, ...] = ()

    @property
    def xla(self) -> bool:
        return self.pjrt_device is not None


def _tpu_text(hw) -> str:
    return f"{hw.tpu_chips} TPU {hw.tpu_kind} chip(s)"


def _available(hw, xla: bool) -> str:
    found = ["cpu"] + (["gpu"] if hw.gpus else []) + (["tpu"] if xla and hw.tpu_chips and hw.tpu_devices else [])
    return ", ".join(found)


def _no_device_files(hw, name: str, value: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {_tpu_text(hw)} on the PCI bus but no /dev/accel* or /dev/vfio/* in "
                       f"this container; start it with --privileged (or --device for each), or set ACCELERATOR=cpu")


def choose(config: Config, hw, xla: bool) -> Accelerator:
    """ACCELERATOR + hardware (+ PJRT_DEVICE) -> what the processes run on. `xla`: the image
    carries PyTorch/XLA."""
    wanted, warnings = config.accelerator, []
    given = config.passed.get("PJRT_DEVICE")
    pjrt = (given or "").strip().upper() or None
    if pjrt and not xla:
        raise ConfigError(f"PJRT_DEVICE={given!r}: this image has no PyTorch/XLA; the tpu "
                          f"variant carries it")
    if pjrt and pjrt not in PJRT_DEVICES:
        raise ConfigError(f"PJRT_DEVICE={given!r}: allowed in this image: "
                          + ", ".join(PJRT_DEVICES))
    if wanted == "auto":
        if hw.tpu_chips and xla and pjrt != "CPU":
            if not hw.tpu_devices:
                raise _no_device_files(hw, "ACCELERATOR", "auto")
            wanted = "tpu"
        else:
            if hw.tpu_chips and not xla:
                warnings.append(f"{_tpu_text(hw)} found, but this image has no PyTorch/XLA (the tpu variant "
                                f"carries it): running on {'GPU' if hw.gpus else 'CPU'}")
            wanted = "gpu" if hw.gpus and pjrt != "CPU" else "cpu"
    elif wanted == "tpu":
        if not hw.tpu_chips:
            raise ConfigError(f"ACCELERATOR='tpu': no TPU on this host (no Google TPU chip on the PCI bus); "
                              f"allowed here: auto, {_available(hw, xla)}")
        if not hw.tpu_devices:
            raise _no_device_files(hw, "ACCELERATOR", "tpu")
    elif wanted == "gpu" and not hw.gpus:
        raise ConfigError(f"ACCELERATOR='gpu': no GPU visible (CUDA_VISIBLE_DEVICES, nvidia-smi, /dev/nvidia*); "
                          f"allowed here: auto, {_available(hw, xla)}")

    if wanted == "tpu":
        if pjrt not in (None, "TPU"):
            raise ConfigError(f"PJRT_DEVICE={given!r} conflicts with ACCELERATOR=tpu; "
                              f"unset one of them")
        pjrt = "TPU"
    elif pjrt == "TPU":
        raise ConfigError(f"PJRT_DEVICE={given!r}: no usable TPU here (ACCELERATOR resolves "
                          f"to {wanted}); allowed here: CPU (XLA's CPU client)")
    return Accelerator(wanted, pjrt, tuple(warnings))


def check_xla_layout(config: Config, accel: Accelerator, hw, nproc: int, direct) -> None:
    """What PyTorch/XLA can run here: one error line for what it cannot."""
    if not accel.xla:
        return
    if config.framework != "pytorch":
        raise ConfigError(f"FRAMEWORK={config.framework}: PJRT_DEVICE={accel.pjrt_device} is PyTorch/XLA's; "
                          f"allowed: pytorch")
    several = nproc > 1 or config.train_mode == "distributed" or (direct and direct.world_size > 1)
    if accel.pjrt_device == "CPU" and several:
        raise ConfigError("PJRT_DEVICE='CPU': XLA's CPU client serves one process (torch-xla 2.9 creates it "
                          "without PJRT's distributed runtime), so each process would train alone; allowed: "
                          "one process on one node (CPU_NUM_DEVICES=N gives it N XLA devices)")
    if config.parallel_mode != "data_parallel":
        raise ConfigError(f"PARALLEL_MODE={config.parallel_mode!r}: the (dp, tp) DeviceMesh is built for CPU "
                          f"and CUDA devices; on XLA, shard with torch_xla's SPMD mesh; allowed: data_parallel")
    if config.sync_mode != "sync":
        raise ConfigError(f"SYNC_MODE={config.sync_mode!r}: local SGD's DDP hooks are not built for the xla "
                          f"process group; allowed with PJRT_DEVICE={accel.pjrt_device}: sync")
    if accel.kind != "tpu":
        return
    if config.elastic:
        raise ConfigError("MIN_NODES/MAX_NODES: a TPU slice has a fixed number of hosts; allowed on TPU: "
                          "NUM_NODES")
    if nproc > hw.tpu_chips:
        raise ConfigError(f"NPROC_PER_NODE={nproc}: each process needs its own TPU chip and this host has "
                          f"{hw.tpu_chips}; allowed: 1 (one process per host, torch_xla.launch starts one per "
                          f"chip) .. {hw.tpu_chips}")
    if config.train_mode == "distributed" and config.node_rank is None:
        raise ConfigError("NODE_RANK is not set: on a multi-host TPU slice a host's node rank is its TPU worker "
                          "number (agent-worker-number in the instance metadata); set NODE_RANK on every worker")


def tpu_worker_env(addresses: list[str], node_rank: int, user_env: dict[str, str]) -> dict[str, str]:
    """TPU_WORKER_ID and TPU_WORKER_HOSTNAMES (addresses in node-rank order), unless the
    platform set them already (GKE does; the translation made NODE_RANK agree)."""
    derived = {"TPU_WORKER_ID": str(node_rank), "TPU_WORKER_HOSTNAMES": ",".join(addresses)}
    return {k: v for k, v in derived.items() if k not in user_env}
