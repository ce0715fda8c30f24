"""Container entrypoint: environment -> launch plan -> supervised training, or a command.

    python -m entrypoint.main [--dry-run] [SCRIPT ARGS...]
    python -m entrypoint.main [--dry-run] PROGRAM [ARGS...]

The image runs this under `tini -g`. It reads only environment variables (see config.py
and README.md), plans the launch (plan.py), joins the other nodes (join.py), supervises the
node's processes (supervisor.py) while watching the job (watch.py), and exits with the
node's Outcome (outcome.py). If the first argument is a program (arguments.py), it runs
that instead, with the environment the training would get. With EXPLAIN=1 or --dry-run it
prints the plan and starts nothing. Bad input: one line on stderr, exit code 2, nothing
started.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import replace
from typing import Protocol

from . import hardware, manifest
from .arguments import Invocation, parse_arguments
from .config import VARIABLES, ConfigError, load_config
from .ecosystem import translate
from .join import Job, LocalJob, NotJoined
from .log import Log
from .outcome import Outcome
from .plan import (NodePlan, Placement, assumed_placement, command_env, explain, plan_node, plan_processes,
                   torchrun_launch)
from .reaper import new_token
from .signals import Signals
from .supervisor import Supervisor

EXIT_BAD_INPUT = 2
DEFAULT_SCRIPT = next(v.default for v in VARIABLES if v.name == "ENTRYPOINT")


def build_plan(env: dict[str, str], script_args: list[str]) -> NodePlan:
    image = manifest.load(env)
    translation = translate(env)
    config = load_config(translation.env, image.frameworks, image.launchers, tuple(script_args),
                         translation.sources, xla=image.xla)
    return plan_node(config, hardware.detect(env), env, translation.direct, python=sys.executable, xla=image.xla,
                     mpirun="mpi" in image.launchers)


def preflight_summary(plan: NodePlan) -> str:
    hw = plan.hardware
    shm = f"{hw.shm_bytes / 2**20:.0f} MiB" if hw.shm_bytes is not None else "unknown"
    c = plan.config
    accel = plan.accelerator
    xla = f", PJRT_DEVICE={accel.pjrt_device}" if accel.xla else ""
    transport = {"mpi": " (Horovod over MPI: Open MPI shared memory)",
                 "gloo": " (Horovod over Gloo)"}.get(plan.horovod_controller or "", "")
    return (f"preflight: accelerator {accel.kind}{xla}; {hw.gpus} GPU(s), {hw.tpu_text()}, {hw.cpus} CPU(s), "
            f"/dev/shm {shm}; FRAMEWORK={c.framework} LAUNCHER={c.launcher}{transport} TRAIN_MODE={c.train_mode} "
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
    spec = plan_processes(plan, assumed_placement(plan))[0]
    os.execvpe(spec.argv[0], list(spec.argv), {**env, **spec.env})
    return 0  # not reached


class Runner(Protocol):
    def run(self) -> Outcome: ...


def node_runner(plan: NodePlan, job: Job | LocalJob, placement: Placement, env: dict[str, str], log: Log,
                signals: Signals) -> Runner:
    """The launch seam: what runs this node's processes and returns its Outcome: torch's
    elastic agent in this process for torchrun across nodes (agent.py; the entrypoint has
    imported torch for the job store already), else a Supervisor over the planned processes
    (torchrun on one node, as a subprocess rendered from torchrun.TorchrunLaunch), or, for
    elastic Horovod, the node that starts workers on the driver's orders."""
    if plan.horovod_elastic:
        from .horovod_elastic import HorovodElasticNode
        log.say(f"running Horovod workers as the driver asks: {plan.launcher}")
        return HorovodElasticNode(job.store, plan, placement, env, log, signals, job.watch(serverless=False))
    if plan.torchrun_in_process:
        from .agent import InProcessTorchrun
        launch = torchrun_launch(plan, placement)
        launch = replace(launch, env={**launch.env, "DISTTRAIN_LAUNCHER": plan.config.launcher})
        log.say(f"starting torch's elastic agent in this process: {plan.launcher}")
        token = new_token()
        return InProcessTorchrun(launch, plan.python, plan.config.grace_period, log, signals=signals, token=token,
                                 watch=job.watch(serverless=False, token=token, agent_in_process=True))
    processes = plan_processes(plan, placement)
    log.say(f"starting {len(processes)} process(es): {plan.launcher}")
    token = new_token()
    watch = job.watch(serverless=not any(p.critical for p in processes), token=token)
    return Supervisor(processes, env, plan.config.grace_period, log, watch=watch, signals=signals, token=token)


