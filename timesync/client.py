"""asyncio client helpers around :class:`timesync.exchange.ClientExchange` (what the SDK calls).

* :func:`sync_burst` - one burst of ``count`` exchanges plus the final report; returns the
  source-side :class:`~timesync.estimator.ClockEstimate` (the server computes the same one).
* :class:`PeriodicSync` - the first burst on :meth:`PeriodicSync.start`, then re-syncs every
  ``interval_s`` in a background task it owns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
from collections.abc import Callable
from typing import Any

from timesync._io import StartCloseContext, cancel_owned_task, close_udp_reader, open_udp_reader
from timesync._sockopt import CMSG_SPACE_TIMESTAMP, enable_rx_timestamps, rx_timestamp_ns
from timesync.clocks import ClockUs, for_time_sync, system_time_us
from timesync.estimator import DEFAULT_BURST_SIZE, ClockEstimate, ClockEstimator
from timesync.exchange import ClientExchange

__all__ = ["PeriodicSync", "TimeSyncError", "realtime_us", "sync_burst"]

log = logging.getLogger(__name__)

#: Thesis default: 10 sync attempts per burst (Sample Code 4.1).
DEFAULT_COUNT = 10


class TimeSyncError(Exception):
    """A burst produced no usable sample (server unreachable, every reply rejected)."""


#: The default source clock: this machine's CLOCK_REALTIME in microseconds.
realtime_us = for_time_sync(system_time_us)


class _Channel:
    """A connected, non-blocking UDP socket read from the event loop with ``recvmsg``.

    When the source clock can convert CLOCK_REALTIME (``from_realtime_ns``) and the kernel gives
    receive timestamps, T4 is the kernel's arrival time of the reply; otherwise the clock is read
    as soon as the loop runs the reader callback.
    """

    def __init__(self, clock_us: ClockUs) -> None:
        self.clock_us = clock_us
        self._from_realtime: Callable[[int], int] | None = getattr(clock_us, "from_realtime_ns", None)
        self.replies: asyncio.Queue[tuple[bytes, int]] = asyncio.Queue(maxsize=64)
        self.kernel_timestamps = False
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self, host: str, port: int) -> None:
        self._sock, self._loop = await open_udp_reader(host, port, self._connect, self._on_readable)

    def _connect(self, sock: socket.socket, _family: int, sockaddr: Any) -> None:
        sock.connect(sockaddr)  # UDP: no handshake; filters replies from other addresses
        if self._from_realtime is not None:
            self.kernel_timestamps = enable_rx_timestamps(sock)

    def send(self, data: bytes) -> None:
        if self._sock is None:
            raise RuntimeError("channel closed")
        with contextlib.suppress(BlockingIOError, InterruptedError):
            self._sock.send(data)  # a full socket buffer drops the request: it then times out

    def close(self) -> None:
        sock, self._sock = self._sock, None
        close_udp_reader(self._loop, sock)

    def _on_readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        cmsg_space = CMSG_SPACE_TIMESTAMP if self.kernel_timestamps else 0
        while True:
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(2048, cmsg_space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. ICMP port unreachable on a connected socket
                log.debug("timesync client socket error: %s", exc)
                return
            t4_us = self.clock_us()  # read first: everything after this adds to the measured RTT
            kernel_ns = rx_timestamp_ns(ancdata) if ancdata else None
            if kernel_ns is not None and self._from_realtime is not None:
                t4_us = min(t4_us, self._from_realtime(kernel_ns))
            with contextlib.suppress(asyncio.QueueFull):
                self.replies.put_nowait((data, t4_us))


async def _run_burst(
    exchange: ClientExchange, host: str, port: int, count: int, timeout_s: float, spacing_s: float
) -> int:
    loop = asyncio.get_running_loop()
    channel = _Channel(exchange.clock_us)
    await channel.open(host, port)
    accepted = 0
    try:
        for i in range(count):
            if i and spacing_s > 0:
                await asyncio.sleep(spacing_s)
            channel.send(exchange.build_request())
            deadline = loop.time() + timeout_s
            while exchange.outstanding:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    exchange.timeout()
                    break
                try:
                    data, t4_us = await asyncio.wait_for(channel.replies.get(), remaining)
                except TimeoutError:
                    exchange.timeout()
                    break
                if exchange.handle_reply(data, t4_us) is not None:
                    accepted += 1
        report = exchange.build_report(end_of_burst=True)
        if report is not None:
            channel.send(report)
    finally:
        channel.close()
    exchange.end_burst()
    return accepted


async def sync_burst(
    host: str,
    port: int,
    source_id: str,
    clock: ClockUs | None = None,
    count: int = DEFAULT_COUNT,
    *,
    timeout_s: float = 0.5,
    spacing_s: float = 0.0,
    key: bytes | None = None,
    exchange: ClientExchange | None = None,
) -> ClockEstimate:
    """Run one burst against ``host:port`` and return the estimate.

    Pass ``exchange`` to keep state across bursts (that is how skew gets estimated); otherwise a
    fresh one is made from ``source_id``, ``clock`` (default :func:`realtime_us`) and ``key``.
    Raises :class:`TimeSyncError` if no reply in the burst was usable.
    """
    if count < 1:
        raise ValueError("count must be >= 1")
    if exchange is None:
        exchange = ClientExchange(source_id, clock or realtime_us, key=key)
    accepted = await _run_burst(exchange, host, port, count, timeout_s, spacing_s)
    estimate = exchange.estimate()
    if accepted == 0 or estimate is None:
        reason = exchange.last_rejection or "timeout"
        raise TimeSyncError(f"no usable reply from {host}:{port} in {count} attempts ({reason})")
    return estimate


EstimateCallback = Callable[[ClockEstimate], None]


class PeriodicSync(StartCloseContext):
    """Initial burst, then background re-syncs; owns its task (``async with`` or start/close).

    ``count`` requests per burst; the minimum filter considers all of them.  ``burst_size`` is the
    most samples the local estimator puts in one burst (as on the server, default
    :data:`~timesync.estimator.DEFAULT_BURST_SIZE`); a ``count`` above it is split into several bursts.
    """

    def __init__(
        self,
        host: str,
        port: int,
        source_id: str,
        clock: ClockUs | None = None,
        *,
        count: int = DEFAULT_COUNT,
        interval_s: float = 60.0,
        timeout_s: float = 0.5,
        spacing_s: float = 0.0,
        key: bytes | None = None,
        burst_size: int = DEFAULT_BURST_SIZE,
        jitter_fraction: float = 0.1,
        on_estimate: EstimateCallback | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.host = host
        self.port = port
        self.count = count
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.spacing_s = spacing_s
        self.jitter_fraction = jitter_fraction
        self.on_estimate = on_estimate
        self.exchange = ClientExchange(
            source_id, clock or realtime_us, key=key, estimator=ClockEstimator(burst_size=burst_size)
        )
        self.last_error: BaseException | None = None
        self.bursts_ok = 0
        self.bursts_failed = 0
        self._estimate: ClockEstimate | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._rng = random.Random()

    @property
    def estimate(self) -> ClockEstimate | None:
        return self._estimate

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def to_reference_us(self, source_ts_us: int) -> int:
        """The source's own view of a timestamp on the reference clock (needs one completed sync)."""
        if self._estimate is None:
            raise TimeSyncError("not synchronised yet")
        return self._estimate.to_reference_us(source_ts_us)

    async def sync_now(self) -> ClockEstimate:
        async with self._lock:
            try:
                est = await sync_burst(
                    self.host,
                    self.port,
                    self.exchange.source_id,
                    count=self.count,
                    timeout_s=self.timeout_s,
                    spacing_s=self.spacing_s,
                    exchange=self.exchange,
                )
            except (TimeSyncError, OSError) as exc:
                self.bursts_failed += 1
                self.last_error = exc
                raise
            self.bursts_ok += 1
            self._estimate = est
        if self.on_estimate is not None:
            self.on_estimate(est)
        return est

    async def start(self) -> ClockEstimate:
        """Run the initial burst (raising if it fails), then start the background re-sync task."""
        est = await self.sync_now()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="timesync-resync")
            self._task.add_done_callback(self._task_done)
        return est

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_owned_task(task)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.last_error = task.exception()
            log.error("timesync re-sync task died: %r", self.last_error)

    async def _run(self) -> None:
        while True:
            jitter = 1.0 + self.jitter_fraction * (2 * self._rng.random() - 1)
            await asyncio.sleep(self.interval_s * jitter)
            try:
                await self.sync_now()
            except (TimeSyncError, OSError) as exc:
                log.warning("timesync re-sync failed (keeping the last estimate): %s", exc)
