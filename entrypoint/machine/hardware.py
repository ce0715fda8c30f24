"""Facts about this machine: GPUs, TPUs, CPUs, /dev/shm, network. The only place that looks.

`Hardware` is what the planner is told; `choose_interface` and `choose_address` are pure
(they take the interface table and a resolver); `locate` gathers those facts and calls
them; the rest reads the machine. The TPU readers take the root of /sys and /dev, so tests
hand them a tree as data.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass
from typing import Callable

BRIDGE_IFACES = ("docker0",)


@dataclass(frozen=True)
class Hardware:
    gpus: int
    cpus: int
    shm_bytes: int | None = None
    tpu_chips: int = 0                       # Google TPU chips on the PCI bus
    tpu_kind: str | None = None              # their generation: v4, v5e, ...
    tpu_devices: tuple[str, ...] = ()        # their device files this container can open
    nvidia_driver: str | None = None         # the NVIDIA driver's version (driver.py), when one is loaded

    def tpu_text(self) -> str:
        if not self.tpu_chips:
            return "no TPU"
        files = f"{self.tpu_devices[0]}..{self.tpu_devices[-1]}" if len(self.tpu_devices) > 1 else \
            (self.tpu_devices[0] if self.tpu_devices else "no device files")
        return f"{self.tpu_chips} TPU {self.tpu_kind} chip(s) ({files})"


def gpu_count(env: dict[str, str]) -> int:
    """Visible NVIDIA GPUs: CUDA_VISIBLE_DEVICES if set, else nvidia-smi, else /dev/nvidiaN."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip() and e.strip() != "-1"]
        return 0 if visible.strip() in ("", "-1", "NoDevFiles") else len(entries)
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
            return sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            return 0
    try:
        return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


# --------------------------------------------------------------------------- TPUs
# A Cloud TPU VM's chips are PCI functions of Google's vendor id; the device ids are the
# ones torch_xla (torch_xla/_internal/tpu.py) and JAX (jax/_src/hardware_utils.py) read.
# /sys is visible in every container; the chips' device files are not: libtpu opens
# /dev/accelN (TPU v2-v4, v5p) or /dev/vfio/N (v5e, v6e), which a container sees only when
# started with --privileged (or --device).
GOOGLE_PCI_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = {"0x0027": "v2/v3", "0x0056": "plc", "0x005e": "v4", "0x0062": "v5p", "0x0063": "v5e",
                   "0x006f": "v6e", "0x0076": "tpu7x"}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def tpu_chips(sys_root: str = "/sys") -> tuple[int, str | None]:
    """(number of TPU chips on the PCI bus, their generation) from sysfs."""
    count, kind = 0, None
    for vendor in sorted(glob.glob(os.path.join(sys_root, "bus/pci/devices/*/vendor"))):
        if _read(vendor) != GOOGLE_PCI_VENDOR:
            continue
        device = _read(os.path.join(os.path.dirname(vendor), "device"))
        if device in TPU_PCI_DEVICES:
            count, kind = count + 1, TPU_PCI_DEVICES[device]
    return count, kind


def tpu_device_files(dev_root: str = "/dev") -> tuple[str, ...]:
    """The TPU device files this container can open: /dev/accelN and /dev/vfio/N."""
    found = glob.glob(os.path.join(dev_root, "accel*")) + glob.glob(os.path.join(dev_root, "vfio", "*"))
    names = [f for f in found if re.fullmatch(r"accel\d+|\d+", os.path.basename(f))]
    return tuple(sorted(names, key=lambda f: (os.path.dirname(f), int(re.sub(r"\D", "", os.path.basename(f))))))


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
        return stat.f_frsize * stat.f_blocks
    except OSError:
        return None


def detect(env: dict[str, str], sys_root: str = "/sys", dev_root: str = "/dev",
           proc_root: str = "/proc") -> Hardware:
    from .nvidia_driver import parse_driver

    chips, kind = tpu_chips(sys_root)
    return Hardware(gpus=gpu_count(env), cpus=cpu_count(), shm_bytes=shm_bytes(), tpu_chips=chips,
                    tpu_kind=kind, tpu_devices=tpu_device_files(dev_root) if chips else (),
                    nvidia_driver=parse_driver(_read(os.path.join(proc_root, "driver/nvidia/version"))))


