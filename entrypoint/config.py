"""The container's environment contract: every variable, parsed and validated in one place.

`load_config(env, manifest)` turns the environment (after ecosystem translation, see
ecosystem.py) into a frozen Config, or raises ConfigError with one line naming the
variable, the bad value and what is allowed. Nothing here touches the machine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FRAMEWORKS = ("pytorch", "tensorflow", "keras", "mxnet")
TRAIN_MODES = ("local", "distributed")
ROLES = ("master", "worker")
PARALLEL_MODES = ("data_parallel", "model_parallel", "hybrid")
LAUNCHERS = ("native", "horovod", "mpi")
SYNC_MODES = ("sync", "async")
COMM_DEBUG = ("off", "warn", "info", "trace")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-_:]*[A-Za-z0-9])?$")


class ConfigError(Exception):
    """A bad variable. str() is the one line the user sees."""


@dataclass(frozen=True)
class Var:
    name: str
    default: str | None
    help: str


# The contract, in the order the README documents it. Defaults are strings as a user
# would write them; None means "unset unless given" (some are derived, see below).
VARIABLES = (
    Var("FRAMEWORK", "pytorch", "pytorch | tensorflow | keras | mxnet (mxnet only if the image carries it)"),
    Var("TRAIN_MODE", None, "local | distributed; default: distributed when NUM_NODES > 1 or ROLE is set"),
    Var("ROLE", None, "master | worker; default: master for NODE_RANK 0"),
    Var("NUM_NODES", "1", "number of nodes (containers) in the job"),
    Var("NODE_RANK", None, "this node's rank; master is 0; workers without it get one at rendezvous"),
    Var("MASTER_ADDR", None, "master's host name or IP (required when distributed)"),
    Var("MASTER_PORT", "29500", "rendezvous port on the master"),
    Var("NPROC_PER_NODE", None, "processes per node; default: visible GPUs, else 1"),
    Var("PARALLEL_MODE", "data_parallel", "data_parallel | model_parallel | hybrid"),
    Var("TP_SIZE", None, "size of the model-parallel dimension (model_parallel: default world size; "
                         "hybrid: required)"),
    Var("LAUNCHER", "native", "native (torchrun / TF_CONFIG) | horovod | mpi"),
    Var("SYNC_MODE", "sync", "sync | async (TF: parameter servers; PyTorch: local SGD)"),
    Var("SYNC_PERIOD", "8", "async PyTorch: steps between model averages"),
    Var("NUM_PS", "1", "async TensorFlow: parameter-server processes on the master"),
    Var("ENTRYPOINT", "/app/code/train.py", "training script; arguments after the image name pass through"),
    Var("DATA_DIR", "/app/data", "dataset folder, passed to the script"),
    Var("CHECKPOINT_DIR", "/app/checkpoints", "checkpoint folder (rank 0 writes, everyone resumes)"),
    Var("MIN_NODES", None, "elastic PyTorch: fewest nodes (torchrun --nnodes=MIN:MAX)"),
    Var("MAX_NODES", None, "elastic PyTorch: most nodes"),
    Var("MAX_RESTARTS", "0", "PyTorch native: times torchrun restarts the workers after a failure"),
    Var("RDZV_TIMEOUT", "300", "seconds to wait for the master and the other nodes"),
    Var("PEER_TIMEOUT", "10", "seconds without a heartbeat before a node counts as dead"),
    Var("GRACE_PERIOD", "8", "seconds between SIGTERM and SIGKILL when stopping the workers"),
    Var("RUN_ID", "disttrain", "rendezvous id; the same on every node of one job"),
    Var("HOROVOD_PORT", None, "master only: port of Horovod's rendezvous server; default MASTER_PORT+1 "
                            "(workers learn it at rendezvous)"),
    Var("NODE_ADDR", None, "address other nodes reach this node at; default: the one routing to MASTER_ADDR"),
    Var("NET_IFNAME", None, "network interface for NCCL/Gloo/Horovod; default: the one routing to MASTER_ADDR"),
    Var("WORKER_PORT_BASE", None, "TensorFlow: fixed worker ports (base + local rank); default: free ports"),
    Var("HOSTFILE", None, "LAUNCHER=mpi across nodes: an Open MPI hostfile, read by mpirun on the master"),
    Var("IB_HCA", None, "InfiniBand adapters for NCCL (NCCL_IB_HCA), e.g. mlx5_0:1"),
    Var("GPU_DIRECT_RDMA", None, "0 | 1: GPUDirect RDMA for NCCL (NCCL_NET_GDR_LEVEL=3 when 1)"),
    Var("P2P_DISABLE", None, "0 | 1: disable NCCL peer-to-peer (NCCL_P2P_DISABLE), for poor PCIe topologies"),
    Var("COMM_DEBUG", None, "off | warn | info | trace: NCCL_DEBUG for the workers"),
    Var("EXPLAIN", "0", "1: print the launch plan and exit without starting anything"),
)
VARIABLE_NAMES = tuple(v.name for v in VARIABLES)

# Seed-advice variables -> the NCCL variable each one sets (a user's own NCCL_* must agree).
NCCL_MAPPING = {"IB_HCA": "NCCL_IB_HCA", "P2P_DISABLE": "NCCL_P2P_DISABLE", "COMM_DEBUG": "NCCL_DEBUG",
                "GPU_DIRECT_RDMA": "NCCL_NET_GDR_LEVEL"}


@dataclass(frozen=True)
class Config:
    framework: str
    train_mode: str
    role: str
    num_nodes: int
    node_rank: int | None
    master_addr: str
    master_port: int
    nproc_per_node: int | None          # None: decided from the hardware at plan time
    parallel_mode: str
    tp_size: int | None
    launcher: str
    sync_mode: str
    sync_period: int
    num_ps: int
    entrypoint: str
    script_args: tuple[str, ...]
    data_dir: str
    checkpoint_dir: str
    min_nodes: int | None
    max_nodes: int | None
    max_restarts: int
    rdzv_timeout: int
    peer_timeout: int
    grace_period: int
    run_id: str
    horovod_port: int
    node_addr: str | None
    net_ifname: str | None
    worker_port_base: int | None
    hostfile: str | None
    nccl_env: dict[str, str] = field(default_factory=dict)
    explain: bool = False
    tf_config: str | None = None        # passed through from a TFJob
    sources: dict[str, str] = field(default_factory=dict)   # variable -> where its value came from

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None

    @property
    def distributed(self) -> bool:
        return self.train_mode == "distributed"


# --------------------------------------------------------------------------- parsing helpers

def _fail(name: str, value: str, allowed: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {allowed}")


def _choice(env: dict, name: str, choices: tuple[str, ...], default: str | None) -> str | None:
    value = env.get(name, default)
    if value is None:
        return None
    normalized = value.strip().lower()
    if normalized not in choices:
        raise _fail(name, value, "allowed: " + ", ".join(choices))
    return normalized


def _int(env: dict, name: str, default: str | None, low: int, high: int | None = None) -> int | None:
    value = env.get(name, default)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise _fail(name, value, f"must be an integer >= {low}" + (f" and <= {high}" if high else "")) from None
    if number < low or (high is not None and number > high):
        raise _fail(name, value, f"must be an integer >= {low}" + (f" and <= {high}" if high else ""))
    return number


def _flag(env: dict, name: str, default: str | None) -> bool | None:
    value = env.get(name, default)
    if value is None:
        return None
    normalized = value.strip().lower()
    if normalized in ("1", "true", "yes", "on"):
        return True
    if normalized in ("0", "false", "no", "off", ""):
        return False
    raise _fail(name, value, "allowed: 0, 1")


def _host(env: dict, name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    value = value.strip()
    if not HOST_RE.match(value):
        raise _fail(name, value, "must be a host name or IP address")
    return value


def _nccl_env(env: dict) -> dict[str, str]:
    """The seed's NCCL advice as our variables -> NCCL_* settings; a user's NCCL_* must agree."""
    wanted: dict[str, str] = {}
    if env.get("IB_HCA"):
        if not re.match(r"^[\^=]?[A-Za-z0-9_]+(:\d+)?(,[A-Za-z0-9_]+(:\d+)?)*$", env["IB_HCA"]):
            raise _fail("IB_HCA", env["IB_HCA"], "must be a list of HCAs like mlx5_0:1,mlx5_1:1")
        wanted["NCCL_IB_HCA"] = env["IB_HCA"]
    gdr = _flag(env, "GPU_DIRECT_RDMA", None)
    if gdr is not None:
        wanted["NCCL_NET_GDR_LEVEL"] = "3" if gdr else "0"
    p2p = _flag(env, "P2P_DISABLE", None)
    if p2p is not None:
        wanted["NCCL_P2P_DISABLE"] = "1" if p2p else "0"
    debug = _choice(env, "COMM_DEBUG", COMM_DEBUG, None)
    if debug is not None and debug != "off":
        wanted["NCCL_DEBUG"] = debug.upper()
    for ours, nccl in NCCL_MAPPING.items():
        if nccl in wanted and nccl in env and env[nccl] != wanted[nccl]:
            raise ConfigError(f"{ours}={env[ours]!r} conflicts with {nccl}={env[nccl]!r}; "
                              f"set only one of them")
    return wanted


# --------------------------------------------------------------------------- the contract

def load_config(env: dict[str, str], frameworks: list[str], launchers: list[str],
                script_args: tuple[str, ...] = (), sources: dict[str, str] | None = None) -> Config:
    """Validate every variable. `frameworks`/`launchers` are what the image carries."""
    framework = (env.get("FRAMEWORK") or "pytorch").strip().lower()
    if framework not in FRAMEWORKS:
        raise _fail("FRAMEWORK", env["FRAMEWORK"], "allowed: " + ", ".join(frameworks)
                    + ("" if "mxnet" in frameworks else " (mxnet: not in this image)"))
    if framework not in frameworks:
        if framework == "mxnet":
            raise ConfigError("FRAMEWORK='mxnet': MXNet is retired upstream (Apache attic, 2023) and this "
                              "image does not carry it; allowed here: " + ", ".join(frameworks))
        raise ConfigError(f"FRAMEWORK={env.get('FRAMEWORK')!r}: not in this image; allowed here: "
                          + ", ".join(frameworks))
    launcher = _choice(env, "LAUNCHER", LAUNCHERS, "native")
    if launcher not in launchers:
        raise ConfigError(f"LAUNCHER={launcher!r}: not in this image; allowed here: " + ", ".join(launchers))

    num_nodes = _int(env, "NUM_NODES", "1", 1)
    node_rank = _int(env, "NODE_RANK", None, 0)
    role = _choice(env, "ROLE", ROLES, None)
    min_nodes = _int(env, "MIN_NODES", None, 1)
    max_nodes = _int(env, "MAX_NODES", None, 1)
    if (min_nodes is None) != (max_nodes is None):
        missing = "MAX_NODES" if max_nodes is None else "MIN_NODES"
        given = "MIN_NODES" if max_nodes is None else "MAX_NODES"
        raise ConfigError(f"{given}={env[given]!r}: elastic training needs both MIN_NODES and MAX_NODES; "
                          f"{missing} is not set")
    if min_nodes is not None and min_nodes > max_nodes:
        raise _fail("MIN_NODES", env["MIN_NODES"], f"must be <= MAX_NODES ({max_nodes})")
    elastic = min_nodes is not None

    default_mode = "distributed" if (num_nodes > 1 or role is not None or elastic) else "local"
    train_mode = _choice(env, "TRAIN_MODE", TRAIN_MODES, default_mode)
    master_addr = _host(env, "MASTER_ADDR")
    master_port = _int(env, "MASTER_PORT", "29500", 1, 65535)

    if train_mode == "local":
        if num_nodes != 1:
            raise _fail("NUM_NODES", env["NUM_NODES"], "TRAIN_MODE=local runs one node; allowed: 1, "
                                                       "or set TRAIN_MODE=distributed")
        if elastic:
            raise ConfigError("MIN_NODES/MAX_NODES: elastic training needs TRAIN_MODE=distributed")
        role = "master"
        node_rank = 0
        master_addr = master_addr or "127.0.0.1"
    else:
        if master_addr is None:
            raise ConfigError("MASTER_ADDR is not set: TRAIN_MODE=distributed needs the master's host "
                              "name or IP on every node")
        upper = max_nodes if elastic else num_nodes
        if node_rank is not None and node_rank >= upper:
            raise _fail("NODE_RANK", env["NODE_RANK"], f"must be < {'MAX_NODES' if elastic else 'NUM_NODES'} "
                                                       f"({upper})")
        if role is None:
            if node_rank is None:
                raise ConfigError("ROLE is not set: allowed: master, worker (or set NODE_RANK; 0 is the master)")
            role = "master" if node_rank == 0 else "worker"
        if role == "master":
            if node_rank not in (None, 0):
                raise _fail("NODE_RANK", env["NODE_RANK"], "the master is node 0; allowed with ROLE=master: 0")
            node_rank = 0
        elif node_rank == 0:
            raise _fail("NODE_RANK", env["NODE_RANK"], "0 is the master's rank; allowed with ROLE=worker: "
                                                       f"1..{upper - 1}")
        if not elastic and role == "worker" and num_nodes < 2:
            raise _fail("NUM_NODES", env.get("NUM_NODES", "1"), "a worker needs NUM_NODES >= 2")

    nproc = env.get("NPROC_PER_NODE")
    nproc_per_node = None if nproc in (None, "", "auto") else _int(env, "NPROC_PER_NODE", None, 1)

    parallel_mode = _choice(env, "PARALLEL_MODE", PARALLEL_MODES, "data_parallel")
    tp_size = _int(env, "TP_SIZE", None, 1)
    if parallel_mode == "data_parallel" and tp_size not in (None, 1):
        raise _fail("TP_SIZE", env["TP_SIZE"], "PARALLEL_MODE=data_parallel has no model-parallel "
                                               "dimension; allowed: 1, or PARALLEL_MODE=model_parallel|hybrid")
    if parallel_mode == "hybrid" and tp_size is None:
        raise ConfigError("TP_SIZE is not set: PARALLEL_MODE=hybrid needs the model-parallel size "
                          "(world size = TP_SIZE x data-parallel size)")
    if parallel_mode != "data_parallel" and framework not in ("pytorch",):
        raise _fail("PARALLEL_MODE", env["PARALLEL_MODE"], f"FRAMEWORK={framework} supports data_parallel "
                                                           f"here; allowed: data_parallel")

    sync_mode = _choice(env, "SYNC_MODE", SYNC_MODES, "sync")
    if sync_mode == "async" and launcher != "native":
        raise _fail("SYNC_MODE", env["SYNC_MODE"], f"LAUNCHER={launcher} synchronises every step; "
                                                   "allowed: sync (async needs LAUNCHER=native)")
    if sync_mode == "async" and parallel_mode != "data_parallel":
        raise _fail("SYNC_MODE", env["SYNC_MODE"], "asynchronous training is data-parallel only; "
                                                   "allowed with PARALLEL_MODE=" + parallel_mode + ": sync")

    max_restarts = _int(env, "MAX_RESTARTS", "0", 0)
    if max_restarts and not (framework == "pytorch" and launcher == "native"):
        raise _fail("MAX_RESTARTS", env["MAX_RESTARTS"], "restarts are torchrun's (FRAMEWORK=pytorch, "
                                                         "LAUNCHER=native); allowed here: 0")
    if elastic and not (framework == "pytorch" and launcher == "native"):
        raise ConfigError(f"MIN_NODES/MAX_NODES: elastic training is torchrun's; needs FRAMEWORK=pytorch and "
                          f"LAUNCHER=native, got FRAMEWORK={framework} LAUNCHER={launcher}")

    hostfile = env.get("HOSTFILE") or None
    if hostfile and launcher != "mpi":
        raise _fail("HOSTFILE", hostfile, "only LAUNCHER=mpi reads a hostfile")
    if launcher == "mpi" and train_mode == "distributed" and not hostfile:
        raise ConfigError("HOSTFILE is not set: LAUNCHER=mpi across nodes needs an Open MPI hostfile on "
                          "the master (one line per node: 'host slots=N')")

    entrypoint = env.get("ENTRYPOINT") or "/app/code/train.py"
    run_id = env.get("RUN_ID", "disttrain")
    if not re.match(r"^[A-Za-z0-9_.-]{1,64}$", run_id):
        raise _fail("RUN_ID", run_id, "allowed: 1-64 letters, digits, '_', '.', '-'")

    horovod_port = _int(env, "HOROVOD_PORT", None, 1, 65535)
    if horovod_port is None:
        if master_port == 65535:
            raise _fail("MASTER_PORT", str(master_port), "Horovod uses MASTER_PORT+1; set HOROVOD_PORT")
        horovod_port = master_port + 1
    if horovod_port == master_port:
        raise _fail("HOROVOD_PORT", env["HOROVOD_PORT"], f"must differ from MASTER_PORT ({master_port})")

    net_ifname = env.get("NET_IFNAME") or None
    if net_ifname and not re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", net_ifname):
        raise _fail("NET_IFNAME", net_ifname, "must be a network interface name like eth0")

    tf_config = env.get("TF_CONFIG") or None
    if tf_config and framework not in ("tensorflow", "keras"):
        raise ConfigError(f"TF_CONFIG is set but FRAMEWORK={framework}; TF_CONFIG is for "
                          f"FRAMEWORK=tensorflow or keras")

    return Config(
        framework=framework, train_mode=train_mode, role=role, num_nodes=num_nodes, node_rank=node_rank,
        master_addr=master_addr, master_port=master_port, nproc_per_node=nproc_per_node,
        parallel_mode=parallel_mode, tp_size=tp_size, launcher=launcher, sync_mode=sync_mode,
        sync_period=_int(env, "SYNC_PERIOD", "8", 1), num_ps=_int(env, "NUM_PS", "1", 1),
        entrypoint=entrypoint, script_args=tuple(script_args),
        data_dir=env.get("DATA_DIR") or "/app/data", checkpoint_dir=env.get("CHECKPOINT_DIR") or "/app/checkpoints",
        min_nodes=min_nodes, max_nodes=max_nodes, max_restarts=max_restarts,
        rdzv_timeout=_int(env, "RDZV_TIMEOUT", "300", 1), peer_timeout=_int(env, "PEER_TIMEOUT", "10", 2),
        grace_period=_int(env, "GRACE_PERIOD", "8", 0), run_id=run_id, horovod_port=horovod_port,
        node_addr=_host(env, "NODE_ADDR"), net_ifname=net_ifname,
        worker_port_base=_int(env, "WORKER_PORT_BASE", None, 1024, 65000), hostfile=hostfile,
        nccl_env=_nccl_env(env), explain=bool(_flag(env, "EXPLAIN", "0")), tf_config=tf_config,
        sources=dict(sources or {}),
    )
