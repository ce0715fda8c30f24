"""torchrun across nodes (TorchrunAgent): torch's elastic agent inside the entrypoint: one process per node imports torch for
the launch (the job store already needs it), not two.

The TorchrunLaunch (torchrun.py) is read back by torch's own parser, as torchrun's command
line (torch.distributed.run.config_from_args): the LaunchConfig, program and arguments are
exactly the ones a torchrun subprocess would use. The agent is torch's LocalElasticAgent,
built as torch's launch_agent builds it, with one addition: it stops when asked (a signal,
or the job watch), as torchrun stops on SIGTERM, shutting its workers down with the signal
and GRACE_PERIOD before SIGKILL, and leaving the rendezvous open for the nodes that stay.

The agent runs on a thread of its own; this thread supervises it in the one supervision
loop (running/loop.py), as Supervisor does its processes: the signals, the job watch once a
second, the agent's result. What the
supervisor gives each process, the workers get here too: the node token (in this process's
environment, which the agent's workers inherit; the sentinel ends them if this process is
killed), and output lines prefixed the same way (torch's tee: '[rank3]: ...'; anything else
the agent writes: '[torchrun] ...').
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

from ...health.watching import watching
from ...running import rank_lines
from ...running.log import Log
from ...running.loop import POLL_INTERVAL, Watch, supervise
from ...running.outcome import NodeState, Outcome
from ...running.reaper import TOKEN_VAR, Sentinel, new_token, sweep
from ...running.signals import Signals
from .launch import Torchrun, TorchrunLaunch
from .node_ids import distinct_node_ids
from .rendezvous_pace import beat_often, keep_pace, reform_at_once
from .run import FAILURE_REPORT, worker_failure
from .worker_stores import WorkersStores

AGENT_LABEL = "torchrun"


class _Lines:
    """A text stream that writes whole lines through the Log: the agent's threads (torch's
    tee of every worker, its logging) and the entrypoint's own lines never interleave.
    `stream` ("out", "err") tells the Log which of the workers' streams a line is from."""

    def __init__(self, log: Log, prefix: str, stream: str):
        self.log, self.prefix, self.stream = log, prefix, stream
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
        for line in lines:
            self.log.line(rank_lines.tagged(line, self.prefix), self.stream)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class _ChildThreadWarning(logging.Filter):
    """torch warns that its agent, off the main thread, cannot install signal handlers: here
    the entrypoint handles the signals and the node token catches orphans."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "running on a child thread" not in record.getMessage()


def _torch_log_handlers(streams) -> list[logging.StreamHandler]:
    """torch's logging handlers that write to these streams (they hold the stream itself)."""
    loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
               if name == "torch" or name.startswith("torch.")]
    return [h for lg in loggers for h in lg.handlers
            if isinstance(h, logging.StreamHandler) and any(h.stream is s for s in streams)]


def launch_config(launch: TorchrunLaunch, python: str, grace_period: float):
    """(LaunchConfig, program, arguments): what torchrun would build from this launch."""
    from torch.distributed.run import config_from_args, parse_args

    argv = launch.argv(python)
    config, program, args = config_from_args(parse_args(list(argv[3:])))    # after `python -m torch.distributed.run`
    config.shutdown_timeout = int(grace_period)
    return config, program, args


def _wrapped(handler, next_rendezvous, use_agent_store=None, on_shutdown=None):
    """torch's rendezvous handler, with its rounds (and optionally whether the workers use
    the agent's store, and what to close at shutdown) replaced; everything else its own."""
    from torch.distributed.elastic.rendezvous.api import RendezvousHandler

    class Wrapped(RendezvousHandler):
        def next_rendezvous(self):
            return next_rendezvous()

        @property
        def use_agent_store(self) -> bool:
            return handler.use_agent_store if use_agent_store is None else use_agent_store

        def get_backend(self):
            return handler.get_backend()

        def is_closed(self):
            return handler.is_closed()

        def set_closed(self):
            return handler.set_closed()

        def num_nodes_waiting(self):
            return handler.num_nodes_waiting()

        def get_run_id(self):
            return handler.get_run_id()

        def shutdown(self):
            if on_shutdown is not None:
                on_shutdown()
            return handler.shutdown()

    return Wrapped()


