"""Who is at the other end of a loopback connection: the uid that owns the connecting
socket, from the kernel's table of the network namespace's TCP sockets (/proc/net/tcp).

A node's Tunnels (tunnel.py) listen on 127.0.0.1 and carry what they accept to the master
with the job's identity. Any process in the node's network namespace can connect there: the
entrypoint's own processes, and also another user's, or another container's that shares the
namespace (a pod's sidecar, a `--network host` neighbour). The Tunnels take a connection
only from a socket of the entrypoint's own uid; the kernel's table says whose it is, so no
client has to present anything (torch's TCPStore could not). A process of the same uid in
the same namespace still gets in: the uid is the boundary, as for /proc.
"""

from __future__ import annotations

import socket
import struct

TCP_TABLE = "/proc/net/tcp"


def _hex_endpoint(host: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it: the address's bytes as a little-endian
    word (127.0.0.1 is 0100007F), then the port, in upper-case hex."""
    word = struct.unpack("<I", socket.inet_aton(host))[0]
    return f"{word:08X}:{port:04X}"


def socket_owner(peer: tuple[str, int], local: tuple[str, int], table: str = TCP_TABLE) -> int | None:
    """The uid owning the socket at `peer` that is connected to `local` (both IPv4 on this
    host); None when the table has no such socket (or cannot be read)."""
    want_local, want_remote = _hex_endpoint(*peer), _hex_endpoint(*local)
    try:
        with open(table) as rows:
            next(rows, None)                                  # the header
            for row in rows:
                fields = row.split()
                if len(fields) > 7 and fields[1] == want_local and fields[2] == want_remote:
                    return int(fields[7])
    except OSError:
        return None
    return None
