"""A process started by an outer launcher (mpirun, srun with a task per rank): it is one rank
of the job already, so the entrypoint becomes the training script in its place."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..contract.config import ConfigError
from ..running.specs import ProcessSpec, rank_env
from .base import Launcher


@dataclass(frozen=True)
class Direct(Launcher):
    @property
    def world_size(self) -> int | None:
        return self.direct.world_size

    def check(self, hw) -> list[str]:
        c, d = self.config, self.direct
        if c.family == "tensorflow" and c.launcher == "native" and not c.tf_config:
            raise ConfigError(f"FRAMEWORK={c.framework} with LAUNCHER=native under {d.source}: each task "
                              f"needs a TF_CONFIG; run one task per node instead, or use LAUNCHER=horovod")
        if c.family == "mxnet" and c.launcher == "native":
            raise ConfigError(f"FRAMEWORK=mxnet with LAUNCHER=native under {d.source}: MXNet's scheduler and "
                              f"servers are started by the entrypoint; run one task per node instead, or use "
                              f"LAUNCHER=horovod")
        if d.world_size > d.local_world_size and c.master_addr == "127.0.0.1" \
                and c.family == "pytorch" and c.launcher == "native":
            raise ConfigError(f"MASTER_ADDR is not set: {d.source} started {d.world_size} ranks across "
                              f"nodes; set MASTER_ADDR (and MASTER_PORT) to rank 0's host")
        return []

    def describe(self) -> str:
        return "direct: this process is one rank, started by an outer launcher"

    def processes(self, plan, placement) -> list[ProcessSpec]:
        d, c = self.direct, self.config
        env = {**plan.env, **rank_env(d.rank, d.world_size, d.local_rank, d.local_world_size,
                                      d.rank // max(1, d.local_world_size)),
               "MASTER_ADDR": c.master_addr, "MASTER_PORT": str(c.master_port)}
        return [ProcessSpec(f"rank {d.rank}", self.script(plan.python), env)]

    def runner(self, plan, job, base_env, log, signals):
        return Exec(self.processes(plan, job.placement)[0], base_env)


@dataclass(frozen=True)
class Exec:
    """The runner of a direct rank: the script replaces the entrypoint (same PID, so the
    outer launcher's signals and exit code are the script's own)."""
    spec: ProcessSpec
    base_env: dict[str, str]

    def run(self):
        os.execvpe(self.spec.argv[0], list(self.spec.argv), {**self.base_env, **self.spec.env})
