"""LAUNCHER=horovod, fixed size: Horovod's workers without SSH or horovodrun.

Across nodes (and on one node with HOROVOD_CONTROLLER=gloo, on GPUs, or without mpirun):
Horovod's Gloo controller. The master's entrypoint serves Horovod's own HTTP rendezvous
(rendezvous_server.py) with Horovod's host assignment for the nodes that joined, and every
node starts its workers with the environment horovodrun would give them: Horovod's
`create_slot_env_vars` for the slot, and the Gloo rendezvous variables (`gloo_env`), the
same builders the elastic launcher uses (elastic.py). As in the elastic launcher,
the master builds every slot's variables once (`slot_envs`) and announces them with the
launch, so the workers import nothing of Horovod's runner (its `gloo_run` module alone
costs a node 0.03-0.1 s of start-up).

On one CPU node: Horovod's MPI controller under mpirun (Open MPI's shared memory beats
Gloo's loopback TCP; README, Benchmarks), started as LAUNCHER=mpi starts its ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...running.specs import ProcessSpec, iface_env, job_store_env, rank_env, tagged
from ...security.tunnel import Gated
from ..base import Launcher, Rendezvous
from ..mpi import Mpirun
from .rendezvous_server import HorovodRendezvous

# Horovod's MPI controller on one CPU node, unless the user sets them (README, Benchmarks):
# each rank's Horovod thread and its training thread both wait in Open MPI, which spins by
# default, so on a node with fewer free cores than waiting threads ranks take turns by time
# slice (20 ms per 1 MB allreduce on 2 cores, 1.1 ms yielding); torch's CPU tensors get
# huge pages, as numpy's arrays do (16 MB allreduces 15-30% faster); and Horovod negotiates
# every 0.1 ms, not every 1 ms (the floor of each small allreduce). Together: allreduces
# within 1.06x of raw Open MPI at 16-64 MB, and training steps 12% faster here.
HOROVOD_MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1", "THP_MEM_ALLOC_ENABLE": "1", "HOROVOD_CYCLE_TIME": "0.1"}


def host_name(node_rank: int) -> str:
    """Horovod's name for a node: its slots' hostname."""
    return f"node{node_rank}"


def node_rank_of(host: str) -> int:
    return int(host[len("node"):])


def horovod_slots(nodes):
    """Horovod's own slot assignment (rank, local/cross rank and size) for the nodes."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    hosts = [HostInfo(host_name(n.node_rank), n.nproc) for n in nodes]
    return get_host_assignments(hosts, sum(n.nproc for n in nodes))


def slot_env(slot) -> dict[str, str]:
    """HOROVOD_RANK, _SIZE, _LOCAL_*, _CROSS_*, _HOSTNAME: Horovod's own builder (gloo_run)."""
    from horovod.runner.gloo_run import create_slot_env_vars

    return create_slot_env_vars(slot)


def slot_envs(nodes) -> tuple[dict[str, str], ...]:
    """Every slot's variables, in rank order: what the master announces with the launch."""
    return tuple(slot_env(slot) for slot in horovod_slots(nodes))


def gloo_env(addr: str, port: int) -> dict[str, str]:
    """Where a Gloo worker finds Horovod's rendezvous, and Gloo for the CPU operations."""
    return {"HOROVOD_GLOO_RENDEZVOUS_ADDR": addr, "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
            "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo"}


def node_env(iface: str | None, node_rank: int) -> dict[str, str]:
    """What a Horovod worker gets from the node that starts it."""
    return {**iface_env(iface), "HOROVOD_GLOO_IFACE": iface or "lo", "NODE_RANK": str(node_rank)}


class ServesOnHorovodPort:
    """A Horovod launcher's server on the master (its rendezvous, or its elastic driver's)
    listens on HOROVOD_PORT."""

    @property
    def server_port(self) -> int:
        return self.config.horovod_port

    @property
    def server_text(self) -> str:
        return f"Horovod's rendezvous on HOROVOD_PORT={self.config.horovod_port}"