def _in_job_order(handler, node_rank: int | None, local_addr: str | None, stores=None):
    """torch's c10d rendezvous handler, with what the job adds to each round:

    `node_rank` (fixed-size jobs): this node's group rank replaced by its rank in the job
    store, so global ranks follow node ranks and rank 0 runs on the master, as under the
    other launchers. c10d numbers the nodes by their sorted descriptors (address, pid), so
    without this rank 0 lands on whichever node sorts first. Both are permutations of
    0..N-1 over the same round, so every node's view agrees. Elastic jobs keep c10d's.

    Where torch does not share its rendezvous store with the workers (restarts enabled:
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE), global rank 0's process serves their store at
    MASTER_ADDR:MASTER_PORT, so that address must be the master's: it is published here,
    under keys of our own in the round's store.

    `stores` (behind JOB_SECRET, worker_stores.WorkersStores): the workers' store is the
    round's own store on the master, reached on this node's loopback; every worker is a
    client (use_agent_store), and no process serves one of its own."""
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
    from torch.distributed.elastic.utils.distributed import get_free_port

    def next_rendezvous():
        info = handler.next_rendezvous()
        rank = info.rank if node_rank is None else node_rank
        bootstrap = info.bootstrap_store_info
        if stores is not None:
            bootstrap = RendezvousStoreInfo("127.0.0.1", stores.open(info.store))
        elif not handler.use_agent_store:
            store = info.store
            if rank == 0:
                store.set("disttrain/master_addr", local_addr or bootstrap.master_addr)
                store.set("disttrain/master_port", str(get_free_port()))
            bootstrap = RendezvousStoreInfo(store.get("disttrain/master_addr").decode(),
                                            int(store.get("disttrain/master_port").decode()))
        return RendezvousInfo(info.store, rank, info.world_size, bootstrap)

    return _wrapped(handler, next_rendezvous, use_agent_store=True if stores is not None else None,
                    on_shutdown=stores.close if stores is not None else None)


def _linked(handler, identity=None, say=None):
    """torch's handler, with this node's links to the others of each round (peer_links.py):
    a node whose connection closes is dropped from the rendezvous at once. `identity`: the
    job's TLS identity (JOB_SECRET), which the links then use."""
    from .peer_links import PeerLinks

    def dropped(node):
        if say is not None:
            say(f"rendezvous: node {node.addr} (pid {node.pid}) closed its connection: dropped without waiting "
                f"for its keep-alive to age out")

    try:
        links = PeerLinks(handler, identity=identity, on_dead=dropped)
    except (OSError, AttributeError) as exc:        # no port to listen on, or a torch without these internals
        if say is not None:
            say(f"rendezvous: no peer links ({type(exc).__name__}: {exc}): a lost node is dropped after "
                f"ELASTIC_DEAD_AFTER")
        return handler

    def next_rendezvous():
        info = handler.next_rendezvous()
        links.follow(list(handler._state_holder.state.participants))
        return info

    return _wrapped(handler, next_rendezvous, on_shutdown=links.close)


ROUND_CHANGE = {-1: "a node left or was lost", 0: "the same nodes, after a restart", 1: "a node joined"}


def _saying_rounds(handler, say):
    """The handler, saying each round it forms in one line: how many nodes, this node's
    place, and whether the job shrank or grew. Where no master watches the job (JOB_STORE),
    that is how a node learns of a lost or new peer."""
    before: dict = {"world": None}

    def next_rendezvous():
        info = handler.next_rendezvous()
        was = before["world"]
        change = "" if was is None else f" (was {was}: {ROUND_CHANGE[(info.world_size > was) - (info.world_size < was)]})"
        say(f"rendezvous: {info.world_size} node(s), this one has group rank {info.rank}{change}")
        before["world"] = info.world_size
        return info

    return _wrapped(handler, next_rendezvous)


