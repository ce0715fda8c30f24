#!/usr/bin/env python3
"""GPU truth in one call: on a CUDA host without Docker, build Horovod with NCCL against the
host's torch and NCCL wheel, check the build, train through the entrypoint on the GPU, show
the entrypoint's preflight, time 256 MB allreduces, and the gradient compressions on NCCL;
one verdict line per step, all within 8 minutes.

    bench/gpu_check.sh --prepare     with a package index: fetch what the GPU host cannot
    bench/gpu_check.sh               on the GPU host: the seven steps
    bench/gpu_check.sh --rehearse    on a machine without a GPU: the same steps on the CPU
    bench/gpu_check.sh --list        the steps and their time limits

Every figure goes to one results file, gpu_check.json, and every command's output to
gpu_check.log, both in --out ($OUT when set, else bench/out). Exit 0 when every step passed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import collectives  # noqa: E402
from testing.ports import free_port  # noqa: E402
from testing.processes import ROOT, entrypoint, run  # noqa: E402
from testing.results import results as parse_results  # noqa: E402
from bench.procs import WORKLOADS, base_env  # noqa: E402
from entrypoint.machine.nvidia_driver import check_driver, parse_driver  # noqa: E402

HOROVOD = "0.28.1"
PATCHES = ROOT / "images" / "patches" / f"horovod-{HOROVOD}"
BUILD_SCRIPT = ROOT / "images" / "scripts" / "build-horovod.sh"
BUDGET_S = 480                 # the 8 minutes, end to end
GPU_HOST_CPUS = 16             # the GPU host's cores: --rehearse scales time limits by 16 / cores here
REHEARSAL_CC = "90"            # compute capability compiled for in rehearsal: the GPU host's H200
ALLREDUCE_BYTES = 256 << 20
# Wheels the GPU host lacks for building (Horovod's setup_requires cffi); fetched by --prepare.
BUILD_WHEELS = ("cffi", "pycparser")
GPU_HOST_PYTHON = "3.12"


@dataclass(frozen=True)
class Step:
    number: int
    name: str
    goal: str
    limit_s: int               # on the GPU host; --rehearse scales it
    run: Callable[["Check"], tuple[bool, str]]


@dataclass
class Check:
    """What the steps share: options, the host's facts, paths, and the results so far."""
    rehearse: bool
    scale: float
    work: Path
    dist: Path
    out: Path
    cc_list: str | None
    rebuild: bool
    facts: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    step_deadline: float = 0.0
    timed_out: list = field(default_factory=list)

    @property
    def site(self) -> Path:
        """Where Horovod and the build's missing wheels are installed (on PYTHONPATH)."""
        return self.work / "site"

    @property
    def nproc(self) -> int:
        """Processes the entrypoint starts on this node by default: one per GPU, else one."""
        return self.facts.get("gpus") or 1

    def device(self, rank: int) -> str:
        return "cpu" if self.rehearse else f"cuda:{rank}"

    def remaining(self) -> float:
        return max(1.0, self.step_deadline - time.monotonic())

    def env(self, **extra) -> dict[str, str]:
        """The environment every command runs with: this Python first on PATH, Horovod's
        install on PYTHONPATH, the NCCL wheel's folder for the loader; no GPU in rehearsal."""
        env = base_env(PYTHONPATH=f"{ROOT}{os.pathsep}{self.site}",
                       PATH=os.pathsep.join([str(self.site / "bin"), str(Path(sys.executable).parent),
                                             *self.facts.get("extra_path", []), os.environ.get("PATH", "")]))
        nccl_lib = self.facts.get("nccl_lib")
        if nccl_lib:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (nccl_lib, os.environ.get("LD_LIBRARY_PATH")) if p)
        if self.rehearse:
            env["CUDA_VISIBLE_DEVICES"] = ""
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def command(self, label: str, cmd: list[str], env: dict[str, str], limit: float | None = None) -> tuple[int, str, float]:
        """Run cmd to completion within the step's time; its output goes to the log."""
        limit = min(limit or self.remaining(), self.remaining())
        code, out, seconds = run(cmd, env, timeout=limit)
        if code == 124:
            self.timed_out.append(label)
        shown = {k: v for k, v in env.items() if k.startswith(("HOROVOD_", "CMAKE_", "PIP_", "CUDA_", "NCCL_"))
                 or k in ("FRAMEWORK", "LAUNCHER", "TRAIN_MODE", "NUM_NODES", "ROLE", "MASTER_ADDR", "ENTRYPOINT")}
        with open(self.out / "gpu_check.log", "a") as log:
            log.write(f"\n===== {label}: {' '.join(cmd)}\n===== env: {shown}\n{out}\n"
                      f"===== {label}: exit {code} after {seconds:.1f}s (limit {limit:.0f}s)\n")
        return code, out, seconds

    def save(self) -> None:
        self.results["total_s"] = round(time.monotonic() - self.started, 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=2, default=str) + "\n")


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------- host facts

