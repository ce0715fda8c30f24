"""bench/gpu_check.sh, the prepared GPU check (issue 15): its cheap parts. The patches it
builds with are applied to the real sdist in test_render.py; the whole rehearsal (a Horovod
build with nvcc, entrypoint runs) is too long for CI and is run by hand (README, Benchmarks)."""

import os
import subprocess
import sys

from bench import collectives, gpu_check
from tests.conftest import ROOT

# The issue's six steps, in its order, and issue 37's gradients before the budget.
ISSUE_STEPS = ["build", "check-build", "train", "preflight", "allreduce", "gradients", "budget"]


def script(*args, timeout=60):
    return subprocess.run([str(ROOT / "bench" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHON": sys.executable})


def test_the_step_list_is_the_issues_and_fits_eight_minutes():
    result = script("--list")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[:2] for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert listed == [[str(i), name] for i, name in enumerate(ISSUE_STEPS, 1)]
    assert [s.name for s in gpu_check.STEPS] == ISSUE_STEPS
    limits = [s.limit_s for s in gpu_check.STEPS[:-1]]
    assert all(limit > 0 for limit in limits) and sum(limits) <= gpu_check.BUDGET_S == 480


def test_bad_options_give_one_line_and_exit_2():
    for args, line in ((["--cc-list", "9.0"], "gpu_check: --cc-list='9.0': allowed: compute capabilities"),
                       (["--time-scale", "0"], "gpu_check: --time-scale=0.0: allowed: a number > 0")):
        result = script(*args)
        assert result.returncode == 2 and not result.stdout, (args, result.stdout, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(line), result.stderr
    result = script("--rehearse", "--prepare")         # argparse's own: usage, then the error line
    assert result.returncode == 2 and "--prepare: not allowed with argument --rehearse" in result.stderr


def test_options_parse():
    args = gpu_check.parse_args(["--rehearse", "--cc-list", "80,90", "--out", "/tmp/x", "--time-scale", "2"])
    assert args.rehearse and args.cc_list == "80,90" and args.out == "/tmp/x" and args.time_scale == 2
    assert gpu_check.parse_args([]).out == os.environ.get("OUT", str(ROOT / "bench" / "out"))


def test_allreduce_rows_need_a_correct_sum():
    out = "SIZE 268435456 0.000120000 iters=10\nCHECK ok rank=0 world=1 device=cuda expected=1\n"
    row = collectives.parse("hvd", [256 << 20], 1, 0, out)[0]
    assert row["ok"] and abs(row["algbw_GBps"] - (256 << 20) / 0.00012 / 1e9) < 1e-6 and row["busbw_GBps"] == 0
    assert not collectives.parse("hvd", [256 << 20], 2, 0, out.replace("CHECK ok", "CHECK FAILED"))[0]["ok"]
    assert not collectives.parse("hvd", [256 << 20], 2, 1, out)[0]["ok"]
