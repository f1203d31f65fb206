"""`skewless timesync`: run the time-sync server alone."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from skewless.cli_common import DURATION_BARE_S, SIGNED_DURATION_BARE_US, finite_float
from timesync.estimator import DEFAULT_BURST_SIZE
from timesync.responder import ResponderConfig
from timesync.server import DEFAULT_PORT, ServerConfig
from timesync.standalone import run_server, run_with_uvloop

__all__ = ["load_keys", "register"]


def load_keys(path: Path) -> dict[str, bytes]:
    """Read ``source_id = hex-key`` lines (``#`` comments allowed)."""
    keys: dict[str, bytes] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        source_id, sep, hex_key = (part.strip() for part in line.partition("="))
        if not sep or not source_id or not hex_key:
            raise typer.BadParameter(f"{path}:{lineno}: expected 'source_id = hexkey'", param_hint="'--keys-file'")
        try:
            keys[source_id] = bytes.fromhex(hex_key)
        except ValueError:
            raise typer.BadParameter(f"{path}:{lineno}: key is not hex", param_hint="'--keys-file'") from None
    return keys


def _ref_id(text: str) -> bytes:
    """1 to 4 ASCII characters (NTP's reference id field is 4 bytes): refused, not truncated."""
    if not 1 <= len(text) <= 4 or not text.isascii():
        raise typer.BadParameter(f"{text!r} must be 1 to 4 ASCII characters (e.g. XSKW, GPS)",
                                 param_hint="'--ref-id'")
    return text.encode("ascii").ljust(4, b"\x00")


# The options of `skewless timesync`, one alias each, so the command's signature reads as its option list.
_Host = Annotated[str, typer.Option(help="Address to bind ('::' for dual stack).")]
_Port = Annotated[int, typer.Option(min=0, max=65535, help="UDP port (123 needs root; 0 = any free port).")]
_ClockOffsetUs = Annotated[int, typer.Option(
    metavar="DURATION", parser=SIGNED_DURATION_BARE_US, show_default="0",
    help="Shift the reference clock by this much, e.g. 250ms or -1.5s: it reads the system clock plus this "
         "(positive: ahead); a bare number is microseconds (demos).")]
_ClockSkewPpm = Annotated[float, typer.Option(
    callback=finite_float(), help="Let the reference clock run this many ppm fast (demos, benchmarks).")]
_Stratum = Annotated[int, typer.Option(min=1, max=15, help="Stratum advertised in replies.")]
_RefId = Annotated[str, typer.Option(help="Reference id, 1 to 4 ASCII characters.")]
_BurstSize = Annotated[int, typer.Option(min=1, help="Most samples per sync burst.")]
_RateLimit = Annotated[float, typer.Option(
    callback=finite_float(at_least=0), help="Requests per second per address (0 disables).")]
_RateBurst = Annotated[int, typer.Option(min=1, help="Rate-limit burst size.")]
_KeysFile = Annotated[Path | None, typer.Option(
    help="'source_id = hexkey' lines; enables HMAC source authentication.", exists=True, dir_okay=False)]
_Upstream = Annotated[list[str] | None, typer.Option(
    help="Discipline the reference clock against this NTP server.")]
_UpstreamIntervalUs = Annotated[int, typer.Option(
    "--upstream-interval-s", metavar="DURATION", parser=DURATION_BARE_S, show_default="64s",
    help="Upstream poll interval; a bare number is seconds.")]
_KernelTimestamps = Annotated[bool, typer.Option(help="Use SO_TIMESTAMPNS receive timestamps for T2.")]
_StatsIntervalUs = Annotated[int, typer.Option(
    "--stats-interval-s", metavar="DURATION", parser=DURATION_BARE_S, show_default="0",
    help="Print JSON stats this often (0: at exit); a bare number is seconds.")]
_DurationUs = Annotated[int, typer.Option(
    "--duration-s", metavar="DURATION", parser=DURATION_BARE_S, show_default="0",
    help="Stop after this long (0: run forever); a bare number is seconds.")]


def timesync_command(
    host: _Host = "0.0.0.0",
    port: _Port = DEFAULT_PORT,
    clock_offset_us: _ClockOffsetUs = 0,
    clock_skew_ppm: _ClockSkewPpm = 0.0,
    stratum: _Stratum = 1,
    ref_id: _RefId = "XSKW",
    burst_size: _BurstSize = DEFAULT_BURST_SIZE,
    rate_limit: _RateLimit = 64.0,
    rate_burst: _RateBurst = 128,
    keys_file: _KeysFile = None,
    upstream: _Upstream = None,
    upstream_interval_us: _UpstreamIntervalUs = 64_000_000,
    kernel_timestamps: _KernelTimestamps = True,
    stats_interval_us: _StatsIntervalUs = 0,
    duration_us: _DurationUs = 0,
) -> None:
    """Run the NTP-compatible time-sync server on its own (the gateway command runs it too)."""
    ref_bytes = _ref_id(ref_id)
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
        upstream_interval_s=upstream_interval_us / 1e6,
    )
    with contextlib.suppress(KeyboardInterrupt):
        run_with_uvloop(run_server(config, stats_interval_us / 1e6, duration_us / 1e6))


def register(app: typer.Typer) -> None:
    app.command("timesync")(timesync_command)
