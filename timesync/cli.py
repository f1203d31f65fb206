"""``skewless timesync``: run the time-sync server alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer

from timesync.estimator import DEFAULT_BURST_SIZE
from timesync.responder import ResponderConfig
from timesync.server import DEFAULT_PORT, ServerConfig, TimeSyncServer, start_server
from timesync.store import SourceInfoStore

__all__ = ["load_keys", "register", "run_server"]

log = logging.getLogger("timesync")


def load_keys(path: Path) -> dict[str, bytes]:
    """Read ``source_id = hex-key`` lines (``#`` comments allowed)."""
    keys: dict[str, bytes] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        source_id, sep, hex_key = (part.strip() for part in line.partition("="))
        if not sep or not source_id or not hex_key:
            raise typer.BadParameter(f"{path}:{lineno}: expected 'source_id = hexkey'")
        try:
            keys[source_id] = bytes.fromhex(hex_key)
        except ValueError:
            raise typer.BadParameter(f"{path}:{lineno}: key is not hex") from None
    return keys


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
    typer.echo(
        f"timesync: serving NTP on {host}:{port} (kernel timestamps: {server.kernel_timestamps_enabled}, "
        f"clock offset {config.clock_offset_us} us)",
        err=True,
    )
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + duration_s if duration_s > 0 else None
    try:
        while stop_at is None or loop.time() < stop_at:
            step = stats_interval_s if stats_interval_s > 0 else 3600.0
            if stop_at is not None:
                step = min(step, max(stop_at - loop.time(), 0.0))
            await asyncio.sleep(step)
            if stats_interval_s > 0:
                typer.echo(_report(server), err=True)
    finally:
        typer.echo(_report(server), err=True)
        await server.close()


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed, else on the default asyncio loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        asyncio.run(main)
        return
    uvloop.run(main)


def register(app: typer.Typer) -> None:
    @app.command("timesync")
    def timesync_command(
        host: Annotated[str, typer.Option(help="Address to bind ('::' for dual stack).")] = "0.0.0.0",
        port: Annotated[int, typer.Option(help="UDP port (123 needs root).")] = DEFAULT_PORT,
        clock_offset_us: Annotated[
            int, typer.Option(help="Shift the reference clock by this many microseconds (demos).")
        ] = 0,
        clock_skew_ppm: Annotated[
            float, typer.Option(help="Let the reference clock run this many ppm fast (demos, benchmarks).")
        ] = 0.0,
        stratum: Annotated[int, typer.Option(min=1, max=15, help="Stratum advertised in replies.")] = 1,
        ref_id: Annotated[str, typer.Option(help="Reference id, up to 4 ASCII characters.")] = "XSKW",
        burst_size: Annotated[int, typer.Option(min=1, help="Most samples per sync burst.")] = DEFAULT_BURST_SIZE,
        rate_limit: Annotated[
            float, typer.Option(help="Requests per second per address (0 disables).")
        ] = 64.0,
        rate_burst: Annotated[int, typer.Option(min=1, help="Rate-limit burst size.")] = 128,
        keys_file: Annotated[
            Path | None, typer.Option(help="'source_id = hexkey' lines; enables HMAC source authentication.")
        ] = None,
        upstream: Annotated[
            list[str] | None, typer.Option(help="Discipline the reference clock against this NTP server.")
        ] = None,
        upstream_interval_s: Annotated[float, typer.Option(help="Upstream poll interval.")] = 64.0,
        kernel_timestamps: Annotated[
            bool, typer.Option(help="Use SO_TIMESTAMPNS receive timestamps for T2.")
        ] = True,
        stats_interval_s: Annotated[float, typer.Option(help="Print JSON stats this often (0: at exit).")] = 0.0,
        duration_s: Annotated[float, typer.Option(help="Stop after this many seconds (0: run forever).")] = 0.0,
    ) -> None:
        """Run the NTP-compatible time-sync server on its own (the gateway command runs it too)."""
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        ref_bytes = ref_id.encode("ascii", errors="strict")[:4].ljust(4, b"\x00")
        config = ServerConfig(
            host=host,
            port=port,
            clock_offset_us=clock_offset_us,
            clock_skew_ppm=clock_skew_ppm,
            kernel_timestamps=kernel_timestamps,
            burst_size=burst_size,
            responder=ResponderConfig(
                stratum=stratum,
                ref_id=ref_bytes,
                rate_limit_per_s=rate_limit,
                rate_limit_burst=rate_burst,
                keys=load_keys(keys_file) if keys_file is not None else {},
            ),
            upstream_servers=tuple(upstream or ()),
            upstream_interval_s=upstream_interval_s,
        )
        with contextlib.suppress(KeyboardInterrupt):
            _run(run_server(config, stats_interval_s, duration_s))
