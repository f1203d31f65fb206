"""The sender task of one source: batches from the send window onto the live pool connections, and heartbeats.

What goes where is decided by the pure cores (``clients.core``: ``UnackedStore.take_batch``, ``encode_batches``,
``PoolScheduler``, ``IdleTimer``, ``GatewayLiveness``, ``heartbeat_next_seq``); this task writes the frames.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from clients.connection import GatewayPool, write_frame
from clients.core import encode_batches, heartbeat_next_seq
from clients.options import ClientSettings
from clients.stats import ClientStats
from clients.window import SendWindow
from contract.wire.frames import encode_frame
from contract.wire.messages import build_heartbeat

__all__ = ["Sender"]


class Sender:
    """Writes what the window holds unsent, lingering ``linger_s`` for a partial batch; heartbeats a source gone
    idle; drops connections whose gateway stopped answering."""

    def __init__(self, settings: ClientSettings, pool: GatewayPool, window: SendWindow, stats: ClientStats,
                 heartbeat_ts_us: Callable[[], int | None]) -> None:
        self._settings = settings
        self._pool = pool
        self._window = window
        self._stats = stats
        self._heartbeat_ts_us = heartbeat_ts_us

    async def run(self) -> None:
        wake, progress, _room = self._window.signals()
        store = self._window.store
        loop = asyncio.get_running_loop()
        batch_events, linger_s = self._settings.batch_events, self._settings.linger_s
        while True:
            live = self._pool.scheduler.live
            now_s = loop.time()
            timeout = _earliest(self._pool.idle.next_due_in(live, now_s), self._pool.liveness.next_due_in(live, now_s))
            if not wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await wake.wait()
            wake.clear()
            pending = store.pending_count
            if pending and pending < batch_events and linger_s > 0 and not self._window.flush_now:
                await asyncio.sleep(linger_s)
            before = store.pending_count
            wrote = await self._write_pending(loop)
            self._send_heartbeats(loop)
            self._pool.check_liveness(loop.time())
            # Only real progress wakes flush()/send_pending(): while no connection is up they wait for one.
            if wrote or store.pending_count != before:
                progress.set()

    async def _write_pending(self, loop: asyncio.AbstractEventLoop) -> bool:
        store, spool, pool, stats = self._window.store, self._window.spool, self._pool, self._stats
        batch_events = self._settings.batch_events
        wrote = False
        while store.pending_count and pool.scheduler.live:
            events = store.take_batch(batch_events)
            if not events:
                break
            # Until the gateway acked a stream, its first seqs must not race each other over two sockets.
            pinned = any(e.stream not in self._window.acked_streams for e in events)
            index = pool.scheduler.next_slot(pinned=pinned)
            assert index is not None
            conn = pool.connections[index]
            writer = conn.writer
            assert writer is not None
            frames = encode_batches(events, batch_events, conn.max_frame_bytes)
            if spool is not None:
                spool.flush()  # on disk before the gateway can have seen them
            for chunk, frame in frames:
                # If the connection is gone, its supervisor requeues what was marked sent on it.
                if write_frame(writer, frame):
                    stats.frames_sent += 1
                    stats.events_sent += len(chunk)
            stats.events_resent += sum(1 for e in events if e.resend)
            store.mark_sent(events, index)
            pool.idle.wrote(index, loop.time())
            pool.liveness.wrote(index, loop.time(), True)
            wrote = True
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()  # a lost connection: its supervisor requeues what it carried
            # drain() returns at once while the socket takes everything: yield, or a long queue goes out in one go
            # while the other clients of this event loop (a replay's sources) send nothing.
            await asyncio.sleep(0)
        return wrote

    def _send_heartbeats(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        pool, store = self._pool, self._window.store
        live = pool.scheduler.live
        due = pool.idle.due(live, now)
        if store.pending_count:
            return  # a heartbeat must not claim seqs still queued here; they go out first
        probes = pool.liveness.probe_due(live, now)
        if probes:
            due = sorted({*due, *probes})
        if not due:
            return
        ts_us = self._heartbeat_ts_us()
        if ts_us is None:
            for index in due:
                pool.idle.wrote(index, now)
            return
        frame = encode_frame(build_heartbeat(ts_us, heartbeat_next_seq(self._window.seqs, store)))
        # The gateway answers a heartbeat with the source's cumulative acks, which exist once one was acked.
        answerable = any(store.acked_through(stream) >= 0 for stream in self._window.streams)
        for index in due:
            writer = pool.connections[index].writer
            if writer is not None and write_frame(writer, frame):
                self._stats.heartbeats_sent += 1
                pool.liveness.wrote(index, now, answerable, heartbeat=True)
            pool.idle.wrote(index, now)


def _earliest(*waits_s: float | None) -> float | None:
    known = [w for w in waits_s if w is not None]
    return min(known) if known else None
