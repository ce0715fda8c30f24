"""PyTorch/XLA: one process per host, as PJRT expects; torch_xla.launch inside it starts a
process per chip (TPU), or XLA's CPU client serves it (PJRT_DEVICE=CPU, the tpu variant)."""

from __future__ import annotations

from dataclasses import dataclass

from ..machine import accelerators
from ..running.specs import ProcessSpec, iface_env, job_store_env
from .base import Launcher


def tpu_slice_env(launcher: Launcher, placement) -> dict[str, str]:
    """TPU_WORKER_ID and TPU_WORKER_HOSTNAMES across TPU hosts, from the job store's placement,
    unless the platform set them (accelerators.tpu_worker_env)."""
    if launcher.accelerator.kind != "tpu" or launcher.mode != "distributed":
        return {}
    given = {k: v for k, v in launcher.config.passed.items() if k in accelerators.TPU_WORKER_VARIABLES}
    return accelerators.tpu_worker_env([n.addr for n in placement.ordered], placement.node_rank, given)


@dataclass(frozen=True)
class XlaHost(Launcher):
    @property
    def exchange(self) -> bool:
        return self.accelerator.kind == "tpu"

    @property
    def world_size(self) -> int | None:
        return None                          # a rank per XLA device, set by PJRT

    @property
    def world_text(self) -> str:
        return "a rank per XLA device, set by PJRT"

    def describe(self) -> str:
        c, accel = self.config, self.accelerator
        per_device = "torch_xla.launch starts one process per chip" if accel.kind == "tpu" else \
            "XLA's CPU client: CPU_NUM_DEVICES devices in this process"
        store = f"xla:// store on {c.master_addr}:{c.xla_port}" if self.mode == "distributed" else \
            "xla:// store on 127.0.0.1"
        if self.mode == "distributed" and c.has_secret:
            store = "xla:// store: the job store, behind JOB_SECRET"
        return f"one PyTorch/XLA process per host, PJRT_DEVICE={accel.pjrt_device} ({per_device}; {store})"

    def processes(self, plan, placement) -> list[ProcessSpec]:
        """Their xla:// store is MASTER_ADDR:store_port, served by torch_xla's process 0, which
        lives on TPU worker 0: node 0, the master. Behind JOB_SECRET it is the job store,
        through each node's tunnel (torch_xla's handler takes TORCHELASTIC_USE_AGENT_STORE)."""
        c, node_rank = self.config, placement.node_rank
        store_port = c.xla_port if self.mode == "distributed" else (placement.master_port or c.master_port)
        master = c.master_addr if self.mode == "distributed" else "127.0.0.1"
        env = {**plan.env, **iface_env(placement.iface), **tpu_slice_env(self, placement),
               "NODE_RANK": str(node_rank), "MASTER_ADDR": master, "MASTER_PORT": str(store_port),
               **job_store_env(placement)}
        return [ProcessSpec(f"node {node_rank}", self.script(plan.python), env)]
