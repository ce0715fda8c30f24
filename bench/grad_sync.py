"""Gradient strategies on a slow link (issue 37): step time of a ~25M-parameter model (DDP,
synthetic data, bench/workloads/grad_steps.py) in two containers of the image, whose link is
limited from the host with `tc ... tbf` on each container's veth (each side shapes what it
receives, so both directions are limited), for GRAD_COMPRESSION none, fp16, bf16, powersgd
and GRAD_ACCUMULATION=4, at 1 Gbit/s, 10 Gbit/s and unlimited, side by side in one run.

Then the bundled example (examples/train.py, PyTorch DDP) on two nodes on loopback, through
the entrypoint, for none, fp16, bf16 and powersgd: its final loss.

Goals: fp16 <= 0.6x and PowerSGD <= 0.3x of none's step time at 1 Gbit/s; no strategy more
than 5 % slower than none unlimited; the example's final loss within 2 % of none's for fp16
and bf16. Accumulation's time is per micro-batch (batch 32), as for the others.

    python bench/grad_sync.py [--image distributed-training-framework:cpu] [--steps 10] [--out bench/out]
                              [--allocator system --allocator tcmalloc] [--link 1gbit --link unlimited]

--allocator runs every row once per MEMORY_ALLOCATOR (each compared with `none` under the
same allocator); --link picks the links (default: all three). --one-process adds rows of
one container with one rank (TRAIN_MODE=local, link "one process"): what a step costs the
CPU without a peer, the allocator's part in it (docs/gradient-sync.md).

Needs root (tc) and the image; the containers get one CPU thread each.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.procs import base_env  # noqa: E402
from testing.cluster import loopback_env  # noqa: E402
from testing.ports import free_port  # noqa: E402
from testing.processes import entrypoint, run_many  # noqa: E402
from testing.results import results  # noqa: E402

STRATEGIES = {
    "none": {},
    "fp16": {"GRAD_COMPRESSION": "fp16"},
    "bf16": {"GRAD_COMPRESSION": "bf16"},
    "powersgd": {"GRAD_COMPRESSION": "powersgd", "POWERSGD_RANK": "4", "POWERSGD_WARMUP": "2"},
    "accumulate 4": {"GRAD_ACCUMULATION": "4"},
}
LINKS = ("1gbit", "10gbit", "unlimited")


def docker(*args: str, check: bool = True) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check).stdout.strip()


def host_veth(container: str) -> str:
    """The host end of the container's eth0 ('eth0@if123': the host's interface 123)."""
    pid = docker("inspect", "-f", "{{.State.Pid}}", container)
    link = subprocess.run(["nsenter", "-t", pid, "-n", "ip", "-o", "link", "show", "eth0"],
                          capture_output=True, text=True, check=True).stdout
    index = re.search(r"eth0@if(\d+)", link)[1]
    for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines():
        if line.startswith(f"{index}: "):
            return line.split(": ")[1].split("@")[0]
    raise RuntimeError(f"no host interface {index} for {container}")


def limit(veth: str, rate: str) -> None:
    """tbf on what the container receives: the rate, a burst of 1/100 s of it."""
    bits = int(rate.removesuffix("gbit")) * 10**9
    subprocess.run(["tc", "qdisc", "add", "dev", veth, "root", "tbf", "rate", rate, "burst", str(bits // 800),
                    "latency", "100ms"], check=True)


ONE_PROCESS = "one process"


def containers_run(image: str, strategy: dict, link: str, steps: int, allocator: str = "system") -> tuple[float, int]:
    """Both nodes' median seconds per micro-batch (the slower rank's), and the bytes the
    master's container sent per micro-batch. Link ONE_PROCESS: one container, one rank."""
    tag = uuid.uuid4().hex[:8]
    net = f"gradsync-{tag}"
    docker("network", "create", net)
    roles = ("master",) if link == ONE_PROCESS else ("master", "worker")
    names = [f"gradsync-{tag}-{role}" for role in roles]
    try:
        for name, role in zip(names, roles):
            mode = dict(TRAIN_MODE="local") if link == ONE_PROCESS else \
                dict(TRAIN_MODE="distributed", NUM_NODES="2", ROLE=role, MASTER_ADDR=names[0])
            env = dict(FRAMEWORK="pytorch", **mode, OMP_NUM_THREADS="1", ENTRYPOINT="/app/code/grad_steps.py",
                       MEMORY_ALLOCATOR=allocator, **strategy)
            docker("run", "-d", "--name", name, "--network", net, "--cpus", "1",
                   "-v", f"{ROOT / 'bench' / 'workloads'}:/app/code:ro",
                   *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], image,
                   "--warmup", "3", "--steps", str(steps))
            if link not in ("unlimited", ONE_PROCESS):
                limit(host_veth(name), link)
        codes = [int(docker("wait", name)) for name in names]
        logs = "".join(subprocess.run(["docker", "logs", name], capture_output=True, text=True).stdout
                       + subprocess.run(["docker", "logs", name], capture_output=True, text=True).stderr
                       for name in names)
        found = re.findall(r"GRADSTEPS rank=(\d+) params=\d+ per_batch=([\d.]+) sent_per_batch=(\d+)", logs)
        if codes != [0] * len(names) or len(found) != len(names):
            raise RuntimeError(f"{strategy} at {link}: exit {codes}\n{logs[-3000:]}")
        return max(float(t) for _, t, _ in found), next(int(b) for r, _, b in found if r == "0")
    finally:
        docker("rm", "-f", *names, check=False)
        docker("network", "rm", net, check=False)


