"""MXNet, LAUNCHER=native: its parameter-server job (ps-lite). The scheduler and NUM_PS
servers run on the master (servers for the workers, stopped once they end), the workers on
every node. Each process gets its DMLC_* role; importing mxnet runs a scheduler's or
server's loop (disttrain.mx_server)."""

from __future__ import annotations

from dataclasses import dataclass

from ..running.specs import ProcessSpec, iface_env, rank_env, tagged
from .base import Launcher


@dataclass(frozen=True)
class MxnetWorker:
    node_rank: int
    local_rank: int
    addr: str
    port: int


@dataclass(frozen=True)
class MxnetPs(Launcher):
    exchange = True
    numeric_addr = True          # ps-lite binds to the address it is given: publish an IP

    @property
    def servers(self) -> int:
        """The scheduler and the parameter servers, each with its own port on the master."""
        return 1 + self.config.num_ps

    def ports_needed(self, master: bool) -> int:
        return self.nproc + (self.servers if master else 0)

    def describe(self) -> str:
        kind = "dist_async" if self.config.sync_mode == "async" else "dist_sync"
        return (f"MXNet parameter servers, {kind} (scheduler + {self.config.num_ps} server(s) on the master, "
                f"workers on every node)")

    def workers(self, nodes) -> list[MxnetWorker]:
        """Every worker of the job, in the order MXNet's scheduler ranks them.

        ps-lite (MXNet 1.9.1's 3rdparty/ps-lite, van.cc) sorts the registered nodes by address,
        descending as strings, then by port, ascending, and numbers the workers in that order.
        Each node's worker ports are given in ascending order of local rank, so a node's workers
        are consecutive ranks in local order; the nodes follow their addresses."""
        workers = []
        for node in sorted(nodes, key=lambda n: n.node_rank):
            ports = sorted(node.ports[self.servers if node.node_rank == 0 else 0:])
            if len(ports) != node.nproc:
                raise ValueError(f"node {node.node_rank} published {len(node.ports)} ports for {node.nproc} "
                                 f"processes")
            workers += [MxnetWorker(node.node_rank, i, node.addr, port) for i, port in enumerate(ports)]
        return sorted(workers, key=lambda w: (w.addr, -w.port), reverse=True)

    def processes(self, plan, placement) -> list[ProcessSpec]:
        c, node_rank, iface = self.config, placement.node_rank, placement.iface
        master = next(n for n in placement.nodes if n.node_rank == 0)
        workers = self.workers(placement.nodes)
        shared = {**plan.env, **iface_env(iface), "DMLC_PS_ROOT_URI": master.addr,
                  "DMLC_PS_ROOT_PORT": str(master.ports[0]), "DMLC_NUM_SERVER": str(c.num_ps),
                  "DMLC_NUM_WORKER": str(len(workers))}
        if iface:
            shared["DMLC_INTERFACE"] = iface
        server = (plan.python, "-u", "-m", "disttrain.mx_server")
        procs = []
        if node_rank == 0:
            # ps-lite binds the scheduler to DMLC_PS_ROOT_URI unless DMLC_USE_KUBERNETES=1, which
            # binds it to every interface (its only effect): MASTER_ADDR may be a name or a VIP.
            procs.append(ProcessSpec("scheduler", server, {**shared, "DMLC_ROLE": "scheduler",
                                                           "DMLC_USE_KUBERNETES": "1"}, critical=False))
            procs += [ProcessSpec(f"server {i}", server, {**shared, "DMLC_ROLE": "server",
                                                          "DMLC_NODE_HOST": master.addr,
                                                          "PORT": str(master.ports[1 + i])}, critical=False)
                      for i in range(c.num_ps)]
        local = [(rank, w) for rank, w in enumerate(workers) if w.node_rank == node_rank]
        for rank, w in sorted(local, key=lambda rw: rw[1].local_rank):
            env = {**shared, "DMLC_ROLE": "worker", "DMLC_NODE_HOST": w.addr, "PORT": str(w.port),
                   **rank_env(rank, len(workers), w.local_rank, len(local), node_rank)}
            procs.append(ProcessSpec(f"rank {rank}", self.script(plan.python), env))
        return tagged(procs, c.launcher)
