#!/usr/bin/env python3
"""Benchmarks, side by side in one run: launch overhead, rendezvous scaling, compose start-up,
allreduce throughput, image size and rebuild time, training scaling, elastic resumption,
hang detection and the cost of progress reporting.

    python bench/run.py                 default sizes (under 10 minutes on 2 cores)
    python bench/run.py --full          + 16 nodes and 256 MB allreduces
    python bench/run.py --smoke         a tiny run that keeps the scripts working (CI)

Prints a Markdown table and writes results.json and PNG plots to --out (bench/out).
Everything runs on this machine: traffic stays on loopback and every run has a timeout.
Run it with the same BUILD_* settings the images were built with (rebuild timing).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import collectives, compose_start, elastic, hangs, image, launch, rendezvous, report, training  # noqa: E402

SECTIONS = ("launch", "rendezvous", "compose", "collectives", "image", "training", "elastic", "hangs")


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {memory:.0f} GiB, {platform.machine()}, no GPU"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    size = p.add_mutually_exclusive_group()
    size.add_argument("--full", action="store_true", help="add 16 nodes and 256 MB allreduces")
    size.add_argument("--smoke", action="store_true", help="one run of tiny sizes (CI)")
    p.add_argument("--only", choices=SECTIONS, action="append", help="run only these sections")
    p.add_argument("--repeats", type=int, help="runs per measurement (default 5; 1 with --smoke)")
    p.add_argument("--image", default="distributed-training-framework:cpu", help="image for the compose section")
    args = p.parse_args()

    repeats = args.repeats or (1 if args.smoke else 5)
    sections = args.only or list(SECTIONS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "date": dt.date.today().isoformat(), "repeats": repeats,
                     "mode": "smoke" if args.smoke else "full" if args.full else "default"}

    clock = {"t": time.monotonic()}

    def step(name):
        now = time.monotonic()
        print(f"== {name} (+{now - clock['t']:.0f}s)", file=sys.stderr, flush=True)
        clock["t"] = now

    if "launch" in sections:
        step("launch overhead")
        results["launch"] = launch.measure(repeats)
    if "rendezvous" in sections:
        step("rendezvous scaling")
        nodes = [2] if args.smoke else [2, 4, 8, 16] if args.full else [2, 4, 8]
        results["rendezvous"] = rendezvous.measure(nodes, repeats)
        results["store_latency"] = rendezvous.store_latency(50 if args.smoke else 2000)
        results["rendezvous_requests"] = rendezvous.rendezvous_requests(20 if args.smoke else 300)
    if "compose" in sections:
        step("compose up -> first collective")
        results["compose"] = compose_start.measure(repeats, args.image)
    if "collectives" in sections:
        step("allreduce throughput")
        top = 14 if args.smoke else 28 if args.full else 26            # 16 KB, 256 MB, 64 MB
        results["collectives"] = collectives.measure([2 ** e for e in range(10, top + 1, 2)], repeats)
    if "image" in sections:
        step("image sizes")
        results["image_sizes"] = image.sizes()
        if not args.smoke:
            step("rebuild times")
            results["rebuild"] = image.rebuild_times("cpu")
    if "training" in sections:
        step("training scaling")
        results["training"] = training.measure(20 if args.smoke else 100, repeats, (32,) if args.smoke else (32, 1024))
    if "elastic" in sections:
        step("elastic resumption")
        results["elastic"] = elastic.measure(repeats, ("torchrun",) if args.smoke else tuple(elastic.LAUNCHERS))
    if "hangs" in sections:
        step("hang detection")
        results["hang_detection"] = hangs.detection((2,) if args.smoke else (2, 4), (5,) if args.smoke else (5, 15),
                                                    1 if args.smoke else max(1, repeats // 2))
        step("progress reporting cost")
        results["progress_cost"] = hangs.cost(2 if args.smoke else 20, 100 if args.smoke else 500,
                                              (64,) if args.smoke else (16, 64, 512))

    step("done")
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    text = report.table(results)
    (out / "table.md").write_text(text)
    print(text)
    for path in report.plots(results, out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
