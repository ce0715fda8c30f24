"""What a launcher asks the supervisor to start: one ProcessSpec per process, and the small
environment builders every launcher composes its processes' environments from (as
Horovod's create_slot_env_vars: one builder per concern)."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ProcessSpec:
    label: str                       # log prefix: 'rank 3', 'ps 0', 'torchrun'
    argv: tuple[str, ...]
    env: dict[str, str]              # on top of the container's environment
    critical: bool = True            # False: a server, stopped once the critical processes end


def script_argv(entrypoint: str, script_args: tuple[str, ...], python: str) -> tuple[str, ...]:
    """The training script's command line: a .py runs with the interpreter, anything else as a program."""
    if entrypoint.endswith(".py"):
        return (python, "-u", entrypoint, *script_args)
    return (entrypoint, *script_args)


def rank_env(rank: int, world: int, local_rank: int, local_world: int, node_rank: int) -> dict[str, str]:
    """torch.distributed's env:// view of one process (and disttrain.context()'s)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "NODE_RANK": str(node_rank)}


def iface_env(iface: str | None) -> dict[str, str]:
    """The network interface for NCCL, Gloo and TensorPipe."""
    if not iface:
        return {}
    return {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface, "TP_SOCKET_IFNAME": iface}


def job_store_env(placement) -> dict[str, str]:
    """Behind JOB_SECRET, a store for the processes' own group (torch.distributed's env://,
    torch_xla's xla://): the job store through this node's tunnel, every process a client
    (TORCHELASTIC_USE_AGENT_STORE, as under torchrun), instead of one their rank 0 would
    serve on every interface. Empty without a secret."""
    if placement.store_host_port is None:
        return {}
    host, port = placement.store_host_port
    return {"MASTER_ADDR": host, "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def tagged(specs: list[ProcessSpec], launcher_variable: str) -> list[ProcessSpec]:
    """Tells the in-process guard (disttrain/guard.py) which LAUNCHER value chose these processes."""
    return [replace(s, env={**s.env, "DISTTRAIN_LAUNCHER": launcher_variable}) for s in specs]
