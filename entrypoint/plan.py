"""Environment -> launch plan. Pure: nothing here starts, opens or reads anything.

Two steps, as in horovod's gloo_run (compute slots, then launch):

1. `plan_from_env(env, image, hw, script_args)`, or `plan_node(config, hw, image)` after the
   translation and validation: the launcher (launchers/, chosen once), how many processes
   this node runs, which rendezvous it joins or serves, the environment every process
   shares, and preflight warnings.
2. `plan_processes(plan, placement)`: the exact commands, once this node has joined the
   job (join.py) and knows its Placement: node rank, peers, interface, ports. The launcher
   writes them.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from .contract import grad_sync
from .contract.config import VARIABLE_NAMES, Config, ConfigError, load_config
from .contract.manifest import Image
from .contract.schedulers import DirectRank, translate
from .contract.spelling import describe, suspects
from .job.placement import Placement
from .launchers import Launcher, Rendezvous, choose
from .machine import accelerators
from .machine.accelerators import Accelerator
from .machine.hardware import Hardware
from .machine.nvidia_driver import check_driver
from .running.specs import ProcessSpec, iface_env
from .store.transport import job_prefix


@dataclass(frozen=True)
class NodePlan:
    launcher: Launcher               # what starts this node's processes, and how they meet
    env: dict[str, str]              # every process of this node gets these
    hardware: Hardware
    warnings: tuple[str, ...] = ()
    python: str = "python3"

    @property
    def config(self) -> Config:
        return self.launcher.config

    @property
    def mode(self) -> str:
        """local | distributed | direct (one rank started by an outer launcher)."""
        return self.launcher.mode

    @property
    def nproc(self) -> int:
        return self.launcher.nproc

    @property
    def accelerator(self) -> Accelerator:
        return self.launcher.accelerator

    @property
    def direct(self) -> DirectRank | None:
        return self.launcher.direct

    @property
    def rendezvous(self) -> Rendezvous | None:
        return self.launcher.rendezvous()

    @property
    def world_size(self) -> int | None:
        return self.launcher.world_size

    @property
    def starts(self) -> str:
        """What starts the workers and how they meet, in words."""
        return self.launcher.describe()


# --------------------------------------------------------------------------- step 1

def plan_from_env(env: dict[str, str], image: Image, hw: Hardware, script_args: tuple[str, ...] = (),
         python: str = sys.executable) -> NodePlan:
    """The whole of planning: the user's environment (and the schedulers' variables in it),
    what the image carries, the detected hardware and the script's arguments -> NodePlan.
    Raises ConfigError with the one line the user sees."""
    translation = translate(env)
    config = load_config(translation.env, image, tuple(script_args), translation.sources)
    misspelt = [] if config.unknown_variables == "ignore" else suspects(env, VARIABLE_NAMES)
    if misspelt and config.unknown_variables == "error":
        more = f" ({len(misspelt) - 1} more: {', '.join(n for n, _ in misspelt[1:])})" if len(misspelt) > 1 else ""
        raise ConfigError(f"{describe(*misspelt[0])}{more}; UNKNOWN_VARIABLES=error refuses it")
    plan = plan_node(config, hw, image, translation.direct, python=python)
    if misspelt:
        noted = tuple(f"{describe(*m)} (UNKNOWN_VARIABLES=error refuses it, =ignore silences this)" for m in misspelt)
        plan = dataclasses.replace(plan, warnings=noted + plan.warnings)
    return plan


def _parallel_env(config: Config, world: int | None) -> dict[str, str]:
    env = {"PARALLEL_MODE": config.parallel_mode}
    if config.parallel_mode == "data_parallel":
        return {**env, "TP_SIZE": "1", "DP_SIZE": str(world) if world else "0"}      # 0: elastic
    if world is None:
        raise ConfigError(f"PARALLEL_MODE={config.parallel_mode}: needs a fixed world size; elastic "
                          f"training (MIN_NODES/MAX_NODES) is data_parallel only")
    tp = config.tp_size or world
    if world % tp:
        raise ConfigError(f"TP_SIZE={tp}: must divide the world size {world} "
                          f"(NUM_NODES x NPROC_PER_NODE); allowed: "
                          + ", ".join(str(d) for d in range(1, world + 1) if world % d == 0))
    dp = world // tp
    if config.parallel_mode == "hybrid" and (tp == 1 or dp == 1):
        allowed = [str(d) for d in range(2, world) if world % d == 0]
        raise ConfigError(f"TP_SIZE={tp}: PARALLEL_MODE=hybrid needs both dimensions > 1 with world size "
                          f"{world}; allowed: " + (", ".join(allowed) or "none (use 4+ processes)"))
    return {**env, "TP_SIZE": str(tp), "DP_SIZE": str(dp)}


def _common_env(launcher: Launcher, hw: Hardware) -> dict[str, str]:
    config, accel, passed = launcher.config, launcher.accelerator, launcher.config.passed
    env = {
        "PYTHONUNBUFFERED": "1",
        # A rank that dies in C++ (SIGABRT, SIGSEGV) says where its Python threads were;
        # Python turns it on for any non-empty value, so the user's 0 becomes empty.
        "PYTHONFAULTHANDLER": "" if passed.get("PYTHONFAULTHANDLER") == "0" else passed.get("PYTHONFAULTHANDLER", "1"),
        "FRAMEWORK": config.framework,
        "LAUNCHER": config.launcher,
        "SYNC_MODE": config.sync_mode,
        "SYNC_PERIOD": str(config.sync_period),
        **config.grad_sync.env(),
        "DATA_DIR": config.data_dir,
        "CHECKPOINT_DIR": config.checkpoint_dir,
        "NUM_NODES": str(config.num_nodes),
        **_parallel_env(config, launcher.world_size),
        **config.nccl_env,
    }
    if config.grad_bucket_mb is not None and config.launcher == "horovod":
        env["HOROVOD_FUSION_THRESHOLD"] = str(config.grad_bucket_mb * 1024 * 1024)
    if "OMP_NUM_THREADS" not in passed:
        env["OMP_NUM_THREADS"] = str(max(1, hw.cpus // max(1, launcher.nproc)))
    if accel.xla:
        env["PJRT_DEVICE"] = accel.pjrt_device
    elif config.accelerator == "cpu" and hw.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""          # ACCELERATOR=cpu on a GPU host
    if config.family == "tensorflow":
        # Keras 3 breaks MultiWorkerMirroredStrategy and horovod.tensorflow.keras: use tf-keras.
        env["TF_USE_LEGACY_KERAS"] = passed.get("TF_USE_LEGACY_KERAS", "1")
        # 2: errors only. At 1, every process prints absl's "before InitializeLog()" banner and
        # the warnings of tf.data (and oneDNN at 0); TF_CPP_MIN_LOG_LEVEL=0 or 1 brings them back.
        if "TF_CPP_MIN_LOG_LEVEL" not in passed:
            env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if launcher.mode == "distributed" and not config.job_store:
        # Where the processes report training rounds (disttrain.elastic): the job store.
        # With JOB_STORE there is no master to log them: global rank 0 says each round itself.
        env.update(DISTTRAIN_JOB_STORE=launcher.endpoint, DISTTRAIN_JOB_PREFIX=job_prefix(config.run_id))
    return {**env, **launcher.env()}


def _hardware_warnings(config: Config, hw: Hardware, accel: Accelerator, nproc: int,
                       direct: DirectRank | None) -> list[str]:
    gpus = hw.gpus if accel.kind == "gpu" else 0
    warnings = list(accel.warnings)
    if gpus and nproc > gpus and not direct:
        warnings.append(f"NPROC_PER_NODE={nproc} exceeds the {hw.gpus} visible GPU(s): processes will share "
                        f"GPUs, which NCCL does not allow")
    if gpus and hw.shm_bytes is not None and hw.shm_bytes < 1 << 30:
        warnings.append(f"/dev/shm is {hw.shm_bytes / 2**20:.0f} MiB: NCCL fails with 'posix_fallocate' below "
                        f"~1 GiB; start the container with --shm-size=8g or --ipc=host")
    return warnings


def _driver_warnings(hw: Hardware, accel: Accelerator, image: Image) -> list[str]:
    """On a GPU host, the NVIDIA driver against the image's CUDA (machine/nvidia_driver.py): too old stops
    here, in one line; older than the CUDA's own driver is a warning."""
    if accel.kind != "gpu" or not hw.gpus or not image.cuda or not hw.nvidia_driver:
        return []
    error, warning = check_driver(hw.nvidia_driver, image.cuda, image.variant, dict(image.cuda_variants))
    if error:
        raise ConfigError(error)
    return [warning] if warning else []


