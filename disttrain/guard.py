"""Stops a training process whose framework did not join the job its launcher started.

A Horovod script under torchrun (FRAMEWORK=pytorch, LAUNCHER=native) calls hvd.init(),
finds no Horovod rendezvous and becomes a world of one; so does every other process, and
the nodes train separate models and exit 0. The split is visible inside each process, and
only there: Horovod reports size 1 while the launcher started WORLD_SIZE > 1 processes.
Likewise a MultiWorkerMirroredStrategy without TF_CONFIG (a TensorFlow script under
LAUNCHER=horovod) is a one-worker cluster per process.

The image runs `install()` in every Python process (a .pth line). It watches two imports
and does nothing else: after `horovod.common.basics` loads, HorovodBasics.init checks the
size it got; after TensorFlow's collective_all_reduce_strategy loads, the strategy checks
for TF_CONFIG. A split ends the process with exit code 2 and one line naming the variable
to set. DISTTRAIN_GUARD=0 turns it off.
"""

from __future__ import annotations

import os
import sys

from .hooks import after_import

EXIT_SPLIT = 2
HOROVOD_MODULE = "horovod.common.basics"
MWMS_MODULE = "tensorflow.python.distribute.collective_all_reduce_strategy"


def launched_world(env: dict[str, str]) -> int:
    try:
        return int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def horovod_split(size: int, env: dict[str, str]) -> str | None:
    """The line to stop with when Horovod's world is smaller than the launcher's, else None."""
    world = launched_world(env)
    if size >= world or world <= 1 or env.get("HOROVOD_ELASTIC") == "1":
        return None          # hvd.elastic: the world shrinks and grows by design
    launcher = env.get("DISTTRAIN_LAUNCHER")
    if launcher:
        native = {"pytorch": "torchrun", "mxnet": "MXNet's parameter-server workers"}
        started = {"native": native.get(env.get("FRAMEWORK", "pytorch"), "TF_CONFIG processes")}
        how = started.get(launcher, launcher)
        fix = "set LAUNCHER=horovod" + ("" if env.get("FRAMEWORK") == "mxnet" else " (or LAUNCHER=mpi)") \
            + " for a Horovod script"
        return (f"disttrain: Horovod joined a world of {size} process(es), but LAUNCHER={launcher} started "
                f"WORLD_SIZE={world} ({how}), so each would train alone: {fix}")
    return (f"disttrain: Horovod joined a world of {size} process(es), but this process is one of "
            f"WORLD_SIZE={world} started by another launcher, so each would train alone: start a Horovod "
            f"script with horovodrun, or in the image with LAUNCHER=horovod")


def mwms_split(env: dict[str, str], has_resolver: bool) -> str | None:
    """The line to stop with when MultiWorkerMirroredStrategy would be a one-worker cluster."""
    world = launched_world(env)
    if has_resolver or env.get("TF_CONFIG") or world <= 1:
        return None
    launcher = env.get("DISTTRAIN_LAUNCHER")
    fix = ("set LAUNCHER=native, which gives each process its TF_CONFIG" if launcher
           else "give each process a TF_CONFIG (the image's LAUNCHER=native does)")
    started = f"LAUNCHER={launcher} started" if launcher else "the launcher started"
    return (f"disttrain: MultiWorkerMirroredStrategy found no TF_CONFIG, but {started} WORLD_SIZE={world} "
            f"processes, so each would train alone: {fix}")


def _stop(line: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    os._exit(EXIT_SPLIT)


def _patch_horovod(module) -> None:
    original = module.HorovodBasics.init

    def init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        line = horovod_split(self.size(), dict(os.environ))
        if line:
            _stop(line)
        return result

    init.__doc__ = original.__doc__
    module.HorovodBasics.init = init


def _patch_mwms(module) -> None:
    strategy = module.CollectiveAllReduceStrategy
    original = strategy.__init__

    def __init__(self, *args, **kwargs):
        resolver = kwargs.get("cluster_resolver", args[0] if args else None)
        line = mwms_split(dict(os.environ), resolver is not None)
        if line:
            _stop(line)
        original(self, *args, **kwargs)

    strategy.__init__ = __init__


def install() -> None:
    if os.environ.get("DISTTRAIN_GUARD", "1") == "0":
        return
    after_import(HOROVOD_MODULE, _patch_horovod)
    after_import(MWMS_MODULE, _patch_mwms)
