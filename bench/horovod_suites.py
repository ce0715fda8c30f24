#!/usr/bin/env python3
"""Horovod's own parallel test suites (test/parallel of horovod/horovod, at the release the
image compiles), run inside a built image as its users would run them:

    python bench/horovod_suites.py --image distributed-training-framework:cpu --horovod-git DIR

    docker run IMAGE horovodrun -np 2 -H localhost:2 python -m pytest test_torch.py ...

The suites are read from a git clone of Horovod (`--horovod-git`: its tag v<version> is
exported with `git archive`; the version is the image's label) or from a folder holding
Horovod's `test/` (`--horovod-tests`); they are never copied into this repository. pytest,
which the images do not carry, is installed on this machine into the output folder
(`pip install --target`) and mounted read-only. The image's default environment is used
(FRAMEWORK unset: the command runs under the default), so what the suites see is what a
user's command after the image sees.

Prints a table (image, suite, rank: passed, failed, skipped, errors; seconds) and writes
horovod_suites.json and each suite's log to --out. A suite that runs past --timeout is
recorded as timed out: ranks left waiting on each other.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

# The suites that exercise each framework the image's Horovod is built for.
SUITES = {"pytorch": ["test_torch.py"],
          "tensorflow": ["test_tensorflow.py", "test_tensorflow2_keras.py", "test_tensorflow_keras.py"],
          "mxnet": ["test_mxnet1.py", "test_mxnet2.py"]}
LABEL = "io.disttrain"
# pytest's summary line, as each rank prints it through horovodrun: '[1,0]<stdout>:3 failed, 97
# passed in 8.1s' under mpirun, '[0]<stdout>:...' under Gloo, '== ... ==' without -q.
SUMMARY = re.compile(r"\[(?:\d+,)?(\d+)\]<stdout>:=*\s*((?:\d+ (?:subtests )?\w+(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) ((?:subtests )?(?:passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?))")


def labels(image: str) -> dict[str, str] | None:
    """The image's labels; None where no such image is on this engine."""
    out = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image],
                         capture_output=True, text=True)
    return json.loads(out.stdout) or {} if out.returncode == 0 else None


def export_tests(git_dir: Path, version: str, dest: Path) -> Path:
    """Horovod's test/ at tag v<version>, from a git clone (read, never committed here)."""
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "--format=tar", f"v{version}", "test/parallel",
                              "test/utils", "test/conftest.py"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "test"


# What the suites import beyond the image: pytest, and test/utils/common.py's mock and
# the TensorFlow suites' parameterized (pure Python; installed here, mounted read-only), with
# pytest's own pluggy, iniconfig and pygments (the cpu image has pygments through TensorFlow,
# images without TensorFlow do not).
TEST_PACKAGES = ("pytest", "mock", "parameterized")


def install_pytest(dest: Path) -> Path:
    if not all((dest / name).is_dir() for name in TEST_PACKAGES):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(dest),
                        *TEST_PACKAGES, "pluggy", "iniconfig", "pygments"], check=True)
    return dest


def counts(text: str) -> dict[int, dict[str, int]]:
    """rank -> {passed: n, failed: n, ...} from each rank's pytest summary line."""
    found: dict[int, dict[str, int]] = {}
    for rank, summary in SUMMARY.findall(text):
        found[int(rank)] = {(kind[:-1] if kind.endswith(("errors", "warnings")) else kind).replace(" ", "_"): int(n)
                            for n, kind in COUNT.findall(summary)}
    return found


def run_suite(image: str, tests: Path, pytest_dir: Path, suite: str, np: int, timeout: float,
              log: Path) -> dict:
    cmd = ["docker", "run", "--rm", "--shm-size=1g", "-v", f"{tests}:/suites:ro", "-v", f"{pytest_dir}:/opt/pytest:ro",
           "-e", "PYTHONPATH=/opt/pytest", "-w", "/suites/parallel", image,
           "horovodrun", "-np", str(np), "-H", f"localhost:{np}",
           "python", "-m", "pytest", "-q", "--color=no", "-p", "no:cacheprovider", suite]
    name = f"suite-{int(time.time() * 1000)}"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([*cmd[:3], "--name", name, *cmd[3:]], stdout=out, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            subprocess.run(["docker", "kill", name], capture_output=True)
            code, timed_out = proc.wait(), True
    text = log.read_text(errors="replace")
    return {"suite": suite, "exit": code, "timed_out": timed_out, "seconds": round(time.monotonic() - started, 1),
            "ranks": counts(text), "log": str(log)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", required=True)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--horovod-git", type=Path, help="a git clone (or bare git dir) of horovod/horovod")
    where.add_argument("--horovod-tests", type=Path, help="a folder holding Horovod's test/ (parallel, utils)")
    parser.add_argument("--suite", action="append", help="a file of test/parallel (default: per framework)")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per suite")
    parser.add_argument("--out", type=Path, default=Path("horovod-suites"))
    args = parser.parse_args(argv)

    found = labels(args.image)
    if found is None:
        parser.error(f"--image {args.image}: no such image on this engine; build it first "
                     f"(python build.py build VARIANT)")
    version = found.get(f"{LABEL}.version.horovod")
    if not version:
        parser.error(f"--image {args.image}: no Horovod in it (no {LABEL}.version.horovod label)")
    args.out.mkdir(parents=True, exist_ok=True)
    tests = (export_tests(args.horovod_git, version, args.out / f"horovod-{version}") if args.horovod_git
             else args.horovod_tests.resolve())
    pytest_dir = install_pytest((args.out / "pytest").resolve())
    frameworks = found.get(f"{LABEL}.horovod.frameworks", "").split(",")
    suites = args.suite or [s for fw in frameworks for s in SUITES.get(fw, [])]
    variant = found.get(f"{LABEL}.variant", args.image)

    rows = []
    for suite in suites:
        print(f"== {variant}: {suite}", flush=True)
        rows.append(run_suite(args.image, tests.resolve(), pytest_dir, suite, args.np, args.timeout,
                              (args.out / f"{variant}-{suite}.log").resolve()))
    results = {"image": args.image, "variant": variant, "horovod": version, "np": args.np, "suites": rows}
    (args.out / f"{variant}.json").write_text(json.dumps(results, indent=2) + "\n")

    print(f"\n| variant | suite | rank | passed | failed | skipped | errors | subtests passed/failed | exit | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        ranks = row["ranks"] or {None: {}}
        for rank, c in sorted(ranks.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
            status = "timed out" if row["timed_out"] else row["exit"]
            print(f"| {variant} | {row['suite']} | {'-' if rank is None else rank} | {c.get('passed', 0)} | "
                  f"{c.get('failed', 0)} | {c.get('skipped', 0)} | {c.get('error', 0)} | "
                  f"{c.get('subtests_passed', 0)}/{c.get('subtests_failed', 0)} | {status} | {row['seconds']} |")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
