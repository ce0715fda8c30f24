"""A real two-node Slurm on this machine (scripts/slurm-two-nodes.sh), and the jobs the
tests submit to it: `sbatch` of the scripts users run (deploy/slurm/), watched through
`scontrol`, cancelled when a test ends.

`.ci/run` starts the cluster and exports SLURM_CONF; elsewhere the `slurm` fixture starts
one of its own where Slurm's packages are installed and this is root, else it skips.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

SCRIPTS = ROOT / "deploy" / "slurm"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL",
         "DEADLINE"}


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    absent = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurmd slurmctld slurm-client munge)"
    if os.geteuid() != 0:
        return "starting slurmd needs root"
    return None


def responds(conf: str) -> bool:
    out = subprocess.run(["sinfo", "-h", "-N", "-t", "idle,mix,alloc", "-o", "%N"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": conf}, timeout=30)
    return out.returncode == 0 and len(set(out.stdout.split())) == 2


class Cluster:
    """A started cluster's SLURM_CONF, and the jobs submitted to it."""

    def __init__(self, conf: str):
        self.conf = conf
        self.submitted: list[Job] = []

    def env(self, **extra) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": self.conf, **{k: str(v) for k, v in extra.items()}}

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), capture_output=True, text=True, env=self.env(), check=check, timeout=timeout)

    def sbatch(self, script: str, args: list[str], env: dict[str, str], log: Path,
               options: list[str] = ()) -> "Job":
        """Submit deploy/slurm/<script> as a user would, with `env` as the submitter's environment."""
        out = subprocess.run(["sbatch", "--parsable", "-o", str(log), *options, str(SCRIPTS / script), *args],
                             capture_output=True, text=True, env=self.env(**env), check=True, timeout=60)
        job = Job(self, out.stdout.strip().split(";")[0], log)
        self.submitted.append(job)
        return job

    def cancel_all(self) -> None:
        for job in self.submitted:
            self.run("scancel", job.id, check=False)


@dataclass
class Job:
    cluster: Cluster
    id: str
    log: Path

    def fields(self) -> dict[str, str]:
        out = self.cluster.run("scontrol", "show", "job", "-o", self.id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    @property
    def state(self) -> str:
        return self.fields().get("JobState", "")

    def wait(self, timeout: float, states=ENDED) -> dict[str, str]:
        """Poll until the job is in one of `states`; its fields then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.fields()
            if fields.get("JobState") in states:
                return fields
            time.sleep(0.5)
        raise TimeoutError(f"job {self.id} still {self.fields().get('JobState')} after {timeout:.0f}s:\n{self.output[-3000:]}")

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.state in ENDED:
                break
            time.sleep(0.5)
        raise TimeoutError(f"job {self.id} ({self.state}) never printed {pattern!r}:\n{self.output[-3000:]}")

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
