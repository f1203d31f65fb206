"""`skewless gateway`: run the ingestion gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Annotated

import typer

from gateway.frames import DEFAULT_MAX_FRAME_BYTES
from gateway.server import Gateway, GatewayConfig


def gateway(
    host: Annotated[str, typer.Option(help="TCP listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP listen port (0 = any free port).")] = 7700,
    bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers.", envvar="SKEWLESS_BOOTSTRAP")]
    = "127.0.0.1:9092",
    prefix: Annotated[str, typer.Option(help="Topic prefix.")] = "skewless",
    max_frame_bytes: Annotated[int, typer.Option(help="Largest accepted frame body.")] = DEFAULT_MAX_FRAME_BYTES,
) -> None:
    """Accept events from sources over TCP and publish them to Kafka; prints `listening HOST:PORT` when ready."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = GatewayConfig(host=host, port=port, bootstrap_servers=bootstrap, topic_prefix=prefix,
                           max_frame_bytes=max_frame_bytes)
    try:
        import uvloop

        runner: asyncio.Runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(_serve(config))


async def _serve(config: GatewayConfig) -> None:
    gw = Gateway(config)
    await gw.start()
    typer.echo(f"listening {config.host}:{gw.port}")
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
