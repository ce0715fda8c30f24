"""Smoke tests inside a built image, as its runtime user (`build.py test`).

Parsing and expectations are pure functions; `SmokeRunner` runs containers through the
Docker SDK. Every check runs the real thing in the image: imports, `horovodrun
--check-build`, 2-process allreduces over gloo and MPI, the size budget, and one copy of
each shared library across all of the image's layers (read from `docker save`).
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .matrix import Variant
from .render import TCMALLOC_LIBRARY, manifest

SCRIPTS = Path(__file__).resolve().parent / "smoke_scripts"
RESULT_RE = re.compile(r"RESULT (\w+) rank=(\d+) size=(\d+) sum=(\[.*?\])")
CHECK_RE = re.compile(r"\[(X| )\] (\w+)")
# libfoo.so, libfoo.so.12, libcupti.so.2025.1.0 (and Python extension modules, which have no soname)
SHARED_OBJECT_RE = re.compile(r"\.so(\.\d+)*$")
SAVE_TIMEOUT_S = 1800          # `docker save` of a CUDA image: minutes before the first byte
CHECK_BUILD_NAMES = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "mxnet": "MXNet", "gloo": "Gloo",
                     "mpi": "MPI", "nccl": "NCCL"}


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


# --------------------------------------------------------------------------- pure

def expected_sum(size: int, width: int) -> list[float]:
    """Allreduce (sum) of [rank + 1] * width over `size` ranks."""
    return [float(size * (size + 1) // 2)] * width


def parse_results(output: str) -> list[tuple[str, int, int, list[float]]]:
    return [(m.group(1), int(m.group(2)), int(m.group(3)), json.loads(m.group(4)))
            for m in RESULT_RE.finditer(output)]


def check_allreduce(output: str, tag: str, size: int, width: int) -> tuple[bool, str]:
    results = [r for r in parse_results(output) if r[0] == tag]
    expected = expected_sum(size, width)
    ranks = sorted(r[1] for r in results)
    if ranks != list(range(size)):
        return False, f"expected ranks 0..{size - 1} to report, got {ranks}"
    wrong = [r for r in results if r[2] != size or r[3] != expected]
    if wrong:
        return False, f"expected size={size} sum={expected}, got {wrong}"
    return True, f"{size} ranks, sum={expected}"


def parse_check_build(output: str) -> dict[str, set[str]]:
    """horovodrun --check-build output -> {'frameworks'|'controllers'|'operations': {'PyTorch', ...}}."""
    sections = {"Available Frameworks": "frameworks", "Available Controllers": "controllers",
                "Available Tensor Operations": "operations"}
    result: dict[str, set[str]] = {name: set() for name in sections.values()}
    current = None
    for line in output.splitlines():
        stripped = line.strip().rstrip(":")
        if stripped in sections:
            current = sections[stripped]
            continue
        match = CHECK_RE.search(line)
        if current and match and match.group(1) == "X":
            result[current].add(match.group(2))
    return result


def expected_check_build(v: Variant) -> dict[str, set[str]]:
    hvd = manifest(v)["horovod"]
    return {
        "frameworks": {CHECK_BUILD_NAMES[f] for f in hvd["frameworks"]},
        "controllers": {CHECK_BUILD_NAMES[c] for c in hvd["controllers"]},
        "operations": {CHECK_BUILD_NAMES[o] for o in hvd["tensor_operations"]},
    }


def compare_check_build(output: str, v: Variant) -> tuple[bool, str]:
    found, expected = parse_check_build(output), expected_check_build(v)
    missing = {k: sorted(expected[k] - found[k]) for k in expected if expected[k] - found[k]}
    if missing:
        return False, f"missing from --check-build: {missing}; found {({k: sorted(s) for k, s in found.items()})}"
    return True, "; ".join(f"{k}: {', '.join(sorted(found[k]))}" for k in ("frameworks", "controllers", "operations"))


def compare_versions(output: str, v: Variant) -> tuple[bool, str]:
    match = re.search(r"VERSIONS (\{.*\})", output)
    if not match:
        return False, "no VERSIONS line in output"
    found = json.loads(match.group(1))
    promised = manifest(v)["versions"]
    pairs = {"torch": "torch", "torchvision": "torchvision", "torchaudio": "torchaudio", "tensorflow": "tensorflow",
             "mxnet": "mxnet", "horovod": "horovod", "mpi4py": "mpi4py", "torch_xla": "torch_xla", "libtpu": "libtpu"}
    def same(installed: str | None, wanted: str) -> bool:
        # PyPI's CUDA torch reports '2.6.0+cu124' for the '2.6.0' the matrix asks for.
        return installed == wanted or ("+" not in wanted and str(installed).startswith(wanted + "+"))

    wrong = {name: (found.get(module), promised[name]) for name, module in pairs.items()
             if name in promised and not same(found.get(module), promised[name])}
    if wrong:
        return False, f"installed != promised: {wrong}"
    return True, ", ".join(f"{k} {val}" for k, val in sorted(found.items()))


def check_xla_reduction(output: str, devices: int, width: int) -> tuple[bool, str]:
    """xla_cpu.py's line: the SPMD sum over `devices` XLA CPU devices of rows [d + 1] * width."""
    match = re.search(r"RESULT xla devices=(\d+) sharding=(\S+) sum=(\[.*?\])", output)
    if not match:
        return False, "no 'RESULT xla' line in output"
    found, sharding, total = int(match.group(1)), match.group(2), json.loads(match.group(3))
    expected = expected_sum(devices, width)
    if found != devices or total != expected:
        return False, f"expected devices={devices} sum={expected}, got devices={found} sum={total}"
    return True, f"{devices} XLA CPU devices, sharding {sharding}, sum={expected}"


