"""3. Allreduce throughput between 2 processes: through the image's stack (the entrypoint
launching Horovod, torchrun/gloo, mpirun/MPI) against raw torchrun and raw mpirun, with
Horovod's tensor fusion on and off, and Horovod's two controllers on one node: MPI (the
default there: Open MPI's shared memory) and Gloo (HOROVOD_CONTROLLER=gloo). Each row's
ratio is against its raw counterpart at the same size: raw mpi4py for Horovod and MPI, raw
torchrun for torch.distributed. busbw = algbw x 2(n-1)/n (nccl-tests)."""

from __future__ import annotations

import math
import re

from testing.processes import PY, entrypoint, run

from .procs import WORKLOADS, base_env, median

ALLREDUCE = str(WORKLOADS / "allreduce.py")
N = 2


def stacks(sizes: str) -> list[tuple[str, list[str], dict]]:
    local = dict(TRAIN_MODE="local", NPROC_PER_NODE=N, ENTRYPOINT=ALLREDUCE, OMP_NUM_THREADS=1)
    sweep = ["--sizes", sizes]
    return [
        ("image: Horovod (MPI controller, the one-node default)", entrypoint("--stack", "hvd", *sweep),
         base_env(LAUNCHER="horovod", **local)),
        # Without the entrypoint's two defaults for it (README, Benchmarks): torch's tensors
        # without huge pages (numpy's raw counterpart gets them by itself), Horovod's 1 ms cycle.
        ("image: Horovod (MPI), THP_MEM_ALLOC_ENABLE=0 HOROVOD_CYCLE_TIME=1", entrypoint("--stack", "hvd", *sweep),
         base_env(LAUNCHER="horovod", THP_MEM_ALLOC_ENABLE=0, HOROVOD_CYCLE_TIME=1, **local)),
        ("image: Horovod, Gloo controller", entrypoint("--stack", "hvd", *sweep),
         base_env(LAUNCHER="horovod", HOROVOD_CONTROLLER="gloo", **local)),
        ("image: Horovod, 16 tensors, fusion on", entrypoint("--stack", "hvd", "--tensors", "16", *sweep),
         base_env(LAUNCHER="horovod", **local)),
        ("image: Horovod, 16 tensors, fusion off", entrypoint("--stack", "hvd", "--tensors", "16", *sweep),
         base_env(LAUNCHER="horovod", HOROVOD_FUSION_THRESHOLD=0, **local)),
        ("image: torch gloo (torchrun)", entrypoint("--stack", "torch", *sweep), base_env(**local)),
        ("image: MPI (mpirun, mpi4py)", entrypoint("--stack", "mpi4py", *sweep), base_env(LAUNCHER="mpi", **local)),
        ("raw torch.distributed gloo", [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={N}",
                                        ALLREDUCE, "--stack", "torch", *sweep], base_env(OMP_NUM_THREADS=1)),
        ("raw mpi4py (mpirun)", ["mpirun", "--np", str(N), "--bind-to", "none", PY, ALLREDUCE, "--stack", "mpi4py",
                                 *sweep], base_env(OMP_NUM_THREADS=1)),
    ]


RAW_TORCH, RAW_MPI = "raw torch.distributed gloo", "raw mpi4py (mpirun)"


def raw_counterpart(stack: str) -> str:
    return RAW_TORCH if "torch" in stack else RAW_MPI


def measure(sizes: list[int], repeats: int = 1) -> list[dict]:
    """Every stack `repeats` times, in rounds (each round runs every stack once), so that what
    slows the machine for a while slows the rows alike; each row is the median of its runs."""
    runs = []
    for _ in range(repeats):
        for name, cmd, env in stacks(",".join(map(str, sizes))):
            code, out, _ = run(cmd, env, timeout=600)
            runs.append(parse(name, sizes, N, code, out))
    return with_ratios(medians(runs))


def medians(runs: list[list[dict]]) -> list[dict]:
    """parse()'s rows from several runs -> one row per (stack, size): median time (of the runs
    that produced one), its range, how many runs; ok only if every run was."""
    grouped: dict[tuple[str, int], list[dict]] = {}
    for rows in runs:
        for r in rows:
            grouped.setdefault((r["stack"], r["bytes"]), []).append(r)
    out = []
    for same in grouped.values():
        times = [r["seconds"] for r in same if not math.isnan(r["seconds"])]        # NaN: that run gave no figure
        seconds = median(times)
        out.append({**same[0], "seconds": seconds, "min_seconds": min(times, default=float("nan")),
                    "max_seconds": max(times, default=float("nan")), "runs": len(same),
                    **bandwidth(same[0]["bytes"], seconds, same[0]["processes"]), "ok": all(r["ok"] for r in same)})
    return out


def with_ratios(rows: list[dict]) -> list[dict]:
    seconds = {(r["stack"], r["bytes"]): r["seconds"] for r in rows}
    for r in rows:
        r["raw"] = raw_counterpart(r["stack"])
        r["ratio"] = r["seconds"] / seconds.get((r["raw"], r["bytes"]), float("nan"))
    return rows


def parse(name: str, sizes: list[int], n: int, code: int, out: str) -> list[dict]:
    """allreduce.py's output from n processes -> one row per size (NaN where one is missing);
    ok: exit 0 and the final sum correct."""
    found = {int(s): float(t) for s, t in re.findall(r"SIZE (\d+) ([\d.]+)", out)}
    checked = "CHECK ok" in out and "CHECK FAILED" not in out
    rows = []
    for size in sizes:
        seconds = found.get(size, float("nan"))
        rows.append({"stack": name, "bytes": size, "seconds": seconds, "processes": n,
                     **bandwidth(size, seconds, n), "ok": code == 0 and checked})
    return rows


def bandwidth(size: int, seconds: float, n: int) -> dict:
    """algbw = bytes / time; busbw = algbw x 2(n-1)/n (nccl-tests). NaN without a time."""
    algbw = size / seconds / 1e9 if seconds > 0 else float("nan")
    return {"algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (n - 1) / n}
