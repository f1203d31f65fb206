"""asyncio UDP shell around :class:`timesync.responder.Responder`.

The socket is read with ``recvmsg`` from a ``loop.add_reader`` callback (works with uvloop and the
default selector loop) so that the kernel's receive timestamp (``SO_TIMESTAMPNS``) can be used as
T2.  Without it, T2 is the reference clock read in the callback, which adds the event loop's
wake-up latency; :attr:`ServerStats.rx_latency_us` records the difference while kernel
timestamps are on.

Embedding in another asyncio program (the gateway)::

    store = SourceInfoStore()
    server = await start_server(ServerConfig(host="0.0.0.0", port=7452), store=store)
    ...                                   # the store fills in while the loop runs
    await server.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from timesync._io import StartCloseContext, cancel_owned_task, close_udp_reader, open_udp_reader
from timesync._sockopt import CMSG_SPACE_TIMESTAMP, enable_rx_timestamps, rx_timestamp_ns
from timesync.clocks import ReferenceClock
from timesync.estimator import DEFAULT_BURST_SIZE, ClockEstimator
from timesync.responder import Responder, ResponderConfig
from timesync.store import SourceInfoStore

__all__ = [
    "DEFAULT_PORT",
    "ReferenceClock",
    "ServerConfig",
    "ServerStats",
    "TimeSyncServer",
    "UpstreamDiscipline",
    "start_server",
]

log = logging.getLogger(__name__)

#: The time-sync port of the thesis' sample client (Sample Code 4.1).  123 would need root.
DEFAULT_PORT = 7452
#: Largest datagram read; longer ones are truncated by the kernel and dropped as too long.
RECV_BUFFER = 2048
#: Datagrams handled per wake-up before yielding to the loop (fairness under a flood).
MAX_BATCH = 64



@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    clock_offset_us: int = 0
    """The reference clock reads ``CLOCK_REALTIME + clock_offset_us`` (demos): the system clock's ``offset_us``
    against the reference, in the one sign of timesync.clocks (``t_ref = t_source + offset_us``), and so how far
    the reference reads ahead of the system clock (``ReferenceClock.ahead_us``)."""
    clock_skew_ppm: float = 0.0
    kernel_timestamps: bool = True
    burst_size: int = DEFAULT_BURST_SIZE
    responder: ResponderConfig = field(default_factory=ResponderConfig)
    upstream_servers: tuple[str, ...] = ()
    """Discipline the reference clock against these NTP servers with ntplib (off when empty)."""
    upstream_interval_s: float = 64.0


@dataclass(slots=True)
class ServerStats:
    kernel_timestamps: int = 0
    loop_timestamps: int = 0
    send_errors: int = 0
    recv_errors: int = 0
    rx_latency_us: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    """Recent (callback T2 - kernel T2): what the kernel timestamp saves."""

    def rx_latency_summary(self) -> dict[str, float]:
        xs = sorted(self.rx_latency_us)
        if not xs:
            return {}
        return {
            "count": float(len(xs)),
            "median_us": float(statistics.median(xs)),
            "p99_us": float(xs[min(len(xs) - 1, int(0.99 * len(xs)))]),
            "max_us": float(xs[-1]),
        }


class TimeSyncServer(StartCloseContext):
    """One UDP socket serving NTP and registering sources; use :func:`start_server`."""

    def __init__(
        self,
        responder: Responder,
        clock: ReferenceClock,
        host: str,
        port: int,
        kernel_timestamps: bool = True,
    ) -> None:
        self.responder = responder
        self.clock = clock
        self.host = host
        self.port = port
        self.stats = ServerStats()
        self._want_kernel_ts = kernel_timestamps
        self.kernel_timestamps_enabled = False
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._discipline: UpstreamDiscipline | None = None

    @property
    def store(self) -> SourceInfoStore:
        return self.responder.store

    @property
    def address(self) -> tuple[str, int]:
        if self._sock is None:
            raise RuntimeError("server not started")
        name = self._sock.getsockname()
        return str(name[0]), int(name[1])

    async def start(self) -> None:
        if self._sock is not None:
            return
        self._sock, self._loop = await open_udp_reader(self.host, self.port, self._bind, self._on_readable)
        log.info("timesync listening on %s:%d", *self.address[:2])

    def _bind(self, sock: socket.socket, family: int, sockaddr: Any) -> None:
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        try:
            sock.bind(sockaddr)
        except OSError as exc:
            # Name the address, as asyncio's create_server does for TCP: "address in use" alone does not say
            # which of a command's ports is taken (issue 28 item 5).
            raise OSError(exc.errno, f"error while attempting to bind on udp address {sockaddr[:2]!r}: "
                                     f"{(exc.strerror or str(exc)).lower()}") from None
        if self._want_kernel_ts:
            self.kernel_timestamps_enabled = enable_rx_timestamps(sock)
            if not self.kernel_timestamps_enabled:
                log.info("SO_TIMESTAMPNS unavailable; T2 is read in the event loop")

    def attach_discipline(self, discipline: UpstreamDiscipline) -> None:
        self._discipline = discipline

    async def close(self) -> None:
        if self._discipline is not None:
            await self._discipline.close()
            self._discipline = None
        sock, self._sock = self._sock, None
        close_udp_reader(self._loop, sock)

    async def serve_forever(self) -> None:
        await self.start()
        try:
            await asyncio.Future()
        finally:
            await self.close()

    # -- datagram path ---------------------------------------------------------------------------

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        cmsg_space = CMSG_SPACE_TIMESTAMP if self.kernel_timestamps_enabled else 0
        responder = self.responder
        clock = self.clock
        for _ in range(MAX_BATCH):
            try:
                data, ancdata, _flags, addr = sock.recvmsg(RECV_BUFFER, cmsg_space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.stats.recv_errors += 1
                return
            loop_t2_us = clock.now_us()
            t2_us = loop_t2_us
            kernel_ns = rx_timestamp_ns(ancdata) if ancdata else None
            if kernel_ns is not None:
                kernel_t2_us = clock.from_realtime_ns(kernel_ns)
                if kernel_t2_us <= loop_t2_us:  # a clock step in between: keep the loop reading
                    t2_us = kernel_t2_us
                    self.stats.rx_latency_us.append(loop_t2_us - kernel_t2_us)
            if t2_us == loop_t2_us:
                self.stats.loop_timestamps += 1
            else:
                self.stats.kernel_timestamps += 1
            pending = responder.handle(data, str(addr[0]), t2_us)
            if pending is None:
                continue
            prepared = responder.prepare(pending)
            reply = responder.finalize(pending, prepared, clock.now_us())  # T3 read as late as possible
            try:
                sock.sendto(reply, addr)
            except OSError:  # BlockingIOError included: the reply is dropped, the client retries
                self.stats.send_errors += 1


class UpstreamDiscipline:
    """Optionally steer the reference clock to upstream NTP servers with ntplib.

    Every ``interval_s`` it queries each server (in a thread; ntplib is blocking) and sets the
    clock's ``correction_us`` to the median measured offset.  Failures (offline) leave the last
    correction in place and are only logged.
    """

    def __init__(
        self, clock: ReferenceClock, servers: Sequence[str], interval_s: float = 64.0, timeout_s: float = 2.0
    ) -> None:
        self.clock = clock
        self.servers = tuple(servers)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.last_offsets_us: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and self.servers:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="timesync-upstream")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_owned_task(task)

    def _query(self, server: str) -> int:
        import ntplib

        port: int | str = "ntp"
        host = server
        if server.count(":") == 1:
            host, port_s = server.split(":")
            port = int(port_s)
        resp = ntplib.NTPClient().request(host, version=4, port=port, timeout=self.timeout_s)
        return round(float(resp.offset) * 1e6)

    async def poll_once(self) -> int | None:
        offsets: list[int] = []
        for server in self.servers:
            try:
                off = await asyncio.to_thread(self._query, server)
            except Exception as exc:  # noqa: BLE001 - any failure of one upstream is tolerated
                log.warning("upstream %s failed: %s", server, exc)
                continue
            self.last_offsets_us[server] = off
            offsets.append(off)
        if not offsets:
            return None
        # ntplib measured (server - system clock); the correction moves the reference onto it.
        self.clock.correction_us = round(statistics.median(offsets))
        return self.clock.correction_us

    async def _run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)


async def start_server(
    config: ServerConfig | None = None,
    store: SourceInfoStore | None = None,
    clock: ReferenceClock | None = None,
) -> TimeSyncServer:
    """Create, bind and start a server in the running loop.  ``await server.close()`` stops it."""
    config = config or ServerConfig()
    clock = clock or ReferenceClock(ahead_us=config.clock_offset_us, skew_ppm=config.clock_skew_ppm)
    burst_size = config.burst_size
    responder = Responder(
        config.responder, store=store, estimator_factory=lambda: ClockEstimator(burst_size=burst_size)
    )
    server = TimeSyncServer(responder, clock, config.host, config.port, config.kernel_timestamps)
    await server.start()
    if config.upstream_servers:
        discipline = UpstreamDiscipline(clock, config.upstream_servers, config.upstream_interval_s)
        server.attach_discipline(discipline)
        discipline.start()
    return server
