"""Rule 15 of gateway.ingest, the takeover window, on virtual time: a shard restored from a checkpoint that does not
name a source its previous owner had welcomed (the owner died before a checkpoint with that hello committed), then
that source comes back with the events it had sent there unacknowledged.

The scenario is the SIGKILL failover test's (tests/reliability/test_cluster_faults.py): the sources of a dead owner
resend 240 events each, stamped base + 10 ms x seq + index seconds before the takeover, and then heartbeat at the
clock (done sending). Ground truth: every event once, on the events topic in reference order (the brute-force
order: all events sorted by reference time), and no event on the events topic below a punctuation before it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from contract.records import PUNCTUATION_KEY
from contract.topics import TopicNames
from contract.wire.messages import Heartbeat, IncomingEvent
from gateway.ingest import (
    TAKEOVER_GRACE_US,
    ConnectionId,
    IngestAction,
    IngestConfig,
    IngestCore,
    Produce,
    StreamProgress,
)
from gateway.native import Core, with_core
from reorder.pipeline import PipelineConfig
from timesync.clocks import IdentityMapping

T0 = 1_700_000_000_000_000
S = 1_000_000
TOPICS = TopicNames("t")
EVENTS = 240
BASE_US = T0 - 8 * S  # the events were stamped before the owner died
SOURCES = ("a", "b", "x")


def stamp(source: str, seq: int) -> int:
    return BASE_US + seq * 10_000 + SOURCES.index(source)


def resend(core: IngestCore, source: str, now_us: int) -> list[IngestAction]:
    """The source's hello and its unacknowledged events (its heartbeats follow: ``heartbeat``)."""
    actions = core.source_registered(source, ("s",), now_us)
    batch = tuple(IncomingEvent("s", q, stamp(source, q), {"q": q}) for q in range(EVENTS))
    return actions + core.events_received(ConnectionId(SOURCES.index(source)), source, batch, now_us)


def heartbeat(core: IngestCore, source: str, now_us: int) -> list[IngestAction]:
    """It has sent everything: a heartbeat at its clock (the SDK's, every 0.2 s in the failover test)."""
    return core.heartbeat_received(source, Heartbeat(now_us, {"s": EVENTS}), now_us)


