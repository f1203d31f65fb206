"""The one way to run `skewless gateway` as its own process and wait until it is ready.

Once everything listens, the CLI (skewless/cli_gateway.py) prints the addresses it serves, the ready line last:

    timesync udp HOST:PORT              unless --no-timesync
    metrics http://HOST:PORT/metrics    with --metrics-port (or metrics_port in the config)
    listening HOST:PORT                 the ready line: sources may connect from now on

`ready_lines` writes them and `ReadyLineParser` reads them, so the two sides cannot drift apart. `spawn_gateway`
(blocking) and `spawn_gateway_async` start the process and return it with the addresses of the ready lines; the
demo, the benchmarks and the tests start gateways through them.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

READY_PREFIX = "listening "
TIMESYNC_PREFIX = "timesync udp "
METRICS_PREFIX = "metrics http://"
METRICS_SUFFIX = "/metrics"
# A gateway is ready in about a second; one that first reads back the clock states of a big sources topic takes longer.
DEFAULT_READY_TIMEOUT_S = 60.0

Stderr = int | IO[Any] | None


class GatewayLaunchError(RuntimeError):
    """The gateway exited, or stayed silent, before its ready line."""


@dataclass(frozen=True)
class GatewayAddresses:
    host: str
    port: int
    timesync_host: str | None = None
    timesync_port: int | None = None
    metrics_host: str | None = None
    metrics_port: int | None = None


def ready_lines(addresses: GatewayAddresses) -> list[str]:
    """What the CLI prints once the gateway serves, in this order."""
    lines = []
    if addresses.timesync_port is not None:
        lines.append(f"{TIMESYNC_PREFIX}{addresses.timesync_host or ''}:{addresses.timesync_port}")
    if addresses.metrics_port is not None:
        lines.append(f"{METRICS_PREFIX}{addresses.metrics_host or ''}:{addresses.metrics_port}{METRICS_SUFFIX}")
    lines.append(f"{READY_PREFIX}{addresses.host}:{addresses.port}")
    return lines


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


class ReadyLineParser:
    """Feed the gateway's stdout line by line; `feed` returns the addresses at the ready line, None before it."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._timesync: tuple[str, int] | None = None
        self._metrics: tuple[str, int] | None = None

    def feed(self, line: str) -> GatewayAddresses | None:
        line = line.strip()
        self.seen.append(line)
        if line.startswith(TIMESYNC_PREFIX):
            self._timesync = _host_port(line.removeprefix(TIMESYNC_PREFIX))
        elif line.startswith(METRICS_PREFIX):
            self._metrics = _host_port(line.removeprefix(METRICS_PREFIX).removesuffix(METRICS_SUFFIX))
        elif line.startswith(READY_PREFIX):
            host, port = _host_port(line.removeprefix(READY_PREFIX))
            timesync_host, timesync_port = self._timesync or (None, None)
            metrics_host, metrics_port = self._metrics or (None, None)
            return GatewayAddresses(host, port, timesync_host, timesync_port, metrics_host, metrics_port)
        return None


def gateway_command(args: Sequence[str], *, wrapper: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """`python -m skewless gateway ARGS`, optionally run through `wrapper` (e.g. `ip netns exec NAME`).

    Gateways started by programs (the demo, tests, benchmarks) run several to a host: unless ``args`` choose a
    metrics port (or ``--no-metrics``), each serves its metrics on a free port instead of the default 7780."""
    chosen = any(a.split("=", 1)[0] in ("--metrics-port", "--no-metrics", "--metrics") for a in args)
    return [*wrapper, python, "-m", "skewless", "gateway", *args, *(() if chosen else ("--metrics-port", "0"))]


def spawn_gateway(args: Sequence[str], *, wrapper: Sequence[str] = (), env: Mapping[str, str] | None = None,
                  cwd: str | os.PathLike[str] | None = None, stderr: Stderr = subprocess.DEVNULL,
                  timeout_s: float = DEFAULT_READY_TIMEOUT_S) -> tuple[subprocess.Popen[bytes], GatewayAddresses]:
    """Start a gateway process and block until its ready line. Its stdout stays a pipe the caller owns; the gateway
    prints one more line there when it stops."""
    process = subprocess.Popen(gateway_command(args, wrapper=wrapper), stdout=subprocess.PIPE, stderr=stderr,
                               stdin=subprocess.DEVNULL, env=None if env is None else dict(env), cwd=cwd)
    assert process.stdout is not None
    parser = ReadyLineParser()
    deadline = time.monotonic() + timeout_s
    pending = b""
    # Raw reads under a selector: a buffered readline() could block past the deadline on a silent child.
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not selector.select(remaining_s):
                _kill(process)
                raise GatewayLaunchError(f"no ready line within {timeout_s} s; saw {parser.seen!r}")
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                _kill(process)
                raise GatewayLaunchError(f"gateway exited before its ready line; saw {parser.seen!r}")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                addresses = parser.feed(line.decode(errors="replace"))
                if addresses is not None:
                    return process, addresses


async def spawn_gateway_async(args: Sequence[str], *, wrapper: Sequence[str] = (),
                              env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                              stderr: Stderr = subprocess.DEVNULL, timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                              ) -> tuple[asyncio.subprocess.Process, GatewayAddresses]:
    """As spawn_gateway, on the running event loop."""
    process = await asyncio.create_subprocess_exec(
        *gateway_command(args, wrapper=wrapper), stdout=asyncio.subprocess.PIPE, stderr=stderr,
        stdin=asyncio.subprocess.DEVNULL, env=None if env is None else dict(env), cwd=cwd)
    assert process.stdout is not None
    parser = ReadyLineParser()
    try:
        async with asyncio.timeout(timeout_s):
            while line := await process.stdout.readline():
                addresses = parser.feed(line.decode(errors="replace"))
                if addresses is not None:
                    return process, addresses
    except TimeoutError:
        await _kill_async(process)
        raise GatewayLaunchError(f"no ready line within {timeout_s} s; saw {parser.seen!r}") from None
    await _kill_async(process)
    raise GatewayLaunchError(f"gateway exited before its ready line; saw {parser.seen!r}")


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


async def _kill_async(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
    await process.wait()
