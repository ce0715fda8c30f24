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
* Batch services and Kubernetes controllers that start the containers of one multi-node
  job (`_batch_platforms`): AWS Batch multi-node parallel jobs (AWS_BATCH_JOB_*), Kubernetes
  LeaderWorkerSet (LWS_*), Volcano (VC_TASK_INDEX and its VC_<TASK>_HOSTS lists), SageMaker
  (SM_HOSTS, SM_CURRENT_HOST), Vertex AI (CLUSTER_SPEC), JobSet (JOBSET_NAME,
  REPLICATED_JOB_NAME, JOB_INDEX) and Indexed Jobs (JOB_COMPLETION_INDEX, with NUM_NODES).

Explicit variables win. If an explicit variable and a scheduler's variable disagree, that
is an error rather than a guess.
"""

from __future__ import annotations

import json
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


# --------------------------------------------------------------------------- batch platforms
# Each reads its platform's variables, or returns False when they are not there. The node
# the platform marks as the main or leader one becomes node 0 (the master).

def _aws_batch(env: dict[str, str], c: _Collector) -> bool:
    """AWS Batch multi-node parallel jobs: the main node may have any index; only the
    other nodes are told its address (the main node reaches itself by its own name)."""
    if "AWS_BATCH_JOB_NUM_NODES" not in env:
        return False
    nodes = _int("AWS_BATCH_JOB_NUM_NODES", env["AWS_BATCH_JOB_NUM_NODES"])
    index = _int("AWS_BATCH_JOB_NODE_INDEX", env.get("AWS_BATCH_JOB_NODE_INDEX", "0"))
    main = _int("AWS_BATCH_JOB_MAIN_NODE_INDEX", env.get("AWS_BATCH_JOB_MAIN_NODE_INDEX", "0"))
    c.put("NUM_NODES", nodes, "AWS_BATCH_JOB_NUM_NODES")
    c.put("NODE_RANK", (index - main) % max(1, nodes), "AWS_BATCH_JOB_NODE_INDEX")
    if env.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"):
        c.put("MASTER_ADDR", env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"],
              "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS")
    elif index == main and env.get("HOSTNAME"):
        c.put("MASTER_ADDR", env["HOSTNAME"], "HOSTNAME")
    if env.get("AWS_BATCH_JOB_ID") and "RUN_ID" not in env:
        c.put("RUN_ID", re.sub(r"[^A-Za-z0-9_.-]", "-", env["AWS_BATCH_JOB_ID"].split("#")[0])[:64], "AWS_BATCH_JOB_ID")
    return True


def _leader_worker_set(env: dict[str, str], c: _Collector) -> bool:
    """Kubernetes LeaderWorkerSet: one group per job, its leader (worker index 0) the master."""
    if "LWS_LEADER_ADDRESS" not in env:
        return False
    c.put("MASTER_ADDR", env["LWS_LEADER_ADDRESS"], "LWS_LEADER_ADDRESS")
    if "LWS_GROUP_SIZE" in env:
        c.put("NUM_NODES", _int("LWS_GROUP_SIZE", env["LWS_GROUP_SIZE"]), "LWS_GROUP_SIZE")
    if "LWS_WORKER_INDEX" in env:
        c.put("NODE_RANK", _int("LWS_WORKER_INDEX", env["LWS_WORKER_INDEX"]), "LWS_WORKER_INDEX")
    return True


def _volcano(env: dict[str, str], c: _Collector) -> bool:
    """Volcano's svc plugin: VC_<TASK>_HOSTS (comma-separated) and VC_<TASK>_NUM for every
    task of the job. The master is the first host of the task named master (else of the only
    task); nodes are numbered through the tasks, master first, then by task name. This pod
    finds itself by its HOSTNAME in the lists (VC_TASK_INDEX when the job has one task)."""
    lists = {k[len("VC_"):-len("_HOSTS")]: [h.strip() for h in v.split(",") if h.strip()]
             for k, v in env.items() if k.startswith("VC_") and k.endswith("_HOSTS")}
    if not lists or not ("VC_TASK_INDEX" in env or "VK_TASK_INDEX" in env):
        return False
    tasks = sorted(lists, key=lambda t: (t.lower() != "master", t))
    if len(tasks) > 1 and tasks[0].lower() != "master":
        raise ConfigError(f"VC_{'_HOSTS, VC_'.join(tasks)}_HOSTS: a Volcano job of several tasks needs one named "
                          f"'master' (its first host is MASTER_ADDR)")
    hosts = [h for t in tasks for h in lists[t]]
    c.put("NUM_NODES", len(hosts), f"VC_{tasks[0]}_HOSTS")
    c.put("MASTER_ADDR", hosts[0], f"VC_{tasks[0]}_HOSTS")
    me = env.get("HOSTNAME", "")
    mine = [k for k, h in enumerate(hosts) if h == me or h.split(".")[0] == me]
    if mine:
        c.put("NODE_RANK", mine[0], "HOSTNAME")
    elif len(tasks) == 1:
        name = "VC_TASK_INDEX" if "VC_TASK_INDEX" in env else "VK_TASK_INDEX"
        c.put("NODE_RANK", _int(name, env[name]), name)
    return True


def _sagemaker(env: dict[str, str], c: _Collector) -> bool:
    """SageMaker training jobs: SM_HOSTS (a JSON list) and SM_CURRENT_HOST; the first host
    is the master, as SageMaker's own distributed examples choose it."""
    if "SM_HOSTS" not in env or "SM_CURRENT_HOST" not in env:
        return False
    try:
        hosts = json.loads(env["SM_HOSTS"])
    except ValueError:
        raise ConfigError(f"SM_HOSTS={env['SM_HOSTS']!r}: must be a JSON list of host names (set by SageMaker)") from None
    if not isinstance(hosts, list) or env["SM_CURRENT_HOST"] not in hosts:
        raise ConfigError(f"SM_CURRENT_HOST={env['SM_CURRENT_HOST']!r} is not one of SM_HOSTS={env['SM_HOSTS']!r}")
    c.put("NUM_NODES", len(hosts), "SM_HOSTS")
    c.put("MASTER_ADDR", hosts[0], "SM_HOSTS")
    c.put("NODE_RANK", hosts.index(env["SM_CURRENT_HOST"]), "SM_CURRENT_HOST")
    return True