TORCH_FACTS = """
import json, os, torch
cuda = torch.cuda.is_available()
print(json.dumps({
    "torch": torch.__version__, "torch_lib": os.path.join(os.path.dirname(torch.__file__), "lib"), "torch_cuda": torch.version.cuda, "cuda_available": cuda,
    "torch_devices": torch.cuda.device_count() if cuda else 0,
    "device_name": torch.cuda.get_device_name(0) if cuda else None,
    "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None}))
"""


def which_nvcc() -> Path | None:
    """CUDA's compiler in a toolkit root (bin/nvcc beside include/cuda_runtime.h): where
    Horovod's build looks (HOROVOD_CUDA_HOME), CUDA_HOME, /usr/local/cuda, above the nvcc on
    PATH, and the nvidia-cuda-nvcc wheel's folder."""
    on_path = shutil.which("nvcc")
    candidates = [os.environ.get("HOROVOD_CUDA_HOME"), os.environ.get("CUDA_HOME"), "/usr/local/cuda",
                  str(Path(on_path).resolve().parent.parent) if on_path else None,
                  str(Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13")]
    for home in map(Path, filter(None, candidates)):
        if (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_runtime.h").is_file():
            return home / "bin" / "nvcc"
    return None


def version_of(cmd: list[str], pattern: str) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(pattern, out)
    return found.group(1) if found else None


def nvcc_archs(nvcc: Path) -> list[str]:
    """Compute capabilities this nvcc compiles for, e.g. ['75', ..., '121'] for CUDA 13.0,
    which dropped everything below 7.5 (Maxwell, Pascal, Volta)."""
    try:
        out = subprocess.run([str(nvcc), "--list-gpu-arch"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return sorted(set(re.findall(r"compute_(\d+)", out)), key=int)


def nccl_home() -> Path | None:
    """The nvidia-nccl wheel's folder, where build-horovod.sh points Horovod's CMake."""
    home = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "nccl"
    return home if (home / "include" / "nccl.h").is_file() else None


def nvidia_smi() -> list[dict]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [dict(zip(("name", "compute_cap", "driver", "memory"), (f.strip() for f in line.split(","))))
            for line in out.strip().splitlines() if line.count(",") >= 3]


def host_facts(check: Check) -> dict:
    """Everything about this host that the steps depend on, read once."""
    gpus = [] if check.rehearse else nvidia_smi()
    nvcc = which_nvcc()
    nccl = nccl_home()
    facts = {
        "mode": "rehearsal (no GPU: CPU operations, device cpu)" if check.rehearse else "GPU",
        "hostname": socket.gethostname(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "python_executable": sys.executable,
        "gpus": len(gpus), "gpu_list": gpus,
        "nvcc": str(nvcc) if nvcc else None,
        "nvcc_version": version_of([str(nvcc), "--version"], r"release ([\d.]+)") if nvcc else None,
        "nvcc_archs": nvcc_archs(nvcc) if nvcc else [],
        "nccl_home": str(nccl) if nccl else None, "nccl_lib": str(nccl / "lib") if nccl else None,
        "cmake": version_of([sys.executable, "-m", "cmake", "--version"], r"version (\S+)")
        or version_of(["cmake", "--version"], r"version (\S+)"),
        "gxx": version_of(["g++", "--version"], r"(\d+\.\d+\.\d+)"),
        "make": shutil.which("make"), "ninja": shutil.which("ninja"), "patch": shutil.which("patch"),
        "dev_shm_mib": round(os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize / 2**20)
        if os.path.isdir("/dev/shm") else None,
        "python_headers": os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
        "extra_path": [],
    }
    code, out, _ = run([sys.executable, "-c", TORCH_FACTS], check.env(), timeout=120)
    if code == 0 and out.strip():
        facts.update(json.loads(out.strip().splitlines()[-1]))
    else:
        facts["torch_error"] = tail(out)
    caps = sorted({g["compute_cap"].replace(".", "") for g in gpus if g.get("compute_cap")})
    facts["cc_list"] = check.cc_list or (REHEARSAL_CC if check.rehearse else ",".join(caps) or None)
    return facts


# --------------------------------------------------------------------------- 1. build

def build_settings(check: Check) -> dict[str, str]:
    """HOROVOD_* for this host: PyTorch only, Gloo controller (no MPI compiler assumed),
    NCCL for GPU tensors, linked against the nvidia-nccl wheel (build-horovod.sh)."""
    f = check.facts
    cuda_home = str(Path(f["nvcc"]).parent.parent)
    settings = {
        "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1", "HOROVOD_CPU_OPERATIONS": "GLOO",
        "HOROVOD_GPU_OPERATIONS": "NCCL", "HOROVOD_NCCL_LINK": "SHARED",
        "HOROVOD_CUDA_HOME": cuda_home, "HOROVOD_BUILD_CUDA_CC_LIST": f["cc_list"],
        # torch's CUDAExtension finds cudart under CUDA_HOME, else above the nvcc on PATH,
        # which may be a wrapper script elsewhere (/usr/local/bin/nvcc here).
        "CUDA_HOME": cuda_home,
        # CMake 4 refuses cmake_minimum_required() below 3.5, which Horovod's third_party has.
        "CMAKE_POLICY_VERSION_MINIMUM": "3.5",
        # Offline: the sdist and the missing build wheels come from --prepare's folder.
        "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(check.dist),
    }
    if not f.get("make") and f.get("ninja"):
        settings["CMAKE_GENERATOR"] = "Ninja"
    return settings


def build_key(check: Check, settings: dict[str, str]) -> dict:
    """What the wheel depends on: a wheel built with the same key is reused (a rerun)."""
    patches = sorted(PATCHES.rglob("*.patch"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in patches + [BUILD_SCRIPT])).hexdigest()[:16]
    f = check.facts
    return {"horovod": HOROVOD, "patches": digest, "python": f["python"], "torch": f.get("torch"),
            "nvcc": f["nvcc_version"], "nccl": f.get("nccl"), "settings": settings}


def ensure_tools(check: Check) -> list[str]:
    """`patch` and the build's missing wheels, from --prepare's folder if the host lacks them."""
    notes = []
    if not check.facts["patch"]:
        debs = sorted(check.dist.glob("patch_*.deb"))
        if not debs or not shutil.which("dpkg-deb"):
            raise RuntimeError(f"no `patch` on this host and no patch_*.deb in {check.dist} to unpack")
        tools = check.work / "tools"
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(tools)], check=True, timeout=60)
        check.facts["extra_path"].append(str(tools / "usr" / "bin"))
        notes.append("patch unpacked from " + debs[-1].name)
    missing = [name for name in BUILD_WHEELS if not can_import(check, name)]
    if missing:
        code, out, _ = check.command("install build wheels", [
            sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(check.dist), "--no-deps",
            "--upgrade", "--target", str(check.site), *missing], check.env(), limit=120)
        if code != 0:
            raise RuntimeError(f"installing {', '.join(missing)} from {check.dist} failed: {tail(out)}")
        notes.append("installed " + ", ".join(missing) + " from --prepare's wheels")
    return notes


def can_import(check: Check, module: str) -> bool:
    return run([sys.executable, "-c", f"import {module}"], check.env(), timeout=60)[0] == 0


def step_build(check: Check) -> tuple[bool, str]:
    f = check.facts
    if not f["nvcc"]:
        return False, "no nvcc (looked at HOROVOD_CUDA_HOME, CUDA_HOME, PATH, /usr/local/cuda, nvidia/cu13)"
    if not f["nccl_home"]:
        return False, "no nvidia-nccl wheel (nvidia/nccl/include/nccl.h) in this Python's site-packages"
    if not f["cc_list"]:
        return False, "no compute capability from nvidia-smi; give --cc-list"
    unsupported = [cc for cc in f["cc_list"].split(",") if f["nvcc_archs"] and cc not in f["nvcc_archs"]]
    if unsupported:
        return False, (f"nvcc {f['nvcc_version']} cannot compile for compute capability {','.join(unsupported)}; "
                       f"it supports {','.join(f['nvcc_archs'])}")
    if not f["python_headers"]:
        return False, f"no Python.h for {sys.executable}: Horovod's extension cannot be compiled"
    if not (check.dist / f"horovod-{HOROVOD}.tar.gz").is_file():
        return False, f"no horovod-{HOROVOD}.tar.gz in {check.dist}: run --prepare where a package index is reachable"
    notes = ensure_tools(check)
    settings = build_settings(check)
    wheel_dir, stamp = check.work / "wheel", check.work / "wheel" / "build-key.json"
    key = build_key(check, settings)
    wheels = sorted(wheel_dir.glob("horovod-*.whl"))
    how = "reused (same build key)"
    if check.rebuild or not wheels or not stamp.is_file() or json.loads(stamp.read_text()) != key:
        shutil.rmtree(wheel_dir, ignore_errors=True)
        code, out, seconds = check.command("build", ["bash", str(BUILD_SCRIPT), HOROVOD, str(PATCHES), str(wheel_dir)],
                                           check.env(**settings))
        applied = re.findall(r"^applying (\S+)", out, re.M)
        check.results["build"] = {"seconds": round(seconds, 1), "patches": applied, "settings": settings}
        if code != 0:
            return False, f"build exit {code}{' (time limit)' if code == 124 else ''}: " + " | ".join(build_errors(out))
        stamp.write_text(json.dumps(key, indent=1))
        wheels = sorted(wheel_dir.glob("horovod-*.whl"))
        how = f"built in {seconds:.0f}s, patches {','.join(name.split('-')[0] for name in applied)}"
    code, out, _ = check.command("install horovod", [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                                                     "--upgrade", "--target", str(check.site), str(wheels[-1])],
                                 check.env(), limit=120)
    if code != 0:
        return False, f"installing {wheels[-1].name} failed: {tail(out)}"
    unresolved = unresolved_libraries(check)
    check.results.setdefault("build", {}).update(wheel=wheels[-1].name, bytes=wheels[-1].stat().st_size,
                                                 unresolved_libraries=unresolved, notes=notes)
    if unresolved:
        return False, f"{wheels[-1].name}: libraries not found: {', '.join(unresolved)}"
    return True, (f"{wheels[-1].name} {how}; nvcc {f['nvcc_version']}, CC {f['cc_list']}, NCCL {f.get('nccl')}, "
                  f"torch {f.get('torch')}" + (f"; {'; '.join(notes)}" if notes else ""))


def build_errors(out: str, most: int = 4) -> list[str]:
    """The first distinct compiler and CMake errors in a build's output (else its end)."""
    found: list[str] = []
    for line in (raw.strip() for raw in out.splitlines()):
        if re.search(r"CMake Error|error:|\bFOUND_LIB_\w+|\*\*\* .*Error \d+", line) and "exited-with-error" not in line:
            if line not in found:
                found.append(line)
    return found[:most] or [tail(out)]


def unresolved_libraries(check: Check) -> list[str]:
    """Shared libraries Horovod's torch extension needs that the loader cannot find (ldd),
    torch's own aside (importing torch loads them first)."""
    if not shutil.which("ldd"):
        return []
    env = check.env()
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, (check.facts.get("torch_lib"), env.get("LD_LIBRARY_PATH"))))
    missing = set()
    for lib in (check.site / "horovod" / "torch").glob("mpi_lib_v2*.so"):
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, env=env, timeout=30).stdout
        missing.update(m.split()[0] for m in out.splitlines() if "not found" in m)
    return sorted(missing)


# --------------------------------------------------------------------------- 2. check-build

def step_check_build(check: Check) -> tuple[bool, str]:
    if not (check.site / "bin" / "horovodrun").exists():
        return False, "no horovodrun: step 1 did not install Horovod"
    code, out, _ = check.command("horovodrun --check-build", ["horovodrun", "--check-build"], check.env())
    sections: dict[str, dict[str, bool]] = {}
    for block in re.split(r"\n\s*\n", out):
        title = re.search(r"Available ([\w ]+):", block)
        if title:
            sections[title.group(1)] = {n: m == "X" for m, n in re.findall(r"\[(X| )\] (\S+)", block)}
    check.results["check_build"] = sections
    enabled = "; ".join(f"{t.split()[0].lower()} " + ",".join(n for n, on in names.items() if on)
                        for t, names in sections.items())
    ok = code == 0 and sections.get("Frameworks", {}).get("PyTorch") and sections.get("Tensor Operations", {}).get("NCCL")
    return bool(ok), f"exit {code}; {enabled or tail(out)}"


# --------------------------------------------------------------------------- 3. train

def train(check: Check, label: str, limit: float, **env) -> tuple[bool, str, dict]:
    """One entrypoint run of the bundled example; the device, the loss, the exit code."""
    ckpt = check.work / f"checkpoints-{label}"
    shutil.rmtree(ckpt, ignore_errors=True)          # a leftover checkpoint would resume, not train
    run_env = check.env(FRAMEWORK="pytorch", ENTRYPOINT=ROOT / "examples" / "train.py", CHECKPOINT_DIR=ckpt,
                        DATA_DIR=check.work / "data", GRACE_PERIOD=5, RDZV_TIMEOUT=60, **env)
    code, out, seconds = check.command(f"train {label}", entrypoint("--steps", "60"), run_env, limit)
    results = [dict(framework=r.framework, rank=r.rank, world=r.world, before=r.before, after=r.after,
                    digest=r.digest, **r.fields) for r in parse_results(out)]
    preflight = re.search(r"entrypoint: (preflight: .*)", out)
    figures = {"exit": code, "seconds": round(seconds, 1), "results": results,
               "preflight": preflight.group(1) if preflight else None,
               "node": (re.search(r"entrypoint: (node 0 of .*)", out) or [None, None])[1],
               "warnings": re.findall(r"entrypoint: WARNING: (.*)", out)}
    problems = []
    if code != 0:
        problems.append(f"exit {code}" + (" (time limit)" if code == 124 else "") + f": {tail(out, 2)}")
    if len(results) != check.nproc:
        problems.append(f"{len(results)} RESULT line(s), expected {check.nproc}")
    wrong = [f"rank {r['rank']} on {r.get('device')}" for r in results if r.get("device") != check.device(r["rank"])]
    if wrong:
        problems.append(f"device: {', '.join(wrong)}, expected {check.device(0)}")
    if any(r["after"] >= r["before"] for r in results):
        problems.append("loss did not go down")
    if len({r["digest"] for r in results}) > 1:
        problems.append("replicas disagree")
    if problems:
        return False, f"{label}: " + "; ".join(problems), figures
    r0 = results[0]
    return True, (f"{label}: exit 0, {len(results)} process(es) on {r0.get('device')}, "
                  f"loss {r0['before']:.4f} -> {r0['after']:.4f}, {seconds:.0f}s"), figures


def step_train(check: Check) -> tuple[bool, str]:
    runs = [("torchrun", {"TRAIN_MODE": "local"}), ("horovod", {"TRAIN_MODE": "local", "LAUNCHER": "horovod"})]
    verdicts, ok_all = [], True
    check.results["train"] = {}
    for i, (label, env) in enumerate(runs):
        if label == "horovod" and not (check.site / "horovod").is_dir():
            verdicts.append("horovod: not run (no Horovod: step 1 failed)")
            ok_all = False
            continue
        ok, text, figures = train(check, label, check.remaining() / (len(runs) - i), **env)
        check.results["train"][label] = figures
        verdicts.append(text)
        ok_all &= ok
    return ok_all, "; ".join(verdicts)


# --------------------------------------------------------------------------- 4. preflight

def host_address() -> tuple[str, str]:
    """(interface, IPv4 address) another host would reach this one at: the first that is
    neither loopback nor a Docker bridge; ('lo', '127.0.0.1') if there is none."""
    import psutil
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127.") and name != "docker0":
                return name, a.address
    return "lo", "127.0.0.1"


def step_preflight(check: Check) -> tuple[bool, str]:
    """A one-node distributed job on this host's own address: the entrypoint's preflight
    (GPU count, /dev/shm) and its NIC choice, which only the distributed path makes."""
    iface, address = host_address()
    ok, text, figures = train(check, "distributed", check.remaining(), TRAIN_MODE="distributed", NUM_NODES=1,
                              ROLE="master", MASTER_ADDR=address, MASTER_PORT=free_port())
    check.results["preflight"] = dict(figures, expected_interface=iface, master_addr=address)
    pre, node = figures["preflight"] or "", figures["node"] or ""
    gpus = re.search(r"(\d+) GPU\(s\)", pre)
    chosen = re.search(r"interface ([^\s,]+)", node)
    problems = [] if ok else [text]
    kind, expected_kind = re.search(r"accelerator (\w+)", pre), "cpu" if check.rehearse else "gpu"
    if kind and kind.group(1) != expected_kind:
        problems.append(f"accelerator {kind.group(1)}, expected {expected_kind}")
    if not gpus or int(gpus.group(1)) != check.facts["gpus"]:
        problems.append(f"preflight GPU count {gpus.group(1) if gpus else '?'} != nvidia-smi's {check.facts['gpus']}")
    if not chosen or chosen.group(1) != iface:
        problems.append(f"interface {chosen.group(1) if chosen else '?'}, expected {iface} (holds {address})")
    driver_text, driver_problems = driver_facts(check)
    problems += driver_problems
    warnings = f"; warnings: {' | '.join(figures['warnings'])}" if figures["warnings"] else ""
    summary = f"{pre.removeprefix('preflight: ') or '(no preflight line)'}; {node or '(no node line)'}; " \
              f"{driver_text}{warnings}"
    return not problems, summary + ("; " + "; ".join(problems) if problems else "")


def driver_facts(check: Check) -> tuple[str, list[str]]:
    """The entrypoint's driver check (entrypoint/machine/nvidia_driver.py) on this host: the version it
    reads from /proc/driver/nvidia/version must be nvidia-smi's, and the torch that just
    trained on the GPU must pass it (no error) for its own CUDA."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        text = ""
    driver, smi = parse_driver(text), (check.facts["gpu_list"] or [{}])[0].get("driver")
    cuda = check.facts.get("torch_cuda")
    check.results["driver"] = dict(proc=driver, nvidia_smi=smi, torch_cuda=cuda)
    if check.rehearse:
        return f"driver: {driver or 'none'} (rehearsal)", []
    if driver is None or driver != smi:
        return f"driver: {driver}", [f"driver version read {driver!r}, nvidia-smi says {smi!r}"]
    error, warning = check_driver(driver, cuda, "this host's torch", {}) if cuda else (None, None)
    check.results["driver"].update(error=error, warning=warning)
    return f"driver {driver} for CUDA {cuda}: {warning or 'fits'}", [error] if error else []


# --------------------------------------------------------------------------- 5. allreduce

def step_allreduce(check: Check) -> tuple[bool, str]:
    device = "cpu" if check.rehearse else "cuda"
    transport = "gloo" if check.rehearse else "NCCL"
    sweep = ["--device", device, "--sizes", str(ALLREDUCE_BYTES), "--min-iters", "10"]
    local = dict(TRAIN_MODE="local", ENTRYPOINT=WORKLOADS / "allreduce.py", CHECKPOINT_DIR=check.work / "checkpoints-ar")
    runs = [(f"Horovod {transport} (entrypoint, LAUNCHER=horovod)", ["--stack", "hvd"], dict(LAUNCHER="horovod")),
            (f"torch.distributed {transport} (entrypoint, torchrun)", ["--stack", "torch"], {})]
    rows, verdicts = [], []
    for i, (name, stack, env) in enumerate(runs):
        if "Horovod" in name and not (check.site / "horovod").is_dir():
            verdicts.append("Horovod: not run (no Horovod: step 1 failed)")
            rows.append({"stack": name, "bytes": ALLREDUCE_BYTES, "ok": False, "seconds": float("nan")})
            continue
        code, out, _ = check.command(f"allreduce {name}", entrypoint(*stack, *sweep), check.env(**local, **env),
                                     check.remaining() / (len(runs) - i))
        row = collectives.parse(name, [ALLREDUCE_BYTES], check.nproc, code, out)[0]
        rows.append(row)
        verdicts.append(f"{name.split(' (')[0]}: {row['seconds'] * 1e3:.2f} ms, {row['algbw_GBps']:.1f} GB/s algbw"
                        if row["ok"] else f"{name}: exit {code}, {tail(out, 2)}")
    check.results["allreduce"] = rows
    note = " (1 process: no traffic between GPUs; times the path, not a link)" if check.nproc == 1 else ""
    return all(r["ok"] for r in rows), f"256 MB x {check.nproc} process(es){note}: " + "; ".join(verdicts)


# --------------------------------------------------------------------------- 6. gradients

GRADIENT_GOAL = 0.02                 # issue 37: fp16's and bf16's final loss within 2 % of none's


def step_gradients(check: Check) -> tuple[bool, str]:
    """GRAD_COMPRESSION on NCCL (on Gloo in rehearsal), through the entrypoint: the 25M-parameter DDP
    workload of bench/grad_sync.py on each GPU of this host, per compression: seconds per
    batch (one GPU: the compression's own cost; several: the links too) and the final loss."""
    compressions = ["none", "fp16", "powersgd", "bf16"]
    rows, problems = {}, []
    for i, compression in enumerate(compressions):
        env = check.env(FRAMEWORK="pytorch", TRAIN_MODE="local", ENTRYPOINT=WORKLOADS / "grad_steps.py",
                        CHECKPOINT_DIR=check.work / "checkpoints-grad", GRAD_COMPRESSION=compression,
                        POWERSGD_WARMUP=2)
        code, out, _ = check.command(f"gradients {compression}", entrypoint("--warmup", "3", "--steps", "20"), env,
                                     check.remaining() / (len(compressions) - i))
        found = re.search(r"GRADSTEPS rank=0 params=\d+ per_batch=([\d.]+) \S+ loss0=([\d.]+) loss=([\d.]+)", out)
        said = "disttrain: gradients: " in out
        if code != 0 or not found or (compression != "none") != said:
            problems.append(f"{compression}: exit {code}" + ("" if found else ", no GRADSTEPS line")
                            + ("" if (compression != "none") == said else f", said {said}") + f": {tail(out, 2)}")
            continue
        rows[compression] = dict(seconds=float(found[1]), loss0=float(found[2]), loss=float(found[3]))
    check.results["gradients"] = rows
    if "none" in rows:
        base = rows["none"]
        for name, row in rows.items():
            row.update(ratio=row["seconds"] / base["seconds"], loss_ratio=row["loss"] / base["loss"])
            if name in ("fp16", "bf16") and abs(row["loss_ratio"] - 1) > GRADIENT_GOAL:
                problems.append(f"{name}: final loss {row['loss']:.4f}, {row['loss_ratio']:.3f}x none's")
    text = ", ".join(f"{k} {v['seconds'] * 1e3:.1f} ms/batch loss {v['loss']:.4f}"
                     + (f" ({v['ratio']:.2f}x, loss {v['loss_ratio']:.3f}x)" if "ratio" in v else "")
                     for k, v in rows.items())
    return not problems, f"{check.nproc} process(es): " + (text or "no run") + ("; " + "; ".join(problems) if problems else "")


# --------------------------------------------------------------------------- 7. budget

def step_budget(check: Check) -> tuple[bool, str]:
    total, budget = time.monotonic() - check.started, BUDGET_S * check.scale
    over = total > budget
    text = f"{total:.0f}s end to end, budget {budget:.0f}s"
    text += f" ({BUDGET_S}s x {check.scale:g}, rehearsal on {check.facts['cpus']} cores)" if check.scale != 1 else ""
    if check.timed_out:
        text += f"; hit its time limit: {', '.join(check.timed_out)}"
    return not over and not check.timed_out, text


STEPS = (
    Step(1, "build", f"Horovod {HOROVOD} from its sdist, patched, HOROVOD_GPU_OPERATIONS=NCCL", 210, step_build),
    Step(2, "check-build", "horovodrun --check-build lists NCCL", 30, step_check_build),
    Step(3, "train", "entrypoint on the GPU: torchrun (NCCL) and LAUNCHER=horovod, cuda:0, loss down, exit 0",
         100, step_train),
    Step(4, "preflight", "the entrypoint's preflight on this host: GPU count, /dev/shm, NIC choice", 40,
         step_preflight),
    Step(5, "allreduce", "256 MB allreduces through Horovod and torch.distributed (NCCL), timed", 60, step_allreduce),
    Step(6, "gradients", "GRAD_COMPRESSION none, fp16, powersgd, bf16 on NCCL: time per batch, final loss within 2 %",
         40, step_gradients),
    Step(7, "budget", "within 8 minutes end to end, a time limit on each step", 0, step_budget),
)


# --------------------------------------------------------------------------- prepare

def prepare(dist: Path) -> int:
    """Fetch what the offline GPU host needs into dist: the Horovod sdist, cffi/pycparser
    wheels for its Python and this one, and Debian's `patch` package in case it has none."""
    dist.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dist)]
    subprocess.run(pip + ["--no-binary", ":all:", f"horovod=={HOROVOD}"], check=True, timeout=600)
    for version in sorted({GPU_HOST_PYTHON, platform.python_version().rsplit(".", 1)[0]}):
        subprocess.run(pip + ["--only-binary", ":all:", "--python-version", version, "--implementation", "cp",
                              *[a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                                for a in ("--platform", p)], *BUILD_WHEELS], check=True, timeout=600)
    if shutil.which("apt-get") and not list(dist.glob("patch_*.deb")):
        got = subprocess.run(["apt-get", "download", "patch"], cwd=dist, capture_output=True, text=True, timeout=300)
        if got.returncode != 0:
            print(f"gpu_check: could not download Debian's patch package ({tail(got.stderr, 1)}); "
                  f"the GPU host must have `patch`", file=sys.stderr)
    for path in sorted(dist.iterdir()):
        print(f"{path.stat().st_size:>10}  {path}")
    return 0