def _agent(config, program, args, stop: dict, node_rank: int | None = None, stores=None, say=None, identity=None):
    """torch's LocalElasticAgent as launch_agent makes it (torch.distributed.launcher.api),
    checking `stop` each time it checks its workers; with `node_rank` (fixed-size jobs), its
    nodes in node-rank order; with `stores`, the workers' store of each round (_in_job_order);
    with `say` and JOB_STORE's rendezvous, a line per round (_saying_rounds); elastic, links
    to the other nodes of each round (_linked), TLS with `identity` (JOB_SECRET)."""
    import torch.distributed.elastic.rendezvous.registry as rdzv_registry
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    from .etcd_rendezvous import register as register_etcd_backend

    class StoppableAgent(LocalElasticAgent):
        def _monitor_workers(self, worker_group):
            if stop["signum"] is not None:
                # What torch's own handler raises on SIGTERM: the agent shuts its workers
                # down with the signal and leaves; the rendezvous stays open for the others.
                stop["seen"].set()
                raise SignalException("stopped by the entrypoint", sigval=signal.Signals(stop["signum"]))
            return super()._monitor_workers(worker_group)

    distinct_node_ids()
    register_etcd_backend()                    # --rdzv-backend=etcd-v3 (JOB_STORE)
    logging.getLogger(FAILURE_REPORT).setLevel(logging.CRITICAL)
    params = RendezvousParameters(backend=config.rdzv_backend, endpoint=config.rdzv_endpoint, run_id=config.run_id,
                                  min_nodes=config.min_nodes, max_nodes=config.max_nodes,
                                  local_addr=config.local_addr, **config.rdzv_configs)
    handler = rdzv_registry.get_rendezvous_handler(params)
    if config.max_nodes > 1:
        keep_pace(handler, config.max_nodes)
        beat_often(handler)
        reform_at_once()
        if config.min_nodes < config.max_nodes:
            handler = _linked(handler, identity, say)
    if node_rank is not None or stores is not None:
        handler = _in_job_order(handler, node_rank, config.local_addr, stores)
    if say is not None and config.rdzv_backend == "etcd-v3":      # no master logs the rounds
        handler = _saying_rounds(handler, say)
        # Its warnings of failed keep-alives: a store that stays lost ends the node in one line.
        logging.getLogger("torch.distributed.elastic.rendezvous.dynamic_rendezvous").setLevel(logging.ERROR)
    spec = WorkerSpec(role=config.role, local_world_size=config.nproc_per_node, entrypoint=program, args=tuple(args),
                      rdzv_handler=handler, max_restarts=config.max_restarts,
                      monitor_interval=config.monitor_interval, local_addr=config.local_addr)
    # GRACE_PERIOD before SIGKILL where this torch's agent takes it; else torch's 30 s,
    # cut short by the token sweep after GRACE_PERIOD (InProcessTorchrun._end, run()).
    takes = inspect.signature(LocalElasticAgent.__init__).parameters
    extra = {"shutdown_timeout": config.shutdown_timeout} if "shutdown_timeout" in takes else {}
    agent = StoppableAgent(spec=spec, logs_specs=config.logs_specs, start_method=config.start_method,
                           log_line_prefix_template=config.log_line_prefix_template, **extra)
    return agent, spec, SignalException


