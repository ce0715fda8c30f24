"""Facts about this machine: GPUs, CPUs, /dev/shm, network. The only place that looks.

`choose_interface` is pure (it takes the interface table); the rest reads the machine.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess

from .plan import Hardware

BRIDGE_IFACES = ("docker0",)


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


def detect(env: dict[str, str]) -> Hardware:
    return Hardware(gpus=gpu_count(env), cpus=cpu_count(), shm_bytes=shm_bytes())


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


def choose_interface(master_ip: str, source_ip: str, table: dict[str, list[str]],
                     wanted: str | None) -> tuple[str | None, list[str]]:
    """Pick the interface for NCCL/Gloo/Horovod traffic. Pure. Returns (name, warnings)."""
    warnings = []
    if wanted:
        if wanted not in table:
            raise LookupError(f"NET_IFNAME={wanted!r}: no such interface; allowed: {', '.join(sorted(table))}")
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
