"""The container's environment contract: every variable, parsed and validated in one place.

Each variable is declared once in `VARIABLES`: its name, its kind (which also says what is
allowed: choices, integer bounds, a pattern), its default and its help. `load_config`
reads every variable by its declaration, then applies the cross-variable rules in
`RULES` (small named functions, in order), and returns a frozen Config, or raises
ConfigError with one line naming the variable, the bad value and what is allowed.
Nothing here touches the machine.

Variables of the frameworks and libraries that the planner reads (OMP_NUM_THREADS,
PJRT_DEVICE, ...) are declared here too, as `PassThrough`: they reach the processes as the
user set them, and Config.passed holds the ones that are set, so the contract has one
table. `docs/configuration.md` is generated from it (`python -m entrypoint.contract.reference`).

An empty value counts as unset (compose files pass `${VAR:-}` through as '').
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from disttrain.gradsync_settings import GradSync

from .grad_sync import COMPRESSIONS, refusal
from .manifest import Image
from .urls import BucketUrl, UrlError, has_scheme, parse_bucket_url, parse_store_url

FRAMEWORKS = ("pytorch", "tensorflow", "keras", "mxnet")
TRAIN_MODES = ("local", "distributed")
ROLES = ("master", "worker")
PARALLEL_MODES = ("data_parallel", "model_parallel", "hybrid")
LAUNCHERS = ("native", "horovod", "mpi")
SYNC_MODES = ("sync", "async")
COMM_DEBUG = ("off", "warn", "info", "trace")
ACCELERATORS = ("auto", "cpu", "gpu", "tpu")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-_:]*[A-Za-z0-9])?$")

# Why a known framework is missing from an image, when there is more to say than "not here".
# (The variant named for MXNet is checked against matrix.yaml by the unit tests.)
MXNET_VARIANT = "cpu-mxnet"
NOT_IN_IMAGE = {"mxnet": f"this image does not carry MXNet (retired upstream, CPU only); the {MXNET_VARIANT} "
                         f"variant has it",
                "tpu": "TPUs need PyTorch/XLA, which only the tpu variant carries"}


class ConfigError(Exception):
    """A bad variable. str() is the one line the user sees."""


def _fail(name: str, value: str, allowed: str) -> ConfigError:
    return ConfigError(f"{name}={value!r}: {allowed}")


# --------------------------------------------------------------------------- kinds
# A kind turns one variable's text into a value, or raises the one-line error.

@dataclass(frozen=True)
class Choice:
    choices: tuple[str, ...]
    offered_by_image: str | None = None      # 'frameworks' | 'launchers': the image narrows the choice

    def parse(self, name: str, text: str, image: Image) -> str:
        value = text.strip().lower()
        offered = getattr(image, self.offered_by_image) if self.offered_by_image else self.choices
        if value not in self.choices:
            hint = "".join(f" ({c}: not in this image)" for c in self.choices
                           if c not in offered and c in NOT_IN_IMAGE)
            raise _fail(name, text, "allowed: " + ", ".join(offered) + hint)
        if value not in offered:
            why = NOT_IN_IMAGE.get(value)
            if why:
                raise ConfigError(f"{name}={value!r}: {why}; allowed here: " + ", ".join(offered))
            raise ConfigError(f"{name}={text!r}: not in this image; allowed here: " + ", ".join(offered))
        return value


@dataclass(frozen=True)
class Int:
    low: int
    high: int | None = None
    auto: bool = False                        # 'auto' means unset (decided later)

    def parse(self, name: str, text: str, image: Image) -> int | None:
        if self.auto and text.strip().lower() == "auto":
            return None
        bounds = (f"must be an integer >= {self.low}" + (f" and <= {self.high}" if self.high else "")
                  + (", or auto" if self.auto else ""))
        try:
            number = int(text.strip())
        except ValueError:
            raise _fail(name, text, bounds) from None
        if number < self.low or (self.high is not None and number > self.high):
            raise _fail(name, text, bounds)
        return number


@dataclass(frozen=True)
class OffOrInt:
    """0 turns the feature off; anything else must be at least `low`."""
    low: int

    def parse(self, name: str, text: str, image: Image) -> int:
        allowed = f"allowed: 0 (off) or an integer >= {self.low}"
        try:
            number = int(text.strip())
        except ValueError:
            raise _fail(name, text, allowed) from None
        if number != 0 and number < self.low:
            raise _fail(name, text, allowed)
        return number


@dataclass(frozen=True)
class OffOrFactor:
    """0 turns the feature off; anything else is a factor above 1."""
    def parse(self, name: str, text: str, image: Image) -> float:
        allowed = "allowed: 0 (off) or a number > 1, like 1.5"
        try:
            number = float(text.strip())
        except ValueError:
            raise _fail(name, text, allowed) from None
        if not (number == 0 or 1 < number < float("inf")):
            raise _fail(name, text, allowed)
        return number


@dataclass(frozen=True)
class Flag:
    def parse(self, name: str, text: str, image: Image) -> bool:
        value = text.strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise _fail(name, text, "allowed: 0, 1")


@dataclass(frozen=True)
class Text:
    pattern: str = r"^.+$"
    expected: str = "must not be empty"

    def parse(self, name: str, text: str, image: Image) -> str:
        value = text.strip()
        if not re.match(self.pattern, value):
            raise _fail(name, text, self.expected)
        return value


@dataclass(frozen=True)
class Secret:
    """A secret: taken as given (surrounding blanks aside) and never shown in an error;
    secret.py checks it is strong enough by the rule `expected` states (JOB_SECRET_FILE's too)."""
    expected: str = ("a generator's: at least 32 hex digits, or 22 base64 characters mixing upper case, lower "
                     "case and digits, or 40 characters with 16 different ones")

    def parse(self, name: str, text: str, image: Image) -> str:
        return text.strip()


@dataclass(frozen=True)
class PassThrough:
    """A variable of a framework or library, given to the processes as the user set it; the
    plan reads it (it decides a default or a choice) but does not validate it."""
    def parse(self, name: str, text: str, image: Image) -> str:
        return text


HOST = Text(HOST_RE.pattern, "must be a host name or IP address")
PORT = Int(1, 65535)


@dataclass(frozen=True)
class Var:
    name: str
    kind: Any
    default: str | None                       # as a user would write it; None: unset, or derived by a rule
    help: str

    @property
    def field(self) -> str:
        return self.name.lower()

    def read(self, env: dict[str, str], image: Image):
        text = env.get(self.name)
        if text is None or text.strip() == "":
            text = self.default
        return None if text is None else self.kind.parse(self.name, text, image)


# The contract, in the order the README documents it.
VARIABLES = (
    Var("FRAMEWORK", Choice(FRAMEWORKS, "frameworks"), "pytorch",
        f"pytorch | tensorflow | keras | mxnet (mxnet: the {MXNET_VARIANT} image)"),
    Var("TRAIN_MODE", Choice(TRAIN_MODES), None, 
        '`local`: one node, all its GPUs or `NPROC_PER_NODE` CPU processes; default: `local`, '
        'or `distributed` when `NUM_NODES` > 1 or `ROLE` is set'),
    Var("ROLE", Choice(ROLES), None, '`master` (node 0, serves rendezvous) or `worker`; default: from `NODE_RANK`'),
    Var("NUM_NODES", Int(1), "1", 'nodes (containers) in the job'),
    Var("NODE_RANK", Int(0), None, 'optional for workers; 0 is the master; default: assigned at rendezvous'),
    Var("MASTER_ADDR", HOST, None, "the master's host name or IP; required when distributed, unless `JOB_STORE` is set"),
    Var("MASTER_PORT", PORT, "29500", "the job store on the master (torchrun's c10d rendezvous uses it too)"),
    Var("JOB_STORE", Text(r"^etcd://.+$", "allowed: etcd://HOST:PORT[,HOST:PORT...]"), None,
        "`etcd://HOST:PORT[,HOST:PORT...]`: the job store and torchrun's rendezvous on an etcd v3 "
        "cluster instead of the master, so that no node is special and an elastic job survives "
        "losing any node, the first included; PyTorch under torchrun (`LAUNCHER=native`), "
        "without `ROLE`, `NODE_RANK`, `MASTER_ADDR` (docs/rendezvous.md)"),
    Var("JOB_STORE_CA", Text(r"^/[^,]+$", "must be an absolute path without ','"), None,
        "`JOB_STORE` over TLS: the CA file (PEM) that signed the etcd members' certificates"),
    Var("JOB_STORE_CERT", Text(r"^/[^,]+$", "must be an absolute path without ','"), None,
        "with `JOB_STORE_KEY`: this node's client certificate (PEM), for an etcd that asks for one "
        "(`--client-cert-auth`)"),
    Var("JOB_STORE_KEY", Text(r"^/[^,]+$", "must be an absolute path without ','"), None,
        "the key of `JOB_STORE_CERT` (PEM, unencrypted)"),
    Var("ACCELERATOR", Choice(ACCELERATORS, "accelerators"), "auto",
        
        '`auto` (a TPU if the host has one and the image is `tpu`, else visible GPUs, else '
        'CPU), `cpu`, `gpu`, `tpu`; asking for one the host lacks is an error'),
    Var("NPROC_PER_NODE", Int(1, auto=True), None, 'processes per node; default: visible GPUs, else 1 (on TPU: 1 per host)'),
    Var("PARALLEL_MODE", Choice(PARALLEL_MODES), "data_parallel", '`data_parallel`, `model_parallel`, `hybrid` (PyTorch)'),
    Var("TP_SIZE", Int(1), None, 
        'size of the model-parallel dimension; must divide the world size; default: world size '
        'for `model_parallel`; required for `hybrid`'),
    Var("LAUNCHER", Choice(LAUNCHERS, "launchers"), "native",
        
        '`native` (torchrun for PyTorch, `TF_CONFIG` for TF/Keras, parameter servers for '
        "MXNet), `horovod`, `mpi` (not MXNet). `horovod` on one CPU node runs Horovod's MPI "
        "controller under `mpirun` (shared memory; Horovod's own `HOROVOD_CONTROLLER=gloo` "
        "keeps Gloo) when that Horovod has MPI compiled in (the image's manifest says; outside "
        "an image, whether Horovod's extension links Open MPI); across nodes, on GPUs and "
        'for a Gloo-only Horovod: Gloo. Never SSH'),
    Var("SYNC_MODE", Choice(SYNC_MODES), "sync",
        '`async`: TF parameter servers, PyTorch local SGD, MXNet `dist_async`'),
    Var("SYNC_PERIOD", Int(1), "8", 'PyTorch `async`: steps between model averages'),
    Var("GRAD_COMPRESSION", Choice(COMPRESSIONS), "none",
        "gradients on the wire: `none`, `fp16`, `bf16`, `powersgd` (low-rank, with error feedback); "
        "what each framework and launcher honours: docs/gradient-sync.md"),
    Var("POWERSGD_RANK", Int(1), "4", "`GRAD_COMPRESSION=powersgd`: the rank of each gradient's approximation"),
    Var("POWERSGD_WARMUP", Int(2), "10",
        "`GRAD_COMPRESSION=powersgd`: steps of plain all-reduce before compression starts"),
    Var("GRAD_ACCUMULATION", Int(1), "1",
        "micro-batches per gradient synchronization: the optimizer steps once every N calls of "
        "`step()`, on the mean of their gradients, and the gradients cross the network once"),
    Var("GRAD_BUCKET_MB", Int(1, 4096), None,
        "MB of gradients sent in one collective (DDP's `bucket_cap_mb`, 25 there; Horovod's "
        "`HOROVOD_FUSION_THRESHOLD`, 64 there)"),
    Var("MEMORY_ALLOCATOR", Choice(("system", "tcmalloc"), offered_by_image="allocators"), "system",
        "`tcmalloc`: the training processes allocate through gperftools' tcmalloc (preloaded), which keeps "
        "freed memory for the next step where the C library's malloc returns each large block to the "
        "kernel and faults it in again: a 25M-parameter DDP step on one CPU thread took 0.7x as long "
        "(docs/gradient-sync.md)"),
    Var("NUM_PS", Int(1), "1", 'TF `async`, MXNet `native`: parameter servers on the master'),
    Var("ENTRYPOINT", Text(), "/app/code/train.py", 'the script; arguments after the image name pass through'),
    Var("DATA_DIR", Text(), "/app/data",
        'dataset folder, passed to the script; or `s3://BUCKET/PREFIX` (any S3-compatible store): '
        'staged once per node into `CACHE_DIR` before the ranks start, and the script gets that '
        'folder (docs/storage.md)'),
    Var("CHECKPOINT_DIR", Text(), "/app/checkpoints", 
        'checkpoints (rank 0 writes replicated state, every rank its own shards; every rank '
        'resumes) and Keras backups; or `s3://BUCKET/PREFIX`: the script writes to a folder in '
        '`CACHE_DIR`, each finished file is uploaded in the background, and a fresh node resumes '
        'from the bucket (docs/storage.md)'),
    Var("CACHE_DIR", Text(r"^/.*$", "must be an absolute path"), "/app/cache",
        'node-local folder for the copies of `s3://` data and checkpoints (mount a volume to keep '
        'it across restarts); default: `/app/cache`, or a temporary folder when that cannot be '
        'written (a read-only container)'),
    Var("S3_ADDRESSING_STYLE", Choice(("auto", "path", "virtual")), None,
        "`s3://` URLs: `path` (MinIO, SeaweedFS, Ceph), `virtual` (OSS, GCS); default: botocore's "
        '`auto` (`virtual` for `oss://`)'),
    Var("MIN_NODES", Int(1), None, 
        'elastic PyTorch: `torchrun --nnodes=MIN:MAX`; PyTorch, TensorFlow or Keras: Horovod '
        'elastic with `LAUNCHER=horovod` (docs/operations.md)'),
    Var("MAX_NODES", Int(1), None, 
        'elastic PyTorch: `torchrun --nnodes=MIN:MAX`; PyTorch, TensorFlow or Keras: Horovod '
        'elastic with `LAUNCHER=horovod` (docs/operations.md)'),
    Var("MAX_RESTARTS", Int(0), "0", 
        "torchrun's worker restarts (PyTorch native only); elastic jobs need room for each lost"
        ' node'),
    Var("RDZV_TIMEOUT", Int(1), "300", 'seconds to wait for the master and the other nodes'),
    Var("ELASTIC_LAST_CALL", Int(1), "2", 
        'elastic: seconds the first rendezvous round waits for more nodes once `MIN_NODES` are '
        "in (torchrun's `last_call_timeout`, 30 s there); a later round forms once every live "
        'node is in it'),
    Var("ELASTIC_DEAD_AFTER", Int(2), "3", 
        'elastic: seconds without a rendezvous keep-alive (four in that time) before a node is '
        'dropped from the rendezvous (15 s in torchrun); a node whose connection closes (its '
        'processes died) is dropped at once'),
    Var("PEER_TIMEOUT", Int(2), "10", 
        'seconds without a heartbeat (or a reply from the job store) before a node, or the '
        'master, counts as lost'),
    Var("GRACE_PERIOD", Int(0), "8", 'seconds from SIGTERM to SIGKILL when stopping the workers'),
    Var("HANG_TIMEOUT", OffOrInt(5), "300",
        'seconds a rank may go without a step or other progress, once it made its first, before '
        'the job counts as hung: every rank\'s stack is dumped, one line names the stalled rank(s), '
        'and the job stops with exit 124 (elastic: the stalled node leaves); `0`: off '
        '(docs/operations.md)'),
    Var("STRAGGLER_FACTOR", OffOrFactor(), "1.5",
        "a rank whose own work per step stays above this times the median of the job's ranks "
        'for `STRAGGLER_WINDOW` seconds is named in one line on the master; `0`: off'),
    Var("STRAGGLER_WINDOW", Int(1), "60", 'seconds a rank must stay behind before it is named a straggler'),
    Var("RUN_ID", Text(r"^[A-Za-z0-9_.-]{1,64}$", "allowed: 1-64 letters, digits, '_', '.', '-'"), "disttrain",
        'rendezvous id, the same on every node of a job'),
    Var("JOB_SECRET", Secret(), None,
        "the job's shared secret, the same on every node, from a generator (`disttrain secret`, "
        "`openssl rand -hex 32`), keyed with `RUN_ID`: the job store, "
        "torchrun's and Horovod's rendezvous then take only TLS connections from nodes that hold it; "
        "default: none (anyone who reaches `MASTER_PORT` can join, stop or run code in the job; "
        "docs/security.md)"),
    Var("JOB_SECRET_FILE", Text(), None,
        'a file holding `JOB_SECRET` (compose and Swarm `secrets:`, a Kubernetes Secret volume); '
        'set one of the two'),
    Var("HOROVOD_PORT", PORT, None, 
        "master only: Horovod's rendezvous server (workers learn it at rendezvous); default: "
        '`MASTER_PORT`+1'),
    Var("XLA_PORT", PORT, None, 'PyTorch/XLA across hosts: the xla:// store on the master; default: `MASTER_PORT`+1'),
    Var("NODE_ADDR", HOST, None, 
        'the address other nodes reach this node at; default: the address that routes to '
        '`MASTER_ADDR`'),
    Var("NET_IFNAME", Text(r"^[A-Za-z0-9_.:@-]{1,15}$", "must be a network interface name like eth0"), None,
        
        'interface for NCCL, Gloo and Horovod; default: the interface that routes to '
        '`MASTER_ADDR`'),
    Var("WORKER_PORT_BASE", Int(1024, 65000), None, 
        "TensorFlow's and MXNet's fixed ports, for firewalls: base + n, the master's servers "
        '(TF chief and ps, MXNet scheduler and servers) first, then one per process; default: '
        'free ports'),
    Var("HOSTFILE", Text(), None, '`LAUNCHER=mpi` across nodes: Open MPI hostfile read by `mpirun` on the master, which '
        'reaches the other hosts through its launch agent (ssh, or `OMPI_MCA_plm_rsh_agent`); the master first, '
        'so that rank 0 runs there'),
    Var("IB_HCA", Text(r"^[\^=]?[A-Za-z0-9_]+(:\d+)?(,[A-Za-z0-9_]+(:\d+)?)*$",
                       "must be a list of HCAs like mlx5_0:1,mlx5_1:1"), None,
        "InfiniBand adapters for NCCL (NCCL_IB_HCA), e.g. mlx5_0:1"),
    Var("GPU_DIRECT_RDMA", Flag(), None, "0 | 1: GPUDirect RDMA for NCCL (NCCL_NET_GDR_LEVEL=3 when 1)"),
    Var("P2P_DISABLE", Flag(), None, "0 | 1: disable NCCL peer-to-peer (NCCL_P2P_DISABLE), for poor PCIe topologies"),
    Var("COMM_DEBUG", Choice(COMM_DEBUG), None, "off | warn | info | trace: NCCL_DEBUG for the workers"),
    Var("EXPLAIN", Flag(), "0", '`1`: print the plan, start nothing'),
    Var("UNKNOWN_VARIABLES", Choice(("warn", "error", "ignore")), "warn",
        "a set variable that looks like one of these but is not (`FRAMWORK`, `NUM_NODE`, "
        "`CHECKPOINTS_DIR`, `ELASTIC_TIMEOUT`): `warn` (one line each, with the likely name), "
        "`error` (exit 2 before anything starts), `ignore`; other variables never warn"),
    # The frameworks' and libraries' own variables that the plan reads: the user's value wins.
    Var("OMP_NUM_THREADS", PassThrough(), None, "threads per process for OpenMP; default: the node's CPUs "
                                                "divided by its processes"),
    Var("TF_USE_LEGACY_KERAS", PassThrough(), None, "1 (default in every image with tf-keras, for every "
                                                    "process, and for TensorFlow and Keras jobs outside one) "
                                                    "makes tf.keras tf-keras, which MultiWorkerMirroredStrategy "
                                                    "and horovod.tensorflow.keras need"),
    Var("TF_CPP_MIN_LOG_LEVEL", PassThrough(), None, "TensorFlow's C++ log level; default for TensorFlow and "
                                                     "Keras jobs: 2 (errors only: no absl or tf.data banners "
                                                     "in every process); 0 or 1 brings them back"),
    Var("LD_PRELOAD", PassThrough(), None, "libraries the dynamic linker loads first into every process; "
                                           "with MEMORY_ALLOCATOR=tcmalloc the training processes get its "
                                           "library before these"),
    Var("PYTHONFAULTHANDLER", PassThrough(), None, "default 1: a training process that crashes (SIGSEGV, SIGABRT "
                                                   "in C++ code) prints every thread's Python stack first; 0 turns "
                                                   "that off"),
    Var("TF_CONFIG", PassThrough(), None, "a TFJob's cluster and task: the container runs that one task"),
    Var("PJRT_DEVICE", PassThrough(), None, "tpu variant: CPU runs PyTorch/XLA on XLA's CPU client; TPU is "
                                            "set on TPU hosts"),
    Var("TPU_WORKER_ID", PassThrough(), None, "TPU slices: this host's worker number (GKE sets it); default: "
                                              "NODE_RANK"),
    Var("TPU_WORKER_HOSTNAMES", PassThrough(), None, "TPU slices: every host, in worker order (GKE sets it); "
                                                     "default: the nodes' addresses from the job store"),
    Var("HOROVOD_CONTROLLER", PassThrough(), None, "LAUNCHER=horovod on one CPU node: gloo keeps Horovod's "
                                                   "Gloo controller instead of MPI under mpirun"),
    Var("HOROVOD_CYCLE_TIME", PassThrough(), None, "Horovod's MPI controller on one node: default 0.1 (ms "
                                                   "between negotiations; Horovod's own is 1)"),
    Var("THP_MEM_ALLOC_ENABLE", PassThrough(), None, "Horovod's MPI controller on one node: default 1 (huge "
                                                     "pages for torch's CPU tensors)"),
    Var("OMPI_MCA_mpi_yield_when_idle", PassThrough(), None, "Horovod's MPI controller on one node: default 1 "
                                                             "(waiting ranks yield their core)"),
)
VARIABLE_NAMES = tuple(v.name for v in VARIABLES)
PASSED_THROUGH = tuple(v.name for v in VARIABLES if isinstance(v.kind, PassThrough))


@dataclass(frozen=True)
class Config:
    """Every variable's value under its lower-case name, after the rules, plus what the
    rules derive (nccl_env) and what is not a variable of ours (script_args, passed)."""
    framework: str
    train_mode: str
    role: str                           # master | worker; peer with JOB_STORE (no node is special)
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
    data_dir: str
    checkpoint_dir: str
    min_nodes: int | None
    max_nodes: int | None
    max_restarts: int
    rdzv_timeout: int
    elastic_last_call: int
    elastic_dead_after: int
    peer_timeout: int
    grace_period: int
    run_id: str
    horovod_port: int
    node_addr: str | None
    net_ifname: str | None
    worker_port_base: int | None
    hostfile: str | None
    accelerator: str = "auto"
    xla_port: int | None = None
    ib_hca: str | None = None
    gpu_direct_rdma: bool | None = None
    p2p_disable: bool | None = None
    comm_debug: str | None = None
    explain: bool = False
    unknown_variables: str = "warn"
    hang_timeout: int = 300
    straggler_factor: float = 1.5
    straggler_window: int = 60
    cache_dir: str = "/app/cache"
    s3_addressing_style: str | None = None
    grad_compression: str = "none"
    powersgd_rank: int = 4
    powersgd_warmup: int = 10
    grad_accumulation: int = 1
    grad_bucket_mb: int | None = None
    memory_allocator: str = "system"
    job_store: tuple[str, ...] | None = None  # JOB_STORE: each etcd member's client URL (http(s)://host:port)
    job_store_ca: str | None = None
    job_store_cert: str | None = None
    job_store_key: str | None = None
    data_url: BucketUrl | None = None        # DATA_DIR=s3://...: data_dir is its node-local copy
    checkpoint_url: BucketUrl | None = None  # CHECKPOINT_DIR=s3://...: checkpoint_dir is its local folder
    job_secret: str | None = field(default=None, repr=False)   # read through secret.read_secret
    job_secret_file: str | None = None
    script_args: tuple[str, ...] = ()
    nccl_env: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)   # variable -> where its value came from
    passed: dict[str, str] = field(default_factory=dict)    # the PassThrough variables that are set

    @property
    def has_secret(self) -> bool:
        """JOB_SECRET or JOB_SECRET_FILE is set (secret.read_secret reads and checks it)."""
        return self.job_secret is not None or self.job_secret_file is not None

    @property
    def tf_config(self) -> str | None:
        """TF_CONFIG, passed through from a TFJob."""
        return self.passed.get("TF_CONFIG")

    @property
    def family(self) -> str:
        """The framework whose launchers run the job: Keras runs on TensorFlow's."""
        return "tensorflow" if self.framework == "keras" else self.framework

    @property
    def grad_sync(self) -> GradSync:
        return GradSync(self.grad_compression, self.powersgd_rank, self.powersgd_warmup, self.grad_accumulation,
                        self.grad_bucket_mb)

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None

    @property
    def distributed(self) -> bool:
        return self.train_mode == "distributed"

    @property
    def most_nodes(self) -> int:
        """The node count ranks must stay below: MAX_NODES when elastic, else NUM_NODES."""
        return self.max_nodes if self.elastic else self.num_nodes