def _vertex(env: dict[str, str], c: _Collector) -> bool:
    """Vertex AI custom training: CLUSTER_SPEC's worker pools 0 (the primary replica, the
    master) and 1 (the workers); pool 2 (reduction servers) and 3 (evaluators) run no ranks."""
    if "CLUSTER_SPEC" not in env:
        return False
    try:
        spec = json.loads(env["CLUSTER_SPEC"])
        pools = spec["cluster"]
        task = spec["task"]
        me = (task["type"], int(task["index"]))
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"CLUSTER_SPEC={env['CLUSTER_SPEC']!r}: not Vertex AI's cluster spec (set by Vertex AI)") from None
    ranked = [(pool, i) for pool in ("workerpool0", "workerpool1") for i in range(len(pools.get(pool, [])))]
    if me not in ranked:
        return True                            # a reduction server or an evaluator: not a node of the job
    c.put("NUM_NODES", len(ranked), "CLUSTER_SPEC")
    c.put("MASTER_ADDR", pools["workerpool0"][0].rsplit(":", 1)[0], "CLUSTER_SPEC")
    c.put("NODE_RANK", ranked.index(me), "CLUSTER_SPEC")
    return True


def _jobset_or_indexed_job(env: dict[str, str], c: _Collector) -> bool:
    """JobSet: the master is the first pod of the first job (its DNS name, with JobSet's
    default subdomain, the JobSet's name); Indexed Jobs: JOB_COMPLETION_INDEX is the node
    rank of a job that says NUM_NODES (an Indexed Job of independent runs says nothing)."""
    if "JOBSET_NAME" in env and "REPLICATED_JOB_NAME" in env:
        name, job = env["JOBSET_NAME"], env["REPLICATED_JOB_NAME"]
        c.put("MASTER_ADDR", f"{name}-{job}-0-0.{name}", "JOBSET_NAME")
        first_job = _int("JOB_INDEX", env.get("JOB_INDEX", "0")) == 0
        if first_job and "JOB_COMPLETION_INDEX" in env:
            c.put("NODE_RANK", _int("JOB_COMPLETION_INDEX", env["JOB_COMPLETION_INDEX"]), "JOB_COMPLETION_INDEX")
        elif not first_job:
            c.put("ROLE", "worker", "JOB_INDEX")   # a later job's pods: workers, ranked at rendezvous
        return True
    if "JOB_COMPLETION_INDEX" in env and env.get("NUM_NODES", "1").strip() not in ("", "1"):
        c.put("NODE_RANK", _int("JOB_COMPLETION_INDEX", env["JOB_COMPLETION_INDEX"]), "JOB_COMPLETION_INDEX")
        return True
    return False


BATCH_PLATFORMS = (("aws-batch", _aws_batch), ("leaderworkerset", _leader_worker_set), ("volcano", _volcano),
                   ("sagemaker", _sagemaker), ("vertex-ai", _vertex), ("jobset", _jobset_or_indexed_job))


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
    else:
        scheduler = next((name for name, reads in BATCH_PLATFORMS if reads(env, c)), None)
    if env.get("TF_CONFIG"):
        scheduler = scheduler or "tfjob"
        if env.get("TRAIN_MODE", "distributed") != "distributed":
            raise ConfigError(f"TRAIN_MODE={env['TRAIN_MODE']!r} conflicts with TF_CONFIG (a TFJob runs "
                              f"distributed); unset one of them")
    merged = {**c.derived, **env}
    return Translation(env=merged, sources=c.sources, scheduler=scheduler, direct=direct)
