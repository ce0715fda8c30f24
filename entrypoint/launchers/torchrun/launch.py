"""torchrun: one node (a torchrun subprocess, --standalone) and across nodes (torch's elastic
agent inside the entrypoint, c10d on the job store).

Everything the entrypoint tells torchrun is one typed value, the TorchrunLaunch: the seam to
torch's agent. `argv` renders it as the command line of a torchrun subprocess, which the
supervisor runs; across nodes, torch's own parser reads the same command line back into
its LaunchConfig (agent.py). Each field is one of torchrun's options
(torch.distributed.run) and, equally, one of torch.distributed.launcher.api.LaunchConfig's.

The rendezvous settings (rdzv_conf) decide how fast an elastic job notices a change:

    last_call_timeout       after MIN_NODES joined, how long a round waits for more (30 s in
                            torchrun; ELASTIC_LAST_CALL here)
    keep_alive_interval,    a node is dropped from the rendezvous after interval x attempts
    keep_alive_max_attempt  without a keep-alive (5 s x 3 in torchrun; 1 s x ELASTIC_DEAD_AFTER
                            here, which the agent then splits into four beats:
                            rendezvous_pace.beat_often). Survivors of a lost node wait this
                            long before re-forming.
    join_timeout            how long a round may take to form (RDZV_TIMEOUT)
"""

from __future__ import annotations

from dataclasses import dataclass

from ...running.specs import ProcessSpec, iface_env
from ..base import Launcher
from ..xla import tpu_slice_env

# The agent checks its workers and the rendezvous's waiting nodes this often (seconds);
# torch's default since 2.3, written out because older torch defaulted to 5 s.
MONITOR_INTERVAL_S = 0.1
TORCHRUN_PREFIX = "[rank${rank}]: "
RUN_MODULE = "entrypoint.launchers.torchrun.run"    # torchrun, with the failed worker's exit code (run.py)
KEEP_ALIVE_INTERVAL_S = 1


@dataclass(frozen=True)
class TorchrunLaunch:
    nproc_per_node: int
    run_id: str
    max_restarts: int
    script: str                               # a .py runs with torchrun's interpreter; else --no-python
    args: tuple[str, ...]
    env: dict[str, str]                       # on top of the container's environment
    standalone: bool = False                  # one node: torchrun's own store on a free local port
    nnodes: str = "1"                         # "N", or "MIN:MAX" for an elastic job
    rdzv_endpoint: str | None = None          # the job store (c10d, is_host=0), or etcd's members
    rdzv_backend: str = "c10d"                # c10d on the job store; etcd-v3 with JOB_STORE (etcd_rendezvous.py)
    rdzv_conf: tuple[tuple[str, int | str], ...] = ()
    local_addr: str | None = None             # where the other nodes reach this one
    monitor_interval: float = MONITOR_INTERVAL_S
    node_rank: int | None = None              # fixed-size, agent in the entrypoint: nodes in this order
    workers_stores: bool = False              # behind JOB_SECRET: a store per round on the master (worker_stores.py)

    @property
    def elastic(self) -> bool:
        return ":" in self.nnodes

    def argv(self, python: str, module: str = "torch.distributed.run") -> tuple[str, ...]:
        """torchrun's command line; `module`: what runs it (RUN_MODULE: the failed worker's exit code)."""
        argv = [python, "-m", module, f"--nproc-per-node={self.nproc_per_node}", "--tee=3",
                f"--max-restarts={self.max_restarts}", f"--monitor-interval={self.monitor_interval:g}",
                f"--rdzv-id={self.run_id}"]
        if self.standalone:
            argv.append("--standalone")
        else:
            conf = ",".join(f"{key}={value}" for key, value in self.rdzv_conf)
            argv += [f"--nnodes={self.nnodes}", f"--rdzv-backend={self.rdzv_backend}",
                     f"--rdzv-endpoint={self.rdzv_endpoint}", f"--rdzv-conf={conf}"]
            if self.local_addr:
                argv.append(f"--local-addr={self.local_addr}")
        argv += [self.script] if self.script.endswith(".py") else ["--no-python", self.script]
        return (*argv, *self.args)