# --------------------------------------------------------------------------- rules
# Each rule sees the values so far (a dict by variable name) and the raw environment (for
# the exact text in messages), raises ConfigError, or returns the values it derives.

Values = dict[str, Any]


def elastic_bounds(v: Values, env: dict) -> Values:
    if (v["MIN_NODES"] is None) != (v["MAX_NODES"] is None):
        given, missing = ("MIN_NODES", "MAX_NODES") if v["MAX_NODES"] is None else ("MAX_NODES", "MIN_NODES")
        raise ConfigError(f"{given}={env[given]!r}: elastic training needs both MIN_NODES and MAX_NODES; "
                          f"{missing} is not set")
    if v["MIN_NODES"] is not None and v["MIN_NODES"] > v["MAX_NODES"]:
        raise _fail("MIN_NODES", env["MIN_NODES"], f"must be <= MAX_NODES ({v['MAX_NODES']})")
    for knob in ("ELASTIC_LAST_CALL", "ELASTIC_DEAD_AFTER"):
        if v["MIN_NODES"] is None and env.get(knob, "").strip():
            raise _fail(knob, env[knob], "only elastic jobs use it; set MIN_NODES and MAX_NODES, or unset it")
    return {}


def external_job_store(v: Values, env: dict) -> Values:
    """JOB_STORE: the members of an etcd cluster, where every node meets the others; no
    node is the master, so ROLE, NODE_RANK and MASTER_ADDR have no meaning (role "peer")."""
    tls = {name: v[name] for name in ("JOB_STORE_CA", "JOB_STORE_CERT", "JOB_STORE_KEY") if v[name] is not None}
    if v["JOB_STORE"] is None:
        for name, value in tls.items():
            raise _fail(name, value, "only JOB_STORE uses it; set JOB_STORE, or unset it")
        return {}
    try:
        members = parse_store_url(v["JOB_STORE"])
    except UrlError as exc:
        raise _fail("JOB_STORE", env["JOB_STORE"], str(exc)) from None
    if ("JOB_STORE_CERT" in tls) != ("JOB_STORE_KEY" in tls):
        given, missing = ("JOB_STORE_CERT", "JOB_STORE_KEY") if "JOB_STORE_CERT" in tls else \
            ("JOB_STORE_KEY", "JOB_STORE_CERT")
        raise _fail(given, tls[given], f"a client certificate needs its key: set {missing} too")
    if "JOB_STORE_CERT" in tls and "JOB_STORE_CA" not in tls:
        raise _fail("JOB_STORE_CERT", tls["JOB_STORE_CERT"], "a client certificate is for TLS: set JOB_STORE_CA "
                                                             "(the CA of etcd's members) too")
    if "JOB_STORE_CA" in tls:
        members = tuple(url.replace("http://", "https://", 1) for url in members)
    for name in ("ROLE", "NODE_RANK", "MASTER_ADDR"):
        if env.get(name, "").strip():
            raise _fail(name, env[name], "not used with JOB_STORE, where every node is equal (the first to "
                                         "arrive is as good as any other); unset it")
    if v["TRAIN_MODE"] == "local":
        raise _fail("TRAIN_MODE", env["TRAIN_MODE"], "JOB_STORE is where several nodes meet; allowed with it: "
                                                     "distributed")
    if v["FRAMEWORK"] != "pytorch" or v["LAUNCHER"] != "native":
        raise ConfigError(f"JOB_STORE={env['JOB_STORE']!r}: an external job store runs PyTorch under torchrun "
                          f"(FRAMEWORK=pytorch, LAUNCHER=native) so far, got FRAMEWORK={v['FRAMEWORK']} "
                          f"LAUNCHER={v['LAUNCHER']}; other jobs meet through their master (MASTER_ADDR, ROLE): "
                          f"docs/rendezvous.md")
    if v["MIN_NODES"] is None and v["NUM_NODES"] < 2:
        raise _fail("NUM_NODES", env.get("NUM_NODES", "1"), "JOB_STORE is where several nodes meet; allowed: "
                                                            "2 or more, or MIN_NODES and MAX_NODES")
    if v["JOB_SECRET"] is not None or v["JOB_SECRET_FILE"] is not None:
        raise ConfigError(f"JOB_SECRET with JOB_STORE={env['JOB_STORE']!r}: the secret's TLS covers the master's "
                          f"store, which this job has none of; secure etcd itself with client certificates "
                          f"(JOB_STORE_CA, JOB_STORE_CERT, JOB_STORE_KEY: docs/rendezvous.md) and unset "
                          f"JOB_SECRET/JOB_SECRET_FILE")
    return {"JOB_STORE": members, "TRAIN_MODE": "distributed", "ROLE": "peer", "MASTER_ADDR": ""}


def train_mode(v: Values, env: dict) -> Values:
    if v["TRAIN_MODE"] is not None:
        return {}
    several = v["NUM_NODES"] > 1 or v["ROLE"] is not None or v["MIN_NODES"] is not None
    return {"TRAIN_MODE": "distributed" if several else "local"}


def local_is_one_node(v: Values, env: dict) -> Values:
    if v["TRAIN_MODE"] != "local":
        return {}
    if v["NUM_NODES"] != 1:
        raise _fail("NUM_NODES", env["NUM_NODES"], "TRAIN_MODE=local runs one node; allowed: 1, "
                                                   "or set TRAIN_MODE=distributed")
    if v["MIN_NODES"] is not None:
        raise ConfigError("MIN_NODES/MAX_NODES: elastic training needs TRAIN_MODE=distributed")
    return {"ROLE": "master", "NODE_RANK": 0, "MASTER_ADDR": v["MASTER_ADDR"] or "127.0.0.1"}


def distributed_placement(v: Values, env: dict) -> Values:
    """MASTER_ADDR is required; ROLE and NODE_RANK agree (the master is node 0)."""
    if v["TRAIN_MODE"] != "distributed" or v["JOB_STORE"] is not None:
        return {}
    if v["MASTER_ADDR"] is None:
        raise ConfigError("MASTER_ADDR is not set: TRAIN_MODE=distributed needs the master's host "
                          "name or IP on every node")
    elastic = v["MIN_NODES"] is not None
    upper = v["MAX_NODES"] if elastic else v["NUM_NODES"]
    rank, role = v["NODE_RANK"], v["ROLE"]
    if rank is not None and rank >= upper:
        raise _fail("NODE_RANK", env["NODE_RANK"], f"must be < {'MAX_NODES' if elastic else 'NUM_NODES'} ({upper})")
    if role is None:
        if rank is None:
            raise ConfigError("ROLE is not set: allowed: master, worker (or set NODE_RANK; 0 is the master)")
        role = "master" if rank == 0 else "worker"
    if role == "master":
        if rank not in (None, 0):
            raise _fail("NODE_RANK", env["NODE_RANK"], "the master is node 0; allowed with ROLE=master: 0")
        rank = 0
    elif rank == 0:
        raise _fail("NODE_RANK", env["NODE_RANK"], f"0 is the master's rank; allowed with ROLE=worker: 1..{upper - 1}")
    if not elastic and role == "worker" and v["NUM_NODES"] < 2:
        raise _fail("NUM_NODES", env.get("NUM_NODES", "1"), "a worker needs NUM_NODES >= 2")
    return {"ROLE": role, "NODE_RANK": rank}


def parallel_layout(v: Values, env: dict) -> Values:
    mode, tp = v["PARALLEL_MODE"], v["TP_SIZE"]
    if mode == "data_parallel" and tp not in (None, 1):
        raise _fail("TP_SIZE", env["TP_SIZE"], "PARALLEL_MODE=data_parallel has no model-parallel "
                                               "dimension; allowed: 1, or PARALLEL_MODE=model_parallel|hybrid")
    if mode == "hybrid" and tp is None:
        raise ConfigError("TP_SIZE is not set: PARALLEL_MODE=hybrid needs the model-parallel size "
                          "(world size = TP_SIZE x data-parallel size)")
    if mode != "data_parallel" and v["FRAMEWORK"] != "pytorch":
        raise _fail("PARALLEL_MODE", env["PARALLEL_MODE"], f"FRAMEWORK={v['FRAMEWORK']} supports data_parallel "
                                                           f"here; allowed: data_parallel")
    return {}


def async_fits(v: Values, env: dict) -> Values:
    if v["SYNC_MODE"] != "async":
        return {}
    if v["LAUNCHER"] != "native":
        raise _fail("SYNC_MODE", env["SYNC_MODE"], f"LAUNCHER={v['LAUNCHER']} synchronises every step; "
                                                   "allowed: sync (async needs LAUNCHER=native)")
    if v["PARALLEL_MODE"] != "data_parallel":
        raise _fail("SYNC_MODE", env["SYNC_MODE"], "asynchronous training is data-parallel only; "
                                                   f"allowed with PARALLEL_MODE={v['PARALLEL_MODE']}: sync")
    return {}


def grad_sync_fits(v: Values, env: dict) -> Values:
    line = refusal(GradSync.from_values(v), v["FRAMEWORK"], v["LAUNCHER"], v["SYNC_MODE"])
    if line:
        raise ConfigError(line)
    return {}


def restarts_are_torchruns(v: Values, env: dict) -> Values:
    torchrun = v["FRAMEWORK"] == "pytorch" and v["LAUNCHER"] == "native"
    if v["MAX_RESTARTS"] and not torchrun:
        raise _fail("MAX_RESTARTS", env["MAX_RESTARTS"], "restarts are torchrun's (FRAMEWORK=pytorch, "
                                                         "LAUNCHER=native); allowed here: 0")
    horovod = v["FRAMEWORK"] in ("pytorch", "tensorflow", "keras") and v["LAUNCHER"] == "horovod"
    if v["MIN_NODES"] is not None and not (torchrun or horovod):
        raise ConfigError(f"MIN_NODES/MAX_NODES: elastic training needs FRAMEWORK=pytorch with LAUNCHER=native "
                          f"(torchrun), or FRAMEWORK=pytorch|tensorflow|keras with LAUNCHER=horovod "
                          f"(hvd.elastic), got FRAMEWORK={v['FRAMEWORK']} LAUNCHER={v['LAUNCHER']}")
    return {}