def records(actions: list[IngestAction]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What went to the events topic (event records and punctuations, in order) and what went late."""
    published = [a for a in actions if isinstance(a, Produce)]
    assert all(a.topic in (TOPICS.events("s"), TOPICS.late("s")) for a in published)
    events = [orjson.loads(a.value) for a in published if a.topic == TOPICS.events("s")]
    late = [orjson.loads(a.value) for a in published if a.topic == TOPICS.late("s")]
    assert all((e["kind"] == "punctuation") == (a.key == PUNCTUATION_KEY)
               for e, a in zip(events, [a for a in published if a.topic == TOPICS.events("s")], strict=True))
    return events, late


def assert_exact(events: list[dict[str, Any]]) -> None:
    """No event on the events topic below a punctuation before it, and reference order."""
    watermark_us = None
    last_ref_us = None
    for record in events:
        if record["kind"] == "punctuation":
            watermark_us = record["watermark_us"]
            continue
        assert watermark_us is None or record["ref_ts_us"] >= watermark_us, (record, watermark_us)
        assert last_ref_us is None or record["ref_ts_us"] >= last_ref_us, record
        last_ref_us = record["ref_ts_us"]


def taken_over_core(grace_us: int, cores: Core = "python") -> tuple[IngestCore, list[IngestAction]]:
    """A new owner: a and b are in the checkpoint it restores, x (welcomed by the dead owner after its last committed
    checkpoint) is not."""
    config = IngestConfig(pipeline=with_core(PipelineConfig(), cores), takeover_grace_us=grace_us)
    core = IngestCore(TOPICS, IdentityMapping(), config)
    core.taken_over(T0)
    actions = core.stream_recovered(StreamProgress("s", 0, {"a": 0, "b": 0}, BASE_US - S), T0)
    return core, actions


def run(core: IngestCore, x_back_us: int, until_us: int, step_us: int = 100_000) -> list[IngestAction]:
    """a and b come back 0.5 s after the takeover, x at ``x_back_us``; the shell's timers run, and every source back
    heartbeats, every ``step_us``."""
    actions: list[IngestAction] = []
    arrivals = {T0 + S // 2: ("a", "b"), x_back_us: ("x",)}
    back: list[str] = []
    for now_us in sorted({*range(T0, until_us + 1, step_us), *arrivals}):
        for source in arrivals.get(now_us, ()):
            actions += resend(core, source, now_us)
            back.append(source)
        for source in back:
            actions += heartbeat(core, source, now_us)
        actions += core.advance(now_us)
        actions += core.poll(now_us)
    return actions


@pytest.mark.parametrize("cores", ["python", "native"])
def test_a_source_the_checkpoint_lacks_that_comes_back_within_the_window_is_merged_in_order_with_the_others(
        cores: Core) -> None:
    core, actions = taken_over_core(TAKEOVER_GRACE_US, cores)
    actions += run(core, T0 + 3 * S // 2, T0 + 4 * S)
    events, late = records(actions)
    assert late == []
    assert_exact(events)
    merged = [(e["source_id"], e["seq"]) for e in events if e["kind"] == "event"]
    assert merged == [(s, q) for _ts, s, q in sorted((stamp(s, q), s, q) for s in SOURCES for q in range(EVENTS))]
    assert (core.counters.takeover_windows, core.counters.takeover_newcomers) == (1, 1)
    assert core.takeover_until_us is None


@pytest.mark.parametrize("cores", ["python", "native"])
def test_the_window_holds_every_release_and_punctuation_until_it_ends_then_the_merge_goes_on(cores: Core) -> None:
    core, actions = taken_over_core(TAKEOVER_GRACE_US, cores)
    assert core.takeover_window_holds_until_us() == T0 + TAKEOVER_GRACE_US  # what /healthz shows
    last_us = T0 + TAKEOVER_GRACE_US - 1_000
    actions += run(core, T0 + 3 * S // 2, last_us, step_us=1_000)
    assert records(actions) == ([], [])
    assert core.next_deadline_us() == T0 + TAKEOVER_GRACE_US
    events, late = records(core.advance(T0 + TAKEOVER_GRACE_US))
    assert late == [] and len([e for e in events if e["kind"] == "event"]) == 3 * EVENTS
    # Then the punctuation the sources' heartbeats promise, in the same call.
    assert events[-1] == {**events[-1], "kind": "punctuation", "watermark_us": last_us}
    assert core.takeover_window_holds_until_us() is None


@pytest.mark.parametrize("grace_us", [0, TAKEOVER_GRACE_US])
def test_a_source_that_comes_back_after_the_window_has_its_older_events_late_with_a_reason(grace_us: int) -> None:
    """Without a window (0: the gateway before rule 15, the CI failure) x is late at 1.5 s already; with one, a source
    that comes after it is. Never silently: every seq once, on one topic or the other."""
    core, actions = taken_over_core(grace_us)
    actions += run(core, T0 + (3 * S // 2 if grace_us == 0 else TAKEOVER_GRACE_US + S // 2), T0 + 4 * S)
    events, late = records(actions)
    assert_exact(events)
    on_time = {(e["source_id"], e["seq"]) for e in events if e["kind"] == "event"}
    assert on_time == {(s, q) for s in ("a", "b") for q in range(EVENTS)}
    # x's newest stamp is below what a's and b's heartbeats promised: each of its events is behind the punctuation.
    assert sorted((r["source_id"], r["seq"], r["late_reason"]) for r in late) == [
        ("x", q, "after_punctuation") for q in range(EVENTS)]
    assert core.counters.takeover_newcomers == 0


def window_blocked_run(cores: Core) -> tuple[IngestCore, list[IngestAction], list[tuple[int, str, int]]]:
    """A fresh owner's window (no checkpoint names anyone); x, y and z say hello in it, each send a frame of 500
    events and then block on their bound of unacknowledged events with a heartbeat (nothing older than their next
    event), as the SDK and the saturated benchmark do. The window withholds every release, hence every ack: they
    speak again only 150-210 ms after it ends, x first. Returns the core, its actions and every event sent as
    (stamp, source, seq)."""
    config = IngestConfig(pipeline=with_core(PipelineConfig(), cores), takeover_grace_us=TAKEOVER_GRACE_US)
    core = IngestCore(TOPICS, IdentityMapping(), config)
    core.taken_over(T0)
    actions = core.stream_recovered(StreamProgress("s", 0, {}, None), T0)
    bases = {"x": T0 + 100_000, "y": T0 + 101_003, "z": T0 + 102_007}  # clocks a little apart; no two stamps equal
    sent: list[tuple[int, str, int]] = []

    def send(source: str, first: int, now_us: int) -> list[IngestAction]:
        batch = tuple(IncomingEvent("s", q, bases[source] + q * 10, {"q": q}) for q in range(first, first + 500))
        sent.extend((e.source_ts_us, source, e.seq) for e in batch)
        return core.events_received(ConnectionId(list(bases).index(source)), source, batch, now_us)

    for source, base in bases.items():
        actions += core.source_registered(source, ("s",), T0 + 90_000)
        actions += send(source, 0, T0 + 100_000)
        actions += core.heartbeat_received(source, Heartbeat(base + 5_000, {"s": 500}), T0 + 100_010)
    back = {T0 + TAKEOVER_GRACE_US + 150_000: "x", T0 + TAKEOVER_GRACE_US + 200_000: "y",
            T0 + TAKEOVER_GRACE_US + 210_000: "z"}
    for now_us in range(T0 + 101_000, T0 + TAKEOVER_GRACE_US + S + 1, 1_000):
        if now_us in back:
            actions += send(back[now_us], 500, now_us)
        actions += core.advance(now_us)
        actions += core.poll(now_us)
    return core, actions, sent


@pytest.mark.parametrize("cores", ["python", "native"])
def test_sources_blocked_on_acks_the_window_withheld_are_not_given_up_when_it_ends(cores: Core) -> None:
    """Rule 15 with rule 5: once x ran the merge past y and z, they had been silent (for the window's acks) longer
    than their whole wait, and the merge gave them up at once: 698 of their events went late (after_give_up,
    after_punctuation), 1 run in 8 of the saturated benchmark. The window's end starts the stall grace instead."""
    core, actions, sent = window_blocked_run(cores)
    events, late = records(actions)
    assert late == []
    assert_exact(events)
    merged = [(e["source_id"], e["seq"]) for e in events if e["kind"] == "event"]
    # Every event up to the lowest of the sources' newest stamps (the rest waits for more), in the brute-force
    # reference order.
    floor_us = min(max(ts for ts, s, _q in sent if s == source) for source in ("x", "y", "z"))
    assert merged == [(s, q) for ts, s, q in sorted(sent) if ts <= floor_us]
    assert len(merged) == 3 * 1_000 - 302
    assert core.pipeline.counters.source_timeouts == 0


def test_the_window_holds_a_recovered_stream_without_sources_from_idle_punctuation_until_it_ends() -> None:
    core = IngestCore(TOPICS, IdentityMapping(), IngestConfig())
    core.taken_over(T0)
    core.stream_recovered(StreamProgress("s", 0, {}, None), T0)
    assert core.punctuate_idle("s", T0 + S, 5 * S) == []
    assert core.counters.takeover_windows == 1
    core.poll(T0 + TAKEOVER_GRACE_US)
    events, _late = records(core.punctuate_idle("s", T0 + TAKEOVER_GRACE_US, 5 * S))
    assert events == [{**events[0], "kind": "punctuation", "watermark_us": T0 + TAKEOVER_GRACE_US - 5 * S}]


def test_a_stream_recovered_after_the_window_is_not_held() -> None:
    core = IngestCore(TOPICS, IdentityMapping(), IngestConfig())
    core.taken_over(T0)
    assert core.takeover_window_holds_until_us() is None  # open, holding nothing yet
    core.poll(T0 + TAKEOVER_GRACE_US)
    core.stream_recovered(StreamProgress("s", 0, {"a": 0}, None), T0 + 3 * S)
    events, late = records(resend(core, "a", T0 + 3 * S))
    assert late == [] and len([e for e in events if e["kind"] == "event"]) == EVENTS
    assert core.counters.takeover_windows == 0


def test_the_window_does_not_end_during_a_kafka_stall() -> None:
    core, _actions = taken_over_core(TAKEOVER_GRACE_US)
    core.kafka_queue_full(T0 + TAKEOVER_GRACE_US - 1)
    assert core.poll(T0 + TAKEOVER_GRACE_US) == [] and core.takeover_until_us == T0 + TAKEOVER_GRACE_US
    grace_end_us = T0 + TAKEOVER_GRACE_US - 1 + core.config.stall_grace_us
    assert core.next_deadline_us() == grace_end_us
    core.advance(grace_end_us)
    assert core.takeover_until_us is None


async def test_a_shard_runtime_opens_the_window_when_it_starts_over_the_streams_it_recovers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell's part: ShardRuntime.start opens the window before it hands the recovered checkpoints to the core
    (no Kafka here: the recovery is the one a scan would have given, the producer is made and closed unused)."""
    from broker.client import KafkaClientConfig
    from gateway.recovery import ShardState
    from gateway.shard import ShardRuntime, ShardSettings, _Takeover
    from tests.unit.gateway.test_shard_fencing import FakeHost
    from timesync.store import SourceInfoStore

    settings = ShardSettings(shard=2, topics=TOPICS, kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={}, ingest=IngestConfig(), transactional=False)
    runtime = ShardRuntime(settings, IdentityMapping(), SourceInfoStore(), FakeHost(), lambda: T0)

    async def recovered(_fencing: object) -> tuple[ShardState, list[StreamProgress], _Takeover]:
        return ShardState(), [StreamProgress("s", 0, {"a": 0}, None)], _Takeover(0.0)

    monkeypatch.setattr(runtime, "_recover", recovered)
    try:
        await runtime.start()
        assert runtime.serving
        assert runtime.core.takeover_window_holds_until_us() == T0 + TAKEOVER_GRACE_US
        assert runtime.core.counters.takeover_windows == 1
    finally:
        await runtime.stop(0.0, graceful=False)
