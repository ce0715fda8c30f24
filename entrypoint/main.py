"""Container entrypoint: environment -> launch plan -> supervised training, or a command.

    python -m entrypoint.main [--dry-run] [SCRIPT ARGS...]
    python -m entrypoint.main [--dry-run] PROGRAM [ARGS...]

The image runs this under `tini -g`. It reads only environment variables (see config.py
and README.md), plans the launch (plan.py), meets the other nodes (membership.py), and
supervises the node's processes (supervisor.py). If the first argument is a program
(arguments.py), it runs that instead, with the environment the training would get. With
EXPLAIN=1 or --dry-run it prints the plan and starts nothing. Bad input: one line on
stderr, exit code 2, nothing started.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time

from . import hardware, manifest
from .arguments import Invocation, parse_arguments
from .config import VARIABLES, ConfigError, load_config
from .ecosystem import translate
from .membership import JobStore, RendezvousError
from .plan import NodeInfo, NodePlan, assumed_nodes, command_env, explain, plan_node, plan_processes
from .supervisor import Supervisor

EXIT_BAD_INPUT = 2
EXIT_RENDEZVOUS = 3
DEFAULT_SCRIPT = next(v.default for v in VARIABLES if v.name == "ENTRYPOINT")


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def say(text: str, stream=sys.stdout) -> None:
    stream.write(f"entrypoint: {text}\n")
    stream.flush()


def build_plan(env: dict[str, str], script_args: list[str]) -> NodePlan:
    image = manifest.load(env)
    translation = translate(env)
    config = load_config(translation.env, image.frameworks, image.launchers, tuple(script_args),
                         translation.sources, xla=image.xla)
    return plan_node(config, hardware.detect(env), env, translation.direct, python=sys.executable, xla=image.xla)


def preflight_summary(plan: NodePlan) -> str:
    hw = plan.hardware
    shm = f"{hw.shm_bytes / 2**20:.0f} MiB" if hw.shm_bytes is not None else "unknown"
    c = plan.config
    accel = plan.accelerator
    xla = f", PJRT_DEVICE={accel.pjrt_device}" if accel.xla else ""
    return (f"preflight: accelerator {accel.kind}{xla}; {hw.gpus} GPU(s), {hw.tpu_text()}, {hw.cpus} CPU(s), "
            f"/dev/shm {shm}; FRAMEWORK={c.framework} LAUNCHER={c.launcher} TRAIN_MODE={c.train_mode} "
            f"NPROC_PER_NODE={plan.nproc}")


def check_script(plan: NodePlan) -> None:
    path = plan.config.entrypoint
    if not os.path.isfile(path):
        raise ConfigError(f"ENTRYPOINT={path!r}: no such file; mount your training code at /app/code "
                          f"(entry train.py) or set ENTRYPOINT to your script")
    if not path.endswith(".py") and not os.access(path, os.X_OK):
        raise ConfigError(f"ENTRYPOINT={path!r}: not a .py file and not executable")


# --------------------------------------------------------------------------- running

def run_direct(plan: NodePlan, env: dict[str, str]) -> int:
    spec = plan_processes(plan, [], plan.direct.rank)[0]
    os.execvpe(spec.argv[0], list(spec.argv), {**env, **spec.env})
    return 0  # not reached


def run_local(plan: NodePlan, env: dict[str, str], supervisor: Supervisor) -> int:
    from .horovod_rendezvous import HorovodRendezvous

    nodes = [NodeInfo(0, "127.0.0.1", plan.nproc, tuple(hardware.free_ports(plan.ports_needed, "127.0.0.1")))]
    server = HorovodRendezvous(nodes, 0, "127.0.0.1") if plan.rendezvous and plan.rendezvous.horovod_server else None
    try:
        specs = plan_processes(plan, nodes, 0, iface=None, horovod_addr="127.0.0.1",
                               horovod_port=server.port if server else None,
                               master_port=hardware.free_ports(1, "127.0.0.1")[0])
        say(f"starting {len(specs)} process(es): {plan.launcher}")
        return supervisor.run(specs, env)
    finally:
        if server:
            server.stop()


def _interrupt_on_signals() -> None:
    def handler(signum, _frame):
        raise Interrupted(signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_distributed(plan: NodePlan, env: dict[str, str], supervisor: Supervisor) -> int:
    from .horovod_rendezvous import HorovodRendezvous

    c = plan.config
    master = c.role == "master"
    deadline = time.monotonic() + c.rdzv_timeout
    store = JobStore(c, serve=master)
    server = None
    _interrupt_on_signals()              # until the processes start, a signal just ends us
    try:
        if not master and hardware.resolve(c.master_addr) is None:
            say(f"WARNING: MASTER_ADDR={c.master_addr!r} does not resolve (yet); retrying for up to "
                f"RDZV_TIMEOUT={c.rdzv_timeout}s")
        say(f"{'serving' if master else 'joining'} the job store at {c.master_addr}:{c.master_port}")
        store.connect(deadline)
        node_rank = store.claim_rank(0 if master else c.node_rank)
        master_ip = hardware.resolve(c.master_addr)
        if master_ip is None:
            raise RendezvousError(f"MASTER_ADDR={c.master_addr!r} does not resolve")
        source_ip = hardware.route_source(master_ip)
        try:
            iface, warnings = hardware.choose_interface(master_ip, source_ip, hardware.interfaces(), c.net_ifname)
        except LookupError as exc:
            raise ConfigError(str(exc)) from None
        for warning in warnings:
            say(f"WARNING: {warning}")
        node_addr = c.node_addr or (c.master_addr if master and not plan.numeric_addr else source_ip)
        if plan.numeric_addr:
            node_addr = hardware.resolve(node_addr) or node_addr
        ports = (tuple(range(c.worker_port_base, c.worker_port_base + plan.ports_needed)) if c.worker_port_base
                 else tuple(hardware.free_ports(plan.ports_needed)))
        me = NodeInfo(node_rank, node_addr, plan.nproc, ports)
        store.publish(me)
        say(f"node {node_rank} of {c.num_nodes if not c.elastic else f'{c.min_nodes}:{c.max_nodes}'}: "
            f"address {node_addr}, interface {iface or '(auto)'}, {plan.nproc} process(es)")
        nodes, horovod_port, torch_port = [me], c.horovod_port, None
        if plan.rendezvous.exchange:
            nodes = store.wait_for_nodes(c.num_nodes, deadline)
            if master:
                if plan.rendezvous.horovod_server:
                    server = HorovodRendezvous(nodes, c.horovod_port)
                # torch.distributed's env:// for scripts under Horovod: rank 0 is on the master,
                # on a port of its own (MASTER_PORT is the job store's).
                torch_port = hardware.free_ports(1)[0]
                store.announce_launch(horovod_port=server.port if server else None, torch_port=torch_port)
            else:
                launch = store.wait_for_launch(deadline)
                horovod_port = launch.get("horovod_port") or horovod_port
                torch_port = launch.get("torch_port")
        specs = plan_processes(plan, nodes, node_rank, iface=iface, horovod_addr=c.master_addr,
                               horovod_port=horovod_port, master_port=torch_port or c.master_port)
    except Interrupted as exc:
        store.abort(f"node stopped by {signal.Signals(exc.signum).name} during rendezvous", 128 + exc.signum)
        return 128 + exc.signum
    except RendezvousError as exc:
        say(f"rendezvous failed: {exc}", sys.stderr)
        store.abort(f"node {store.node_rank}: {exc}")
        return EXIT_RENDEZVOUS

    supervisor.install_signal_handlers()
    supervisor.poll = store.poll
    supervisor.on_signal = lambda signum: store.abort(
        f"node {node_rank} was stopped ({signal.Signals(signum).name})", 128 + signum)
    if not any(s.critical for s in specs):
        supervisor.job_finished = store.master_finished
    try:
        say(f"starting {len(specs)} process(es): {plan.launcher}")
        code = supervisor.run(specs, env)
        final = store.finish(code, stop_requested=lambda: supervisor.signal_received is not None)
        return final
    finally:
        if server:
            server.stop()


def run_command(invocation: Invocation, env: dict[str, str]) -> int:
    """A program given after the image: runs in this process's place, with the environment
    the training processes would share (plan_node's), as the image's user."""
    try:
        plan = build_plan(env, [])
    except ConfigError as exc:
        say(str(exc), sys.stderr)
        return EXIT_BAD_INPUT
    extra = command_env(plan)
    if invocation.dry_run or plan.config.explain:
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(extra.items()) if env.get(k) != v)
        print(f"disttrain command (no training is launched)\n  runs:  {shlex.join(invocation.command)}"
              f"\n  program: {invocation.program}\n  env:   {shown}", flush=True)
        return 0
    script = plan.config.entrypoint
    if os.path.isfile(script):
        say(f"running the command {invocation.command[0]!r} ({invocation.program}), not {script}; to pass "
            f"{invocation.command[0]!r} to the script, put -- before it", sys.stderr)
    os.execve(invocation.program, list(invocation.command), {**env, **extra})
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    env = dict(os.environ)
    script = (env.get("ENTRYPOINT") or "").strip() or DEFAULT_SCRIPT
    invocation = parse_arguments(list(sys.argv[1:] if argv is None else argv), script, os.getcwd())
    if invocation.command:
        return run_command(invocation, env)
    dry_run, args = invocation.dry_run, list(invocation.script_args)
    try:
        plan = build_plan(env, args)
        if not (dry_run or plan.config.explain):
            check_script(plan)
    except ConfigError as exc:
        say(str(exc), sys.stderr)
        return EXIT_BAD_INPUT

    if dry_run or plan.config.explain:
        try:
            nodes = assumed_nodes(plan)
            rank = plan.direct.rank if plan.direct else (plan.config.node_rank or 0)
            processes = plan_processes(plan, nodes, rank, iface=plan.config.net_ifname, master_port=plan.config.master_port,
                                       horovod_port=plan.config.horovod_port)
        except ConfigError as exc:
            say(str(exc), sys.stderr)
            return EXIT_BAD_INPUT
        print(explain(plan, processes, env), flush=True)
        return 0

    if plan.mode != "direct":
        say(preflight_summary(plan))
    for warning in plan.warnings:
        say(f"WARNING: {warning}")
    if plan.mode == "direct":
        return run_direct(plan, env)
    supervisor = Supervisor(plan.config.grace_period)
    started = time.monotonic()
    try:
        if plan.mode == "local":
            supervisor.install_signal_handlers()
            code = run_local(plan, env, supervisor)
        else:
            code = run_distributed(plan, env, supervisor)
    except ConfigError as exc:
        say(str(exc), sys.stderr)
        return EXIT_BAD_INPUT
    say(f"done: exit {code} after {time.monotonic() - started:.1f}s")
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave now: the processes are stopped and the output flushed. Interpreter teardown
    # (torch's destructors) takes a while, and a SIGTERM arriving then (compose stopping
    # the other containers) would turn this node's result into 143.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