def largest_layers(history: list[dict], count: int = 5) -> list[str]:
    layers = sorted(history, key=lambda layer: layer.get("Size", 0), reverse=True)[:count]
    return [f"{layer['Size'] / 1e9:.2f} GB  {layer.get('CreatedBy', '')[:110]}" for layer in layers]


def check_size(size_bytes: int, budget_gb: float, history: list[dict]) -> tuple[bool, str]:
    size_gb = size_bytes / 1e9
    if size_gb <= budget_gb:
        return True, f"{size_gb:.2f} GB <= budget {budget_gb} GB"
    return False, (f"{size_gb:.2f} GB > budget {budget_gb} GB; largest layers:\n    "
                   + "\n    ".join(largest_layers(history)))


@dataclass(frozen=True)
class SharedObject:
    """One shared library file in one layer of an image."""
    layer: str          # the layer's name in the `docker save` archive
    path: str           # its path in that layer
    soname: str         # DT_SONAME: the name the dynamic loader finds it by
    size: int           # bytes


def elf_soname(data: bytes) -> str | None:
    """The DT_SONAME of an ELF shared object, or None (not ELF, not a shared object, no soname)."""
    try:
        elf = ELFFile(io.BytesIO(data))
        if elf.header.e_type != "ET_DYN":
            return None
        for segment in elf.iter_segments():
            if segment.header.p_type == "PT_DYNAMIC":
                for tag in segment.iter_tags("DT_SONAME"):
                    return tag.soname
    except (ELFError, ValueError, KeyError):
        return None
    return None


def layer_shared_objects(save: io.RawIOBase | io.BufferedIOBase) -> Iterator[SharedObject]:
    """Every shared library with a soname in every layer of a `docker save` stream (the
    legacy `<id>/layer.tar` layout or the OCI `blobs/sha256/...` one), read front to back
    once. Files a later layer shadows or deletes are still listed: they still take space.
    Symbolic and hard links are not files of their own and are skipped."""
    with tarfile.open(fileobj=save, mode="r|") as archive:
        for member in archive:
            if not member.isfile() or not (member.name.endswith("layer.tar") or member.name.startswith("blobs/")):
                continue
            try:
                layer = tarfile.open(fileobj=archive.extractfile(member), mode="r|*")
            except tarfile.TarError:
                continue                      # a config or manifest blob, not a layer
            with layer:
                for entry in layer:
                    if entry.isfile() and SHARED_OBJECT_RE.search(entry.name):
                        soname = elf_soname(layer.extractfile(entry).read())
                        if soname:
                            yield SharedObject(member.name, entry.name, soname, entry.size)


def duplicate_sonames(objects: Iterable[SharedObject]) -> dict[str, list[SharedObject]]:
    """soname -> its files, for every soname stored more than once, largest waste first."""
    by_soname: dict[str, list[SharedObject]] = defaultdict(list)
    for obj in objects:
        by_soname[obj.soname].append(obj)
    duplicates = {name: files for name, files in by_soname.items() if len(files) > 1}
    return dict(sorted(duplicates.items(), key=lambda kv: (-_extra_bytes(kv[1]), kv[0])))


def _extra_bytes(files: list[SharedObject]) -> int:
    return sum(f.size for f in files) - max(f.size for f in files)


# Second copies of a library kept on purpose: a folder (part of a path) and why. Its files
# are left out of the count, and the check's line says so.
KEPT_ON_PURPOSE = {
    "triton/backends/nvidia/lib/cupti-blackwell/":
        "Triton's profiler loads this newer CUPTI on Blackwell GPUs (compute capability >= 10.0) "
        "instead of the variant's (triton.profiler.profile: arch >= 100)",
}


def kept_on_purpose(obj: SharedObject) -> str | None:
    return next((folder for folder in KEPT_ON_PURPOSE if folder in obj.path), None)


def check_duplicates(objects: list[SharedObject], shown: int = 12) -> tuple[bool, str]:
    folders = {o: kept_on_purpose(o) for o in objects}
    kept = [o for o in objects if folders[o]]
    objects = [o for o in objects if not folders[o]]
    layers = len({o.layer for o in objects})
    duplicates = duplicate_sonames(objects)
    if not duplicates:
        also = (f"; kept on purpose: {len(kept)} in " + ", ".join(sorted({folders[o] for o in kept}))
                if kept else "")
        return True, f"{len(objects)} shared libraries (in {layers} of the layers), each soname once{also}"
    extra = sum(_extra_bytes(files) for files in duplicates.values())
    lines = [f"{name}: {len(files)} files, {_extra_bytes(files) / 1e6:.1f} MB extra: "
             + ", ".join(f"{f.path} (layer {_layer_id(f.layer)})" for f in files)
             for name, files in list(duplicates.items())[:shown]]
    more = f"\n    ... and {len(duplicates) - shown} more" if len(duplicates) > shown else ""
    return False, (f"{len(duplicates)} sonames stored more than once across {layers} layers "
                   f"({extra / 1e6:.0f} MB extra):\n    " + "\n    ".join(lines) + more)


def _layer_id(name: str) -> str:
    """'abc123.../layer.tar' or 'blobs/sha256/abc123...' -> 'abc123abc123' (12 characters)."""
    parts = name.split("/")
    return (parts[-2] if name.endswith("layer.tar") else parts[-1])[:12]


# --------------------------------------------------------------------------- executing

class SmokeRunner:
    """Runs commands in throwaway containers of one image, as the image's own USER."""

    def __init__(self, image: str, timeout: int = 300):
        import docker

        self.client = docker.from_env()
        self.image = image
        self.timeout = timeout

    def run(self, command: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        container = self.client.containers.run(
            self.image, command=command, entrypoint=["tini", "-g", "--"], environment=env or {},
            volumes={str(SCRIPTS): {"bind": "/smoke", "mode": "ro"}}, detach=True, shm_size="512m")
        try:
            status = container.wait(timeout=self.timeout)
            output = container.logs(stdout=True, stderr=True).decode(errors="replace")
            return status["StatusCode"], output
        finally:
            container.remove(force=True)

    def image_info(self) -> tuple[int, list[dict]]:
        image = self.client.images.get(self.image)
        return image.attrs["Size"], image.history()

    def left_out(self) -> list[str]:
        """The companions this image was built without (its io.disttrain.without label)."""
        label = self.client.images.get(self.image).labels.get("io.disttrain.without", "")
        return [name for name in label.split(",") if name]

    def shared_objects(self) -> list[SharedObject]:
        """Every shared library in every layer, streamed from the engine's `docker save`."""
        import docker

        # The engine sends nothing until it has prepared the archive: for the 8 GB CUDA
        # images that took longer than the SDK's default 60 s read timeout.
        client = docker.from_env(timeout=SAVE_TIMEOUT_S)
        chunks = client.images.get(self.image).save(named=False)
        return list(layer_shared_objects(io.BufferedReader(_ChunkStream(chunks), buffer_size=1 << 20)))


class _ChunkStream(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (the SDK's `image.save()`)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def _result(name: str, code: int, output: str, verdict: tuple[bool, str]) -> CheckResult:
    ok, detail = verdict
    if code != 0:
        ok, detail = False, f"exit code {code}\n" + "\n".join(output.splitlines()[-25:])
    return CheckResult(name, ok, detail)


MAPPED = "print('mapped' if any('{name}' in line for line in open('/proc/self/maps')) else 'not mapped')"


def run_smoke_tests(image: str, v: Variant, shared_objects: list[SharedObject] | None = None) -> list[CheckResult]:
    """Every check for the variant, in throwaway containers of `image`. `shared_objects`:
    the image's, where the caller has read its layers already (one `docker save` is a
    minute for the cpu image)."""
    runner = SmokeRunner(image)
    v = v.leaving_out(runner.left_out())       # expect what this build says it carries
    results = []

    code, output = runner.run(["sh", "-c", "id -u; for c in gcc cc g++ nvcc cmake; do command -v $c; done; true"])
    uid = output.split()[0] if output.split() else "?"
    compilers = output.split()[1:]
    results.append(CheckResult("runtime user, no compilers", code == 0 and uid != "0" and not compilers,
                               f"uid {uid}; compilers found: {compilers or 'none'}"))

    code, output = runner.run(["python3", "/smoke/imports.py"])
    results.append(_result("frameworks import", code, output, compare_versions(output, v)))

    if v.horovod:
        code, output = runner.run(["horovodrun", "--check-build"])
        results.append(_result("horovodrun --check-build", code, output, compare_check_build(output, v)))
        for framework in v.horovod.frameworks:
            code, output = runner.run(["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
                                       "python3", "/smoke/hvd_allreduce.py", framework])
            results.append(_result(f"horovod {framework} allreduce (gloo, 2 processes)", code, output,
                                   check_allreduce(output, framework, 2, 4)))

    if v.pytorch:
        code, output = runner.run(["torchrun", "--standalone", "--nproc-per-node", "2",
                                   "/smoke/torch_allreduce.py"])
        results.append(_result("torch.distributed gloo allreduce (2 processes)", code, output,
                               check_allreduce(output, "torch", 2, 4)))

    if v.xla:
        code, output = runner.run(["python3", "/smoke/xla_cpu.py"], env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"})
        results.append(_result("torch-xla SPMD reduction (XLA CPU client, 2 devices)", code, output,
                               check_xla_reduction(output, 2, 4)))

    if v.mxnet:
        code, output = runner.run(["python3", "/smoke/mx_kvstore.py"])
        results.append(_result("mxnet kvstore dist_sync (scheduler, server, 2 workers)", code, output,
                               check_allreduce(output, "kvstore", 2, 4)))

    # MEMORY_ALLOCATOR=tcmalloc preloads this library by its name: the dynamic linker finds it.
    code, output = runner.run(["python3", "-c", MAPPED.format(name="libtcmalloc_minimal")],
                              env={"LD_PRELOAD": TCMALLOC_LIBRARY})
    results.append(_result(f"{TCMALLOC_LIBRARY} preloads (MEMORY_ALLOCATOR=tcmalloc)", code, output,
                           (output.strip().splitlines()[-1:] == ["mapped"], output.strip()[-300:])))

    if v.mpi4py:
        code, output = runner.run(["mpirun", "-np", "2", "python3", "/smoke/mpi_allreduce.py"])
        results.append(_result("mpi4py allreduce (Open MPI, 2 processes)", code, output,
                               check_allreduce(output, "mpi", 2, 1)))

    size, history = runner.image_info()
    ok, detail = check_size(size, v.size_budget_gb, history)
    results.append(CheckResult("image size within budget", ok, detail))

    ok, detail = check_duplicates(runner.shared_objects() if shared_objects is None else shared_objects)
    results.append(CheckResult("each shared library once across all layers (by soname)", ok, detail))
    return results
