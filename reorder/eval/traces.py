"""Replay traces: the JSON Lines format (docs/traces.md) and a seeded DEBS-2013-like generator.

One event per line::

    {"source_id": "s0", "stream": "sensors", "seq": 0, "true_ts_us": 0, "source_ts_us": 0,
     "arrival_ts_us": 500, "payload": {"sid": 4, "ts": 0, "x": ..., "v": ...}}

``true_ts_us``: when it really happened, on the reference clock.  ``source_ts_us``: what the source's
clock said (``= true_ts_us`` unless the source drifts).  ``arrival_ts_us``: when it reached the gateway.
Lines may be in any order; ``seq`` is per (source_id, stream) and follows the source's clock.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import orjson

__all__ = [
    "MULTI_SOURCE_SPECS",
    "PROFILES",
    "Burst",
    "DisorderProfile",
    "TraceEvent",
    "TraceFormatError",
    "TraceSpec",
    "generate",
    "read_trace",
    "write_trace",
]


class TraceEvent(NamedTuple):
    source_id: str
    stream: str
    seq: int
    true_ts_us: int
    source_ts_us: int
    arrival_ts_us: int
    payload: dict[str, int] | None = None


class TraceFormatError(ValueError):
    """A trace line that is not a valid event; the message names the line."""


_FIELDS = ("source_id", "stream", "seq", "true_ts_us", "source_ts_us", "arrival_ts_us")


def _parse(line: bytes, lineno: int) -> TraceEvent:
    obj = orjson.loads(line)
    if not isinstance(obj, dict):
        raise TraceFormatError(f"line {lineno}: not a JSON object")
    try:
        values = [obj[k] for k in _FIELDS]
    except KeyError as exc:
        raise TraceFormatError(f"line {lineno}: missing field {exc.args[0]!r}") from None
    if not isinstance(values[0], str) or not isinstance(values[1], str):
        raise TraceFormatError(f"line {lineno}: source_id and stream must be strings")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values[2:]):
        raise TraceFormatError(f"line {lineno}: seq and *_ts_us must be integers")
    payload = obj.get("payload")
    return TraceEvent(values[0], values[1], values[2], values[3], values[4], values[5], payload)


def read_trace(path: Path) -> list[TraceEvent]:
    """Read a JSON Lines trace; blank lines are skipped, malformed ones raise ValueError with the line."""
    events: list[TraceEvent] = []
    with path.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                events.append(_parse(line, lineno))
    return events


def write_trace(path: Path, events: Iterable[TraceEvent]) -> int:
    n = 0
    with path.open("wb") as fh:
        for e in events:
            obj: dict[str, object] = dict(zip(_FIELDS, e[:6], strict=True))
            if e.payload is not None:
                obj["payload"] = e.payload
            fh.write(orjson.dumps(obj) + b"\n")
            n += 1
    return n


# -- generator -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Burst:
    """A short episode in which ``events`` events get a huge extra delay."""

    at_fraction: float
    events: int
    min_delay_us: int
    max_delay_us: int
    span_us: int = 20_000


@dataclass(frozen=True, slots=True)
class DisorderProfile:
    """Network disorder of one source, on top of a constant ``base_delay_us``.

    * with probability ``ooo_probability`` an event gets an exponential extra delay whose mean drifts
      slowly between ``small_mean_us`` bounds (the thesis' "average late inter-arrival time");
    * with probability ``tail_probability`` a log-uniform extra delay in ``tail_us`` (heavy tail);
    * ``bursts``: rare, huge delays (Dataset 1's two peaks of 750-1000 ms);
    * ``connections`` > 1: round-robin over a TCP connection pool, each connection FIFO with its own
      mean-reverting jitter and rare stalls (head-of-line blocking);
    * ``uplink_stall_probability``: rare stalls of the source's whole uplink (heavy-tailed, log-uniform).
    """

    name: str
    ooo_probability: float = 0.0
    small_mean_us: tuple[int, int] = (100, 300)
    tail_probability: float = 0.0
    tail_us: tuple[int, int] = (10_000, 2_000_000)
    bursts: tuple[Burst, ...] = ()
    base_delay_us: int = 500
    connections: int = 1
    connection_jitter_us: int = 300
    stall_probability: float = 0.0
    stall_us: tuple[int, int] = (5_000, 50_000)
    uplink_stall_probability: float = 0.0
    uplink_stall_us: tuple[int, int] = (10_000, 500_000)
    """With this probability per event the source's whole uplink stalls for a log-uniform time in ``uplink_stall_us``
    from that event on: it and every event sent during the stall arrive at its end at the earliest, in order. No gap
    shows at the gateway, the source just goes silent: only the merge can wait for it."""
    description: str = ""


PROFILES: dict[str, DisorderProfile] = {
    "dataset1": DisorderProfile(
        "dataset1",
        ooo_probability=0.19,
        small_mean_us=(100, 300),
        bursts=(Burst(0.35, 3, 750_000, 1_000_000), Burst(0.7, 3, 750_000, 1_000_000)),
        description="~12% out of order by 0.1-0.3 ms on average; two bursts with 750-1000 ms delays",
    ),
    "dataset2": DisorderProfile(
        "dataset2",
        ooo_probability=0.15,
        small_mean_us=(300, 900),
        tail_probability=0.0002,
        tail_us=(2_000, 1_900_000),
        description="wider: ~12% out of order, mean < 1 ms, a thin tail up to ~1.9 s",
    ),
    "dataset3": DisorderProfile(
        "dataset3",
        ooo_probability=0.09,
        small_mean_us=(1_000, 7_000),
        tail_probability=0.0001,
        tail_us=(100_000, 30_000_000),
        description="~8% out of order, mean 1-7 ms, rare delays up to 30 s",
    ),
    "heavytail": DisorderProfile(
        "heavytail",
        ooo_probability=0.10,
        small_mean_us=(100, 300),
        tail_probability=0.03,
        tail_us=(10_000, 2_000_000),
        description="3% of events delayed log-uniformly by 10 ms-2 s on top of dataset1's small disorder",
    ),
    "pool": DisorderProfile(
        "pool",
        connections=4,
        connection_jitter_us=60,
        stall_probability=0.0002,
        description="no injected delays: 4 pooled TCP connections with jitter and rare 5-50 ms stalls",
    ),
}

# Multi-source profiles (issue 12 item 7): sources whose whole uplink stalls now and then, heavy-tailed. No gap shows
# at the gateway, so only the merge can wait for them; their clocks disagree by up to 120 ms (time sync maps them).
PROFILES["multitail"] = DisorderProfile(
    "multitail",
    ooo_probability=0.10,
    small_mean_us=(1_000, 5_000),
    tail_probability=0.001,
    tail_us=(10_000, 500_000),
    uplink_stall_probability=0.0003,
    uplink_stall_us=(10_000, 500_000),
    description="10% out of order by 1-5 ms, 0.1% delayed 10-500 ms, uplink stalls of 10-500 ms: ~3.5% delayed > 10 ms",
)
PROFILES["multistall"] = DisorderProfile(
    "multistall",
    connections=4,
    connection_jitter_us=300,
    stall_probability=0.0005,
    stall_us=(5_000, 50_000),
    uplink_stall_probability=0.0005,
    uplink_stall_us=(10_000, 500_000),
    description="4 pooled connections with 5-50 ms stalls, uplink stalls of 10-500 ms: ~4% delayed > 10 ms",
)

# DEBS 2013: one ball in play at 2000 Hz (4 ball sensors rotate; we keep four), 16 players x 2 legs
# + 2 goalkeepers x 2 hands at 200 Hz: 4*2000 + 36*200 = 15,200 events/s.
_BALL_SIDS = (4, 8, 10, 12)
_PLAYER_SIDS = tuple(range(13, 49))
_BALL_PERIOD_US = 500
_PLAYER_PERIOD_US = 5_000


@dataclass(frozen=True, slots=True)
class TraceSpec:
    profile: DisorderProfile
    events_per_source: int = 100_000
    sources: int = 1
    seed: int = 1
    source_shift_us: int = 3_000
    """Section 5.1.2: source k publishes the same data k * 3 ms later."""
    same_disorder: bool = True
    """Section 5.1.2 replays one dataset per source, so every source shares one delay pattern."""
    ahead_us: int = 0
    """How far the clock of every source but the first reads ahead (the thesis' drift, section 5.1.3):
    ``source_ts = true_ts + ahead + skew * true_ts``; its ``offset_us`` (``t_ref = t_source + offset_us``) is
    ``-ahead_us``."""
    skew_ppm: float = 0.0
    """Source k (k >= 1) runs ``k * skew_ppm`` fast."""
    per_source_ahead_us: tuple[int, ...] = ()
    """How far the clock of source k reads ahead, for the sources it lists (it replaces ``ahead_us`` for them):
    several sources whose clocks disagree by different amounts, as unsynchronised devices do."""
    time_scale: int = 1
    """Every reading's true time is multiplied by this: 30 turns the 15,200 events/s DEBS feed into a 507 events/s
    source, so a delay of half a second is overtaken by hundreds of events, not by seven thousand."""
    stream: str = "sensors"
    payload: bool = True
    extra: dict[str, int] = field(default_factory=dict)


#: The multi-source traces of the replay benchmark: 507 events/s per source (DEBS x 1/30), independent disorder.
MULTI_SOURCE_SPECS: dict[str, TraceSpec] = {
    # the trace of issue 12 item 7: 5 sources, 25,000 events, clocks up to 120 ms ahead or behind
    "multitail": TraceSpec(PROFILES["multitail"], events_per_source=5_000, sources=5, same_disorder=False,
                           per_source_ahead_us=(0, 120_000, -75_000, 40_000, -110_000), time_scale=30,
                           payload=False),
    "multistall": TraceSpec(PROFILES["multistall"], events_per_source=3_000, sources=10, same_disorder=False,
                            per_source_ahead_us=(0, 50_000, -30_000, 20_000, -45_000, 10_000, 35_000, -15_000,
                                                 5_000, -50_000),
                            time_scale=30, payload=False),
}  # fmt: skip


def _sensor_times(n: int, rng: random.Random) -> list[tuple[int, int]]:
    """(true_ts_us, sid) of the first ``n`` sensor readings, in time order."""
    duration_us = int(n / 15_200 * 1_000_000) + 10_000
    out: list[tuple[int, int]] = []
    for sid in _BALL_SIDS:
        out += [(t, sid) for t in range(rng.randrange(_BALL_PERIOD_US), duration_us, _BALL_PERIOD_US)]
    for sid in _PLAYER_SIDS:
        out += [(t, sid) for t in range(rng.randrange(_PLAYER_PERIOD_US), duration_us, _PLAYER_PERIOD_US)]
    out.sort()
    return out[:n]


def _payload(ts_us: int, sid: int) -> dict[str, int]:
    # smooth, deterministic motion; units as DEBS: mm, um/s, um/s^2, ts in picoseconds
    w = 0.3 + sid * 0.01
    t = ts_us / 1e6
    x = int(26_000 * math.sin(w * t + sid))
    y = int(16_000 * math.cos(0.7 * w * t + sid))
    v = int(abs(4_000_000 * math.sin(1.3 * w * t + sid)) + 100_000)
    a = int(abs(9_000_000 * math.cos(2.1 * w * t)))
    return {
        "sid": sid, "ts": ts_us * 1_000_000, "x": x, "y": y, "z": 200 if sid in _BALL_SIDS else 0,
        "v": v, "a": a, "vx": int(10_000 * math.cos(w * t)), "vy": int(10_000 * math.sin(w * t)), "vz": 0,
        "ax": int(10_000 * math.sin(2 * w * t)), "ay": int(10_000 * math.cos(2 * w * t)), "az": 0,
    }  # fmt: skip


def _extra_delays(times: list[int], profile: DisorderProfile, rng: random.Random) -> list[int]:
    """Extra network delay of each event (same length as ``times``)."""
    n = len(times)
    duration = max(times[-1] - times[0], 1) if n else 1
    lo, hi = profile.small_mean_us
    extra = [0] * n
    p_small = profile.ooo_probability
    p_tail = profile.tail_probability
    t_lo, t_hi = math.log(profile.tail_us[0]), math.log(profile.tail_us[1])
    for i, t in enumerate(times):
        r = rng.random()
        if r < p_tail:
            extra[i] = int(math.exp(rng.uniform(t_lo, t_hi)))
        elif r < p_tail + p_small:
            phase = (t - times[0]) / duration
            mean = lo + (hi - lo) * (0.5 - 0.5 * math.cos(6 * math.pi * phase))
            extra[i] = int(rng.expovariate(1.0 / mean)) + 1
    for burst in profile.bursts:
        centre = times[0] + int(burst.at_fraction * duration)
        window = [i for i, t in enumerate(times) if abs(t - centre) <= burst.span_us // 2]
        for i in rng.sample(window, min(burst.events, len(window))):
            extra[i] = rng.randint(burst.min_delay_us, burst.max_delay_us)
    return extra


def _pooled_arrivals(times: list[int], extra: list[int], profile: DisorderProfile, rng: random.Random) -> list[int]:
    """Arrival times through the connection pool (FIFO per connection) or directly."""
    base = profile.base_delay_us
    k = profile.connections
    if k <= 1:
        return [t + base + x for t, x in zip(times, extra, strict=True)]
    jitter = [0.0] * k
    last = [0] * k
    sigma = profile.connection_jitter_us / 4
    arrivals = []
    for i, (t, x) in enumerate(zip(times, extra, strict=True)):
        c = i % k
        jitter[c] = max(0.0, 0.995 * jitter[c] + rng.gauss(0.0, sigma))
        delay = base + x + int(jitter[c])
        if profile.stall_probability and rng.random() < profile.stall_probability:
            delay += rng.randint(*profile.stall_us)
        last[c] = max(last[c], t + delay)  # TCP delivers in order on one connection
        arrivals.append(last[c])
    return arrivals


def _uplink_stalls(times: list[int], arrivals: list[int], profile: DisorderProfile, rng: random.Random) -> list[int]:
    """Arrival times with the source's uplink stalls applied (every event sent during a stall waits for its end)."""
    p = profile.uplink_stall_probability
    if not p:
        return arrivals
    lo, hi = math.log(profile.uplink_stall_us[0]), math.log(profile.uplink_stall_us[1])
    out = list(arrivals)
    stall_end = -1  # send time up to which the uplink is stalled
    release = 0  # when the stalled uplink delivers
    for i, t in enumerate(times):
        if t > stall_end and rng.random() < p:
            duration = int(math.exp(rng.uniform(lo, hi)))
            stall_end = t + duration
            release = arrivals[i] + duration
        if t <= stall_end:
            out[i] = max(out[i], release)
    return out


def generate(spec: TraceSpec) -> list[TraceEvent]:
    """Build the trace in memory, in arrival order (ties by source and seq).  Same spec, same trace."""
    rng = random.Random(spec.seed)
    readings = _sensor_times(spec.events_per_source, rng)
    if spec.time_scale != 1:
        readings = [(t * spec.time_scale, sensor) for t, sensor in readings]
    times = [t for t, _ in readings]
    shared = _extra_delays(times, spec.profile, rng) if spec.same_disorder else None
    shared_arrivals = _pooled_arrivals(times, shared, spec.profile, rng) if shared is not None else None
    if shared_arrivals is not None:
        shared_arrivals = _uplink_stalls(times, shared_arrivals, spec.profile, rng)
    events: list[TraceEvent] = []
    for k in range(spec.sources):
        src_rng = random.Random(f"{spec.seed}/{k}")
        if shared_arrivals is None:
            arrivals = _pooled_arrivals(times, _extra_delays(times, spec.profile, src_rng), spec.profile, src_rng)
            arrivals = _uplink_stalls(times, arrivals, spec.profile, src_rng)
        else:
            arrivals = shared_arrivals
        shift = k * spec.source_shift_us
        ahead = spec.per_source_ahead_us[k] if k < len(spec.per_source_ahead_us) else spec.ahead_us if k >= 1 else 0
        rate = k * spec.skew_ppm * 1e-6
        sid = f"s{k}"
        for seq, ((t, sensor), arr) in enumerate(zip(readings, arrivals, strict=True)):
            true_ts = t + shift
            source_ts = true_ts + ahead + int(rate * true_ts)
            payload = _payload(t, sensor) if spec.payload else {"sid": sensor, "v": 100_000 + (t * 7919) % 4_000_000}
            events.append(TraceEvent(sid, spec.stream, seq, true_ts, source_ts, arr + shift, payload))
    events.sort(key=lambda e: (e.arrival_ts_us, e.source_id, e.seq))
    return events


def with_profile(name: str, **overrides: object) -> DisorderProfile:
    """A named profile with some fields replaced."""
    return replace(PROFILES[name], **overrides)  # type: ignore[arg-type]


def iter_sources(events: Iterable[TraceEvent]) -> Iterator[str]:
    seen: set[str] = set()
    for e in events:
        if e.source_id not in seen:
            seen.add(e.source_id)
            yield e.source_id
