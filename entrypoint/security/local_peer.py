"""Who is at the other end of a loopback connection: the uid that owns the connecting
socket, as the kernel knows it (its socket diagnostics over netlink, else its table of the
network namespace's TCP sockets, /proc/net/tcp).

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
# The kernel's socket diagnostics (netlink's NETLINK_SOCK_DIAG, linux/inet_diag.h): one
# exact lookup by the connection's four addresses answers in microseconds, where reading
# /proc/net/tcp costs milliseconds once thousands of closed connections wait there (a
# Horovod worker's 10 ms polls leave that many).
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, NLMSG_ERROR = 4, 20, 1, 2
NO_COOKIE = 0xFFFFFFFF
_NLMSGHDR = struct.Struct("=IHHII")
_REQUEST = struct.Struct("=BBBBI")                     # family, protocol, ext, pad, states
_SOCKID = struct.Struct("!HH16s16s")                   # ports and addresses, network order
_TAIL = struct.Struct("=III")                          # interface, cookie (two words)
_MESSAGE = struct.Struct("=BBBB48sIIIII")              # ..., id, expires, rqueue, wqueue, uid, inode


def _diag_owner(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid of the TCP socket at `peer` connected to `local`, by netlink; None when
    there is no such socket; OSError where sock_diag is not offered."""
    sockid = _SOCKID.pack(peer[1], local[1], socket.inet_aton(peer[0]).ljust(16, b"\0"),
                          socket.inet_aton(local[0]).ljust(16, b"\0"))
    body = _REQUEST.pack(socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid + \
        _TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body)
        answer = nl.recv(8192)
    _, kind, _, _, _ = _NLMSGHDR.unpack_from(answer)
    if kind == NLMSG_ERROR:
        errno = -struct.unpack_from("=i", answer, _NLMSGHDR.size)[0]
        if errno == 2:                                  # ENOENT: no such socket
            return None
        raise OSError(errno, "sock_diag")
    return _MESSAGE.unpack_from(answer, _NLMSGHDR.size)[8]


def _hex_endpoint(host: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it: the address's bytes as a little-endian
    word (127.0.0.1 is 0100007F), then the port, in upper-case hex."""
    word = struct.unpack("<I", socket.inet_aton(host))[0]
    return f"{word:08X}:{port:04X}"


def _table_owner(peer: tuple[str, int], local: tuple[str, int], table: str = TCP_TABLE) -> int | None:
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


def socket_owner(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the socket at `peer` that is connected to `local` (both IPv4 on this
    host): the kernel's answer by netlink, else its table; None when neither shows it."""
    try:
        return _diag_owner(peer, local)
    except OSError:
        return _table_owner(peer, local)
