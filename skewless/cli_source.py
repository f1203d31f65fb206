"""`skewless source ...`: replay a recorded trace as live event sources through the SDK.

The plan (which event leaves when, with which timestamps) is computed up front by the pure :func:`plan_replay`;
the asyncio part only sleeps until each send time and calls ``SkewlessClient.send``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.cli import CommandError
from clients.client import SkewlessClient
from clients.core import Backoff
from contract.topics import InvalidStreamName, validate_stream_name
from contract.wire.messages import SEQ_CONFLICT
from gateway.logs import quiet_unless_chosen
from reorder.eval.progress import progress_bar, progress_enabled
from reorder.eval.traces import TraceEvent, read_trace
from skewless.cli_common import DURATION_BARE_MS, DURATION_BARE_US, SIGNED_DURATION_BARE_US, finite_float
from timesync.clocks import MAX_SKEW_PPM, SimulatedClock, system_time_us

__all__ = [
    "PlannedSend",
    "ReplayRepeated",
    "ReplaySummary",
    "SourceReplayOptions",
    "plan_replay",
    "register",
    "replay_trace",
]

source_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Run event sources through the SDK (trace replay).")


@dataclass(frozen=True, slots=True)
class SourceReplayOptions:
    """How to turn a trace into live sources. Clocks follow ``SimulatedClock``: ``ahead_us`` is how far a source
    clock reads ahead of its base (its ``offset_us``, in the one sign of timesync.clocks, is ``-ahead_us``)."""

    speed: float = 1.0
    ahead_us: int = 0
    ahead_spread_us: int = 0
    skew_ppm: float = 0.0
    skew_spread_ppm: float = 0.0
    jitter_us: int = 0
    keep_seqs: bool = True
    sources: tuple[str, ...] = ()
    limit: int | None = None
    seed: int = 0
    source_suffix: str = ""
    """Appended to every source id on the wire: a repeat of a replay under fresh ids (the gateway keeps each
    source's seqs, and refuses a seq it already has)."""


class ReplayRepeated(Exception):
    """The gateway already has an event of this source and stream at this seq: the trace was replayed to it
    before. Replaying stops at once (every further event would be refused the same way)."""

    def __init__(self, source_id: str, stream: str, seq: int) -> None:
        super().__init__(f"the gateway already has source {source_id!r} stream {stream!r} seq {seq} (this trace "
                         f"was replayed to it before); replay under fresh source ids with --source-suffix TEXT "
                         f"(e.g. --source-suffix -2)")
        self.source_id = source_id
        self.stream = stream
        self.seq = seq


@dataclass(frozen=True, slots=True)
class PlannedSend:
    at_s: float
    """Seconds after the replay starts."""
    source_id: str
    stream: str
    seq: int | None
    source_ts_us: int
    payload: Any


def source_clocks(source_ids: Sequence[str], options: SourceReplayOptions, start_us: int,
                  base: Any = system_time_us) -> dict[str, SimulatedClock]:
    """One simulated clock per source: the common ahead/skew plus a seeded per-source spread."""
    rng = random.Random(options.seed)
    clocks: dict[str, SimulatedClock] = {}
    for source_id in sorted(source_ids):
        ahead_us = options.ahead_us + (rng.randint(-options.ahead_spread_us, options.ahead_spread_us)
                                       if options.ahead_spread_us else 0)
        skew = options.skew_ppm + (rng.uniform(-options.skew_spread_ppm, options.skew_spread_ppm)
                                   if options.skew_spread_ppm else 0.0)
        skew = max(-MAX_SKEW_PPM, min(MAX_SKEW_PPM, skew))
        clocks[source_id] = SimulatedClock(ahead_us, skew, base=base, origin_us=start_us)
    return clocks


def plan_replay(events: Sequence[TraceEvent], options: SourceReplayOptions, start_us: int,
                clocks: dict[str, SimulatedClock]) -> list[PlannedSend]:
    """Every send of the replay, in send order (pure).

    The trace's timeline is rebased so that its first instant is ``start_us`` on the wall clock and compressed by
    ``speed``. An event leaves at its (scaled) ``arrival_ts_us`` plus a uniform random jitter in
    ``[0, jitter_us]`` (jitter reorders events whose gaps are smaller). Its ``source_ts_us`` is what the source's
    simulated clock read at the event's (scaled) true time, plus the trace's own clock error
    (``source_ts_us - true_ts_us`` in the trace). With ``keep_seqs`` the trace's seqs travel as recorded (the
    gateway sees the trace's disorder); otherwise the SDK numbers events in send order.
    """
    if options.speed <= 0:
        raise ValueError("speed must be > 0")
    selected = [e for e in events if not options.sources or e.source_id in options.sources]
    selected.sort(key=lambda e: (e.arrival_ts_us, e.source_id, e.stream, e.seq))
    if options.limit is not None:
        selected = selected[:options.limit]
    if not selected:
        return []
    t0 = min(selected[0].arrival_ts_us, *(e.true_ts_us for e in selected))
    rng = random.Random(options.seed + 1)
    plan: list[PlannedSend] = []
    for event in selected:
        at_s = (event.arrival_ts_us - t0) / options.speed / 1e6
        if options.jitter_us:
            at_s += rng.uniform(0, options.jitter_us) / 1e6
        true_wall_us = start_us + round((event.true_ts_us - t0) / options.speed)
        clock = clocks[event.source_id]
        source_ts_us = max(0, clock.at(true_wall_us) + (event.source_ts_us - event.true_ts_us))
        plan.append(PlannedSend(at_s, event.source_id, event.stream, event.seq if options.keep_seqs else None,
                                source_ts_us, event.payload))
    plan.sort(key=lambda p: p.at_s)
    return plan


@dataclass
class ReplaySummary:
    events: int
    sources: int
    duration_s: float
    planned_s: float
    max_lag_s: float
    acked: int
    given_up: int
    reconnects: int
    resent: int

    def line(self) -> str:
        rate = self.events / self.duration_s if self.duration_s > 0 else 0.0
        return (f"replayed {self.events} events from {self.sources} sources in {self.duration_s:.2f} s "
                f"(planned {self.planned_s:.2f} s, max lag {self.max_lag_s * 1e3:.1f} ms, {rate:,.0f} events/s); "
                f"acked {self.acked}, given up by the gateway {self.given_up} (sent once for the late topic), "
                f"reconnects {self.reconnects}, resent {self.resent}")


def _not_a_seq_conflict(record: logging.LogRecord) -> bool:
    """The SDK logs each refused event; a replay stops at the first seq_conflict and says it in one line."""
    return not (record.name.startswith("clients") and f"({SEQ_CONFLICT})" in record.getMessage())


def _given_up(client: SkewlessClient, send: PlannedSend) -> bool:
    return any(g.stream == send.stream and g.first_seq <= (send.seq or 0) <= g.last_seq for g in client.gaps)


def _repeated(client: SkewlessClient) -> ReplayRepeated:
    conflict = next(r for r in client.refused if r.code == SEQ_CONFLICT)
    return ReplayRepeated(client.source_id, conflict.stream, conflict.seq)


async def replay_trace(events: Sequence[TraceEvent], host: str, port: int, options: SourceReplayOptions, *,
                       timesync_port: int | None = None, time_sync: bool = True, sync_attempts: int = 10,
                       pool_size: int = 1,
                       batch_events: int = 50, linger_s: float = 0.002, token: str | None = None,
                       hmac_secret: bytes | None = None, flush_timeout_s: float = 60.0,
                       progress: bool = False) -> ReplaySummary:
    """Replay ``events`` against a gateway: one ``SkewlessClient`` per source, paced by the plan."""
    start_us = system_time_us()
    selected_sources = sorted({e.source_id for e in events if not options.sources or e.source_id in options.sources})
    clocks = source_clocks(selected_sources, options, start_us)
    plan = plan_replay(events, options, start_us, clocks)
    streams: dict[str, list[str]] = {}
    for p in plan:
        if p.stream not in streams.setdefault(p.source_id, []):
            streams[p.source_id].append(p.stream)
    clients = {source_id: SkewlessClient(host, port, source_id + options.source_suffix, source_streams,
                                         time_sync=time_sync,
                                         udp_port=timesync_port,
                                         sync_attempts=sync_attempts, clock_us=clocks[source_id],
                                         pool_size=pool_size, batch_events=batch_events, linger_s=linger_s,
                                         token=token, hmac_secret=hmac_secret, backoff=Backoff(max_s=2.0))
               for source_id, source_streams in streams.items()}
    await asyncio.gather(*(c.connect() for c in clients.values()))
    loop = asyncio.get_running_loop()
    max_lag = 0.0
    started = loop.time()
    wall_started = time.perf_counter()
    try:
        with progress_bar("replay", len(plan), enabled=progress) as advance:
            for p in plan:
                delay = started + p.at_s - loop.time()
                if delay > 0.001:
                    await asyncio.sleep(delay)
                else:
                    max_lag = max(max_lag, -delay)
                    # Behind the plan: still let the clients' writers and readers run, or one source's queue
                    # goes out in one go later while the others are silent (issue 25 item 9).
                    await asyncio.sleep(0)
                client = clients[p.source_id]
                if p.seq is not None and p.seq <= client.acked_through(p.stream) and not _given_up(client, p):
                    # The gateway acknowledged this seq before we sent it: an earlier run's event (unless its ack
                    # passed it as a given-up gap: a trace's late arrival, sent now for the late topic).
                    raise ReplayRepeated(client.source_id, p.stream, p.seq)
                if client.stats.conflicts:
                    raise _repeated(client)
                await client.send(p.stream, p.payload, p.source_ts_us, seq=p.seq)
                advance()
            await asyncio.gather(*(c.flush(flush_timeout_s) for c in clients.values()))
            for client in clients.values():
                if client.stats.conflicts:
                    raise _repeated(client)
    finally:
        await asyncio.gather(*(c.close() for c in clients.values()))
    return ReplaySummary(
        events=len(plan), sources=len(clients), duration_s=time.perf_counter() - wall_started,
        planned_s=plan[-1].at_s if plan else 0.0, max_lag_s=max_lag,
        acked=sum(c.stats.events_acked for c in clients.values()),
        given_up=sum(c.stats.events_given_up for c in clients.values()),
        reconnects=sum(c.stats.reconnects for c in clients.values()),
        resent=sum(c.stats.events_resent for c in clients.values()))


# The options of `skewless source replay`, one alias each, so the command's signature reads as its option list.
_Trace = Annotated[Path, typer.Argument(help="JSON Lines trace (docs/traces.md): source_id, stream, seq, "
                                             "true_ts_us, source_ts_us, arrival_ts_us, optional payload.",
                                        exists=True, dir_okay=False)]
_Host = Annotated[str, typer.Option(help="Gateway host.")]
_Port = Annotated[int, typer.Option(min=1, max=65535, help="Gateway TCP port.")]
_TimesyncPort = Annotated[int | None, typer.Option(
    min=1, max=65535, help="Time-sync UDP port if the gateway announces none (it announces its own in welcome).")]
_Timesync = Annotated[bool, typer.Option(
    "--timesync/--no-timesync", help="Sync each source's clock with the gateway (--no-timesync: never).")]
_UdpPort = Annotated[int | None, typer.Option(hidden=True, help="Deprecated spelling of --timesync-port.")]
_SyncAttempts = Annotated[int, typer.Option(min=1, help="Requests per time-sync burst.")]
_Speed = Annotated[float, typer.Option(
    callback=finite_float(above=0, meaning="2 plays the trace twice as fast"),
    help="Replay speed factor: 2 plays the trace twice as fast (its timeline is compressed, timestamps included).")]
_Source = Annotated[list[str] | None, typer.Option("--source", help="Replay only this source (repeatable).")]
_Limit = Annotated[int | None, typer.Option(min=0, help="Replay at most this many events (first by arrival).")]
_AheadUs = Annotated[int, typer.Option(
    "--ahead-us", "--offset-us", metavar="DURATION", parser=SIGNED_DURATION_BARE_US, show_default="0",
    help="How far every source clock reads ahead of the system clock, e.g. 250ms or -1.5s (negative = behind); a "
         "bare number is microseconds. --offset-us is a deprecated spelling of it.")]
_AheadSpreadUs = Annotated[int, typer.Option(
    "--ahead-spread-us", "--offset-spread-us", metavar="DURATION", parser=DURATION_BARE_US, show_default="0",
    help="Plus a per-source amount ahead, uniform in ±this; a bare number is microseconds. --offset-spread-us is a "
         "deprecated spelling of it.")]
_SkewPpm = Annotated[float, typer.Option(callback=finite_float(), help="Clock skew injected into every source (ppm).")]
_SkewSpreadPpm = Annotated[float, typer.Option(callback=finite_float(at_least=0),
                                               help="Plus a per-source uniform skew in ±this (ppm).")]
_JitterUs = Annotated[int, typer.Option(
    metavar="DURATION", parser=DURATION_BARE_US, show_default="0",
    help="Extra send delay per event, uniform in [0, this] (reorders close events); a bare number is microseconds.")]
_Pool = Annotated[int, typer.Option(min=1, help="TCP connections per source; batches interleave round-robin.")]
_BatchEvents = Annotated[int, typer.Option(min=1, help="Events per frame at most.")]
_LingerUs = Annotated[int, typer.Option(
    "--linger-ms", metavar="DURATION", parser=DURATION_BARE_MS, show_default="2",
    help="How long a partial batch waits for more events; a bare number is milliseconds.")]
_KeepSeqs = Annotated[bool, typer.Option(help="Send the trace's seqs (the gateway sees its disorder); "
                                              "--no-keep-seqs lets the SDK number events in send order.")]
_Token = Annotated[str | None, typer.Option(help="Static token for the hello (env SKEWLESS_TOKEN).",
                                            envvar="SKEWLESS_TOKEN", show_envvar=False)]
_HmacSecret = Annotated[str | None, typer.Option(help="Sign HMAC tokens with this secret (env SKEWLESS_HMAC_SECRET).",
                                                 envvar="SKEWLESS_HMAC_SECRET", show_envvar=False)]
_Seed = Annotated[int, typer.Option(help="Seed of the per-source spreads and the jitter.")]
_SourceSuffix = Annotated[str, typer.Option(
    metavar="TEXT", help="Append this to every source id, e.g. -2: replay a trace again to a gateway that already "
                         "has it (it keeps each source's seqs and refuses seqs it has).")]
_Progress = Annotated[bool, typer.Option(help="Show a progress bar on stderr (only when stderr is a terminal).")]


@source_app.command("replay")
def replay(
    trace: _Trace,
    host: _Host = "127.0.0.1",
    port: _Port = 7700,
    timesync_port: _TimesyncPort = None,
    timesync: _Timesync = True,
    udp_port: _UdpPort = None,
    sync_attempts: _SyncAttempts = 10,
    speed: _Speed = 1.0,
    source: _Source = None,
    limit: _Limit = None,
    ahead_us: _AheadUs = 0,
    ahead_spread_us: _AheadSpreadUs = 0,
    skew_ppm: _SkewPpm = 0.0,
    skew_spread_ppm: _SkewSpreadPpm = 0.0,
    jitter_us: _JitterUs = 0,
    pool: _Pool = 1,
    batch_events: _BatchEvents = 50,
    linger_us: _LingerUs = 2_000,
    keep_seqs: _KeepSeqs = True,
    token: _Token = None,
    hmac_secret: _HmacSecret = None,
    seed: _Seed = 0,
    source_suffix: _SourceSuffix = "",
    progress: _Progress = True,
) -> None:
    """Replay a trace as live sources (one SDK client per source_id) in arrival order, paced in real time.

    Each source gets a simulated clock (ahead, skew) and syncs it with the gateway (at the time-sync port the
    gateway announces, else --timesync-port) unless --no-timesync.

    Events keep the trace's disorder, plus jitter and pool interleaving; a summary follows the last ack.
    """
    # The SDK logs every failed connect at INFO; the summary or the one error line say it for a replay.
    quiet_unless_chosen("clients")
    events = _read_named_trace(trace)
    options = SourceReplayOptions(speed=speed, ahead_us=ahead_us, ahead_spread_us=ahead_spread_us,
                                  skew_ppm=skew_ppm, skew_spread_ppm=skew_spread_ppm, jitter_us=jitter_us,
                                  keep_seqs=keep_seqs, sources=tuple(source or ()), limit=limit, seed=seed,
                                  source_suffix=source_suffix)
    summary = _replay_or_say_why(events, host, port, options, timesync_port=(
        timesync_port if timesync_port is not None else udp_port), time_sync=timesync, sync_attempts=sync_attempts,
        pool_size=pool, batch_events=batch_events, linger_s=linger_us / 1e6, token=token,
        hmac_secret=hmac_secret.encode() if hmac_secret else None, progress=progress_enabled(progress))
    typer.echo(summary.line())


def _read_named_trace(trace: Path) -> list[TraceEvent]:
    """The trace's events, or one line saying why the file is not a trace or which stream name is invalid."""
    try:
        events = read_trace(trace)
    except ValueError as exc:  # orjson's decode error is a ValueError too
        raise typer.BadParameter(f"{trace} is not a JSON Lines trace: {exc} (docs/traces.md)",
                                 param_hint="'TRACE'") from None
    for event in events:
        try:
            validate_stream_name(event.stream)
        except InvalidStreamName as exc:
            raise typer.BadParameter(f"{trace}: {exc}", param_hint="'TRACE'") from None
    return events


def _replay_or_say_why(events: Sequence[TraceEvent], host: str, port: int, options: SourceReplayOptions,
                       **client: Any) -> ReplaySummary:
    """:func:`replay_trace` (``client``: its keyword arguments), a repeat or an unreachable gateway in one line."""
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(_not_a_seq_conflict)
    try:
        return asyncio.run(replay_trace(events, host, port, options, **client))
    except ReplayRepeated as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot reach the gateway at {host}:{port} ({exc.strerror or exc}); start it with "
                           f"`skewless gateway`, or pass its --host and --port") from None
    finally:
        for handler in handlers:
            handler.removeFilter(_not_a_seq_conflict)


def register(app: typer.Typer) -> None:
    app.add_typer(source_app, name="source")
