"""Kernel receive timestamps (SO_TIMESTAMPNS) for UDP sockets; shared by server and client."""

from __future__ import annotations

import socket
import struct
import sys

__all__ = ["CMSG_SPACE_TIMESTAMP", "enable_rx_timestamps", "rx_timestamp_ns"]

# Python 3.11 does not export SO_TIMESTAMPNS; 35 is Linux's asm-generic value (x86, arm, riscv).
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@qq")
CMSG_SPACE_TIMESTAMP = socket.CMSG_SPACE(_TIMESPEC.size)


def enable_rx_timestamps(sock: socket.socket) -> bool:
    """Ask the kernel to attach a CLOCK_REALTIME receive timestamp to every datagram."""
    if SO_TIMESTAMPNS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def rx_timestamp_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The receive timestamp in ``recvmsg`` ancillary data, if any."""
    for level, ctype, cdata in ancdata:
        if level == socket.SOL_SOCKET and ctype == SO_TIMESTAMPNS and len(cdata) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(cdata)
            return int(sec) * 1_000_000_000 + int(nsec)
    return None
