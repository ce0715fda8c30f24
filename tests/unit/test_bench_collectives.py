"""The allreduce section's rows: medians over runs, and each ratio against its raw counterpart."""
import math

from bench import collectives, report

HVD, RAW = "image: Horovod (MPI controller, the one-node default)", collectives.RAW_MPI


def run_output(seconds_by_size: dict[int, float], ok: bool = True) -> str:
    lines = [f"SIZE {size} {t:.9f} iters=10" for size, t in seconds_by_size.items()]
    return "\n".join(lines + ["CHECK ok rank=0 world=2" if ok else "CHECK FAILED rank=0"]) + "\n"


def rows(stack: str, seconds_by_size: dict[int, float], ok: bool = True) -> list[dict]:
    return collectives.parse(stack, list(seconds_by_size), 2, 0, run_output(seconds_by_size, ok))


def test_each_row_is_the_median_of_its_runs_with_their_range():
    runs = [rows(HVD, {1024: t, 4096: 2 * t}) for t in (0.003, 0.001, 0.002)]
    by_size = {r["bytes"]: r for r in collectives.medians(runs)}
    assert by_size[1024]["seconds"] == 0.002 and by_size[4096]["seconds"] == 0.004
    assert (by_size[1024]["min_seconds"], by_size[1024]["max_seconds"], by_size[1024]["runs"]) == (0.001, 0.003, 3)
    assert math.isclose(by_size[4096]["algbw_GBps"], 4096 / 0.004 / 1e9)
    assert math.isclose(by_size[4096]["busbw_GBps"], by_size[4096]["algbw_GBps"])          # 2(n-1)/n = 1 at n=2


def test_a_run_without_a_figure_does_not_count_and_one_bad_run_marks_the_row():
    runs = [rows(HVD, {1024: 0.001}), collectives.parse(HVD, [1024], 2, 1, "crashed\n"), rows(HVD, {1024: 0.003})]
    (row,) = collectives.medians(runs)
    assert row["seconds"] == 0.002 and row["runs"] == 3 and not row["ok"]


def test_ratios_are_against_the_raw_counterpart_at_the_same_size():
    merged = collectives.medians([rows(HVD, {1024: 0.004, 4096: 0.010}), rows(RAW, {1024: 0.002, 4096: 0.010})])
    ratio = {(r["stack"], r["bytes"]): r["ratio"] for r in collectives.with_ratios(merged)}
    assert ratio[(HVD, 1024)] == 2.0 and ratio[(HVD, 4096)] == 1.0 and ratio[(RAW, 1024)] == 1.0


def test_the_table_shows_the_median_and_the_range():
    merged = collectives.with_ratios(collectives.medians([rows(RAW, {1024: t}) for t in (0.001, 0.002, 0.004)]))
    text = report.table({"machine": "test", "date": "today", "repeats": 3, "collectives": merged})
    assert "| raw mpi4py (mpirun) | 1 KB | 2.000 | 3: 1.000–4.000 |" in text
