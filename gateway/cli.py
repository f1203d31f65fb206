"""`skewless gateway`: run the ingestion gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
from pathlib import Path
from typing import Annotated

import typer

from gateway.config import build_config, load_settings
from gateway.launch import GatewayAddresses, ready_lines
from gateway.logs import configure_logging
from gateway.server import Gateway, GatewayConfig


def gateway(
    config_file: Annotated[Path | None, typer.Option("--config", help="TOML file with a [gateway] table.")] = None,
    host: Annotated[str | None, typer.Option(help="TCP listen address [127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="TCP listen port, 0 = any free port [7700].")] = None,
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers [127.0.0.1:9092].",
                                                  envvar="SKEWLESS_BOOTSTRAP")] = None,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix [skewless].")] = None,
    max_frame_bytes: Annotated[int | None, typer.Option(help="Largest accepted frame body [1 MiB].")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="Serve /metrics and /healthz on this port.")] = None,
    metrics_host: Annotated[str | None, typer.Option(help="Address of the metrics endpoint [127.0.0.1].")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="PEM certificate: enables TLS.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key for --tls-cert.")] = None,
    auth_hmac_secret: Annotated[str | None, typer.Option(help="Require HMAC tokens made with this secret.",
                                                         envvar="SKEWLESS_GATEWAY_AUTH_HMAC_SECRET")] = None,
    timesync: Annotated[bool | None, typer.Option(
        "--timesync/--no-timesync", help="Run the NTP-format time-sync server and map source clocks [on].")] = None,
    timesync_port: Annotated[int | None, typer.Option(help="UDP port of the time-sync server [7452].")] = None,
    clock_offset_us: Annotated[int | None, typer.Option(
        help="Shift the gateway's reference clock by this many microseconds (demos of a skewed reference).")] = None,
    max_future_s: Annotated[int | None, typer.Option(
        help="Quarantine events whose reference time is this far ahead of the gateway clock [60].")] = None,
    log_json: Annotated[bool, typer.Option(help="Log one JSON object per line (to stderr).")] = False,
    log_level: Annotated[str, typer.Option(help="Log level.")] = "INFO",
) -> None:
    """Accept events from sources over TCP and publish them to Kafka; prints `listening HOST:PORT` when ready (after
    the time-sync and metrics addresses, if any).

    Settings come from --config (TOML, table [gateway]), then SKEWLESS_GATEWAY_* environment variables, then flags.
    """
    configure_logging(log_level, json_format=log_json)
    settings = load_settings(config_file, overrides={
        "host": host, "port": port, "bootstrap_servers": bootstrap, "topic_prefix": prefix,
        "max_frame_bytes": max_frame_bytes, "metrics_port": metrics_port, "metrics_host": metrics_host,
        "tls_cert": str(tls_cert) if tls_cert else None, "tls_key": str(tls_key) if tls_key else None,
        "auth_hmac_secret": auth_hmac_secret, "timesync": timesync, "timesync_port": timesync_port,
        "clock_offset_us": clock_offset_us, "max_future_s": max_future_s,
    })
    config = build_config(settings)
    _raise_fd_limit()
    try:
        import uvloop

        runner: asyncio.Runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(_serve(config))


def _raise_fd_limit() -> None:
    """One descriptor per connection: raise the soft RLIMIT_NOFILE to the hard limit (often 1024 -> 10^5+)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger(__name__).warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, hard, exc)


async def _serve(config: GatewayConfig) -> None:
    gw = Gateway(config)
    await gw.start()
    addresses = GatewayAddresses(
        config.host, gw.port, timesync_host=config.timesync.host if config.timesync else None,
        timesync_port=gw.timesync_port, metrics_host=config.metrics_host, metrics_port=gw.metrics_port)
    for line in ready_lines(addresses):  # gateway.launch reads them: the ready line comes last
        typer.echo(line)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gw.stop()
    typer.echo(f"stopped; counters: {gw.counters}")


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