def hostfile_is_mpis(v: Values, env: dict) -> Values:
    if v["HOSTFILE"] and v["LAUNCHER"] != "mpi":
        raise _fail("HOSTFILE", v["HOSTFILE"], "only LAUNCHER=mpi reads a hostfile")
    if v["LAUNCHER"] == "mpi" and v["TRAIN_MODE"] == "distributed" and not v["HOSTFILE"]:
        raise ConfigError("HOSTFILE is not set: LAUNCHER=mpi across nodes needs an Open MPI hostfile on "
                          "the master (one line per node: 'host slots=N')")
    return {}


def horovod_port(v: Values, env: dict) -> Values:
    port, master = v["HOROVOD_PORT"], v["MASTER_PORT"]
    if port is None:
        if master == 65535:
            raise _fail("MASTER_PORT", str(master), "Horovod uses MASTER_PORT+1; set HOROVOD_PORT")
        return {"HOROVOD_PORT": master + 1}
    if port == master:
        raise _fail("HOROVOD_PORT", env["HOROVOD_PORT"], f"must differ from MASTER_PORT ({master})")
    return {}


def xla_port(v: Values, env: dict) -> Values:
    if v["XLA_PORT"] is None:
        return {"XLA_PORT": v["MASTER_PORT"] + 1 if v["MASTER_PORT"] < 65535 else v["MASTER_PORT"] - 1}
    if v["XLA_PORT"] == v["MASTER_PORT"]:
        raise _fail("XLA_PORT", env["XLA_PORT"], f"must differ from MASTER_PORT ({v['MASTER_PORT']})")
    return {}


