"""The table (Markdown, printed) and the plots (PNG) for one benchmark run."""

from __future__ import annotations

import math
from pathlib import Path


def _fmt(value, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return format(value, spec)


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:g} {unit}"
        n //= 1024
    return str(n)


# Each section: (results key, heading, column names, one row's cells).
SECTIONS = [
    ("launch", "Launch overhead (process start → first line of train.py)",
     ["processes", "launcher", "seconds", "vs"],
     lambda r: [r["nproc"], r["name"], _fmt(r["seconds"]), f"{_fmt(r['ratio'])}× {r['baseline']}"]),
    ("rendezvous", "Rendezvous: N nodes (1 process each, loopback) until every rank has joined; whole job "
                   "(start → every process ended) against raw torchrun",
     ["path", "nodes", "start → all joined (s)", "last import → all joined (s)", "wall (s)", "CPU-s",
      "vs raw torchrun (wall, CPU)", "runs (failed)"],
     lambda r: [r["path"], r["nodes"], _fmt(r["seconds"]), _fmt(r.get("join_seconds")), _fmt(r.get("wall")),
                _fmt(r.get("cpu")), f"{_fmt(r.get('ratio_wall'))}×, {_fmt(r.get('ratio_cpu'))}×"
                + (f"; {_fmt(r['vs_plain'])}× without the secret (goal ≤ 1.05×)" if "vs_plain" in r else ""),
                f"{r['runs']} ({r['failures']})"]),
    ("store_latency", "The job store, one operation (a node's TCPStore client): plain, and behind JOB_SECRET",
     ["path", "operation", "µs (median)", "vs plain", "operations"],
     lambda r: [r["path"], r["op"], _fmt(r["us"], ".0f"), f"{_fmt(r['ratio'])}×", r["ops"]]),
    ("rendezvous_requests", "Horovod's HTTP rendezvous, one request per connection (as Gloo's HTTPStore): "
                            "plain, and behind JOB_SECRET",
     ["path", "ms per request (median)", "vs plain", "requests"],
     lambda r: [r["path"], _fmt(r["ms"], ".2f"), f"{_fmt(r['ratio'])}×", r["requests"]]),
    ("compose", "docker compose up → every node in its first collective (2 nodes, one Docker host)",
     ["path", "up → all joined (s)", "up → all exited (s)", "vs raw torchrun (joined, exited)", "runs (failed)"],
     lambda r: [r["path"], _fmt(r["seconds"]), _fmt(r["wall"]), f"{_fmt(r['ratio'])}×, {_fmt(r['ratio_wall'])}×",
                f"{r['runs']} ({r['failures']})"]),
    ("collectives", "Allreduce, 2 processes (busbw = algbw × 2(n−1)/n)",
     ["stack", "size", "time (ms), median", "runs: min–max (ms)", "algbw GB/s", "busbw GB/s", "vs raw"],
     lambda r: [r["stack"], human_bytes(r["bytes"]), _fmt(r["seconds"] * 1e3, ".3f"),
                f"{r.get('runs', 1)}: {_fmt(r.get('min_seconds', r['seconds']) * 1e3, '.3f')}–"
                f"{_fmt(r.get('max_seconds', r['seconds']) * 1e3, '.3f')}",
                _fmt(r["algbw_GBps"], ".3f"), _fmt(r["busbw_GBps"], ".3f"),
                f"{_fmt(r.get('ratio'))}× {r.get('raw', '')}"]),
    ("image_sizes", "Images",
     ["variant", "image GB", "base GB", "Python packages GB", "overhead ratio", "largest layers"],
     lambda r: [r["variant"], _fmt(r["image_GB"]), _fmt(r["base_GB"]), _fmt(r["python_packages_GB"]),
                _fmt(r["overhead_ratio"]), "<br>".join(r["largest_layers"])]),
    ("rebuild", "Rebuild (cpu)", ["change", "seconds", "steps run", "steps cached"],
     lambda r: [r["change"], _fmt(r["seconds"], ".1f"), ", ".join(r["steps_run"]) or "none", r["steps_cached"]]),
    ("training", "Training (examples/pytorch_ddp.py, CPU, batch 256 per process)",
     ["hidden width", "processes", "samples/s", "speed-up"],
     lambda r: [r["hidden"], r["processes"], _fmt(r["samples_per_s"], ".0f"), f"{_fmt(r.get('speedup'))}×"]),
    ("hang_detection", "Hang detection: a rank stalls (N nodes, 1 process each, DDP over Gloo) → the master's "
                       "diagnosis line, and → every node exited (124)",
     ["nodes", "HANG_TIMEOUT (s)", "stall → diagnosis (s)", "stall → job ended (s)", "slowest end (s)", "goal (s)",
      "runs (failed)"],
     lambda r: [r["nodes"], r["hang_timeout"], _fmt(r["diagnosis_s"], ".1f"), _fmt(r["end_s"], ".1f"),
                _fmt(r["max_end_s"], ".1f"), f"≤ {r['goal_s']}", f"{r['runs']} ({r['failures']})"]),
    ("progress_cost", "Progress reporting: steps/s of a PyTorch loop (1 process, 1 thread) with the image's "
                      "hooks and without",
     ["hidden width", "steps", "without (steps per CPU-s)", "with", "with / without", "cost of a step (µs)",
      "with / without, wall clock", "blocks each"],
     lambda r: [r["hidden"], r["steps"], _fmt(r["without"], ".0f"), _fmt(r["with"], ".0f"), _fmt(r["ratio"], ".3f"),
                _fmt(r["step_cost_us"], ".1f"), _fmt(r["wall_ratio"], ".3f"), r["runs"]]),
    ("elastic", "Elastic PyTorch: membership change → end of the first training step at the new world size",
     ["launcher", "change", "world size", "seconds", "min–max", "runs (failed)"],
     lambda r: [r["launcher"], r["change"], r["world"], _fmt(r["seconds"], ".1f"),
                f"{_fmt(r['min'], '.1f')}–{_fmt(r['max'], '.1f')}", f"{r['runs']} ({r['failures']})"]),
]


