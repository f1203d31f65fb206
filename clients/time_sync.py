"""Time sync with the shard's owner: the source clock follows the time-sync server of the gateway that owns it.

The decisions are pure (``clients.core.plan_owner_sync``, ``ResyncGate``); this module owns the tasks: the first
burst and the periodic re-syncs (``timesync.client.PeriodicSync``), a move to a new owner's server, and the bursts
a gateway asks for after it saw this clock step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from clients.core import GatewayAddress, GatewayRouter, OwnerSync, ResyncGate, plan_owner_sync
from clients.errors import TimeSyncError
from clients.options import ClientSettings
from clients.stats import ClientStats
from contract.wire.messages import ResyncRequest
from timesync.client import PeriodicSync
from timesync.client import TimeSyncError as _AnyTimeSyncError
from timesync.clocks import for_time_sync
from timesync.estimator import ClockEstimate

__all__ = ["OwnerTimeSync"]

# Every room of the SDK logs under the name applications (and the reliability tests) filter on.
log = logging.getLogger("clients.client")

# How long close() waits for the time-sync task to stop before cancelling it again (see _close_periodic).
_SYNC_CLOSE_WAIT_S = 0.2


class OwnerTimeSync:
    """Where and when this source syncs its clock: with the owner's announced time-sync port, else the configured
    ``udp_port`` on the owner's host; once before the first hello when an HMAC token needs the synced clock."""

    def __init__(self, settings: ClientSettings, source_id: str, router: GatewayRouter, stats: ClientStats,
                 task_done: Callable[[asyncio.Task[None]], None]) -> None:
        self._settings = settings
        self._source_id = source_id
        self._router = router
        self._stats = stats
        self._task_done = task_done
        self.periodic: PeriodicSync | None = None
        # One time-sync move at a time: several pool connections may learn the same new owner together.
        self._lock = asyncio.Lock()
        self._resync_gate = ResyncGate()
        self._resync_task: asyncio.Task[None] | None = None
        self.move_task: asyncio.Task[None] | None = None  # a burst with a new owner that already maps this clock
        self._warned_no_time_server = False

    @property
    def estimate(self) -> ClockEstimate | None:
        return None if self.periodic is None else self.periodic.estimate

    async def start(self, host: str, udp_port: int) -> None:
        """The first sync burst (raising when it gets no usable reply), then the periodic re-syncs."""
        def on_estimate(_estimate: ClockEstimate) -> None:
            self._stats.syncs += 1

        settings = self._settings
        interval = settings.resync_interval_s
        sync = PeriodicSync(host, udp_port, self._source_id, for_time_sync(settings.clock_us),
                            count=settings.sync_attempts, interval_s=interval if interval is not None else 1.0,
                            timeout_s=settings.sync_timeout_s, key=settings.timesync_key, on_estimate=on_estimate)
        try:
            if interval is None:
                await sync.sync_now()
            else:
                await sync.start()
        except _AnyTimeSyncError as exc:
            raise _sdk_time_sync_error(exc, host, udp_port) from exc
        self.periodic = sync

    async def presync(self, udp_port: int) -> None:
        """Sync with the first gateway of the list that answers (any gateway's clock makes a fresh HMAC token)."""
        failure: BaseException | None = None
        for address in self._router.addresses:
            try:
                await self.start(address.host, udp_port)
                return
            except (_AnyTimeSyncError, OSError) as exc:
                log.info("%s: no time sync at %s:%d: %s", self._source_id, address.host, udp_port, exc)
                failure = exc
        assert failure is not None
        raise failure

    def endpoint(self, owner: GatewayAddress | None = None) -> tuple[str, int] | None:
        """Where this source syncs its clock: the owner's announced time-sync port, else the configured ``udp_port``
        on the owner's host (the first address while no owner is known); None when time sync is off or neither is
        known."""
        udp_port = self._settings.udp_port
        if not self._settings.time_sync:
            return None
        owner = owner if owner is not None else self._router.owner
        if owner is None:
            return None if udp_port is None else (self._router.addresses[0].host, udp_port)
        port = owner.timesync_port if owner.timesync_port is not None else udp_port
        return None if port is None else (owner.host, port)

    async def follow_owner(self, owner: GatewayAddress, owner_knows_clock: bool = False) -> None:
        """Sync with the owner's time-sync server before anything is sent to it: the first burst (raising, so that
        ``connect()`` fails as it always did), or a move of the existing sync when the owner changed — awaited when
        the owner has no estimate of this clock, beside the sending when its welcome says ``clock_known``
        (``clients.core.plan_owner_sync``)."""
        target = self.endpoint(owner)
        if target is None:
            if self._settings.time_sync and self.periodic is None and not self._warned_no_time_server:
                self._warned_no_time_server = True
                log.info("%s: %s:%d announces no time-sync server and no udp_port is set: events go unsynced",
                         self._source_id, owner.host, owner.port)
            return
        async with self._lock:
            sync = self.periodic
            plan = plan_owner_sync(None if sync is None else (sync.host, sync.port), target,
                                   owner_knows_clock=owner_knows_clock)
            if plan is OwnerSync.FIRST_BURST:
                await self.start(*target)
            elif plan is not OwnerSync.STAY:
                assert sync is not None
                await self._move(sync, target, plan)

    async def _move(self, sync: PeriodicSync, target: tuple[str, int], plan: OwnerSync) -> None:
        log.info("%s: time sync moves from %s:%d to the owner's %s:%d (%s)", self._source_id, sync.host, sync.port,
                 *target, "it knows this clock: resending beside the burst"
                 if plan is OwnerSync.MOVE_BESIDE_SENDING else "before sending")
        self._stats.time_sync_moves += 1
        sync.host, sync.port = target
        # Another gateway, maybe another reference clock: the old server's samples must not bend the new line
        # (the estimate itself stays until the new burst replaces it).
        sync.exchange.estimator.reset()
        if plan is OwnerSync.MOVE_BESIDE_SENDING:
            # The owner maps this source's events with the estimate it restored: the unacked ones go now, the
            # burst runs beside them (the connection's other slots find the sync already moved).
            if self.move_task is not None:
                self.move_task.cancel()  # a burst with an owner this source already left
            self.move_task = asyncio.create_task(self._move_burst(sync, target),
                                                 name=f"skewless-{self._source_id}-move-sync")
            self.move_task.add_done_callback(self._task_done)
            return
        await self._move_burst(sync, target)

    async def _move_burst(self, sync: PeriodicSync, target: tuple[str, int]) -> None:
        try:
            await sync.sync_now()
        except (_AnyTimeSyncError, OSError) as exc:
            # Not fatal: the periodic re-sync (and any resync request) tries the new server again.
            log.warning("%s: time sync with the new owner %s:%d failed: %s", self._source_id, *target, exc)

    async def sync_now(self) -> ClockEstimate:
        """One sync burst now with the owner's time-sync server (``TimeSyncError`` when it gets no usable reply, or
        when no server is known)."""
        if self.periodic is None:
            target = self.endpoint()
            if target is None:
                raise TimeSyncError("no time-sync server: time_sync is off, or the gateway announced none and no "
                                    "udp_port is set")
            await self.start(*target)
            assert self.periodic is not None
            estimate = self.periodic.estimate
            assert estimate is not None
            return estimate
        try:
            return await self.periodic.sync_now()
        except _AnyTimeSyncError as exc:
            raise _sdk_time_sync_error(exc, self.periodic.host, self.periodic.port) from exc

    def on_resync_request(self, request: ResyncRequest, closed: bool) -> None:
        """The gateway saw this source's clock step and holds its events until a sync after the step: one burst now
        (clients.core.ResyncGate decides when), beside the periodic ones; sending goes on meanwhile."""
        self._stats.resyncs_requested += 1
        if self.periodic is None or closed:
            return  # no time sync: the gateway has no estimate of this clock to renew
        log.warning("%s: the gateway asks for a re-sync (%s at %s seq %s)", self._source_id, request.reason,
                    request.stream, request.seq)
        delay_s = self._resync_gate.request(asyncio.get_running_loop().time())
        if delay_s is not None:
            self._resync_task = asyncio.create_task(self._resync(delay_s), name=f"skewless-{self._source_id}-resync")
            self._resync_task.add_done_callback(self._task_done)

    async def _resync(self, delay_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        while delay_s is not None and self.periodic is not None:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            self._resync_gate.started(loop.time())
            try:
                await self.periodic.sync_now()
            except (_AnyTimeSyncError, OSError) as exc:
                # Not fatal: the gateway sends its held events to the late topic when its hold runs out, and the
                # periodic re-sync tries again.
                log.warning("%s: the re-sync the gateway asked for failed: %s", self._source_id, exc)
            delay_s = self._resync_gate.finished(loop.time())

    async def stop_tasks(self) -> None:
        """Cancel a move burst and a requested re-sync (before the connections drop)."""
        for task in (self.move_task, self._resync_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def close(self) -> None:
        if self.periodic is not None:
            await _close_periodic(self.periodic)


def _sdk_time_sync_error(exc: _AnyTimeSyncError, host: str, udp_port: int) -> TimeSyncError:
    return exc if isinstance(exc, TimeSyncError) else TimeSyncError(f"time sync with {host}:{udp_port}: {exc}")


async def _close_periodic(sync: PeriodicSync) -> None:
    """``sync.close()``, bounded. Python 3.11's ``asyncio.wait_for`` (which a sync burst awaits each reply with)
    swallows a cancellation that lands in the loop iteration where the reply arrived: the re-sync task then goes on to
    its next sleep and ``close()`` would wait for it forever. Cancelling the pending ``close()`` cancels the task it
    awaits a second time, which that sleep does not swallow."""
    closing = asyncio.ensure_future(sync.close())
    done, _pending = await asyncio.wait({closing}, timeout=_SYNC_CLOSE_WAIT_S)
    if not done:
        log.debug("the time-sync task ignored a cancellation; cancelling it again")
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
