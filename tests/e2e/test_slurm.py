"""The sbatch scripts users run (deploy/slurm/), on a real two-node Slurm on this machine
(slurmctld and two `slurmd -N`, node1 on 127.0.0.1 and node2 on 127.0.0.2): the entrypoint
read from Slurm's variables, one task per node directly and through `docker run`, several
tasks per node as ranks; `scancel` leaving nothing behind, a failing rank failing the job,
and a job that Slurm sends SIGTERM checkpointing and resuming once requeued."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from testing.cluster import base_env

from testing.results import results
from tests.e2e.docker_env import docker
from tests.e2e.slurm import SCRIPTS

pytestmark = pytest.mark.e2e


def job_env(tmp: Path, **env) -> dict[str, str]:
    """A submitter's environment: this checkout's entrypoint on this interpreter (python3 on
    PATH is it), the test's folders, a free MASTER_PORT."""
    from testing.ports import free_port

    env = base_env(tmp, MASTER_PORT=free_port(), FRAMEWORK="pytorch", **env)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def assert_replicas_agree(output: str, world: int) -> None:
    found = results(output)
    assert len(found) == world, output[-3000:]
    assert {r.world for r in found} == {world}
    assert len({r.digest for r in found}) == 1, [r.digest for r in found]
    assert all(r.after < r.before for r in found)


def processes_of(job_id: str) -> list[psutil.Process]:
    """Every process on this machine that Slurm started for the job (its SLURM_JOB_ID)."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("SLURM_JOB_ID") == job_id and p.name() != "slurmstepd":
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def gone_within(what, timeout: float) -> list:
    """Poll `what()` until it is empty; what is left at the timeout."""
    deadline = time.monotonic() + timeout
    while (left := what()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_one_task_per_node_runs_the_entrypoint_and_the_nodes_agree(slurm, tmp_path):
    job = slurm.sbatch("entrypoint.sbatch", ["--steps", "40"], job_env(tmp_path), tmp_path / "job.log")
    fields = job.wait(240)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), job.output[-3000:]
    assert "entrypoint: node 0 of 2: address node1" in job.output
    assert "entrypoint: node 1 of 2" in job.output
    assert_replicas_agree(job.output, 2)


def test_several_tasks_per_node_are_ranks_started_by_slurm(slurm, tmp_path):
    job = slurm.sbatch("ranks.sbatch", ["--steps", "40"], job_env(tmp_path), tmp_path / "job.log")
    fields = job.wait(240)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), job.output[-3000:]
    assert_replicas_agree(job.output, 4)
    assert "torchrun" not in job.output          # Slurm started each rank; no launcher in between


def test_a_failing_rank_fails_the_job_for_sbatch_wait(slurm, tmp_path):
    script = tmp_path / "fails_on_rank_1.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1':\n    sys.exit(7)\n"
                      "time.sleep(600)\n")
    env = job_env(tmp_path, ENTRYPOINT=script)
    started = time.monotonic()
    done = subprocess.run(["sbatch", "--wait", "-o", str(tmp_path / "job.log"), str(SCRIPTS / "entrypoint.sbatch")],
                          capture_output=True, text=True, env=slurm.env(**env), timeout=240)
    log = (tmp_path / "job.log").read_text()
    assert done.returncode != 0, log[-3000:]
    assert "exit 7" in log or "exited with 7" in log or "code 7" in log, log[-3000:]
    assert time.monotonic() - started < 120


def test_scancel_leaves_no_process_behind(slurm, tmp_path):
    job = slurm.sbatch("entrypoint.sbatch", ["--steps", "100000", "--step-delay", "0.01"], job_env(tmp_path),
                       tmp_path / "job.log")
    job.wait_for(r"TRAINING rank=1", 180)
    assert processes_of(job.id)
    slurm.run("scancel", job.id)
    job.wait(60)
    left = gone_within(lambda: processes_of(job.id), 40)      # KillWait=30 s, then SIGKILL
    assert not left, [(p.pid, p.cmdline()) for p in left]


def test_docker_run_per_node_trains_and_scancel_removes_the_containers(slurm, tmp_path, image):
    code, ckpt = tmp_path / "code", tmp_path / "ckpt"
    code.mkdir()
    ckpt.mkdir()
    for example in (SCRIPTS.parent.parent / "examples").glob("*.py"):
        (code / example.name).write_text(example.read_text())
    env = job_env(tmp_path, IMAGE=image, CODE=code, CHECKPOINTS=ckpt)
    job = slurm.sbatch("docker.sbatch", ["--steps", "40"], env, tmp_path / "job.log")
    fields = job.wait(240)
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), job.output[-3000:]
    assert_replicas_agree(job.output, 2)

    def containers(job_id: str) -> list[str]:
        return docker("ps", "-aq", "--filter", f"name=disttrain-{job_id}-").stdout.split()

    assert not containers(job.id)                           # --rm
    long = slurm.sbatch("docker.sbatch", ["--steps", "100000", "--step-delay", "0.01"], env, tmp_path / "long.log")
    long.wait_for(r"TRAINING rank=1", 180)
    assert len(containers(long.id)) == 2
    slurm.run("scancel", long.id)
    left = gone_within(lambda: containers(long.id), 40)
    assert not left, docker("ps", "-a").stdout


def test_preempted_by_slurms_sigterm_checkpoints_and_the_requeued_job_resumes(slurm, tmp_path):
    """Slurm signals every process of the job step: at `--signal=TERM@<s>` ahead of the time
    limit (the scripts ask for 120 s) and at `scancel --signal=TERM`, the same way. The time
    limit's warning comes up to 60 s early (Slurm's event resolution; measured here: 4 s
    into a job with `--time=2 --signal=TERM@90`), so the test sends it with scancel once
    training runs. The ranks agree on a step, checkpoint it and exit 143; `scontrol
    requeue` runs the job again, and it resumes from that step, to the end, both nodes
    agreeing."""
    job = slurm.sbatch("entrypoint.sbatch", ["--steps", "600", "--step-delay", "0.02"], job_env(tmp_path),
                       tmp_path / "job.log")
    job.wait_for(r"step 100 ", 180)
    slurm.run("scancel", "--signal=TERM", job.id)
    fields = job.wait(120)
    first = job.output
    assert fields["JobState"] in {"FAILED", "CANCELLED"}, first[-3000:]
    steps = {int(s) for s in re.findall(r"PREEMPTED rank=\d+ checkpoint_step=(\d+)", first)}
    assert len(steps) == 1 and len(re.findall("PREEMPTED rank=", first)) == 2, first[-3000:]
    step = steps.pop()
    assert 100 < step < 600
    assert (tmp_path / "checkpoints" / f"ckpt-{step:08d}.pt").exists()

    slurm.run("scontrol", "requeue", job.id)
    # Slurm holds a requeued job back about two minutes; here 5 s. Not sooner: slurmd revoked
    # the first run's credential when it ended, and a run whose credential is made in the
    # same second is refused ("Killing non-startable batch job: Job credential revoked",
    # seen once in CI with StartTime=now).
    slurm.run("scontrol", "update", f"JobId={job.id}", "StartTime=now+5")
    job.wait(120, states={"RUNNING", "COMPLETING", "COMPLETED"})
    fields = job.wait(240)
    second = job.output[len(first):]
    assert fields["Restarts"] == "1"
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), second[-3000:]
    assert f"RESUMED rank=0 step={step}" in second and f"RESUMED rank=1 step={step}" in second, second[-3000:]
    assert_replicas_agree(second, 2)