@dataclass(frozen=True)
class HorovodGloo(ServesOnHorovodPort, Launcher):
    exchange = True
    serves = True
    transport = "Horovod over Gloo"

    def rendezvous(self):
        r = super().rendezvous()
        if r is None:          # one node: Horovod's rendezvous on 127.0.0.1, no job store
            return Rendezvous("127.0.0.1:0", serve_store=False, exchange=False, horovod_server=True,
                              timeout=self.config.rdzv_timeout)
        return r

    def describe(self) -> str:
        c = self.config
        where = f"Horovod HTTP rendezvous on {c.master_addr}:{c.horovod_port}" if self.mode == "distributed" \
            else "Horovod HTTP rendezvous on 127.0.0.1"
        return f"Horovod gloo workers, no SSH ({where})"

    def serve(self, plan, nodes, store, log):
        slots = horovod_slots(nodes)
        if self.mode != "distributed":
            return HorovodRendezvous.serving(slots, 0, "127.0.0.1")
        if store is not None and store.identity is not None:
            # Behind JOB_SECRET: on loopback, with a Gate on HOROVOD_PORT (Horovod's HTTP
            # server has no authentication, and its handlers unpickle request bodies).
            return Gated(HorovodRendezvous.serving(slots, 0, "127.0.0.1"), self.config.horovod_port,
                         store.identity.server_context(), log.say)
        return HorovodRendezvous.serving(slots, self.config.horovod_port)

    def launch_env(self, nodes) -> tuple[dict[str, str], ...]:
        return slot_envs(nodes)

    def processes(self, plan, placement) -> list[ProcessSpec]:
        """They also get torch.distributed's env:// (MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE),
        so a torch.distributed script under LAUNCHER=horovod joins one group too: rank 0 is on
        the master (Horovod's host assignment), which serves it on the placement's master_port."""
        c, node_rank = self.config, placement.node_rank
        addr = placement.server_addr or c.master_addr
        procs = []
        for slot in placement.launch_env or slot_envs(placement.nodes):   # the master's, or (dry run) our own
            if slot["HOROVOD_HOSTNAME"] != host_name(node_rank):
                continue
            rank = int(slot["HOROVOD_RANK"])
            env = {**plan.env, **node_env(placement.iface, node_rank),
                   **rank_env(rank, int(slot["HOROVOD_SIZE"]), int(slot["HOROVOD_LOCAL_RANK"]),
                              int(slot["HOROVOD_LOCAL_SIZE"]), node_rank),
                   **gloo_env(addr, placement.server_port or c.horovod_port), **slot,
                   **self.torch_store_env(placement, addr)}
            procs.append(ProcessSpec(f"rank {rank}", self.script(plan.python), env))
        return tagged(procs, c.launcher)

    def torch_store_env(self, placement, addr: str) -> dict[str, str]:
        """torch.distributed's env:// store: served by rank 0 on the placement's master_port;
        behind JOB_SECRET, the job store through this node's tunnel (job_store_env)."""
        return job_store_env(placement) or \
            {"MASTER_ADDR": addr, "MASTER_PORT": str(placement.master_port or self.config.master_port)}


@dataclass(frozen=True)
class HorovodMpi(Mpirun):
    """One CPU node: mpirun starts the entrypoint per rank (as LAUNCHER=mpi); Horovod's MPI
    controller. HOROVOD_CONTROLLER=gloo keeps Gloo."""
    transport = "Horovod over MPI: Open MPI shared memory"

    def env(self) -> dict[str, str]:
        return {k: v for k, v in HOROVOD_MPI_DEFAULTS.items() if k not in self.config.passed}

    def describe(self) -> str:
        return "Horovod's MPI controller under mpirun on this node (Open MPI shared memory), no SSH"

    def processes(self, plan, placement) -> list[ProcessSpec]:
        return tagged(super().processes(plan, placement), self.config.launcher)