# --------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--rehearse", action="store_true", help="no GPU: every step on the CPU, expecting device cpu")
    mode.add_argument("--prepare", action="store_true", help="download the sdist and wheels into --dist, then exit")
    mode.add_argument("--list", action="store_true", help="print the steps and exit")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "out"),
                   help="folder for gpu_check.json and gpu_check.log (default: $OUT, else bench/out)")
    p.add_argument("--work", default=str(ROOT / ".gpucheck" / "work"), help="build folder (kept for reruns)")
    p.add_argument("--dist", default=str(ROOT / ".gpucheck" / "dist"), help="--prepare's downloads")
    p.add_argument("--cc-list", help="HOROVOD_BUILD_CUDA_CC_LIST, e.g. 90 or 80,90 (default: nvidia-smi's; "
                                     f"{REHEARSAL_CC} in rehearsal)")
    p.add_argument("--time-scale", type=float, help="multiply every time limit (default 1; in rehearsal "
                                                    f"{GPU_HOST_CPUS} / this machine's cores)")
    p.add_argument("--rebuild", action="store_true", help="build even if a wheel with the same build key exists")
    args = p.parse_args(argv)
    if args.cc_list is not None and not re.fullmatch(r"\d{2,3}(,\d{2,3})*", args.cc_list):
        p.exit(2, f"gpu_check: --cc-list={args.cc_list!r}: allowed: compute capabilities without the dot, "
                  f"comma-separated, e.g. 90 or 80,90\n")
    if args.time_scale is not None and args.time_scale <= 0:
        p.exit(2, f"gpu_check: --time-scale={args.time_scale}: allowed: a number > 0\n")
    return args


