"""Container entrypoint: environment -> launch plan -> supervised training, or a command.

    python -m entrypoint.main [--dry-run] [SCRIPT ARGS...]
    python -m entrypoint.main [--dry-run] PROGRAM [ARGS...]

The image runs this under `tini -g`. It reads only environment variables (config.py,
docs/configuration.md), plans the launch (plan.py: one launcher from launchers/), joins the
other nodes (join.py), runs the launcher's runner over the node's processes
(running/loop.py) while watching the job (job/watch.py), finishes together with the
other nodes (finish.py), and exits with the node's Outcome (outcome.py). If the first argument is a program (arguments.py), it runs
that instead, with the environment the training would get. With EXPLAIN=1 or --dry-run it
prints the plan and starts nothing. Bad input: one line on stderr, exit code 2, nothing
started.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time

from .contract import manifest
from .contract.arguments import Invocation, parse_arguments
from .contract.config import VARIABLES, ConfigError
from .explain import assumed_placement, control_plane, explain
from .health.progress import ProgressFolder
from .health.vigil import DIAGNOSTICS
from .job.finish import finish_together
from .job.join import Job, JoinedJob, LocalJob, NotJoined
from .job.peers import PeerJob
from .machine import hardware
from .machine import writable_dirs
from .plan import NodePlan, command_env, plan_from_env, plan_processes
from .running.log import Log
from .running.outcome import Outcome
from .running.signals import Signals
from .security.environ import init_holds_secret, scrub_environ_block, without_secret
from .security.secret import Deriving, read_secret
from .storage.client import StorageError
from .storage.node import NodeStorage

EXIT_BAD_INPUT = 2
DEFAULT_SCRIPT = next(v.default for v in VARIABLES if v.name == "ENTRYPOINT")


def build_plan(env: dict[str, str], script_args: list[str]) -> NodePlan:
    """This container's plan: its environment, its image, its hardware."""
    return plan_from_env(env, manifest.load(env), hardware.detect(env), tuple(script_args), python=sys.executable)


def preflight_summary(plan: NodePlan) -> str:
    hw = plan.hardware
    shm = f"{hw.shm_bytes / 2**20:.0f} MiB" if hw.shm_bytes is not None else "unknown"
    c = plan.config
    accel = plan.accelerator
    xla = f", PJRT_DEVICE={accel.pjrt_device}" if accel.xla else ""
    transport = f" ({plan.launcher.transport})" if plan.launcher.transport else ""
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


def job_identity(plan: NodePlan) -> Deriving | None:
    """The job's TLS identity from JOB_SECRET or JOB_SECRET_FILE (None: no secret), derived
    on a thread while the node starts (secret.Deriving). The secret leaves this process's
    environment, and its value the environment block that /proc/<pid>/environ shows
    (environ.py), so no process reads it from here."""
    secret = read_secret(plan.config)
    os.environ.pop("JOB_SECRET", None)
    scrub_environ_block("JOB_SECRET")
    return Deriving(secret, plan.config.run_id) if secret is not None else None


def prepare_folders(plan: NodePlan, env: dict[str, str], args: list[str]) -> tuple[NodePlan, list[str]]:
    """The folders the node writes, checked or redirected (writable_dirs.py); with a bucket
    URL and an unwritable default CACHE_DIR, the plan again with the fallback folder."""
    said = []
    if plan.config.data_url or plan.config.checkpoint_url:
        if (fallback := writable_dirs.object_cache(env, plan.config.cache_dir)) is not None:
            said.append(f"CACHE_DIR={plan.config.cache_dir} is not writable by uid {os.getuid()}: the node-local "
                        f"copies of the buckets go to {fallback} (mount a volume at CACHE_DIR to keep them)")
            os.environ["CACHE_DIR"] = env["CACHE_DIR"] = fallback
            plan = build_plan(env, args)
    return plan, said + writable_dirs.prepare(env, plan.config.checkpoint_dir)


# --------------------------------------------------------------------------- running

def run_node(plan: NodePlan, env: dict[str, str], log: Log, identity: Deriving | None = None,
             storage: NodeStorage | None = None) -> Outcome:
    """Join the job (or, locally, nothing to join), run this node's processes with the
    launcher's runner, and finish together with the other nodes. `identity`: the job's
    secret (JOB_SECRET), for its control plane; `storage`: its buckets, whose uploads are
    flushed once the processes have ended."""
    signals = Signals().install()
    outcome = _run_node(plan, env, log, identity, storage, signals)
    return storage.finish(outcome, signals.received_at, log.say) if storage else outcome


