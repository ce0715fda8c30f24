"""Config + hardware -> launch plan. Pure: nothing here starts, opens or reads anything.

Two steps, as in horovod's gloo_run (compute slots, then launch):

1. `plan_node(config, hw)`: how many processes this node runs, which rendezvous it joins
   or serves, the environment every process shares, and preflight warnings.
2. `plan_processes(plan, placement)`: the exact commands, once this node has joined the
   job (join.py) and knows its Placement: node rank, peers, interface, ports (for
   torchrun, peers are not needed: torchrun does its own rendezvous; for Horovod and
   TensorFlow, the nodes exchanged addresses at the master).

Each launcher is a function from the same inputs to a list of ProcessSpec.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace

from . import accelerators
from .accelerators import Accelerator
from .config import Config, ConfigError
from .ecosystem import DirectRank
from .torchrun import TorchrunLaunch, rendezvous_conf

TORCHRUN_PREFIX = "[rank${rank}]: "


@dataclass(frozen=True)
class Hardware:
    gpus: int
    cpus: int
    shm_bytes: int | None = None
    tpu_chips: int = 0                       # Google TPU chips on the PCI bus
    tpu_kind: str | None = None              # their generation: v4, v5e, ...
    tpu_devices: tuple[str, ...] = ()        # their device files this container can open

    def tpu_text(self) -> str:
        if not self.tpu_chips:
            return "no TPU"
        files = f"{self.tpu_devices[0]}..{self.tpu_devices[-1]}" if len(self.tpu_devices) > 1 else \
            (self.tpu_devices[0] if self.tpu_devices else "no device files")
        return f"{self.tpu_chips} TPU {self.tpu_kind} chip(s) ({files})"


def job_prefix(run_id: str) -> str:
    """Where one job's keys live in the job store (jobstore.py)."""
    return f"disttrain/{run_id}/"


@dataclass(frozen=True)
class NodeInfo:
    """What a node tells the others at rendezvous."""
    node_rank: int
    addr: str
    nproc: int
    ports: tuple[int, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"node_rank": self.node_rank, "addr": self.addr, "nproc": self.nproc,
                           "ports": list(self.ports)})

    @staticmethod
    def from_json(text: str | bytes) -> "NodeInfo":
        data = json.loads(text)
        return NodeInfo(int(data["node_rank"]), data["addr"], int(data["nproc"]), tuple(data["ports"]))


@dataclass(frozen=True)
class Placement:
    """Where this node stands once it has joined the job: what the launchers need."""
    node_rank: int
    nodes: tuple[NodeInfo, ...] = ()     # every node when the launcher exchanges addresses, else this one
    iface: str | None = None             # NIC for NCCL, Gloo and Horovod (None: theirs to choose)
    master_port: int | None = None       # torch's MASTER_PORT for processes that form their own group
    horovod_addr: str | None = None      # Horovod's rendezvous server
    horovod_port: int | None = None

    @property
    def me(self) -> NodeInfo | None:
        return next((n for n in self.nodes if n.node_rank == self.node_rank), None)


@dataclass(frozen=True)
class ProcessSpec:
    label: str                       # log prefix: 'rank 3', 'ps 0', 'torchrun'
    argv: tuple[str, ...]
    env: dict[str, str]              # on top of the container's environment
    critical: bool = True            # False: a server, stopped once the critical processes end


@dataclass(frozen=True)
class Rendezvous:
    endpoint: str                    # MASTER_ADDR:MASTER_PORT, the job store
    serve_store: bool                # this node hosts the job store (the master)
    exchange: bool                   # nodes must exchange addresses before launching
    horovod_server: bool             # this node serves Horovod's HTTP rendezvous
    timeout: int