def rendezvous_conf(timeout_s: int, elastic: bool, last_call_s: int, dead_after_s: int,
                    backend: str = "c10d", op_timeout_s: int = 0) -> tuple[tuple[str, int], ...]:
    """torchrun's rendezvous settings. On the job store (c10d) the store is the master
    entrypoint's (is_host=0), so it outlives any one torchrun; etcd outlives every node, and
    a call that no member answers within `op_timeout_s` (PEER_TIMEOUT) means it is lost."""
    conf = [("is_host", 0)] if backend == "c10d" else []
    conf += [("join_timeout", timeout_s), ("read_timeout", timeout_s)]
    if backend != "c10d":
        conf += [("op_timeout", op_timeout_s)]
    if elastic:
        conf += [("last_call_timeout", last_call_s), ("keep_alive_interval", KEEP_ALIVE_INTERVAL_S),
                 ("keep_alive_max_attempt", max(1, dead_after_s // KEEP_ALIVE_INTERVAL_S))]
    return tuple(conf)


def store_tls_conf(c) -> tuple[tuple[str, str], ...]:
    """JOB_STORE's TLS files, for the etcd rendezvous (etcd_rendezvous.create_etcd_handler)."""
    files = (("ca_file", c.job_store_ca), ("cert_file", c.job_store_cert), ("key_file", c.job_store_key))
    return tuple((key, path) for key, path in files if path) if c.job_store else ()


@dataclass(frozen=True)
class Torchrun(Launcher):
    """A torchrun subprocess: --standalone on one node; across nodes (PyTorch/XLA with a
    process per chip), c10d on the job store."""

    in_process = False

    @property
    def exchange(self) -> bool:
        return self.accelerator.kind == "tpu"           # TPU hosts learn every host: TPU_WORKER_HOSTNAMES

    def check(self, hw) -> list[str]:
        if self.config.elastic and self.config.max_restarts == 0:
            return ["MAX_RESTARTS=0 with MIN_NODES/MAX_NODES: the job ends at the first lost node; "
                    "set MAX_RESTARTS to the losses it should survive"]
        return []

    def describe(self) -> str:
        c, accel = self.config, self.accelerator
        if self.mode == "local":
            return "torchrun --standalone" + (f" (PJRT_DEVICE={accel.pjrt_device}, one process per chip)"
                                              if accel.xla else "")
        nnodes = f"{c.min_nodes}:{c.max_nodes}" if c.elastic else str(c.num_nodes)
        xla = f", PJRT_DEVICE={accel.pjrt_device}, one process per chip" if accel.xla else ""
        where = ", torch's elastic agent inside the entrypoint" if self.in_process else ""
        if c.job_store:
            return f"torchrun --nnodes={nnodes} (rendezvous on {self.endpoint}, which no node hosts{xla}{where})"
        return f"torchrun --nnodes={nnodes} (c10d rendezvous at {self.endpoint}{xla}{where})"

    def open_despite_secret(self) -> list[str]:
        if self.mode == "distributed" and not self.in_process:
            return ["the workers' own torch.distributed store (served by global rank 0's process, on every "
                    "interface of its node)"]
        return []

    def launch(self, plan, placement) -> TorchrunLaunch:
        c = self.config
        env = {**plan.env, **iface_env(placement.iface), **tpu_slice_env(self, placement),
               "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": TORCHRUN_PREFIX, "NODE_RANK": str(placement.node_rank),
               "DISTTRAIN_LAUNCHER": c.launcher}
        common = dict(nproc_per_node=self.nproc, run_id=c.run_id, max_restarts=c.max_restarts, env=env,
                      script=c.entrypoint, args=tuple(c.script_args))
        if self.mode == "local":
            return TorchrunLaunch(standalone=True, **common)
        if c.elastic or c.max_restarts or c.job_store:
            # torch >= 2.4 shares the rendezvous store with the workers and builds its address
            # once per agent: a node joining a later round then waits for a MASTER_ADDR that
            # rank 0 never writes again (pytorch/pytorch#135712). Rounds after the first need
            # torch's opt-out. On JOB_STORE too: no node's agent then serves the workers' store.
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        # Behind JOB_SECRET, this node reaches the job store through its tunnel, and the
        # workers' torch.distributed store is a fresh one per round on the master, behind its
        # Gate (worker_stores.py): torch would serve one on every interface of rank 0's node.
        workers_stores = bool(placement.store_endpoint) and self.in_process
        if workers_stores:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"        # torch serves no store of its own
        backend, endpoint = ("etcd-v3", ",".join(c.job_store)) if c.job_store else \
            ("c10d", placement.store_endpoint or self.endpoint)
        me = placement.me
        # The address the others reach this node at (torchrun's default, the FQDN, may not
        # resolve elsewhere). torchrun orders the nodes by these addresses; a fixed-size job
        # under the agent in the entrypoint orders them by node rank instead (rank 0 on the
        # master: agent._in_job_order); elastic jobs keep torchrun's order.
        return TorchrunLaunch(
            nnodes=f"{c.min_nodes}:{c.max_nodes}" if c.elastic else str(c.num_nodes),
            rdzv_endpoint=endpoint, rdzv_backend=backend, workers_stores=workers_stores,
            rdzv_conf=rendezvous_conf(c.rdzv_timeout, c.elastic, c.elastic_last_call, c.elastic_dead_after, backend,
                                      c.peer_timeout) + store_tls_conf(c),
            local_addr=me.addr if me else None,
            node_rank=None if c.elastic or c.job_store or not self.in_process else placement.node_rank, **common)

    def processes(self, plan, placement) -> list[ProcessSpec]:
        launch = self.launch(plan, placement)
        # In the entrypoint (agent.py), the command line only configures torch's agent.
        module = "torch.distributed.run" if self.in_process else RUN_MODULE
        return [ProcessSpec("torchrun", launch.argv(plan.python, module), launch.env)]