def mxnet_launchers(v: Values, env: dict) -> Values:
    if v["FRAMEWORK"] == "mxnet" and v["LAUNCHER"] == "mpi":
        raise _fail("LAUNCHER", env["LAUNCHER"], "FRAMEWORK=mxnet runs on MXNet's parameter servers or "
                                                 "Horovod; allowed: native, horovod")
    return {}


def tf_config_is_tensorflows(v: Values, env: dict) -> Values:
    if env.get("TF_CONFIG") and v["FRAMEWORK"] not in ("tensorflow", "keras"):
        raise ConfigError(f"TF_CONFIG is set but FRAMEWORK={v['FRAMEWORK']}; TF_CONFIG is for "
                          f"FRAMEWORK=tensorflow or keras")
    return {}


# The seed's NCCL advice as our variables -> the NCCL variable each one sets.
NCCL_MAPPING = {"IB_HCA": "NCCL_IB_HCA", "P2P_DISABLE": "NCCL_P2P_DISABLE", "COMM_DEBUG": "NCCL_DEBUG",
                "GPU_DIRECT_RDMA": "NCCL_NET_GDR_LEVEL"}


def nccl_settings(v: Values, env: dict) -> Values:
    """NCCL_* settings from IB_HCA, GPU_DIRECT_RDMA, P2P_DISABLE, COMM_DEBUG; a user's own
    NCCL_* must agree with them."""
    nccl_values = {"IB_HCA": v["IB_HCA"],
                   "GPU_DIRECT_RDMA": None if v["GPU_DIRECT_RDMA"] is None else "3" if v["GPU_DIRECT_RDMA"] else "0",
                   "P2P_DISABLE": None if v["P2P_DISABLE"] is None else "1" if v["P2P_DISABLE"] else "0",
                   "COMM_DEBUG": None if v["COMM_DEBUG"] in (None, "off") else v["COMM_DEBUG"].upper()}
    wanted = {NCCL_MAPPING[ours]: value for ours, value in nccl_values.items() if value is not None}
    for ours, nccl in NCCL_MAPPING.items():
        if nccl in wanted and nccl in env and env[nccl] != wanted[nccl]:
            raise ConfigError(f"{ours}={env[ours]!r} conflicts with {nccl}={env[nccl]!r}; set only one of them")
    iface = v["NET_IFNAME"]
    for name in IFNAME_VARIABLES:
        if iface and env.get(name) and not interface_matches(env[name], iface):
            raise ConfigError(f"NET_IFNAME={iface!r} conflicts with {name}={env[name]!r}, which does not select "
                              f"it; set only one of them")
    return {"nccl_env": wanted}