@dataclass(frozen=True)
class NodePlan:
    config: Config
    mode: str                        # local | distributed | direct
    nproc: int
    launcher: str                    # human-readable: what starts the workers, how they meet
    rendezvous: Rendezvous | None
    env: dict[str, str]              # every process of this node gets these
    warnings: tuple[str, ...] = ()
    direct: DirectRank | None = None
    python: str = "python3"
    ports_needed: int = 0            # free ports this node must reserve (TensorFlow, MXNet)
    hardware: Hardware | None = None
    accelerator: Accelerator = Accelerator("cpu")
    user_tpu_env: tuple[tuple[str, str], ...] = ()    # TPU_WORKER_* the platform set itself
    numeric_addr: bool = False       # publish an IP, not a name: MXNet's ps-lite binds to it
    horovod_controller: str | None = None    # LAUNCHER=horovod: 'mpi' (mpirun, one node) or 'gloo'

    @property
    def xla_host(self) -> bool:
        """One PyTorch/XLA process per host, started directly; it starts its own per-device ranks."""
        return self.accelerator.xla and self.nproc == 1 and self.mode in ("local", "distributed")

    @property
    def horovod_elastic(self) -> bool:
        """hvd.elastic: workers are started on demand by Horovod's ElasticDriver (horovod_elastic.py)."""
        return self.mode == "distributed" and self.config.elastic and self.config.launcher == "horovod"

    @property
    def torchrun_in_process(self) -> bool:
        """torchrun across nodes: torch's elastic agent runs inside the entrypoint (agent.py),
        which has imported torch for the job store, rather than in a second process that
        imports it again. One node (no job store, no torch in the entrypoint) and PyTorch/XLA
        keep a torchrun subprocess."""
        c = self.config
        fw = "tensorflow" if c.framework == "keras" else c.framework
        return self.mode == "distributed" and c.launcher == "native" and fw == "pytorch" \
            and not self.accelerator.xla

    @property
    def world_size(self) -> int | None:
        if self.direct:
            return self.direct.world_size
        if self.config.elastic or self.xla_host:
            return None
        return self.nproc * (self.config.num_nodes if self.mode == "distributed" else 1)


# --------------------------------------------------------------------------- step 1

def script_argv(config: Config, python: str) -> tuple[str, ...]:
    if config.entrypoint.endswith(".py"):
        return (python, "-u", config.entrypoint, *config.script_args)
    return (config.entrypoint, *config.script_args)


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