def example_losses(strategies: list[str], steps: int) -> dict[str, float]:
    """The bundled example on two loopback nodes: rank 0's final loss per strategy."""
    out = {}
    for name in strategies:
        port, tmp = free_port(), Path(tempfile.mkdtemp(prefix="disttrain-gradsync-"))
        cmds = [(entrypoint("--steps", str(steps)),
                 base_env(ENTRYPOINT=str(ROOT / "examples" / "train.py"), CHECKPOINT_DIR=str(tmp / "ckpt"),
                          DATA_DIR=str(tmp / "data"), OMP_NUM_THREADS="1",
                          **loopback_env(k, 2, port, HOROVOD_PORT=free_port(), **STRATEGIES[name])))
                for k in range(2)]
        codes, output, _, _ = run_many(cmds, timeout=600)
        found = [r for r in results(output) if r.rank == 0]
        if codes != [0, 0] or not found:
            raise RuntimeError(f"the example with {name}: exit {codes}\n{output[-2000:]}")
        out[name] = found[0].after
    return out


def table(rows: list[dict], losses: dict[str, float]) -> str:
    lines = ["| allocator | link | strategy | s per batch | x none | MB sent per batch |", "|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['allocator']} | {row['link']} | {row['strategy']} | {row['seconds']:.3f} | "
                     f"{row['ratio']:.2f} | {row['sent'] / 1e6:.2f} |")
    lines += ["", "| bundled example | final loss | x none |", "|---|---|---|"]
    lines += [f"| {name} | {loss:.4f} | {loss / losses['none']:.3f} |" for name, loss in losses.items()]
    return "\n".join(lines)


def plot(rows: list[dict], out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    names = list(STRATEGIES)
    series = list(dict.fromkeys((r["allocator"], r["link"]) for r in rows))
    width = 0.8 / len(series)
    for i, (allocator, link) in enumerate(series):
        values = [next(r["seconds"] for r in rows if (r["allocator"], r["link"]) == (allocator, link)
                       and r["strategy"] == s) for s in names]
        label = link if len({a for a, _ in series}) == 1 else f"{link}, {allocator}"
        ax.bar([k + i * width for k in range(len(names))], values, width, label=label)
    ax.set_xticks([k + width for k in range(len(names))], names)
    ax.set_ylabel("seconds per batch of 32 (25M parameters, 2 nodes)")
    ax.set_title("Gradient strategies by link speed (tc tbf)")
    ax.legend()
    path = out / "grad_sync.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default="distributed-training-framework:cpu")
    p.add_argument("--steps", type=int, default=10, help="timed steps per run (after 3 untimed)")
    p.add_argument("--example-steps", type=int, default=200)
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    p.add_argument("--allocator", action="append", choices=("system", "tcmalloc"),
                   help="MEMORY_ALLOCATOR for every process (repeatable; default: system)")
    p.add_argument("--link", action="append", choices=LINKS, help="repeatable; default: all")
    p.add_argument("--one-process", action="store_true", help="also one container with one rank (no link)")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for allocator in args.allocator or ["system"]:
        for link in [*(args.link or LINKS), *([ONE_PROCESS] if args.one_process else [])]:
            for name, strategy in STRATEGIES.items():
                seconds, sent = containers_run(args.image, strategy, link, args.steps, allocator)
                rows.append(dict(allocator=allocator, link=link, strategy=name, seconds=seconds, sent=sent))
                print(f"{allocator:>8} {link:>9} {name:>12}: {seconds:.3f} s per batch, {sent / 1e6:.2f} MB sent",
                      flush=True)
    for row in rows:
        row["ratio"] = row["seconds"] / next(r["seconds"] for r in rows if r["link"] == row["link"]
                                             and r["allocator"] == row["allocator"] and r["strategy"] == "none")
    losses = example_losses(["none", "fp16", "bf16", "powersgd"], args.example_steps)
    (out / "grad_sync.json").write_text(json.dumps({"rows": rows, "losses": losses}, indent=1))
    print(table(rows, losses))
    print(f"\nplot: {plot(rows, out)}")


if __name__ == "__main__":
    main()
