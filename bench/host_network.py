"""Nodes that share a host's network meet every time (issue 36): 2 and 4 containers of one
job with `--network host` on this machine (one container per GPU, as on a multi-GPU host),
MASTER_ADDR=127.0.0.1, so every node has the same address and, in its own PID namespace,
the same PID. For each size, the fixed-size, restart (MAX_RESTARTS) and elastic
(MIN_NODES..MAX_NODES) paths, `--trials` times each: how many trained to exit 0 on every
node with the replicas agreeing, and how long each took.

Before the fix, 2 of 4 two-container runs failed (RendezvousTimeoutError on one node,
RendezvousClosedError on the other).

    python bench/host_network.py [--trials 10] [--sizes 2 4] [--image distributed-training-framework:cpu]

Prints a table and writes bench/out/host_network.{json,png}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testing.ports import free_port  # noqa: E402
from testing.results import results  # noqa: E402

MODES = {
    "fixed-size": {},
    "restarts": {"MAX_RESTARTS": "2"},
    "elastic": {"MIN_NODES": "{n}", "MAX_NODES": "{n_plus_1}"},
}


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def trial(image: str, nodes: int, mode: str, timeout: float) -> dict:
    """One job of `nodes` containers on the host's network; its outcome."""
    port, tag = free_port(), uuid.uuid4().hex[:8]
    names = [f"hostnet-{tag}-{k}" for k in range(nodes)]
    extra = {k: v.format(n=nodes, n_plus_1=nodes + 1) for k, v in MODES[mode].items()}
    started = time.monotonic()
    try:
        for k, name in enumerate(names):
            env = dict(FRAMEWORK="pytorch", TRAIN_MODE="distributed", ROLE="master" if k == 0 else "worker",
                       NUM_NODES=str(nodes), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RDZV_TIMEOUT="60",
                       OMP_NUM_THREADS="1", **extra)
            docker("run", "-d", "--name", name, "--network", "host",
                   "-v", f"{ROOT / 'examples'}:/app/code:ro", *[a for k2, v in env.items() for a in ("-e", f"{k2}={v}")],
                   image, "--steps", "20", "--checkpoint-every", "1000")
        with ThreadPoolExecutor(nodes) as pool:
            waited = list(pool.map(lambda n: docker("wait", n, timeout=timeout), names))
        codes = [int(w.stdout.strip() or -1) for w in waited]
        seconds = time.monotonic() - started
        output = "".join(docker("logs", n).stdout + docker("logs", n).stderr for n in names)
        found = results(output)
        agree = len(found) == nodes and len({r.digest for r in found}) == 1
        return dict(nodes=nodes, mode=mode, codes=codes, ok=codes == [0] * nodes and agree, seconds=seconds,
                    why=None if codes == [0] * nodes and agree else output[-1500:])
    except subprocess.TimeoutExpired:
        return dict(nodes=nodes, mode=mode, codes=None, ok=False, seconds=time.monotonic() - started,
                    why=f"still running after {timeout:.0f}s")
    finally:
        docker("rm", "-f", *names)


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for nodes in sorted({r["nodes"] for r in rows}):
        for mode in MODES:
            these = [r for r in rows if r["nodes"] == nodes and r["mode"] == mode]
            if these:
                times = [r["seconds"] for r in these if r["ok"]]
                out.append(dict(nodes=nodes, mode=mode, trials=len(these), ok=sum(r["ok"] for r in these),
                                median_s=statistics.median(times) if times else float("nan"),
                                max_s=max(times) if times else float("nan")))
    return out


def table(rows: list[dict]) -> str:
    lines = ["| containers | path | trials | exit 0, replicas agree | median s | max s |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['nodes']} | {r['mode']} | {r['trials']} | {r['ok']} | {r['median_s']:.1f} | {r['max_s']:.1f} |"
              for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{r['nodes']} × {r['mode']}" for r in rows]
    ax.bar(labels, [r["ok"] / r["trials"] * 100 for r in rows], color="tab:green")
    ax.set_ylim(0, 105)
    ax.set_ylabel("trials that trained (%)")
    ax.set_title("Containers sharing the host's network, MASTER_ADDR=127.0.0.1")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default="distributed-training-framework:cpu")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--out", default=str(ROOT / "bench" / "out"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for t in range(args.trials):                 # each trial runs every case once, in turn
        for nodes in args.sizes:
            for mode in MODES:
                row = trial(args.image, nodes, mode, args.timeout)
                rows.append(row)
                print(f"trial {t + 1} {nodes} x {mode}: {'ok' if row['ok'] else 'FAILED'} {row['seconds']:.1f}s"
                      + ("" if row["ok"] else f" codes={row['codes']}\n{row['why']}"), flush=True)
    summed = summary(rows)
    (out / "host_network.json").write_text(json.dumps({"trials": rows, "summary": summed}, indent=1))
    print(table(summed))
    plot(summed, out / "host_network.png")
    print(f"\nplot: {out / 'host_network.png'}")


if __name__ == "__main__":
    main()