def run_node(plan: NodePlan, env: dict[str, str], log: Log) -> Outcome:
    """Join the job (or, locally, nothing to join), run this node's processes, and finish
    together with the other nodes."""
    signals = Signals().install()
    job = LocalJob(plan) if plan.mode == "local" else Job(plan, log, signals)
    with job:
        try:
            placement = job.join()
        except NotJoined as exc:
            return exc.outcome
        return job.finish(node_runner(plan, job, placement, env, log, signals).run())


def run_command(invocation: Invocation, env: dict[str, str], log: Log) -> int:
    """A program given after the image: runs in this process's place, with the environment
    the training processes would share (plan_node's), as the image's user."""
    try:
        plan = build_plan(env, [])
    except ConfigError as exc:
        log.say(str(exc), error=True)
        return EXIT_BAD_INPUT
    extra = command_env(plan)
    if invocation.dry_run or plan.config.explain:
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(extra.items()) if env.get(k) != v)
        print(f"disttrain command (no training is launched)\n  runs:  {shlex.join(invocation.command)}"
              f"\n  program: {invocation.program}\n  env:   {shown}", flush=True)
        return 0
    script = plan.config.entrypoint
    if os.path.isfile(script):
        log.say(f"running the command {invocation.command[0]!r} ({invocation.program}), not {script}; to pass "
                f"{invocation.command[0]!r} to the script, put -- before it", error=True)
    os.execve(invocation.program, list(invocation.command), {**env, **extra})
    return 0  # not reached


def main(argv: list[str] | None = None) -> int:
    env = dict(os.environ)
    log = Log()
    script = (env.get("ENTRYPOINT") or "").strip() or DEFAULT_SCRIPT
    invocation = parse_arguments(list(sys.argv[1:] if argv is None else argv), script, os.getcwd())
    if invocation.command:
        return run_command(invocation, env, log)
    dry_run, args = invocation.dry_run, list(invocation.script_args)
    try:
        plan = build_plan(env, args)
        if not (dry_run or plan.config.explain):
            check_script(plan)
    except ConfigError as exc:
        log.say(str(exc), error=True)
        return EXIT_BAD_INPUT

    if dry_run or plan.config.explain:
        try:
            processes = plan_processes(plan, assumed_placement(plan))
        except ConfigError as exc:
            log.say(str(exc), error=True)
            return EXIT_BAD_INPUT
        print(explain(plan, processes, env), flush=True)
        return 0

    if plan.mode != "direct":
        log.say(preflight_summary(plan))
    for warning in plan.warnings:
        log.say(f"WARNING: {warning}")
    if plan.mode == "direct":
        return run_direct(plan, env)
    started = time.monotonic()
    try:
        outcome = run_node(plan, env, log)
    except ConfigError as exc:
        log.say(str(exc), error=True)
        return EXIT_BAD_INPUT
    log.say(f"done: exit {outcome.code} after {time.monotonic() - started:.1f}s")
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave now: the processes are stopped and the output flushed. Interpreter teardown
    # (torch's destructors) takes a while, and a SIGTERM arriving then (compose stopping
    # the other containers) would turn this node's result into 143.
    os._exit(outcome.code)


if __name__ == "__main__":
    sys.exit(main())
