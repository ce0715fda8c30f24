"""5. Training scaling: samples/s of the example PyTorch model, 1 process against 2, through
the entrypoint. This machine has 2 cores: two processes share them with everything else."""

from __future__ import annotations

import re

from testing.processes import ROOT, entrypoint, run

from .procs import base_env, median


def measure(steps: int, repeats: int, widths=(32, 1024)) -> list[dict]:
    """The example as it is (hidden width 32: communication-bound) and a wider one
    (compute-bound)."""
    rows = []
    for hidden, nproc in [(h, n) for h in widths for n in (1, 2)]:
        samples = []
        for _ in range(repeats):
            env = base_env(TRAIN_MODE="local", NPROC_PER_NODE=nproc, ENTRYPOINT=str(ROOT / "examples/pytorch_ddp.py"),
                           CHECKPOINT_DIR=f"/tmp/disttrain-bench-train-{nproc}")
            code, out, _ = run(entrypoint("--steps", str(steps), "--batch-size", "256", "--hidden", str(hidden),
                                          "--checkpoint-every", str(10 ** 9)), env, timeout=300)
            values = [float(v) for v in re.findall(r"rank=0 .*samples_per_s=(\d+)", out)]
            if code == 0 and values:
                samples.append(values[0])
            run(["rm", "-rf", f"/tmp/disttrain-bench-train-{nproc}"], base_env())
        rows.append({"hidden": hidden, "processes": nproc, "samples_per_s": median(samples), "runs": len(samples)})
    for row in rows:
        single = next(r for r in rows if r["hidden"] == row["hidden"] and r["processes"] == 1)
        row["speedup"] = row["samples_per_s"] / single["samples_per_s"]
    return rows