def _common_env(config: Config, hw: Hardware, nproc: int, world: int | None, user_env: dict[str, str],
                accel: Accelerator) -> dict:
    env = {
        "PYTHONUNBUFFERED": "1",
        "FRAMEWORK": config.framework,
        "LAUNCHER": config.launcher,
        "SYNC_MODE": config.sync_mode,
        "SYNC_PERIOD": str(config.sync_period),
        "DATA_DIR": config.data_dir,
        "CHECKPOINT_DIR": config.checkpoint_dir,
        "NUM_NODES": str(config.num_nodes),
        **_parallel_env(config, world),
        **config.nccl_env,
    }
    if "OMP_NUM_THREADS" not in user_env:
        env["OMP_NUM_THREADS"] = str(max(1, hw.cpus // max(1, nproc)))
    if accel.xla:
        env["PJRT_DEVICE"] = accel.pjrt_device
    elif config.accelerator == "cpu" and hw.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""          # ACCELERATOR=cpu on a GPU host
    if config.framework in ("tensorflow", "keras"):
        # Keras 3 breaks MultiWorkerMirroredStrategy and horovod.tensorflow.keras: use tf-keras.
        env.setdefault("TF_USE_LEGACY_KERAS", user_env.get("TF_USE_LEGACY_KERAS", "1"))
        if "TF_CPP_MIN_LOG_LEVEL" not in user_env:
            env["TF_CPP_MIN_LOG_LEVEL"] = "1"
    return env


# Horovod's MPI controller on one CPU node, unless the user sets them (README, Benchmarks):
# each rank's Horovod thread and its training thread both wait in Open MPI, which spins by
# default, so on a node with fewer free cores than waiting threads ranks take turns by time
# slice (20 ms per 1 MB allreduce on 2 cores, 1.1 ms yielding); torch's CPU tensors get
# huge pages, as numpy's arrays do (16 MB allreduces 15-30% faster); and Horovod negotiates
# every 0.1 ms, not every 1 ms (the floor of each small allreduce). Together: allreduces
# within 1.06x of raw Open MPI at 16-64 MB, and training steps 12% faster here.
HOROVOD_MPI_DEFAULTS = {"OMPI_MCA_mpi_yield_when_idle": "1", "THP_MEM_ALLOC_ENABLE": "1", "HOROVOD_CYCLE_TIME": "0.1"}


def horovod_controller(config: Config, mode: str, accel: Accelerator, user_env: dict[str, str],
                       mpirun: bool) -> str | None:
    """Horovod's controller (and CPU operations) for LAUNCHER=horovod. On one CPU node, MPI:
    Open MPI's shared memory beats Gloo's loopback TCP (README, Benchmarks), and mpirun
    needs no SSH on one host. Across nodes, Gloo: SSH-free with the entrypoint's rendezvous.
    HOROVOD_CONTROLLER=gloo keeps Gloo on one node; an image without mpirun has only Gloo."""
    if config.launcher != "horovod":
        return None
    if mode == "local" and accel.kind == "cpu" and mpirun \
            and user_env.get("HOROVOD_CONTROLLER", "").strip().lower() != "gloo":
        return "mpi"
    return "gloo"


def _launcher_text(config: Config, mode: str, accel: Accelerator, nproc: int, controller: str | None) -> str:
    endpoint = f"{config.master_addr}:{config.master_port}"
    fw = "tensorflow" if config.framework == "keras" else config.framework
    if mode == "direct":
        return "direct: this process is one rank, started by an outer launcher"
    if accel.xla and nproc == 1:
        per_device = "torch_xla.launch starts one process per chip" if accel.kind == "tpu" else \
            "XLA's CPU client: CPU_NUM_DEVICES devices in this process"
        store = f"xla:// store on {config.master_addr}:{config.xla_port}" if mode == "distributed" else \
            "xla:// store on 127.0.0.1"
        return f"one PyTorch/XLA process per host, PJRT_DEVICE={accel.pjrt_device} ({per_device}; {store})"
    if config.launcher == "mpi":
        return "mpirun (Open MPI)" + (f" across the nodes of HOSTFILE={config.hostfile}" if config.hostfile else "")
    if config.launcher == "horovod":
        if controller == "mpi":
            return "Horovod's MPI controller under mpirun on this node (Open MPI shared memory), no SSH"
        if mode == "distributed" and config.elastic:
            return (f"Horovod elastic, no SSH: Horovod's ElasticDriver on the master, {config.min_nodes}:"
                    f"{config.max_nodes} nodes from the job store")
        where = f"Horovod HTTP rendezvous on {config.master_addr}:{config.horovod_port}" if mode == "distributed" \
            else "Horovod HTTP rendezvous on 127.0.0.1"
        return f"Horovod gloo workers, no SSH ({where})"
    if fw == "pytorch":
        if mode == "local":
            return "torchrun --standalone" + (f" (PJRT_DEVICE={accel.pjrt_device}, one process per chip)"
                                              if accel.xla else "")
        nnodes = f"{config.min_nodes}:{config.max_nodes}" if config.elastic else str(config.num_nodes)
        xla = f", PJRT_DEVICE={accel.pjrt_device}, one process per chip" if accel.xla else ""
        where = "" if accel.xla else ", torch's elastic agent inside the entrypoint"
        return f"torchrun --nnodes={nnodes} (c10d rendezvous at {endpoint}{xla}{where})"
    if fw == "mxnet":
        kind = "dist_async" if config.sync_mode == "async" else "dist_sync"
        return (f"MXNet parameter servers, {kind} (scheduler + {config.num_ps} server(s) on the master, "
                f"workers on every node)")
    strategy = "ParameterServerStrategy (chief + ps on the master)" if config.sync_mode == "async" \
        else "MultiWorkerMirroredStrategy"
    return f"TF_CONFIG for {strategy}"


def master_servers(config: Config) -> int:
    """Server processes on the master, each with its own port ahead of the workers' ports:
    TensorFlow's chief and parameter servers (async), MXNet's scheduler and servers."""
    fw = "tensorflow" if config.framework == "keras" else config.framework
    if config.launcher != "native" or (fw == "tensorflow" and config.sync_mode != "async"):
        return 0
    return 1 + config.num_ps if fw in ("tensorflow", "mxnet") else 0


def plan_node(config: Config, hw: Hardware, user_env: dict[str, str] | None = None,
              direct: DirectRank | None = None, python: str = "python3", xla: bool = False,
              mpirun: bool = True) -> NodePlan:
    """`xla`: the image carries PyTorch/XLA; `mpirun`: the image carries Open MPI's mpirun."""
    user_env = user_env or {}
    accel = accelerators.choose(config, hw, user_env, xla)
    gpus = hw.gpus if accel.kind == "gpu" else 0
    warnings = list(accel.warnings)
    if direct:
        nproc, mode = 1, "direct"
        world = direct.world_size
    else:
        mode = config.train_mode
        nproc = config.nproc_per_node or (gpus if gpus else 1)
        world = None if config.elastic or (accel.xla and nproc == 1) else \
            nproc * (config.num_nodes if mode == "distributed" else 1)
    accelerators.check_xla_layout(config, accel, hw, nproc, direct)
    if gpus and nproc > gpus and not direct:
        warnings.append(f"NPROC_PER_NODE={nproc} exceeds the {hw.gpus} visible GPU(s): processes will share "
                        f"GPUs, which NCCL does not allow")
    if gpus and hw.shm_bytes is not None and hw.shm_bytes < 1 << 30:
        warnings.append(f"/dev/shm is {hw.shm_bytes / 2**20:.0f} MiB: NCCL fails with 'posix_fallocate' below "
                        f"~1 GiB; start the container with --shm-size=8g or --ipc=host")

    fw = "tensorflow" if config.framework == "keras" else config.framework
    if config.tf_config and not direct:
        raise ConfigError("TF_CONFIG is set: the container runs as that one TensorFlow task (TFJob); "
                          "NPROC_PER_NODE/NUM_NODES do not apply")
    if direct and fw == "tensorflow" and config.launcher == "native" and not config.tf_config:
        raise ConfigError(f"FRAMEWORK={config.framework} with LAUNCHER=native under {direct.source}: each task "
                          f"needs a TF_CONFIG; run one task per node instead, or use LAUNCHER=horovod")
    if direct and fw == "mxnet" and config.launcher == "native":
        raise ConfigError(f"FRAMEWORK=mxnet with LAUNCHER=native under {direct.source}: MXNet's scheduler and "
                          f"servers are started by the entrypoint; run one task per node instead, or use "
                          f"LAUNCHER=horovod")
    if direct and direct.world_size > direct.local_world_size and config.master_addr == "127.0.0.1" \
            and fw == "pytorch" and config.launcher == "native":
        raise ConfigError(f"MASTER_ADDR is not set: {direct.source} started {direct.world_size} ranks across "
                          f"nodes; set MASTER_ADDR (and MASTER_PORT) to rank 0's host")

    rendezvous = None
    ports_needed = 0
    if mode == "distributed":
        # Fixed-size Horovod and TensorFlow jobs exchange addresses before starting; elastic
        # Horovod starts workers as nodes come (horovod_elastic.py), with its own server.
        # TPU hosts learn every host's address: TPU_WORKER_HOSTNAMES.
        fixed_horovod = config.launcher == "horovod" and not config.elastic
        exchange = fixed_horovod or (fw in ("tensorflow", "mxnet") and config.launcher == "native") \
            or accel.kind == "tpu"
        rendezvous = Rendezvous(
            endpoint=f"{config.master_addr}:{config.master_port}",
            serve_store=config.role == "master",
            exchange=exchange,
            horovod_server=fixed_horovod and config.role == "master",
            timeout=config.rdzv_timeout)
    controller = None if direct else horovod_controller(config, mode, accel, user_env, mpirun)
    if mode == "local" and controller == "gloo":
        rendezvous = Rendezvous("127.0.0.1:0", serve_store=False, exchange=False, horovod_server=True,
                                timeout=config.rdzv_timeout)
    if fw in ("tensorflow", "mxnet") and config.launcher == "native" and mode != "direct":
        ports_needed = nproc + (master_servers(config) if config.role == "master" else 0)
    mxnet_ps = fw == "mxnet" and config.launcher == "native" and mode != "direct"

    if config.elastic and config.launcher == "native" and config.max_restarts == 0:
        warnings.append("MAX_RESTARTS=0 with MIN_NODES/MAX_NODES: the job ends at the first lost node; "
                        "set MAX_RESTARTS to the losses it should survive")

    env = _common_env(config, hw, nproc, world, user_env, accel)
    if mode == "distributed":
        # Where the processes report training rounds (disttrain.elastic): the job store.
        env.update(DISTTRAIN_JOB_STORE=f"{config.master_addr}:{config.master_port}",
                   DISTTRAIN_JOB_PREFIX=job_prefix(config.run_id))
    if controller == "mpi":
        env.update({k: v for k, v in HOROVOD_MPI_DEFAULTS.items() if k not in user_env})
    return NodePlan(config=config, mode=mode, nproc=nproc, launcher=_launcher_text(config, mode, accel, nproc, controller),
                    rendezvous=rendezvous, env=env, warnings=tuple(warnings), direct=direct, python=python,
                    ports_needed=ports_needed, hardware=hw, accelerator=accel,
                    user_tpu_env=tuple((k, user_env[k]) for k in accelerators.TPU_WORKER_VARIABLES if k in user_env),
                    numeric_addr=mxnet_ps, horovod_controller=controller)


# --------------------------------------------------------------------------- step 2: launchers

def _rank_env(rank: int, world: int, local_rank: int, local_world: int, node_rank: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world), "NODE_RANK": str(node_rank)}


def iface_env(iface: str | None) -> dict[str, str]:
    if not iface:
        return {}
    return {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface, "TP_SOCKET_IFNAME": iface}


def torchrun_launch(plan: NodePlan, placement: Placement) -> TorchrunLaunch:
    c = plan.config
    env = {**plan.env, **iface_env(placement.iface), **_tpu_env(plan, list(placement.nodes), placement.node_rank),
           "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": TORCHRUN_PREFIX, "NODE_RANK": str(placement.node_rank)}
    common = dict(nproc_per_node=plan.nproc, run_id=c.run_id, max_restarts=c.max_restarts, env=env,
                  script=c.entrypoint, args=tuple(c.script_args))
    if plan.mode == "local":
        return TorchrunLaunch(standalone=True, **common)
    if c.elastic or c.max_restarts:
        # torch >= 2.4 shares the rendezvous store with the workers and builds its address
        # once per agent: a node joining a later round then waits for a MASTER_ADDR that
        # rank 0 never writes again (pytorch/pytorch#135712). Rounds after the first need
        # torch's opt-out.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    me = placement.me
    # The address the others reach this node at (torchrun's default, the FQDN, may not
    # resolve elsewhere); the node that gets global rank 0 serves the workers'
    # process-group store there. torchrun orders global ranks by these addresses.
    return TorchrunLaunch(
        nnodes=f"{c.min_nodes}:{c.max_nodes}" if c.elastic else str(c.num_nodes),
        rdzv_endpoint=plan.rendezvous.endpoint,
        rdzv_conf=rendezvous_conf(c.rdzv_timeout, c.elastic, c.elastic_last_call, c.elastic_dead_after),
        local_addr=me.addr if me else None, **common)


def torchrun_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    launch = torchrun_launch(plan, placement)
    return [ProcessSpec("torchrun", launch.argv(plan.python), launch.env)]


def _tpu_env(plan: NodePlan, nodes: list[NodeInfo], node_rank: int) -> dict[str, str]:
    if plan.accelerator.kind != "tpu" or plan.mode != "distributed":
        return {}
    addresses = [n.addr for n in sorted(nodes, key=lambda n: n.node_rank)]
    return accelerators.tpu_worker_env(addresses, node_rank, dict(plan.user_tpu_env))


def xla_host_processes(plan: NodePlan, placement: Placement, store_port: int) -> list[ProcessSpec]:
    """One PyTorch/XLA process on this host, as PJRT expects; torch_xla.launch inside it starts
    a process per chip. Their xla:// store is MASTER_ADDR:store_port, served by torch_xla's
    process 0, which lives on TPU worker 0: node 0, the master."""
    c, node_rank = plan.config, placement.node_rank
    master = c.master_addr if plan.mode == "distributed" else "127.0.0.1"
    env = {**plan.env, **iface_env(placement.iface), **_tpu_env(plan, list(placement.nodes), node_rank),
           "NODE_RANK": str(node_rank), "MASTER_ADDR": master, "MASTER_PORT": str(store_port)}
    return [ProcessSpec(f"node {node_rank}", script_argv(c, plan.python), env)]


def horovod_slots(nodes: list[NodeInfo]):
    """Horovod's own slot assignment (rank, local/cross rank and size) for the nodes."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    hosts = [HostInfo(f"node{n.node_rank}", n.nproc) for n in nodes]
    return get_host_assignments(hosts, sum(n.nproc for n in nodes))


def horovod_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    """Horovod's workers, started directly with the environment horovodrun would give them.
    They also get torch.distributed's env:// (MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE), so
    a torch.distributed script under LAUNCHER=horovod joins one group too: rank 0 is on the
    master (Horovod's host assignment), which serves it on the placement's master_port."""
    c = plan.config
    node_rank, iface = placement.node_rank, placement.iface
    procs = []
    for slot in horovod_slots(list(placement.nodes)):
        if slot.hostname != f"node{node_rank}":
            continue
        env = {
            **plan.env, **iface_env(iface),
            **_rank_env(slot.rank, slot.size, slot.local_rank, slot.local_size, node_rank),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": placement.horovod_addr or c.master_addr,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(placement.horovod_port or c.horovod_port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface or "lo",
            "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "MASTER_ADDR": placement.horovod_addr or c.master_addr,
            "MASTER_PORT": str(placement.master_port or c.master_port),
        }
        procs.append(ProcessSpec(f"rank {slot.rank}", script_argv(c, plan.python), env))
    return procs


def tf_cluster(plan: NodePlan, nodes: list[NodeInfo]) -> dict[str, list[str]]:
    """TF_CONFIG's cluster: workers in global-rank order; chief and ps on the master for async."""
    cluster: dict[str, list[str]] = {"worker": []}
    async_ = plan.config.sync_mode == "async"
    for node in sorted(nodes, key=lambda n: n.node_rank):
        ports = list(node.ports)
        if async_ and node.node_rank == 0:
            cluster["chief"] = [f"{node.addr}:{ports.pop(0)}"]
            cluster["ps"] = [f"{node.addr}:{ports.pop(0)}" for _ in range(plan.config.num_ps)]
        if len(ports) != node.nproc:
            raise ValueError(f"node {node.node_rank} published {len(node.ports)} ports for {node.nproc} processes")
        cluster["worker"] += [f"{node.addr}:{p}" for p in ports]
    return cluster


def tensorflow_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    c = plan.config
    nodes, node_rank, iface = list(placement.nodes), placement.node_rank, placement.iface
    cluster = tf_cluster(plan, nodes)
    ordered = sorted(nodes, key=lambda n: n.node_rank)
    first = sum(n.nproc for n in ordered if n.node_rank < node_rank)
    world = sum(n.nproc for n in ordered)
    server = (plan.python, "-u", "-m", "disttrain.tf_server")

    def spec(label, task_type, index, argv, critical, rank):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
        env = {**plan.env, **iface_env(iface), "TF_CONFIG": tf_config,
               **_rank_env(rank, world, max(rank - first, 0), plan.nproc, node_rank)}
        return ProcessSpec(label, argv, env, critical)

    procs = []
    if c.sync_mode == "async":
        if node_rank == 0:
            procs.append(spec("chief", "chief", 0, script_argv(c, plan.python), True, 0))
            procs += [spec(f"ps {i}", "ps", i, server, False, 0) for i in range(c.num_ps)]
        procs += [spec(f"worker {first + i}", "worker", first + i, server, False, first + i)
                  for i in range(plan.nproc)]
    else:
        procs += [spec(f"rank {first + i}", "worker", first + i, script_argv(c, plan.python), True, first + i)
                  for i in range(plan.nproc)]
    return procs


@dataclass(frozen=True)
class MxnetWorker:
    node_rank: int
    local_rank: int
    addr: str
    port: int


def mxnet_workers(plan: NodePlan, nodes: list[NodeInfo]) -> list[MxnetWorker]:
    """Every worker of the job, in the order MXNet's scheduler ranks them.

    ps-lite (MXNet 1.9.1's 3rdparty/ps-lite, van.cc) sorts the registered nodes by address,
    descending as strings, then by port, ascending, and numbers the workers in that order.
    Each node's worker ports are given in ascending order of local rank, so a node's workers
    are consecutive ranks in local order; the nodes follow their addresses."""
    num_ps = plan.config.num_ps
    workers = []
    for node in sorted(nodes, key=lambda n: n.node_rank):
        ports = sorted(node.ports[(1 + num_ps) if node.node_rank == 0 else 0:])
        if len(ports) != node.nproc:
            raise ValueError(f"node {node.node_rank} published {len(node.ports)} ports for {node.nproc} processes")
        workers += [MxnetWorker(node.node_rank, i, node.addr, port) for i, port in enumerate(ports)]
    return sorted(workers, key=lambda w: (w.addr, -w.port), reverse=True)


def mxnet_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    """MXNet's parameter-server job: the scheduler and NUM_PS servers on the master (servers
    for the workers, stopped once they end), the workers on every node. Each process gets
    its DMLC_* role; importing mxnet runs a scheduler's or server's loop."""
    c = plan.config
    nodes, node_rank, iface = list(placement.nodes), placement.node_rank, placement.iface
    master = next(n for n in nodes if n.node_rank == 0)
    workers = mxnet_workers(plan, nodes)
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
        procs += [ProcessSpec(f"server {i}", server, {**shared, "DMLC_ROLE": "server", "DMLC_NODE_HOST": master.addr,
                                                      "PORT": str(master.ports[1 + i])}, critical=False)
                  for i in range(c.num_ps)]
    local = [(rank, w) for rank, w in enumerate(workers) if w.node_rank == node_rank]
    for rank, w in sorted(local, key=lambda rw: rw[1].local_rank):
        env = {**shared, "DMLC_ROLE": "worker", "DMLC_NODE_HOST": w.addr, "PORT": str(w.port),
               **_rank_env(rank, len(workers), w.local_rank, len(local), node_rank)}
        procs.append(ProcessSpec(f"rank {rank}", script_argv(c, plan.python), env))
    return procs


def mpi_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    """mpirun starts the entrypoint once per rank; each one sees OMPI_COMM_WORLD_* and runs
    the script directly (ecosystem.py), with RANK/WORLD_SIZE/MASTER_* for torch's env://."""
    c = plan.config
    iface, master_port = placement.iface, placement.master_port or c.master_port
    if plan.mode == "distributed" and placement.node_rank != 0:
        return []          # the master's mpirun reaches this node through the MPI launch agent
    world = plan.nproc * (c.num_nodes if plan.mode == "distributed" else 1)
    env = {**plan.env, **iface_env(iface), "MASTER_ADDR": c.master_addr, "MASTER_PORT": str(master_port),
           "HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "mpi", "ENTRYPOINT": c.entrypoint}
    argv = ["mpirun", "--np", str(world), "--bind-to", "none", "--map-by", "slot", "--tag-output"]
    if c.hostfile:
        argv += ["--hostfile", c.hostfile]
    for name in sorted(env):
        argv += ["-x", name]
    # `--`: what follows is the script's, even a word that names a program (arguments.py).
    argv += ["-x", "PATH", "-x", "DISTTRAIN_MANIFEST", plan.python, "-m", "entrypoint.main", "--", *c.script_args]
    return [ProcessSpec("mpirun", tuple(argv), env)]


def direct_process(plan: NodePlan) -> ProcessSpec:
    d, c = plan.direct, plan.config
    env = {**plan.env, **_rank_env(d.rank, d.world_size, d.local_rank, d.local_world_size,
                                   d.rank // max(1, d.local_world_size)),
           "MASTER_ADDR": c.master_addr, "MASTER_PORT": str(c.master_port)}
    return ProcessSpec(f"rank {d.rank}", script_argv(c, plan.python), env)


def plan_processes(plan: NodePlan, placement: Placement) -> list[ProcessSpec]:
    """The node's processes, once it has joined (the placement)."""
    c = plan.config
    fw = "tensorflow" if c.framework == "keras" else c.framework
    if plan.mode == "direct":
        return [direct_process(plan)]
    if plan.xla_host:
        store_port = (placement.master_port or c.master_port) if plan.mode == "local" else c.xla_port
        return xla_host_processes(plan, placement, store_port)
    if c.launcher == "mpi":
        return mpi_processes(plan, placement)
    if plan.horovod_controller == "mpi":
        # mpirun starts the entrypoint per rank (as LAUNCHER=mpi): Horovod's MPI controller.
        return [replace(s, env={**s.env, "DISTTRAIN_LAUNCHER": c.launcher}) for s in mpi_processes(plan, placement)]
    if c.launcher == "horovod":
        if plan.horovod_elastic:
            return []                  # Horovod's ElasticDriver orders them (horovod_elastic.py)
        specs = horovod_processes(plan, placement)
    elif fw == "pytorch":
        specs = torchrun_processes(plan, placement)
    elif fw == "mxnet":
        specs = mxnet_processes(plan, placement)
    else:
        specs = tensorflow_processes(plan, placement)
    # Tells the in-process guard (disttrain/guard.py) which variable chose this launcher.
    return [replace(s, env={**s.env, "DISTTRAIN_LAUNCHER": c.launcher}) for s in specs]


def command_env(plan: NodePlan) -> dict[str, str]:
    """The environment for a command given after the image (`docker run IMAGE bash`): what
    every training process of this node shares, and NET_IFNAME's interface variables."""
    iface = plan.config.net_ifname
    return {**plan.env, **iface_env(iface), **({"HOROVOD_GLOO_IFACE": iface} if iface else {})}


# --------------------------------------------------------------------------- explaining

def assumed_placement(plan: NodePlan) -> Placement:
    """For EXPLAIN before rendezvous: every node like this one, ports as placeholders."""
    c = plan.config
    count = c.num_nodes if plan.mode == "distributed" and not c.elastic else 1
    nodes = []
    for rank in range(count):
        ports = plan.nproc + (master_servers(c) if rank == 0 else 0) if plan.ports_needed else 0
        addr = c.master_addr if rank == 0 else f"<node {rank} address>"
        nodes.append(NodeInfo(rank, addr, plan.nproc, tuple(range(20000 + 100 * rank, 20000 + 100 * rank + ports))))
    rank = plan.direct.rank if plan.direct else (c.node_rank or 0)
    return Placement(rank, tuple(nodes), iface=c.net_ifname, master_port=c.master_port,
                     horovod_addr=c.master_addr, horovod_port=c.horovod_port)


def explain(plan: NodePlan, processes: list[ProcessSpec] | None, base_env: dict[str, str]) -> str:
    c = plan.config
    lines = [f"disttrain launch plan ({plan.mode})",
             f"  framework:   {c.framework}    launcher: {c.launcher}    sync: {c.sync_mode}    "
             f"parallel: {c.parallel_mode} (tp={plan.env.get('TP_SIZE')}, dp={plan.env.get('DP_SIZE')})",
             f"  node:        role={c.role} node_rank={c.node_rank if c.node_rank is not None else 'at rendezvous'} "
             f"nodes={c.num_nodes if not c.elastic else f'{c.min_nodes}:{c.max_nodes}'} "
             f"processes/node={plan.nproc} "
             f"world={plan.world_size or ('a rank per XLA device, set by PJRT' if plan.xla_host else 'elastic')}",
             f"  accelerator: {plan.accelerator.kind}"
             + (f", PJRT_DEVICE={plan.accelerator.pjrt_device}" if plan.accelerator.xla else "")
             + (f"; {plan.hardware.tpu_text()}" if plan.hardware and plan.accelerator.kind == "tpu" else ""),
             f"  starts:      {plan.launcher}"]
    if plan.rendezvous:
        r = plan.rendezvous
        serves = [what for what, on in (("the job store", r.serve_store), ("Horovod rendezvous", r.horovod_server)) if on]
        lines.append(f"  rendezvous:  job store {r.endpoint}; this node serves: {', '.join(serves) or 'nothing'}; "
                     f"address exchange: {'yes' if r.exchange else 'no'}; timeout {r.timeout}s")
    for source, value in sorted(c.sources.items()):
        lines.append(f"  from scheduler: {source} <- {value}")
    for warning in plan.warnings:
        lines.append(f"  WARNING: {warning}")
    if processes is not None:
        lines.append("  processes:" + (" (assuming every node looks like this one)" if plan.mode == "distributed" else ""))
        if plan.torchrun_in_process:
            lines.append("    (torch's elastic agent runs inside the entrypoint, configured by this torchrun command line)")
        for p in processes:
            keys = sorted(k for k in p.env if base_env.get(k) != p.env[k])
            shown = " ".join(f"{k}={shlex.quote(p.env[k])}" for k in keys if k != "TF_CONFIG")
            lines.append(f"    [{p.label}]{'' if p.critical else ' (server)'} {' '.join(shlex.quote(a) for a in p.argv)}")
            lines.append(f"        env: {shown}")
            if "TF_CONFIG" in p.env:
                lines.append(f"        TF_CONFIG={p.env['TF_CONFIG']}")
    return "\n".join(lines)
