"""The launchers: one class per way of starting a node's processes (base.py's interface),
and `choose`, the one place that decides which one runs.

    module                   class          when
    direct.py                Direct         an outer launcher started this process as one rank
    xla.py                   XlaHost        PyTorch/XLA with one process per host (TPU, XLA's CPU client)
    mpi.py                   Mpirun         LAUNCHER=mpi
    horovod/fixed.py         HorovodMpi     LAUNCHER=horovod on one CPU node with mpirun and MPI in Horovod
                             HorovodGloo    LAUNCHER=horovod otherwise, fixed size
    horovod/elastic.py       HorovodElastic LAUNCHER=horovod with MIN_NODES/MAX_NODES
    torchrun/launch.py       Torchrun       PyTorch on one node (and PyTorch/XLA with a process per chip)
    torchrun/agent.py        TorchrunAgent  PyTorch across nodes: torch's agent inside the entrypoint
    tensorflow.py            TfConfig       TensorFlow and Keras: TF_CONFIG strategies
    mxnet.py                 MxnetPs        MXNet: its parameter servers

Modules that import a framework (Horovod's elastic driver) are imported only when chosen.
"""

from __future__ import annotations

from ..contract.config import Config
from ..contract.manifest import Image, horovod_has_mpi
from ..contract.schedulers import DirectRank
from ..machine.accelerators import Accelerator
from .base import Launcher, Rendezvous, Server

__all__ = ["Launcher", "Rendezvous", "Server", "choose"]


def _horovod_on_mpi(config: Config, mode: str, accel: Accelerator, image: Image) -> bool:
    """Horovod's MPI controller: one CPU node, mpirun in the image, Horovod built with MPI,
    HOROVOD_CONTROLLER not gloo. Across nodes Horovod stays on Gloo: SSH-free with the
    entrypoint's rendezvous. A Gloo-only Horovod under mpirun would crash (exit 139)."""
    wants_gloo = config.passed.get("HOROVOD_CONTROLLER", "").strip().lower() == "gloo"
    mpirun = "mpi" in image.launchers              # the image carries Open MPI's mpirun
    if mode != "local" or accel.kind != "cpu" or not mpirun or wants_gloo:
        return False
    return horovod_has_mpi(image, config.family)


def choose(config: Config, mode: str, nproc: int, accel: Accelerator, image: Image,
           direct: DirectRank | None = None) -> Launcher:
    """The launcher for this node. `mode`: local | distributed | direct."""
    args = dict(config=config, mode=mode, nproc=nproc, accelerator=accel, direct=direct)
    if direct:
        from .direct import Direct
        return Direct(**args)
    if accel.xla and nproc == 1:
        from .xla import XlaHost
        return XlaHost(**args)
    if config.launcher == "mpi":
        from .mpi import Mpirun
        return Mpirun(**args)
    if config.launcher == "horovod":
        if _horovod_on_mpi(config, mode, accel, image):
            from .horovod.fixed import HorovodMpi
            return HorovodMpi(**args)
        if mode == "distributed" and config.elastic:
            from .horovod.elastic import HorovodElastic
            return HorovodElastic(**args)
        from .horovod.fixed import HorovodGloo
        return HorovodGloo(**args)
    if config.family == "pytorch":
        if mode == "distributed" and not accel.xla:
            from .torchrun.agent import TorchrunAgent
            return TorchrunAgent(**args)
        from .torchrun.launch import Torchrun
        return Torchrun(**args)
    if config.family == "mxnet":
        from .mxnet import MxnetPs
        return MxnetPs(**args)
    from .tensorflow import TfConfig
    return TfConfig(**args)
