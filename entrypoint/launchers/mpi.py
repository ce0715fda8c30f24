"""LAUNCHER=mpi: mpirun (Open MPI) on the master starts the entrypoint once per rank; each
one sees OMPI_COMM_WORLD_* and runs the script directly (launchers/direct.py), with
RANK/WORLD_SIZE/MASTER_* for torch's env://. Across nodes, HOSTFILE names the hosts and
mpirun reaches them through its own launch agent; the ranks' env:// store is then on a port
the master picks (ranks_own_store), as MASTER_PORT is the job store's."""

from __future__ import annotations

from dataclasses import dataclass

from ..running.specs import ProcessSpec, iface_env
from .base import Launcher


@dataclass(frozen=True)
class Mpirun(Launcher):
    ranks_own_store = True

    def describe(self) -> str:
        c = self.config
        return "mpirun (Open MPI)" + (f" across the nodes of HOSTFILE={c.hostfile}" if c.hostfile else "")

    def open_despite_secret(self) -> list[str]:
        if self.mode == "distributed":
            return ["Open MPI's out-of-band channel between mpirun and its daemons, which your launch agent "
                    "starts (Open MPI has no TLS)",
                    "the ranks' own torch.distributed store, which rank 0 serves on a free port of the master "
                    "(the ranks on other hosts are mpirun's, with no tunnel of their own to the job store)"]
        return []

    def processes(self, plan, placement) -> list[ProcessSpec]:
        c = self.config
        master_port = placement.master_port or c.master_port
        if self.mode == "distributed" and placement.node_rank != 0:
            return []          # the master's mpirun reaches this node through the MPI launch agent
        env = {**plan.env, **iface_env(placement.iface), "MASTER_ADDR": c.master_addr,
               "MASTER_PORT": str(master_port), "HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi",
               "ENTRYPOINT": c.entrypoint}
        argv = ["mpirun", "--np", str(self.world_size), "--bind-to", "none", "--map-by", "slot", "--tag-output"]
        if c.hostfile:
            argv += ["--hostfile", c.hostfile]
        for name in sorted(env):
            argv += ["-x", name]
        # `--`: what follows is the script's, even a word that names a program (arguments.py).
        argv += ["-x", "PATH", "-x", "DISTTRAIN_MANIFEST", plan.python, "-m", "entrypoint.main", "--",
                 *c.script_args]
        return [ProcessSpec("mpirun", tuple(argv), env)]