def verdict_line(step: Step, ok: bool, seconds: float, limit: float, text: str) -> str:
    limit_text = f"/{limit:.0f}s" if step.limit_s else ""
    return f"VERDICT {step.number} {step.name}: {'PASS' if ok else 'FAIL'} {seconds:.1f}s{limit_text} - {text}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for s in STEPS:
            print(f"{s.number} {s.name:<12} {f'{s.limit_s}s' if s.limit_s else '-':>5}  {s.goal}")
        print(f"  {'total':<12} {f'{BUDGET_S}s':>5}  the budget every step's time limit is also cut to")
        return 0
    if args.prepare:
        return prepare(Path(args.dist))
    scale = args.time_scale or (max(1.0, GPU_HOST_CPUS / (os.cpu_count() or 1)) if args.rehearse else 1.0)
    check = Check(rehearse=args.rehearse, scale=scale, work=Path(args.work), dist=Path(args.dist), out=Path(args.out),
                  cc_list=args.cc_list, rebuild=args.rebuild)
    check.out.mkdir(parents=True, exist_ok=True)
    check.work.mkdir(parents=True, exist_ok=True)
    (check.out / "gpu_check.log").write_text("")
    check.facts = host_facts(check)
    check.results.update(facts=check.facts, budget_s=BUDGET_S * scale, steps=[])
    f = check.facts
    print(f"HOST {f['mode']}: {f['gpus']} GPU(s) {' '.join(g['name'] + ' cc' + g['compute_cap'] for g in f['gpu_list'])}"
          f"{' driver ' + f['gpu_list'][0]['driver'] if f['gpu_list'] else ''}; Python {f['python']}, "
          f"torch {f.get('torch')} (CUDA {f.get('torch_cuda')}, available {f.get('cuda_available')}), "
          f"NCCL {f.get('nccl')}, nvcc {f['nvcc_version']}, cmake {f['cmake']}, g++ {f['gxx']}, "
          f"{f['cpus']} CPUs, /dev/shm {f['dev_shm_mib']} MiB", flush=True)
    if not args.rehearse and not (f["gpus"] and f.get("cuda_available")):
        check.save()
        print(f"gpu_check: no usable GPU (nvidia-smi: {f['gpus']}, torch.cuda.is_available(): "
              f"{f.get('cuda_available')}); on a machine without one, run --rehearse", file=sys.stderr)
        return 2
    lines = []
    for step in STEPS:
        limit = step.limit_s * scale
        check.step_deadline = min(time.monotonic() + limit, check.started + BUDGET_S * scale) if limit else 0
        began = time.monotonic()
        print(f"== {step.number} {step.name}: {step.goal}", flush=True)
        try:
            if limit and check.step_deadline - began < 5:
                ok, text = False, "not run: the 8-minute budget is spent"
            else:
                ok, text = step.run(check)
        except Exception as exc:          # a step's own bug must not stop the others
            ok, text = False, f"error: {type(exc).__name__}: {exc}"
            with open(check.out / "gpu_check.log", "a") as log:
                log.write(traceback.format_exc())
        seconds = time.monotonic() - began
        line = verdict_line(step, ok, seconds, limit, text)
        lines.append(line)
        print(line, flush=True)
        check.results["steps"].append({"step": step.number, "name": step.name, "ok": ok, "seconds": round(seconds, 1),
                                       "limit_s": round(limit), "verdict": text})
        check.save()
    passed = sum("PASS" in line.split(" - ")[0] for line in lines)
    print(f"\n== summary ({passed}/{len(STEPS)} passed; results: {check.out / 'gpu_check.json'})", flush=True)
    for line in lines:
        print(line)
    return 0 if passed == len(STEPS) else 1


if __name__ == "__main__":
    sys.exit(main())
