"""Small socket helpers shared by the launchers and tests."""

from __future__ import annotations

import errno
import socket
import time


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def ensure_tcp_port_free(host: str, port: int) -> None:
    """Raise OSError(EADDRINUSE) naming ``host:port`` if another process listens there (as asyncio's create_server
    words it, so `skewless` names the port in its one error line)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as a server sets it: a port left in TIME_WAIT by a stopped broker is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise OSError(exc.errno, f"error while attempting to bind on address {(host, port)!r}: "
                                     f"{(exc.strerror or str(exc)).lower()}") from None


def wait_for_tcp(host: str, port: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False
