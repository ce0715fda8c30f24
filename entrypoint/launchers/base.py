"""The Launcher interface: everything one way of launching decides, in one class.

A launcher is chosen once per node (launchers/__init__.py, `choose`) from the
configuration, the accelerator and the image, and then answers, in the order a node needs
the answers:

    check(hw)            its checks of the configuration (ConfigError), and its warnings
    world_size           the job's fixed world size, or None (elastic, or set by PJRT)
    rendezvous()         how this node meets the others (None: it meets nobody)
    ports_needed(master) the free ports this node publishes at rendezvous
    env()                what it adds to every process's environment
    describe()           its line of the dry run and of the log ('starts: ...')
    serve(...)           the server it runs on the master once the nodes are known (server_port,
                         server_text), and how a worker reaches it (reach_server)
    launch_env(nodes)    per-rank variables the master builds once and announces with the launch
    processes(plan, placement)   the node's processes, once it has joined
    runner(...)          what runs and supervises them, returning the node's Outcome

Subclasses override what differs; the defaults are the common case (a supervised list of
processes, one job store, nothing served). The methods that run take the NodePlan (`plan`:
its shared `env` and `python`) and the JoinedJob (`job`: its `placement` and `store`).
Planning needs nothing that runs: the running machinery (the Supervisor, the reaper's
token, health.watching) is imported by the methods that run, when they run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.config import Config
from ..contract.schedulers import DirectRank
from ..job.placement import NodeInfo, Placement
from ..machine.accelerators import Accelerator
from ..machine.hardware import Hardware
from ..running.log import Log
from ..running.loop import Runner
from ..running.signals import Signals
from ..running.specs import ProcessSpec, script_argv
from ..store.transport import JobStore


@dataclass(frozen=True)
class Rendezvous:
    endpoint: str                    # MASTER_ADDR:MASTER_PORT, the job store (or JOB_STORE's etcd://...)
    serve_store: bool                # this node hosts the job store (the master)
    exchange: bool                   # nodes must exchange addresses before launching
    horovod_server: bool             # this node serves the launcher's rendezvous (Horovod's HTTP server)
    timeout: int


class Server:
    """Something a launcher serves on the master while the job runs (Horovod's rendezvous,
    its elastic driver): the port the workers reach it at, and how it stops."""
    port: int | None

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Launcher:
    config: Config
    mode: str                        # local | distributed | direct
    nproc: int                       # processes this node starts (ranks, or one launcher process)
    accelerator: Accelerator
    direct: DirectRank | None = None

    exchange = False                 # the nodes publish their addresses and wait for each other
    numeric_addr = False             # publish an IP, not a name
    serves = False                   # serves something of its own on the master (serve())
    ranks_own_store = False          # the master's processes alone start every rank, and those form torch's
                                     # env:// group on a port picked on the master (MASTER_PORT is the job store's)
    transport = ""                   # how the ranks talk, for the preflight line, where worth saying

    # ----------------------------------------------------------------- planning
    def check(self, hw: Hardware) -> list[str]:
        """Raise ConfigError for what this launcher cannot run; return its warnings."""
        return []

    @property
    def world_size(self) -> int | None:
        if self.config.elastic:
            return None
        return self.nproc * (self.config.num_nodes if self.mode == "distributed" else 1)

    @property
    def world_text(self) -> str:
        return str(self.world_size) if self.world_size else "elastic"

    def rendezvous(self) -> Rendezvous | None:
        c = self.config
        if self.mode != "distributed":
            return None
        master = c.role == "master"
        return Rendezvous(endpoint=self.endpoint, serve_store=master, exchange=self.exchange,
                          horovod_server=self.serves and master, timeout=c.rdzv_timeout)

    def ports_needed(self, master: bool) -> int:
        return 0

    def env(self) -> dict[str, str]:
        return {}

    def describe(self) -> str:
        raise NotImplementedError

    def dry_run_notes(self) -> list[str]:
        return []

    @property
    def server_port(self) -> int | None:
        """The port its server on the master listens on (serve), where it has a fixed one."""
        return None

    @property
    def server_text(self) -> str:
        """Its server, for a line that says it could not be served."""
        return f"the launcher's server on port {self.server_port}"

    def open_despite_secret(self) -> list[str]:
        """What this launcher serves for its processes' coordination that JOB_SECRET does not
        put behind TLS (the job store and torchrun's rendezvous always are; docs/security.md)."""
        return []

    # ----------------------------------------------------------------- running
    def serve(self, plan, nodes: list[NodeInfo], store: JobStore | None, log: Log) -> Server | None:
        """On the master (or the one local node), once the nodes are known. Raises OSError
        when its port cannot be served (Job reports it as a failed rendezvous). What is
        served speaks HTTP, a request per connection (Horovod's rendezvous): behind
        JOB_SECRET the other nodes reach it through a tunnel.RequestTunnel."""
        return None

    def reach_server(self, master_addr: str, port: int, identity) -> tuple[str, int, object | None]:
        """On a worker: where its processes reach the server the master announced on `port`,
        and the tunnel that relays to it (to stop with the job), if any. Behind JOB_SECRET
        (`identity`) the server is behind the master's Gate: a RequestTunnel on this node."""
        if identity is None:
            return master_addr, port, None
        from ..security.tunnel import RequestTunnel

        tunnel = RequestTunnel(master_addr, port, identity.client_context()).start()
        return "127.0.0.1", tunnel.port, tunnel

    def launch_env(self, nodes: list[NodeInfo]) -> tuple[dict[str, str], ...]:
        """On the master, once the nodes are known: every rank's variables that only a view
        of the whole job gives (Horovod's slots), announced to the nodes with the launch and
        found in their Placement.launch_env. Nothing by default."""
        return ()

    def processes(self, plan, placement: Placement) -> list[ProcessSpec]:
        raise NotImplementedError

    def runner(self, plan, job, base_env: dict[str, str], log: Log,
               signals: Signals) -> Runner:
        """A Supervisor over the planned processes (the common case)."""
        from ..health.watching import watching
        from ..running.reaper import new_token
        from ..running.supervisor import Supervisor

        processes = self.processes(plan, job.placement)
        started = f"{self.nproc} training process" + ("es" if self.nproc != 1 else "")
        if len(processes) > 1 and len(processes) != self.nproc:       # MXNet's servers and scheduler
            started += f" ({len(processes)} processes in all)"
        log.say(f"starting {started}: {self.describe()}")
        token = new_token()
        watch = watching(job, serverless=not any(p.critical for p in processes), token=token)
        return Supervisor(processes, base_env, self.config.grace_period, log, watch=watch, signals=signals,
                          token=token)

    # ----------------------------------------------------------------- helpers for subclasses
    def script(self, python: str) -> tuple[str, ...]:
        return script_argv(self.config.entrypoint, self.config.script_args, python)

    @property
    def endpoint(self) -> str:
        """Where the nodes meet: the master's job store, or JOB_STORE's etcd members."""
        if self.config.job_store:
            return "etcd://" + ",".join(url.split("://", 1)[1] for url in self.config.job_store)
        return f"{self.config.master_addr}:{self.config.master_port}"
