"""The benchmark command's smoke mode, so the scripts keep working (its numbers are not
judged here: speed goals live in bench/, not in tests)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.docker]


def test_bench_smoke_prints_a_table_and_writes_plots(image, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--out", str(tmp_path),
                             "--image", image],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for heading in ("Launch overhead", "Rendezvous", "The job store, one operation", "Horovod's HTTP rendezvous", "docker compose up", "Allreduce", "Images", "Training", "Elastic",
                    "Hang detection", "Progress reporting"):
        assert heading in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert all(r["runs"] == 1 for r in results["launch"]), results["launch"]
    assert all(r["failures"] == 0 for r in results["rendezvous"]), results["rendezvous"]
    assert any(r["path"].endswith("JOB_SECRET") for r in results["rendezvous"])
    assert {r["op"] for r in results["store_latency"]} == {"add", "get", "set", "check"}
    assert len(results["rendezvous_requests"]) == 3 and all(r["ms"] > 0 for r in results["rendezvous_requests"])
    assert all(r["failures"] == 0 for r in results["compose"]), results["compose"]
    assert all(r["ok"] for r in results["collectives"])
    assert results["image_sizes"] and all(r["overhead_ratio"] > 0 for r in results["image_sizes"])
    assert all(r["failures"] == 0 for r in results["elastic"]), results["elastic"]
    assert all(r["failures"] == 0 for r in results["hang_detection"]), results["hang_detection"]
    assert results["progress_cost"] and all(r["ratio"] > 0 for r in results["progress_cost"])
    for name in ("launch.png", "rendezvous.png", "allreduce.png", "images.png", "hangs.png"):
        assert (tmp_path / name).stat().st_size > 5000
