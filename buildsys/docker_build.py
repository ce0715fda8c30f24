"""Build and push images with BuildKit. `build_command` is pure; the rest executes.

BuildKit is required (cache mounts, secret mounts, bind mounts from the context). It is
reached either through `docker buildx build --load` or, for Docker clients before 23.0
that have BuildKit built in, through `DOCKER_BUILDKIT=1 docker build`. A client of 23.0 or
newer without the buildx plugin has neither, so `find_docker_cli` skips it.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from . import render
from .matrix import Variant


class BuildError(Exception):
    pass


@dataclass(frozen=True)
class DockerCli:
    path: str
    buildx: bool          # True: `buildx build --load`; False: legacy client with built-in BuildKit


@dataclass(frozen=True)
class BuildOptions:
    """What a build farm may change without touching matrix.yaml."""
    base_images: dict[str, str] = field(default_factory=dict)   # distro -> image ('*' for all)
    apt_mirror: str | None = None
    pip_index_url: str | None = None
    pip_extra_index_url: str | None = None
    ca_cert: Path | None = None
    wheelhouse: Path | None = None
    no_cache: bool = False
    pull: bool = False
    progress: str = "auto"
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    revision: str | None = None
    created: str | None = None


def parse_base_images(values: list[str]) -> dict[str, str]:
    """['bookworm=local/debian:bookworm', 'img'] -> {'bookworm': ..., '*': 'img'}."""
    result = {}
    for value in values:
        distro, sep, image = value.partition("=")
        if sep and distro and "/" not in distro and ":" not in distro:
            result[distro] = image
        else:
            result["*"] = value
    return result


def check_companion_sources(v: Variant, options: BuildOptions) -> None:
    """Before anything is built: where will pip find each local build ('+cpu') of a torch
    companion? PyPI has none; the wheelhouse or a given index must. One line if nowhere."""
    if options.pip_index_url or options.pip_extra_index_url:
        return              # the farm's index is trusted to carry what it was given for
    python_tag = "cp" + v.python.replace(".", "")
    wheels = [w.name for w in Path(options.wheelhouse).glob("*.whl")] if options.wheelhouse else []
    for name, pin in v.torch_companions().items():
        if "+" not in pin or any(w.startswith(f"{name}-{pin}-{python_tag}-") for w in wheels):
            continue
        local = pin.split("+", 1)[1]
        raise BuildError(f"variant {v.name!r}: {name} {pin} (PyTorch's {local} build, for torch "
                         f"{v.pytorch.version}) is not on PyPI and not in the wheelhouse"
                         f"{' ' + str(options.wheelhouse) if options.wheelhouse else ''}: put its {python_tag} "
                         f"wheel there (--wheelhouse), pass --pip-extra-index-url "
                         f"https://download.pytorch.org/whl/{local}, or build without it: --without {name}")


def base_image_for(v: Variant, options: BuildOptions) -> str:
    return options.base_images.get(v.distro) or options.base_images.get("*") or v.base_image()


def build_command(cli: DockerCli, v: Variant, tags: list[str], context: Path, options: BuildOptions,
                  target: str = "runtime", output: str | None = None, digest: str | None = None) -> list[str]:
    """The docker command line for one variant (no side effects). `digest`: the rendered
    context's (render.context_digest), labelled so that a stale image can be told."""
    cmd = [cli.path] + (["buildx", "build"] if cli.buildx else ["build"])
    cmd += ["--progress", options.progress, "--target", target]
    if output:
        cmd += ["--output", output]
    elif cli.buildx:
        cmd.append("--load")
    build_args = {"BASE_IMAGE": base_image_for(v, options)}
    if options.apt_mirror:
        build_args["APT_MIRROR"] = options.apt_mirror
    if options.pip_index_url:
        build_args["PIP_INDEX_URL"] = options.pip_index_url
    if options.pip_extra_index_url:
        build_args["PIP_EXTRA_INDEX_URL"] = options.pip_extra_index_url
    for key, value in build_args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    if options.ca_cert:
        cmd += ["--secret", f"id=ca_cert,src={Path(options.ca_cert).resolve()}"]
    if options.no_cache:
        cmd.append("--no-cache")
    if options.pull:
        cmd.append("--pull")
    for ref in options.cache_from:
        cmd += ["--cache-from", ref]
    if options.cache_to:
        cmd += ["--cache-to", options.cache_to]
    if not output:
        # Per-build labels go on the command line, so they never invalidate cached layers.
        created = options.created or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        cmd += ["--label", f"org.opencontainers.image.created={created}"]
        if options.revision:
            cmd += ["--label", f"org.opencontainers.image.revision={options.revision}"]
        if digest:
            cmd += ["--label", f"{render.CONTEXT_LABEL}={digest}"]
        for tag in tags:
            cmd += ["--tag", tag]
    cmd.append(str(context))
    return cmd


