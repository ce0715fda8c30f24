"""1. Launch overhead: process start -> first line of train.py, entrypoint against the
plain launchers on the same job (median of `repeats` runs)."""

from __future__ import annotations

import time

from testing.processes import PY, entrypoint, run

from .procs import WORKLOADS, base_env, median, stamps

FIRST = str(WORKLOADS / "first_line.py")


def configurations(nproc: int) -> list[tuple[str, str, list[str], dict]]:
    """(name, baseline name, command, env) for one process count."""
    local = dict(TRAIN_MODE="local", NPROC_PER_NODE=nproc, ENTRYPOINT=FIRST)
    configs = [
        ("entrypoint → torchrun", "torchrun", entrypoint(), base_env(**local)),
        ("torchrun", "torchrun", [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                                  FIRST], base_env()),
        ("entrypoint → Horovod", "horovodrun", entrypoint(), base_env(LAUNCHER="horovod", **local)),
        ("horovodrun", "horovodrun", ["horovodrun", "-np", str(nproc), "-H", f"localhost:{nproc}", "--gloo",
                                      PY, FIRST], base_env()),
    ]
    if nproc == 1:
        configs.append(("python", "python", [PY, FIRST], base_env()))
        configs.append(("entrypoint (1 process)", "python", entrypoint(), base_env(**local)))
    return configs


def measure(repeats: int) -> list[dict]:
    rows = []
    for nproc in (1, 2):
        for name, baseline, cmd, env in configurations(nproc):
            samples = []
            for _ in range(repeats):
                start = time.time()
                code, out, _ = run(cmd, env, timeout=120)
                firsts = stamps(out, "FIRST_LINE")
                if code == 0 and len(firsts) == nproc:
                    samples.append(max(firsts) - start)
            rows.append({"nproc": nproc, "name": name, "baseline": baseline, "seconds": median(samples),
                         "runs": len(samples)})
    by_key = {(r["nproc"], r["name"]): r["seconds"] for r in rows}
    for r in rows:
        r["ratio"] = r["seconds"] / by_key[(r["nproc"], r["baseline"])]
    return rows
