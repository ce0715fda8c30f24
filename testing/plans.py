"""Launch plans as the unit tests build them: an environment and a machine -> a NodePlan,
and the placements a node could have after joining. Pure, like the planner."""

from __future__ import annotations

from entrypoint.contract.manifest import Image
from entrypoint.job.placement import NodeInfo, Placement
from entrypoint.machine.hardware import Hardware
from entrypoint.plan import plan_from_env

FW, LA = ["pytorch", "tensorflow", "keras", "mxnet"], ["native", "horovod", "mpi"]
CPU2 = Hardware(gpus=0, cpus=2, shm_bytes=64 << 20)


def plan(hw=CPU2, image=Image(FW, LA), **env):
    return plan_from_env({k: str(v) for k, v in env.items()}, image, hw, ("--steps", "3"), python="py")


def nodes(*nprocs, ports=0):
    return [NodeInfo(i, f"10.0.0.{i + 1}", n, tuple(range(40000 + 10 * i, 40000 + 10 * i + (ports or n))))
            for i, n in enumerate(nprocs)]


def at(node_rank, node_list, iface=None, **kw):
    """The placement a node has after joining."""
    return Placement(node_rank, tuple(node_list), iface=iface, **kw)