def build_env(cli: DockerCli) -> dict[str, str]:
    env = dict(os.environ)
    if not cli.buildx:
        env["DOCKER_BUILDKIT"] = "1"
    return env


# --------------------------------------------------------------------------- executing

def _client_version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "version", "--format", "{{.Client.Version}}"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    digits = [p for p in out.split("+")[0].split(".") if p.isdigit()]
    return tuple(int(p) for p in digits) or None


def _has_buildx(path: str) -> bool:
    try:
        return subprocess.run([path, "buildx", "version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def find_docker_cli(preferred: str | None = None) -> DockerCli:
    """The first docker client that can run BuildKit builds: $DOCKER_CLI, then PATH, then /usr/bin."""
    candidates = []
    for path in [preferred, os.environ.get("DOCKER_CLI")] + \
            [str(Path(d) / "docker") for d in os.environ.get("PATH", "").split(os.pathsep) if d] + \
            ["/usr/bin/docker"]:
        if path and path not in candidates and shutil.which(path):
            candidates.append(path)
    for path in candidates:
        if _has_buildx(path):
            return DockerCli(path, buildx=True)
        version = _client_version(path)
        if version and version < (23,):
            return DockerCli(path, buildx=False)
    raise BuildError("no docker client with BuildKit found: need `docker buildx`, or a docker client "
                     "older than 23.0 (built-in BuildKit); tried " + (", ".join(candidates) or "none")
                     + ". Set DOCKER_CLI to one.")


def stage_context(v: Variant, out_dir: Path, wheelhouse: Path | None,
                  cuda_variants: dict[str, str] | None = None) -> tuple[Path, str]:
    """Render the variant's context into out_dir and add the local wheelhouse to it: the
    folder, and the rendered files' digest."""
    files = render.render_context(v, cuda_variants)
    context = render.write_context(files, out_dir)
    if wheelhouse:
        wheels = sorted(Path(wheelhouse).glob("*.whl"))
        if not wheels:
            raise BuildError(f"--wheelhouse {wheelhouse}: no *.whl files there")
        for wheel in wheels:
            target = context / "wheelhouse" / wheel.name
            try:
                os.link(wheel, target)          # same filesystem: no copy
            except OSError:
                shutil.copy2(wheel, target)
    return context, render.context_digest(files)


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+ " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, env=env)
    if result.returncode != 0:
        raise BuildError(f"command failed with exit code {result.returncode}: {' '.join(cmd[:3])} ...")


def build(cli: DockerCli, v: Variant, tags: list[str], context: Path, options: BuildOptions,
          digest: str | None = None) -> None:
    run(build_command(cli, v, tags, context, options, digest=digest), env=build_env(cli))


def export_wheels(cli: DockerCli, v: Variant, context: Path, options: BuildOptions, dest: Path) -> None:
    """Copy the builder's wheels (Horovod, mpi4py) out to dest, e.g. for a test venv."""
    dest.mkdir(parents=True, exist_ok=True)
    run(build_command(cli, v, [], context, options, target="wheels", output=f"type=local,dest={dest}"),
        env=build_env(cli))


def image_exists(ref: str) -> bool:
    """Whether the engine has an image by that reference (any docker client can tell)."""
    try:
        return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0
    except FileNotFoundError:                # no docker client at all
        return False


def push(tags: list[str]) -> None:
    import docker  # the SDK; imported here so `list`/`render` work without a daemon

    client = docker.from_env()
    for tag in tags:
        repository, _, name = tag.rpartition(":")
        print(f"pushing {tag}", flush=True)
        for event in client.images.push(repository, tag=name, stream=True, decode=True):
            if "error" in event:
                raise BuildError(f"push {tag}: {event['error']}")
