"""4. Images: size against base + installed Python packages (the overhead ratio), the
largest layers, and rebuild time after touching only entrypoint/ or only a tag."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from testing.processes import PY, ROOT

PACKAGES_SIZE = ("import os, sysconfig; root = sysconfig.get_paths()['purelib']; "
                 "print(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) "
                 "for f in fs if not os.path.islink(os.path.join(d, f))))")


def built_images() -> list[tuple[str, str]]:
    """(variant, image id) of every image build.py built, one per variant."""
    out = subprocess.run(["docker", "images", "--filter", "label=io.disttrain.variant", "--format",
                          "{{.ID}} {{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout
    seen, result = set(), []
    for line in out.splitlines():
        image_id, ref = line.split()
        if image_id in seen or ref.endswith("<none>"):
            continue
        seen.add(image_id)
        variant = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "io.disttrain.variant"}}',
                                  image_id], capture_output=True, text=True).stdout.strip()
        result.append((variant, ref))
    return sorted(result)


def _command(created_by: str) -> str:
    return re.sub(r"\s+", " ", created_by)[:70]


def sizes() -> list[dict]:
    import docker

    client = docker.from_env()
    rows = []
    for variant, ref in built_images():
        image = client.images.get(ref)
        history = image.history()
        base = history[-1]["Size"]                      # the bottom layer is the base image
        packages = int(client.containers.run(ref, entrypoint=["python3", "-c", PACKAGES_SIZE], remove=True))
        largest = sorted(history, key=lambda h: h["Size"], reverse=True)[:3]
        rows.append({
            "variant": variant, "image_GB": image.attrs["Size"] / 1e9, "base_GB": base / 1e9,
            "python_packages_GB": packages / 1e9, "overhead_ratio": image.attrs["Size"] / (base + packages),
            "largest_layers": [f"{h['Size'] / 1e9:.2f} GB {_command(h['CreatedBy'])}" for h in largest],
        })
    return rows


def _copy_repo(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _build(repo: Path, variant: str, out: Path) -> tuple[float, list[str], int, bool]:
    """(seconds, steps that ran, steps cached, ok) for `build.py build` of a copy of the repo."""
    env = {**os.environ, "BUILD_PROGRESS": "plain"}
    start = time.perf_counter()
    result = subprocess.run([PY, str(repo / "build.py"), "--registry", "bench.local", "build", variant,
                             "-o", str(out)], capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - start
    log = result.stdout + result.stderr
    steps = {n: f"{stage} {instr[:40]}" for n, stage, instr in
             re.findall(r"^#(\d+) \[(\w+ \d+/\d+)\] (.*)$", log, re.M) if not instr.startswith("FROM")}
    cached = set(re.findall(r"^#(\d+) CACHED", log, re.M))
    ran = [name for n, name in sorted(steps.items(), key=lambda kv: int(kv[0])) if n not in cached]
    return seconds, ran, len(set(steps) & cached), result.returncode == 0


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def rebuild_times(variant: str = "cpu") -> list[dict]:
    """Warm build, then touch entrypoint/ only, then a tag in matrix.yaml only."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        _copy_repo(repo)
        out = Path(tmp) / "contexts"
        changes = [
            ("warm (nothing changed)", None),
            # A new token each run, so an earlier run's layers cannot answer for this one.
            ("touched entrypoint/ only", lambda: _append(repo / "entrypoint" / "main.py", f"\n# touched {uuid.uuid4()}\n")),
            ("changed a tag in matrix.yaml only", lambda: (repo / "matrix.yaml").write_text(
                (repo / "matrix.yaml").read_text().replace("aliases: [latest]", "aliases: [latest, bench]"))),
        ]
        for name, change in changes:
            if change:
                change()
            seconds, ran, cached, ok = _build(repo, variant, out)
            rows.append({"change": name, "seconds": seconds, "steps_run": ran, "steps_cached": cached, "ok": ok})
            if not ok:
                raise RuntimeError(f"rebuild after '{name}' failed; run with the BUILD_* settings of the image")
    tags = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "bench.local/*"],
                          capture_output=True, text=True).stdout.split()
    if tags:
        subprocess.run(["docker", "rmi", *tags], capture_output=True)
    return rows