def _run_node(plan: NodePlan, env: dict[str, str], log: Log, identity: Deriving | None,
              storage: NodeStorage | None, signals: Signals) -> Outcome:
    if plan.mode == "local":
        job = LocalJob(plan, log)
    elif plan.config.job_store:                 # JOB_STORE: the nodes meet on etcd, no master
        job = PeerJob(plan, log, signals)
    else:
        job = Job(plan, log, signals, identity)
    c = plan.config
    # The processes report their steps here (vigil.py), unless both detections are off.
    progress = ProgressFolder() if c.hang_timeout or c.straggler_factor else None
    if progress:
        os.environ.update(progress.env())      # also for the processes torch's agent starts from here
        env = {**env, **progress.env()}
    with job:
        try:
            joined = dataclasses.replace(job.join(), progress=progress)
        except NotJoined as exc:
            return exc.outcome
        if storage:
            storage.start_mirror(joined.placement.node_rank, log.say)
        if plan.mode == "distributed" and not c.elastic:     # a lost node's peers fail in a collective
            log.hold_tracebacks(os.path.join(c.checkpoint_dir, DIAGNOSTICS), joined.placement.node_rank)
        store = joined.placement.store_endpoint
        if store and "DISTTRAIN_JOB_STORE" in plan.env:     # behind JOB_SECRET: this node's tunnel
            plan = dataclasses.replace(plan, env={**plan.env, "DISTTRAIN_JOB_STORE": store})
        try:
            runner = plan.launcher.runner(plan, joined, env, log, signals)
            return finish_together(runner.watch, runner.run())
        finally:
            if progress:
                progress.close()


def run_command(invocation: Invocation, env: dict[str, str], log: Log) -> int:
    """A program given after the image: runs in this process's place, with the environment
    the training processes would share (the plan's), as the image's user."""
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
    os.execve(invocation.program, list(invocation.command), {**without_secret(env), **extra})
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
        identity = job_identity(plan)
        env = without_secret(env)           # every process started from here on
        redirected, storage = [], None
        if not (dry_run or plan.config.explain):
            plan, redirected = prepare_folders(plan, env, args)
            if plan.mode == "direct" and plan.config.checkpoint_url:
                raise ConfigError(f"CHECKPOINT_DIR={str(plan.config.checkpoint_url)!r}: a rank started by an outer "
                                  f"launcher (mpirun, srun) has no node process to upload it; use the image's "
                                  f"launcher (LAUNCHER=mpi, or one container per node) or a shared folder")
            storage = NodeStorage.prepare(plan.config, env, log.say)
    except ConfigError as exc:
        log.say(str(exc), error=True)
        return EXIT_BAD_INPUT

    if dry_run or plan.config.explain:
        try:
            hardware.check_interface(plan.config.net_ifname)     # the real run's checks that need no peer
            processes = plan_processes(plan, assumed_placement(plan))
        except (ConfigError, LookupError) as exc:
            log.say(str(exc), error=True)
            return EXIT_BAD_INPUT
        print(explain(plan, processes, env), flush=True)
        return 0

    for line in redirected:
        log.say(line)
    if plan.mode != "direct":
        log.say(preflight_summary(plan))
    for warning in plan.warnings:
        log.say(f"WARNING: {warning}")
    if plan.config.has_secret and init_holds_secret():
        log.say("WARNING: JOB_SECRET stays readable in /proc/1/environ (the container's init, started with it) by "
                "every process of its user; give it as JOB_SECRET_FILE (a mounted secret: compose/secret.yml, "
                "the Kubernetes manifests) instead")
    if plan.mode == "direct":       # one rank of an outer launcher: the script takes this process's place
        try:
            if storage:             # each rank in turn (a lock): the first fetches, the others find it cached
                storage.before_ranks(log.say)
        except (ConfigError, StorageError) as exc:
            log.say(str(exc), error=True)
            return EXIT_BAD_INPUT if isinstance(exc, ConfigError) else 1
        if plan.config.has_secret and plan.direct.rank == 0:
            log.say(f"control plane: {control_plane(plan)}")
        return plan.launcher.runner(plan, JoinedJob(assumed_placement(plan)), env, log, None).run()
    started = time.monotonic()
    try:
        if storage:
            storage.before_ranks(log.say)
        outcome = run_node(plan, env, log, identity, storage)
    except ConfigError as exc:
        log.say(str(exc), error=True)
        return EXIT_BAD_INPUT
    except StorageError as exc:
        log.say(str(exc), error=True)
        return 1
    # A failure and its reasons go to stderr, so that no pipe puts the verdict first; a
    # success and a stop asked for (SIGTERM) to stdout.
    log.release()
    log.say(f"done: exit {outcome.code} after {time.monotonic() - started:.1f}s",
            error=not (outcome.ok or outcome.on_purpose))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave now: the processes are stopped and the output flushed. Interpreter teardown
    # (torch's destructors) takes a while, and a SIGTERM arriving then (compose stopping
    # the other containers) would turn this node's result into 143.
    os._exit(outcome.code)


if __name__ == "__main__":
    sys.exit(main())