def table(results: dict) -> str:
    out = [f"Machine: {results['machine']}. Date: {results['date']}. Medians of {results['repeats']} runs.", ""]
    for key, heading, columns, cells in SECTIONS:
        if key not in results:
            continue
        out += [f"### {heading}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        out += ["| " + " | ".join(str(c) for c in cells(r)) + " |" for r in results[key]]
        out.append("")
    return "\n".join(out)


def plots(results: dict, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []

    def save(fig, name):
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    if "launch" in results:
        fig, ax = plt.subplots(figsize=(8, 4))
        rows = results["launch"]
        labels = [f"{r['name']}\n({r['nproc']} proc)" for r in rows]
        ax.barh(labels, [r["seconds"] for r in rows], color=["tab:blue" if "entrypoint" in r["name"] else "tab:gray"
                                                             for r in rows])
        ax.set_xlabel("seconds to first line of train.py (median)")
        ax.set_title("Launch overhead")
        save(fig, "launch.png")
    if "rendezvous" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        for path in dict.fromkeys(r["path"] for r in results["rendezvous"]):
            rows = [r for r in results["rendezvous"] if r["path"] == path]
            line, = ax.plot([r["nodes"] for r in rows], [r["seconds"] for r in rows], marker="o", label=path)
            ax.plot([r["nodes"] for r in rows], [r.get("join_seconds") for r in rows], marker="x", ls="--",
                    color=line.get_color(), label=f"{path}: after last import")
        ax.set_xlabel("nodes (entrypoint processes on loopback)")
        ax.set_ylabel("seconds until every rank joined")
        ax.set_xscale("log", base=2)
        ax.legend()
        ax.set_title("Rendezvous scaling (2 cores)")
        save(fig, "rendezvous.png")
    if "collectives" in results:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for stack in dict.fromkeys(r["stack"] for r in results["collectives"]):
            rows = [r for r in results["collectives"] if r["stack"] == stack]
            ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker=".", label=stack)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per allreduce")
        ax.set_ylabel("busbw GB/s")
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.set_title("Allreduce, 2 processes, loopback")
        save(fig, "allreduce.png")
    if "image_sizes" in results:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        rows = results["image_sizes"]
        names = [r["variant"] for r in rows]
        ax.bar(names, [r["base_GB"] for r in rows], label="base")
        ax.bar(names, [r["python_packages_GB"] for r in rows], bottom=[r["base_GB"] for r in rows],
               label="Python packages")
        ax.bar(names, [r["image_GB"] - r["base_GB"] - r["python_packages_GB"] for r in rows],
               bottom=[r["base_GB"] + r["python_packages_GB"] for r in rows], label="everything else")
        ax.set_ylabel("GB")
        ax.legend()
        ax.set_title("Image size")
        save(fig, "images.png")
    if "hang_detection" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        for timeout in dict.fromkeys(r["hang_timeout"] for r in results["hang_detection"]):
            rows = [r for r in results["hang_detection"] if r["hang_timeout"] == timeout]
            line, = ax.plot([r["nodes"] for r in rows], [r["end_s"] for r in rows], marker="o",
                            label=f"HANG_TIMEOUT={timeout}: job ended")
            ax.plot([r["nodes"] for r in rows], [r["diagnosis_s"] for r in rows], marker="x", ls="--",
                    color=line.get_color(), label=f"HANG_TIMEOUT={timeout}: diagnosis")
            ax.axhline(timeout + 10, color=line.get_color(), ls=":", lw=1)
        ax.set_xlabel("nodes")
        ax.set_ylabel("seconds after the stall")
        ax.legend(fontsize=7)
        ax.set_title("Hang detection (dotted: goal, HANG_TIMEOUT + 10 s)")
        save(fig, "hangs.png")
    return written