def plan_node(config: Config, hw: Hardware, image: Image, direct: DirectRank | None = None,
              python: str = "python3") -> NodePlan:
    accel = accelerators.choose(config, hw, image.xla)
    if direct:
        nproc, mode = 1, "direct"
    else:
        mode = config.train_mode
        nproc = config.nproc_per_node or (hw.gpus if accel.kind == "gpu" and hw.gpus else 1)
    accelerators.check_xla_layout(config, accel, hw, nproc, direct)
    refused = grad_sync.on_accelerator(config.grad_sync, accel.xla)
    if refused:
        raise ConfigError(refused)
    warnings = _hardware_warnings(config, hw, accel, nproc, direct) + _driver_warnings(hw, accel, image)
    if config.tf_config and not direct:
        raise ConfigError("TF_CONFIG is set: the container runs as that one TensorFlow task (TFJob); "
                          "NPROC_PER_NODE/NUM_NODES do not apply")
    launcher = choose(config, mode, nproc, accel, image, direct)
    warnings += launcher.check(hw)
    env = {**_common_env(launcher, hw), **_allocator_env(config, image)}
    return NodePlan(launcher=launcher, env=env, hardware=hw, warnings=tuple(warnings), python=python)


def _allocator_env(config: Config, image: Image) -> dict[str, str]:
    """MEMORY_ALLOCATOR's library, preloaded into every training process before any the
    user preloads (Choice has checked that the image carries it)."""
    library = image.allocator_library(config.memory_allocator)
    if library is None:
        return {}
    return {"LD_PRELOAD": " ".join(p for p in (library, config.passed.get("LD_PRELOAD", "")) if p)}


# --------------------------------------------------------------------------- step 2

def plan_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    """The node's processes, once it has joined (the placement)."""
    return plan.launcher.processes(plan, placement)


def command_env(plan: NodePlan) -> dict[str, str]:
    """The environment for a command given after the image (`docker run IMAGE bash`): what
    every training process of this node shares, and NET_IFNAME's interface variables."""
    iface = plan.config.net_ifname
    return {**plan.env, **iface_env(iface), **({"HOROVOD_GLOO_IFACE": iface} if iface else {})}