class InProcessTorchrun:
    """Runs torch's elastic agent for this node in this process; `run()` returns the
    node's Outcome, as Supervisor.run() does for a torchrun subprocess."""

    def __init__(self, launch: TorchrunLaunch, python: str, grace_period: float, log: Log,
                 watch: Watch | None = None, signals: Signals | None = None, token: str | None = None,
                 stores=None, identity=None):
        """`stores`: the workers' stores behind JOB_SECRET (worker_stores.WorkersStores);
        `identity`: the job's TLS identity behind JOB_SECRET (for the peer links)."""
        self.launch, self.python, self.grace, self.log = launch, python, grace_period, log
        self.stores, self.identity = stores, identity
        self.watch = watch
        self.signals = signals or Signals()
        self.token = token or new_token()
        self._stop: dict = {"signum": None, "seen": threading.Event()}
        self._result: Outcome | None = None
        self._done = threading.Event()

    def run(self) -> Outcome:
        # The workers inherit this process's environment (torch's SubprocessHandler): the
        # launch's variables and the node token go there. /proc/<pid>/environ of this process
        # keeps its start-up environment, so the token sweeps never count it as a carrier.
        os.environ.update(self.launch.env)
        os.environ[TOKEN_VAR] = self.token
        sentinel = Sentinel(self.token)
        streams = sys.stdout, sys.stderr
        prefix = rank_lines.prefix(AGENT_LABEL)
        sys.stdout, sys.stderr = _Lines(self.log, prefix, "out"), _Lines(self.log, prefix, "err")
        handlers = {h: h.stream for h in _torch_log_handlers(streams)}
        for handler in handlers:
            handler.setStream(sys.stderr)
        quiet = _ChildThreadWarning()
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(quiet)
        try:
            config, program, args = launch_config(self.launch, self.python, self.grace)
            thread = threading.Thread(target=self._run_agent, args=(config, program, args), daemon=True,
                                      name="torchrun-agent")
            thread.start()
            outcome = supervise(self, self.watch, self.signals, self.log)
            self._end(thread, outcome)
            return outcome
        finally:
            sweep(self.token)
            sentinel.close()
            sys.stdout, sys.stderr = streams
            logging.getLogger("torch.distributed.elastic.multiprocessing.api").removeFilter(quiet)
            for handler, stream in handlers.items():
                handler.setStream(stream)

    def _run_agent(self, config, program, args) -> None:
        try:
            agent, spec, SignalException = _agent(config, program, args, self._stop, self.launch.node_rank,
                                                     self.stores, say=self.log.say, identity=self.identity)
            stopped = False
            try:
                result = agent.run()
            except SignalException:
                stopped = True          # asked to stop: the rendezvous stays open for the others
                raise
            finally:
                if not stopped:
                    spec.rdzv_handler.shutdown()
            self._result = self._outcome(result)
        except BaseException as exc:          # noqa: BLE001 - the node's outcome, whatever ended the agent
            from .etcd_rendezvous import StoreLost

            text = str(exc).splitlines()[0] if str(exc) else ""
            if isinstance(exc, StoreLost):      # JOB_STORE's quorum lost: poll() says this one line
                self._result = Outcome.lost(text)
                return
            if self._stop["signum"] is None:
                self.log.say(f"{AGENT_LABEL}: {type(exc).__name__}: {text}", error=True)
            self._result = Outcome.failed(f"{AGENT_LABEL} failed: {type(exc).__name__}", 1)
        finally:
            self._done.set()

    @staticmethod
    def _outcome(result) -> Outcome:
        """The agent's RunResult as the node's outcome: the failed worker's own exit code
        (torchrun itself exits 1)."""
        if result is None or not result.is_failed():
            return Outcome.succeeded()
        rank, failure = min(result.failures.items())
        return worker_failure(rank, failure.exitcode)

    # ----------------------------------------------------------------- Supervised
    def poll(self) -> Outcome | None:
        if not self._done.is_set():
            return None
        if self._result.state is not NodeState.SUCCEEDED:
            self.log.say(f"{self._result.reason}: stopping", error=True)
        return self._result

    def what(self) -> str:
        return f"{AGENT_LABEL}'s workers"

    def wait(self, seconds: float) -> None:
        self._done.wait(seconds)

    def _end(self, thread: threading.Thread, outcome: Outcome) -> None:
        """Stop the agent if it still runs: its workers get SIGTERM, then SIGKILL after the
        grace period (torch's shutdown, or the token sweep in run()). An agent busy elsewhere
        (a rendezvous, a store call to a master that froze) does not see the request within
        a few monitor intervals: then the workers get SIGTERM from here, and the agent is
        left behind when this process exits."""
        if self._done.is_set():
            return
        deadline = time.monotonic() + self.grace
        self._stop["signum"] = signal.SIGTERM
        if not self._stop["seen"].wait(5 * self.launch.monitor_interval + POLL_INTERVAL):
            sweep(self.token, signal.SIGTERM)
        thread.join(max(0.0, deadline - time.monotonic()) + POLL_INTERVAL)
        if thread.is_alive():
            self.log.say(f"{AGENT_LABEL}'s agent did not stop within GRACE_PERIOD={self.grace:g}s: "
                         f"SIGKILL to its workers")


@dataclass(frozen=True)
class TorchrunAgent(Torchrun):
    """Across nodes: torch's elastic agent runs inside the entrypoint (this module),
    which has imported torch for the job store already, rather than in a second process
    that imports it again."""

    in_process = True

    def dry_run_notes(self) -> list[str]:
        return ["(torch's elastic agent runs inside the entrypoint, configured by this torchrun command line)"]

    def runner(self, plan, job, base_env, log, signals):
        launch = self.launch(plan, job.placement)
        log.say(f"starting torch's elastic agent in this process: {self.describe()}")
        token = new_token()
        stores = WorkersStores(job.store) if launch.workers_stores else None
        return InProcessTorchrun(launch, plan.python, self.config.grace_period, log, signals=signals, token=token,
                                 watch=watching(job, serverless=False, token=token, agent_in_process=True), stores=stores,
                                 identity=getattr(job.store, "identity", None))
