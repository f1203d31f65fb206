"""IO-shell pieces both ends of time sync share: the UDP socket read from the event loop, the ``async with``
lifecycle and the end of an owned task."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

__all__ = ["StartCloseContext", "cancel_owned_task", "close_udp_reader", "open_udp_reader"]

# Connects (client) or binds (server) the fresh socket; called with the socket, its family and its address.
SocketSetup = Callable[[socket.socket, int, Any], None]


async def open_udp_reader(host: str, port: int, setup: SocketSetup,
                          on_readable: Callable[[], None]) -> tuple[socket.socket, asyncio.AbstractEventLoop]:
    """A non-blocking UDP socket for ``host:port``, prepared by ``setup`` and read by ``on_readable`` from the
    running loop; closed again when ``setup`` fails, so that no file descriptor leaks."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    family, _, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM, proto)
    try:
        sock.setblocking(False)
        setup(sock, family, sockaddr)
        loop.add_reader(sock.fileno(), on_readable)
    except BaseException:
        sock.close()
        raise
    return sock, loop


def close_udp_reader(loop: asyncio.AbstractEventLoop | None, sock: socket.socket | None) -> None:
    """Stop reading ``sock`` and close it (nothing when it is already gone)."""
    if sock is None:
        return
    if loop is not None:
        loop.remove_reader(sock.fileno())
    sock.close()


async def cancel_owned_task(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` and wait for its end; an error it died of before is raised here, to the closer."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class StartCloseContext:
    """``async with`` runs ``start()`` on entry and ``close()`` on exit, whatever the exit."""

    async def start(self) -> object:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
