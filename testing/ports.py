"""Ports for the nodes a test or a benchmark starts on this machine."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_PICKER = random.Random()
_HANDED_OUT: set[int] = set()


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port that is free now and stays free until a node binds it: one below the kernel's
    ephemeral range, which is where every port-0 bind (a node's loopback stores and tunnels)
    and every outgoing connection's own port come from, so none of them can take it in the
    seconds before the node that was given it starts serving. Never the same port twice."""
    low = ephemeral_low()
    for _ in range(200):
        port = _PICKER.randrange(10000, low) if low > 11000 else 0
        try:
            with socket.socket() as s:
                s.bind(("0.0.0.0", port))
                port = s.getsockname()[1]
        except OSError:
            continue
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port below the ephemeral range")