# --------------------------------------------------------------------------- network

def resolve(host: str) -> str | None:
    """The IPv4 address of host, or None if it does not resolve (yet)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    return infos[0][4][0] if infos else None


def route_source(ip: str) -> str:
    """The local address the kernel would send from to reach ip (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        return s.getsockname()[0]


def interfaces() -> dict[str, list[str]]:
    """Interface name -> its IPv4 addresses."""
    import psutil

    return {name: [a.address for a in addrs if a.family == socket.AF_INET]
            for name, addrs in psutil.net_if_addrs().items()}


def check_interface(wanted: str | None, table: dict[str, list[str]] | None = None) -> None:
    """NET_IFNAME names an interface of this machine (LookupError, one line, if not)."""
    table = interfaces() if table is None else table
    if wanted and wanted not in table:
        raise LookupError(f"NET_IFNAME={wanted!r}: no such interface; allowed: {', '.join(sorted(table))}")


def choose_interface(master_ip: str, source_ip: str, table: dict[str, list[str]],
                     wanted: str | None) -> tuple[str | None, list[str]]:
    """Pick the interface for NCCL/Gloo/Horovod traffic. Pure. Returns (name, warnings)."""
    warnings = []
    if wanted:
        check_interface(wanted, table)
        return wanted, warnings
    name = next((n for n, ips in table.items() if source_ip in ips), None)
    remote = not ipaddress.ip_address(master_ip).is_loopback and not any(master_ip in ips for ips in table.values())
    if name == "lo" and remote:
        warnings.append(f"the route to MASTER_ADDR ({master_ip}) leaves through 'lo'; other hosts cannot "
                        f"reach this node there: set NET_IFNAME")
    if name in BRIDGE_IFACES and remote:
        warnings.append(f"the route to MASTER_ADDR ({master_ip}) leaves through {name!r}, a local Docker "
                        f"bridge that other hosts cannot reach: run with --network host or set NET_IFNAME")
    if name is None:
        warnings.append(f"no interface holds {source_ip}, the address that routes to MASTER_ADDR; "
                        f"NCCL/Gloo will choose their own")
    return name, warnings


@dataclass(frozen=True)
class Location:
    """Where the other nodes reach this one, and the interface its collectives use."""
    addr: str
    iface: str | None
    warnings: tuple[str, ...] = ()


def choose_address(*, master: bool, master_addr: str, node_addr: str | None, numeric: bool, source_ip: str,
                   resolve: Callable[[str], str | None]) -> str:
    """The address this node publishes. Pure. NODE_ADDR if given; the master keeps the name
    the workers already reach it by; a worker, the local address that routes to the master.
    `numeric`: publish an IP (MXNet's ps-lite binds to the address it is given)."""
    addr = node_addr or (master_addr if master and not numeric else source_ip)
    return (resolve(addr) or addr) if numeric else addr


def locate(master_ip: str, master_addr: str, node_addr: str | None, net_ifname: str | None, master: bool,
           numeric: bool) -> Location:
    """This node's Location, from the machine's routes and interfaces (master_ip: MASTER_ADDR
    resolved). Raises LookupError when NET_IFNAME names no interface."""
    source_ip = route_source(master_ip)
    iface, warnings = choose_interface(master_ip, source_ip, interfaces(), net_ifname)
    addr = choose_address(master=master, master_addr=master_addr, node_addr=node_addr, numeric=numeric,
                          source_ip=source_ip, resolve=resolve)
    return Location(addr, iface, tuple(warnings))


def node_ports(count: int, base: int | None) -> tuple[int, ...]:
    """The ports this node publishes: WORKER_PORT_BASE and the next ones, else free ones."""
    return tuple(range(base, base + count)) if base else tuple(free_ports(count))


def free_ports(count: int, host: str = "0.0.0.0") -> list[int]:
    """`count` distinct ports that are free now (the OS picks them)."""
    sockets, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports
