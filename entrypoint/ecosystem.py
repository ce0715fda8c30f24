"""Other schedulers' variables -> this image's contract. Pure.

So that one image runs under Kubeflow, Slurm, mpirun and TFJob unchanged:

* Kubeflow PyTorchJob: PET_NNODES ('2' or '1:4'), PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ENDPOINT, PET_MAX_RESTARTS; without PET_*,
  WORLD_SIZE and RANK count pods (nodes).
* Slurm: one task per node (srun --ntasks-per-node=1) makes this container a node
  (SLURM_NNODES, SLURM_NODEID, master = first host of SLURM_JOB_NODELIST); several tasks
  per node make each task one rank, run directly.
* mpirun (OMPI_COMM_WORLD_*) and MPICH/Intel MPI (PMI_RANK, PMI_SIZE): each process is one
  rank, run directly. LAUNCHER=mpi relies on this: mpirun starts the entrypoint per rank.
* TFJob: TF_CONFIG is passed through untouched; the container runs its one task.
* TPU slices (GKE sets these for TPU pods; so may a user): TPU_WORKER_HOSTNAMES gives
  NUM_NODES and MASTER_ADDR (its first host), TPU_WORKER_ID the NODE_RANK.

Explicit variables win. If an explicit variable and a scheduler's variable disagree, that
is an error rather than a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .config import ConfigError


@dataclass(frozen=True)
class DirectRank:
    """This process was started by an outer launcher as one rank of the job."""
    source: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


@dataclass(frozen=True)
class Translation:
    env: dict[str, str]                       # the contract's variables, explicit + derived
    sources: dict[str, str] = field(default_factory=dict)   # variable -> scheduler variable it came from
    scheduler: str | None = None
    direct: DirectRank | None = None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: 'gpu[07-09,12],cpu1' -> 'gpu07'."""
    text = nodelist.strip()
    depth, end = 0, len(text)
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            end = i
            break
    entry = text[:end]
    match = re.match(r"^([^\[]*)\[([^\]]+)\](.*)$", entry)
    if not match:
        return entry
    prefix, ranges, suffix = match.groups()
    first = ranges.split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"


def _int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r}: must be an integer (set by the scheduler)") from None


class _Collector:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.derived: dict[str, str] = {}
        self.sources: dict[str, str] = {}

    def put(self, name: str, value, source: str) -> None:
        value = str(value)
        if name in self.env and self.env[name] != value:
            raise ConfigError(f"{name}={self.env[name]!r} conflicts with {source}={self.env.get(source, value)!r}"
                              f"; remove one of them")
        if name in self.derived and self.derived[name] != value:
            raise ConfigError(f"{name}: {self.sources[name]} says {self.derived[name]!r} but {source} says "
                              f"{value!r}")
        self.derived[name] = value
        self.sources.setdefault(name, source)


def _kubeflow(env: dict[str, str], c: _Collector) -> bool:
    pet = {k: v for k, v in env.items() if k.startswith("PET_")}
    if not pet and not ("WORLD_SIZE" in env and "RANK" in env and "MASTER_ADDR" in env):
        return False
    nnodes = pet.get("PET_NNODES")
    if nnodes:
        if ":" in nnodes:
            low, high = nnodes.split(":", 1)
            c.put("MIN_NODES", _int("PET_NNODES", low), "PET_NNODES")
            c.put("MAX_NODES", _int("PET_NNODES", high), "PET_NNODES")
        else:
            c.put("NUM_NODES", _int("PET_NNODES", nnodes), "PET_NNODES")
    if "PET_NPROC_PER_NODE" in pet and pet["PET_NPROC_PER_NODE"] not in ("auto", "gpu", "cpu"):
        c.put("NPROC_PER_NODE", _int("PET_NPROC_PER_NODE", pet["PET_NPROC_PER_NODE"]), "PET_NPROC_PER_NODE")
    if "PET_NODE_RANK" in pet:
        c.put("NODE_RANK", _int("PET_NODE_RANK", pet["PET_NODE_RANK"]), "PET_NODE_RANK")
    if "PET_RDZV_ENDPOINT" in pet:
        host, _, port = pet["PET_RDZV_ENDPOINT"].rpartition(":")
        if host and port:
            c.put("MASTER_ADDR", host, "PET_RDZV_ENDPOINT")
            c.put("MASTER_PORT", _int("PET_RDZV_ENDPOINT", port), "PET_RDZV_ENDPOINT")
    if "PET_MASTER_ADDR" in pet:
        c.put("MASTER_ADDR", pet["PET_MASTER_ADDR"], "PET_MASTER_ADDR")
    if "PET_MASTER_PORT" in pet:
        c.put("MASTER_PORT", _int("PET_MASTER_PORT", pet["PET_MASTER_PORT"]), "PET_MASTER_PORT")
    if "PET_MAX_RESTARTS" in pet:
        c.put("MAX_RESTARTS", _int("PET_MAX_RESTARTS", pet["PET_MAX_RESTARTS"]), "PET_MAX_RESTARTS")

    if "WORLD_SIZE" in env and "RANK" in env:
        world, rank = _int("WORLD_SIZE", env["WORLD_SIZE"]), _int("RANK", env["RANK"])
        if nnodes is None and "PET_NODE_RANK" not in pet:
            # Plain PyTorchJob: one process per pod, so pods are nodes.
            c.put("NUM_NODES", world, "WORLD_SIZE")
            c.put("NODE_RANK", rank, "RANK")
        elif nnodes and ":" not in nnodes:
            nproc = pet.get("PET_NPROC_PER_NODE")
            if nproc and nproc.isdigit() and world not in (int(nnodes), int(nnodes) * int(nproc)):
                raise ConfigError(f"WORLD_SIZE={env['WORLD_SIZE']!r} conflicts with PET_NNODES={nnodes!r} x "
                                  f"PET_NPROC_PER_NODE={nproc!r}")
    return True


def _slurm(env: dict[str, str], c: _Collector) -> DirectRank | None:
    nnodes = _int("SLURM_NNODES", env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES", "1"))
    ntasks = _int("SLURM_NTASKS", env.get("SLURM_NTASKS", str(nnodes)))
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if nodelist:
        c.put("MASTER_ADDR", first_host(nodelist), "SLURM_JOB_NODELIST")
    if "SLURM_JOB_ID" in env and "RUN_ID" not in env:
        c.put("RUN_ID", f"slurm-{env['SLURM_JOB_ID']}", "SLURM_JOB_ID")
    if ntasks <= nnodes:
        c.put("NUM_NODES", nnodes, "SLURM_NNODES")
        c.put("NODE_RANK", _int("SLURM_NODEID", env.get("SLURM_NODEID", "0")), "SLURM_NODEID")
        return None
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or ""
    match = re.match(r"^(\d+)", per_node)
    local_world = int(match.group(1)) if match else max(1, ntasks // nnodes)
    return DirectRank("slurm", rank=_int("SLURM_PROCID", env["SLURM_PROCID"]), world_size=ntasks,
                      local_rank=_int("SLURM_LOCALID", env.get("SLURM_LOCALID", "0")),
                      local_world_size=local_world)


def _tpu_slice(env: dict[str, str], c: _Collector) -> bool:
    hosts = [h.strip() for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if len(hosts) > 1:
        c.put("NUM_NODES", len(hosts), "TPU_WORKER_HOSTNAMES")
        c.put("MASTER_ADDR", hosts[0], "TPU_WORKER_HOSTNAMES")
    if "TPU_WORKER_ID" in env and len(hosts) != 1:
        c.put("NODE_RANK", _int("TPU_WORKER_ID", env["TPU_WORKER_ID"]), "TPU_WORKER_ID")
    return len(hosts) > 1


def _mpi(env: dict[str, str]) -> DirectRank | None:
    if "OMPI_COMM_WORLD_RANK" in env:
        g = lambda k, d=None: _int(k, env.get(k, d))  # noqa: E731
        return DirectRank("mpirun", rank=g("OMPI_COMM_WORLD_RANK"), world_size=g("OMPI_COMM_WORLD_SIZE"),
                          local_rank=g("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
                          local_world_size=g("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return DirectRank("mpirun", rank=_int("PMI_RANK", env["PMI_RANK"]), world_size=_int("PMI_SIZE", env["PMI_SIZE"]),
                          local_rank=_int("MPI_LOCALRANKID", env.get("MPI_LOCALRANKID", "0")),
                          local_world_size=_int("MPI_LOCALNRANKS", env.get("MPI_LOCALNRANKS", "1")))
    return None


def translate(env: dict[str, str]) -> Translation:
    """Explicit contract variables plus what the scheduler's own variables imply."""
    c = _Collector(env)
    scheduler, direct = None, None
    mpi = _mpi(env)
    if mpi:
        scheduler, direct = "mpirun", mpi
    elif "SLURM_PROCID" in env:
        scheduler, direct = "slurm", _slurm(env, c)
    elif _kubeflow(env, c):
        scheduler = "kubeflow"
    elif _tpu_slice(env, c):
        scheduler = "tpu-slice"
    if env.get("TF_CONFIG"):
        scheduler = scheduler or "tfjob"
        if env.get("TRAIN_MODE", "distributed") != "distributed":
            raise ConfigError(f"TRAIN_MODE={env['TRAIN_MODE']!r} conflicts with TF_CONFIG (a TFJob runs "
                              f"distributed); unset one of them")
    merged = {**c.derived, **env}
    return Translation(env=merged, sources=c.sources, scheduler=scheduler, direct=direct)