# What NET_IFNAME sets (running/specs.py), which a user's own value must agree with.
IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HOROVOD_GLOO_IFACE")


def interface_matches(selector: str, iface: str) -> bool:
    """Whether NCCL's interface selector (`eth` prefixes, `=eth0` exact names, `^docker`
    exclusions, comma-separated) selects `iface`."""
    exact = selector.startswith("=")
    exclude = selector.startswith("^")
    names = [n for n in selector.lstrip("=^").split(",") if n]
    hit = any(iface == n if exact else iface.startswith(n) for n in names)
    return not hit if exclude else hit


def object_storage(v: Values, env: dict) -> Values:
    """DATA_DIR and CHECKPOINT_DIR as bucket URLs: each becomes a folder in CACHE_DIR, and
    the URL is kept beside it (storage/ stages, uploads and resumes)."""
    out: Values = {"data_url": None, "checkpoint_url": None}
    for name, kind, url_field in (("DATA_DIR", "data", "data_url"), ("CHECKPOINT_DIR", "checkpoints", "checkpoint_url")):
        if not has_scheme(v[name]):
            continue
        try:
            url = parse_bucket_url(v[name])
        except UrlError as exc:
            raise _fail(name, env.get(name, v[name]), str(exc)) from None
        out[url_field] = url
        out[name] = f"{v['CACHE_DIR'].rstrip('/')}/{kind}/{url.local_name}"
    if out["data_url"] and out["checkpoint_url"] and out["data_url"] == out["checkpoint_url"]:
        raise _fail("CHECKPOINT_DIR", env["CHECKPOINT_DIR"], "must not be the same bucket and prefix as DATA_DIR")
    return out


RULES: tuple[Callable[[Values, dict], Values], ...] = (
    elastic_bounds, external_job_store, train_mode, local_is_one_node, distributed_placement, parallel_layout, async_fits, grad_sync_fits,
    restarts_are_torchruns, hostfile_is_mpis, horovod_port, xla_port, mxnet_launchers, tf_config_is_tensorflows,
    nccl_settings, object_storage,
)


# --------------------------------------------------------------------------- the contract

def load_config(env: dict[str, str], image: Image, script_args: tuple[str, ...] = (),
                sources: dict[str, str] | None = None) -> Config:
    """Validate every variable against what the image carries."""
    values: Values = {var.name: var.read(env, image) for var in VARIABLES}
    for rule in RULES:
        values = {**values, **rule(values, env)}
    by_field = {var.field: values[var.name] for var in VARIABLES if var.name not in PASSED_THROUGH}
    passed = {name: values[name] for name in PASSED_THROUGH if values[name] is not None}
    return Config(**by_field, nccl_env=values["nccl_env"], data_url=values["data_url"],
                  checkpoint_url=values["checkpoint_url"], script_args=tuple(script_args),
                  sources=dict(sources or {}), passed=passed)
