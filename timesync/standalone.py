"""What ``skewless timesync`` runs (the command itself, and the key file it reads, are skewless/cli_timesync.py):
the server loop and its JSON report on stderr."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from typing import Any

from timesync.server import ServerConfig, TimeSyncServer, start_server
from timesync.store import SourceInfoStore

__all__ = ["run_server", "run_with_uvloop"]

log = logging.getLogger("timesync")


def _report(server: TimeSyncServer) -> str:
    now = server.clock.now_us()
    sources = {
        sid: {
            "offset_us": info.offset_us,
            "skew_ppm": round(info.skew_ppm, 3),
            "rtt_us": info.rtt_us,
            "error_bound_us": info.error_bound_us(now),
            "last_sync_us": info.last_sync_us,
            "samples": info.sample_count,
        }
        for sid, info in server.store.snapshot().items()
    }
    return json.dumps(
        {
            "stats": server.responder.stats.as_dict(),
            "rx_latency": server.stats.rx_latency_summary(),
            "t_a_us": server.store.max_rtt_us(),
            "sources": sources,
        },
        sort_keys=True,
    )


async def run_server(config: ServerConfig, stats_interval_s: float = 0.0, duration_s: float = 0.0) -> None:
    """Run until cancelled (or ``duration_s`` elapsed), logging stats every ``stats_interval_s``."""
    server = await start_server(config, store=SourceInfoStore())
    host, port = server.address
    print(f"timesync: serving NTP on {host}:{port} (kernel timestamps: {server.kernel_timestamps_enabled}, "
          f"clock offset {config.clock_offset_us} us)", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + duration_s if duration_s > 0 else None
    try:
        while stop_at is None or loop.time() < stop_at:
            step = stats_interval_s if stats_interval_s > 0 else 3600.0
            if stop_at is not None:
                step = min(step, max(stop_at - loop.time(), 0.0))
            await asyncio.sleep(step)
            if stats_interval_s > 0:
                print(_report(server), file=sys.stderr, flush=True)
    finally:
        print(_report(server), file=sys.stderr, flush=True)
        await server.close()


def run_with_uvloop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        asyncio.run(main)
        return
    uvloop.run(main)
