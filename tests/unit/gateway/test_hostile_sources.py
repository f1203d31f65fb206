"""Issue 24 items 5 and 9, sans-IO: what a source that only says hello costs the gateway's core, when an idle
source's state is freed, and the limits on what one hello may name."""

from __future__ import annotations

import gc
import tracemalloc

from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import IncomingEvent
from gateway.ingest import JOIN_WINDOW_SOURCE, ConnectionId, IngestAction, IngestConfig, IngestCore, Produce
from gateway.session import CloseConnection, GatewaySession, SendBytes, SourceRegistered

T0 = 1_700_000_000_000_000
TOPICS = TopicNames("t")
CONN = ConnectionId(1)
STREAMS = tuple(f"s{i}" for i in range(64))
RETENTION_US = 60_000_000
# The documented cost of a hello (docs/operations.md, "Limits"): at most this much per stream it names (measured
# about 120 B: its checkpoint entry and its place among the stream's silent newcomers; a merge entry per stream made
# at hello cost 1.3 KiB).
HELLO_BYTES_PER_STREAM = 256


def make_core(streams: tuple[str, ...] = STREAMS) -> IngestCore:
    core = IngestCore(TOPICS, _identity(), IngestConfig(idle_source_retention_us=RETENTION_US))
    for stream in streams:
        core.stream_created(stream)
    return core


def _identity():  # imported here: timesync.clocks is the mapping's home
    from timesync.clocks import IdentityMapping
    return IdentityMapping()


def deliver(core: IngestCore, actions: list[IngestAction], now_us: int) -> list[int]:
    seqs = []
    for offset, action in enumerate(a for a in actions if isinstance(a, Produce) and a.delivery is not None):
        assert action.delivery is not None
        core.on_delivered(action.delivery, None, offset, now_us)
        seqs.append(action.delivery.seq)
    return seqs


def test_a_source_that_only_says_hello_costs_at_most_the_documented_bytes_per_stream():
    core = make_core()
    sources = 200
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(sources):
            core.source_registered(f"hello-only-{i}", STREAMS, T0 + i)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    per_source = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / sources
    # c005711: 530 KB per source (a reorderer with its estimators per declared stream).
    assert per_source <= HELLO_BYTES_PER_STREAM * len(STREAMS), per_source
    # The merge holds one join entry per stream for all of them, not one entry per newcomer (rule 11).
    for stream in STREAMS:
        assert core.pipeline._streams[stream].merger.sources() == [JOIN_WINDOW_SOURCE]


def test_a_hello_only_source_is_forgotten_after_the_idle_retention_and_leaves_the_checkpoint():
    core = make_core(("s",))
    core.source_registered("ghost", ("s",), T0)
    core.source_disconnected("ghost", T0 + 1)
    assert core.known_sources() == {"ghost"}
    core.poll(T0 + RETENTION_US)  # not yet: the retention counts from the disconnection
    assert core.known_sources() == {"ghost"}
    core.poll(T0 + 1_000_000 + RETENTION_US)  # the next sweep (every second)
    assert core.known_sources() == set()
    assert core.counters.sources_forgotten == 1
    assert not core.pipeline.has_sources("s")
    progress = core.stream_progress("s")
    assert progress is not None and "ghost" not in progress.next_seq


def test_a_connected_source_is_never_forgotten():
    core = make_core(("s",))
    core.source_registered("live", ("s",), T0)
    core.poll(T0 + 10 * RETENTION_US)
    assert core.known_sources() == {"live"}


def test_a_forgotten_source_comes_back_where_it_left_off():
    """Freed state must not cost the source anything: a resend of an acked seq stays a duplicate and its next seq
    is released at once (no gap wait for seqs it sent before)."""
    core = make_core(("s",))
    core.source_registered("a", ("s",), T0)
    events = tuple(IncomingEvent("s", q, T0 + 10 * q, q) for q in range(5))
    assert deliver(core, core.events_received(CONN, "a", events, T0 + 100), T0 + 200) == [0, 1, 2, 3, 4]
    core.source_disconnected("a", T0 + 300)
    core.poll(T0 + 301 + RETENTION_US)
    assert core.known_sources() == set()
    now_us = T0 + 400 + RETENTION_US
    core.source_registered("a", ("s",), now_us)
    again = core.events_received(CONN, "a", (IncomingEvent("s", 4, T0 + 40, 4),), now_us)
    assert not [a for a in again if isinstance(a, Produce)]
    assert core.counters.duplicates == 1
    fresh = core.events_received(CONN, "a", (IncomingEvent("s", 5, now_us, 5),), now_us + 1)
    assert deliver(core, fresh, now_us + 2) == [5]


def test_a_source_holding_events_is_kept_past_the_retention():
    core = make_core(("s",))
    core.source_registered("a", ("s",), T0)
    core.events_received(CONN, "a", (IncomingEvent("s", 1, T0, 1),), T0 + 1)  # seq 0 missing: held for the gap
    core.source_disconnected("a", T0 + 2)
    core.poll(T0 + 3 + RETENTION_US)
    assert core.known_sources() == {"a"} and core.pipeline.buffered() == {"a": 1}
    assert core.counters.sources_forgotten == 0


# -- limits on one hello ------------------------------------------------------------------------------------------


def _replies(actions):
    decoder = FrameDecoder()
    return [m for a in actions if isinstance(a, SendBytes) for m in decoder.feed(a.data)]


def test_a_hello_naming_more_streams_than_the_limit_is_refused_with_a_clear_error():
    session = GatewaySession(max_streams_per_source=4)
    hello = {"type": "hello", "version": 1, "source_id": "greedy", "streams": [f"s{i}" for i in range(5)]}
    actions = session.receive_data(encode_frame(hello))
    assert not [a for a in actions if isinstance(a, SourceRegistered)]
    (reply,) = _replies(actions)
    assert reply["code"] == "invalid_message" and reply["fatal"] is True
    assert "at most 4 streams" in reply["message"] and "names 5" in reply["message"]
    assert isinstance(actions[-1], CloseConnection)


def test_a_hello_within_the_limit_registers():
    session = GatewaySession(max_streams_per_source=4)
    hello = {"type": "hello", "version": 1, "source_id": "ok", "streams": [f"s{i}" for i in range(4)]}
    (registered,) = session.receive_data(encode_frame(hello))
    assert isinstance(registered, SourceRegistered)


def test_a_stream_outside_the_allow_list_is_refused():
    session = GatewaySession(allowed_streams=frozenset({"orders"}))
    hello = {"type": "hello", "version": 1, "source_id": "x", "streams": ["orders", "typo-orders"]}
    actions = session.receive_data(encode_frame(hello))
    (reply,) = _replies(actions)
    assert reply["code"] == "stream_refused" and reply["fatal"] is True
    assert "'typo-orders'" in reply["message"]
    assert isinstance(actions[-1], CloseConnection) and actions[-1].error_code == "stream_refused"


# -- issue 24 item 4: per-event log lines are rate-limited, counters stay exact ----------------------------------


def test_a_flood_of_refused_payloads_writes_a_bounded_number_of_log_lines_and_counts_every_one(caplog):
    """c005711: 1.21 M refused events wrote 121 MiB of WARNING lines, one per event."""
    import logging

    from contract.wire.messages import RejectedPayload
    from gateway.logs import LIMITER, LOG_BURST

    LIMITER._buckets.clear()  # a fresh bucket: other tests' lines must not count here
    core = make_core(("s",))
    core.source_registered("flood", ("s",), T0)
    caplog.set_level(logging.WARNING, logger="gateway.ingest")
    for batch in range(10):  # 10 frames of 1,000 refused events, within one virtual second
        events = tuple(IncomingEvent("s", batch * 1000 + q, T0, RejectedPayload("payload: NaN is not JSON"))
                       for q in range(1000))
        core.events_received(CONN, "flood", events, T0 + batch)
    refused_lines = [r for r in caplog.records if "refused flood/s" in r.getMessage()]
    assert len(refused_lines) == LOG_BURST
    assert core.counters.invalid_payloads == 10_000
    # A second later one more line passes, and says how many were left out.
    core.events_received(CONN, "flood", (IncomingEvent("s", 10_000, T0, RejectedPayload("x")),), T0 + 1_000_001)
    last = [r for r in caplog.records if "refused flood/s" in r.getMessage()][-1].getMessage()
    assert last.endswith(f"({10_000 - LOG_BURST} similar lines suppressed)")


def test_a_trickle_of_silent_newcomers_holds_a_good_sources_events_at_most_one_join_grace():
    """c005711 (and the 500-hello scenario of tests/reliability/test_hostile_peers.py): each newcomer's grace
    counted from its own hello, so newcomers arriving one after the other held the merge for as long as they kept
    coming (a good source's acks took 8-16 s during a 7.5 s wave of hellos)."""
    from reorder.pipeline import IngestPipeline, PipelineConfig, PublishRecord

    grace_us = 2_000_000
    pipe = IngestPipeline(_identity(), PipelineConfig(join_grace_us=grace_us))
    pipe.register("good", ("s",), T0)
    released_at: dict[int, int] = {}
    for step in range(100):  # a newcomer every 100 ms for 10 s; the good source sends one event per step
        now_us = T0 + step * 100_000
        pipe.register(f"silent-{step}", ("s",), now_us)
        out = pipe.push("good", IncomingEvent("s", step, now_us, step), now_us)
        deadline = pipe.next_deadline_us()
        if deadline is not None and deadline <= now_us:
            out += pipe.advance(now_us)
        for o in out:
            if isinstance(o, PublishRecord):
                released_at[o.record.seq] = now_us
    while (deadline := pipe.next_deadline_us()) is not None:  # the last window runs out
        for o in pipe.advance(deadline):
            if isinstance(o, PublishRecord):
                released_at[o.record.seq] = deadline
    waits = [released_at[seq] - (T0 + seq * 100_000) for seq in released_at]
    assert sorted(released_at) == list(range(100))
    assert max(waits) <= grace_us, max(waits)


# -- issue 24 item 4: a duplicate flood's reads are bounded by bytes, not by their count ---------------------------

# uvloop reads up to this many bytes at a time (measured: a 64 MiB burst on loopback arrived in reads of 256,000).
UVLOOP_READ_BYTES = 256_000
# The documented decoded size of what a connection read and has not processed (docs/operations.md, "Limits"): at
# most MAX_PENDING_READ_BYTES plus one read, each byte of one-event frames about 5.3 bytes once decoded (392 B per
# 74-byte frame, tracemalloc, CPython 3.11): 6.6 MiB. This allows 6 times the raw bytes.
DECODED_BYTES_PER_READ_BYTE = 6


async def test_a_duplicate_flood_is_not_read_past_the_pending_bytes_and_what_it_holds_decoded_is_bounded():
    """The duplicate flood of tests/reliability/test_hostile_peers.py grew the gateway by 44 MiB, beyond the
    documented formula: the connection stopped reading at 64 queued reads, each up to 256,000 bytes of 74-byte frames
    decoded at once into 3,459 frames (392 B each): up to 83 MiB per connection. Bounded by bytes, reading stops once
    a megabyte waits, and what waits decoded stays within the documented bound."""
    import asyncio

    from contract.wire.messages import build_event, build_events
    from gateway.connection import MAX_PENDING_READ_BYTES, ConnectionHandler
    from tests.unit.gateway.test_gateway_connection import FakeTransport

    release = asyncio.Event()
    processed: list[int] = []
    all_processed = asyncio.Event()
    frames_read = 0

    class BlockedOwner:
        """The core is busy: no read is processed until ``release`` (the flooder outruns the worker)."""

        def attach(self, connection: ConnectionHandler) -> ConnectionId:
            return CONN

        def detach(self, connection: ConnectionHandler) -> None:
            pass

        async def register_source(self, connection: ConnectionHandler, hello: object) -> None:
            pass

        async def receive_events(self, connection: ConnectionHandler, received: object, arrival_us: int) -> None:
            await release.wait()
            processed.append(1)
            if len(processed) == frames_read:
                all_processed.set()

    frame = encode_frame(build_events([build_event("s", 0, T0, {"i": 0})]))
    read = frame * (UVLOOP_READ_BYTES // len(frame))
    handler = ConnectionHandler(BlockedOwner(), GatewaySession(now_us=T0), clock_us=lambda: T0)  # type: ignore[arg-type]
    transport = FakeTransport()
    handler.connection_made(transport)  # type: ignore[arg-type]
    handler.data_received(encode_frame({"type": "hello", "version": 1, "source_id": "flooder", "streams": ["s"]}))
    await asyncio.sleep(0)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reads = 0
        while transport.reading:  # the kernel hands the gateway a read whenever it reads
            handler.data_received(read)
            reads += 1
            assert reads < 64, "still reading after 64 reads"
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Paused at the first read that took the queue to a megabyte: 5 reads of 256,000 bytes, not 64.
    assert reads == -(-MAX_PENDING_READ_BYTES // len(read)), reads
    assert held <= DECODED_BYTES_PER_READ_BYTE * (MAX_PENDING_READ_BYTES + len(read)), held
    # The worker catches up: reading resumes, and every frame read reaches the core.
    frames_read = reads * (len(read) // len(frame))
    release.set()
    await asyncio.wait_for(all_processed.wait(), 30)
    assert transport.reading
    assert len(processed) == frames_read


# -- issue 24 item 5: a hello costs no merge entry per stream; the merge waits as if it had made them ---------------


class RegisteringAtHello(IngestCore):
    """The reference: every newcomer gets its merge entry per stream at its hello, as before the join entry."""

    def _join(self, source_id: str, streams: list[str], now_us: int, outputs: list) -> None:  # type: ignore[type-arg]
        outputs += self.pipeline.register(source_id, tuple(streams), now_us)


def _published(actions: list[IngestAction]) -> list[tuple[str, bytes]]:
    """What reaches Kafka, in order: each record's topic and value (event records carry their release time)."""
    return [(a.topic, a.value) for a in actions if isinstance(a, Produce)]


def _scenario(seed: int, core: IngestCore) -> list[tuple[str, bytes]]:
    """Random hellos (some naming streams they never use, some never speaking), events in order or with a gap,
    heartbeats, byes, disconnections with a short retention, and the deadlines as they fall due."""
    import random

    from contract.wire.messages import Heartbeat

    rng = random.Random(seed)
    streams = ("s0", "s1", "s2")
    for stream in streams:
        core.stream_created(stream)
    sources = [f"src{k}" for k in range(6)]
    next_seq: dict[tuple[str, str], int] = {}
    named: dict[str, tuple[str, ...]] = {}
    out: list[tuple[str, bytes]] = []
    now = T0
    for _step in range(300):
        now += rng.choice((1_000, 50_000, 300_000, 900_000))
        due = core.next_deadline_us()
        while due is not None and due <= now:
            actions = core.advance(due)
            deliver(core, actions, due)
            out += _published(actions)
            nxt = core.next_deadline_us()
            due = nxt if nxt is not None and nxt > due else None
        source = rng.choice(sources)
        roll = rng.random()
        if roll < 0.2 or source not in named:
            named[source] = tuple(rng.sample(streams, rng.randint(1, 3)))
            actions = core.source_registered(source, named[source], now)
        elif roll < 0.75:
            stream = rng.choice(named[source])
            seq = next_seq.get((source, stream), 0)
            batch = list(range(seq, seq + rng.randint(1, 4)))
            if rng.random() < 0.1 and len(batch) > 1:
                batch.pop(0)  # a gap before the batch, filled (or given up) later
            next_seq[(source, stream)] = batch[-1] + 1
            frame = tuple(IncomingEvent(stream, q, now - rng.randint(0, 20_000), q) for q in batch)
            actions = core.events_received(CONN, source, frame, now)
        elif roll < 0.85:
            stream = rng.choice(named[source])
            actions = core.heartbeat_received(
                source, Heartbeat(now - 1_000, {stream: next_seq.get((source, stream), 0)}), now)
        elif roll < 0.92:
            actions = core.source_left(source, now)
        else:
            core.source_disconnected(source, now)
            actions = []
        deliver(core, actions, now)
        out += _published(actions)
        actions = core.poll(now)
        deliver(core, actions, now)
        out += _published(actions)
    # The end: every wait runs out and what the merge still holds is released.
    while (due := core.next_deadline_us()) is not None:
        actions = core.advance(max(due, now))
        now = max(due, now) + 1
        deliver(core, actions, now)
        out += _published(actions)
    return out


def _outcome(published: list[tuple[str, bytes]]) -> tuple[set[tuple[str, str, int]], set[tuple[str, str, int]]]:
    """The events topic's and the late topics' (stream, source, seq), after checking the events topic keeps its
    promises: per source in seq order, and no event record below a punctuation published before it on its stream."""
    import orjson

    on_time: set[tuple[str, str, int]] = set()
    late: set[tuple[str, str, int]] = set()
    watermark: dict[str, int] = {}
    last_seq: dict[tuple[str, str], int] = {}
    for topic, value in published:
        record = orjson.loads(value)
        if record["kind"] == "punctuation":
            assert record["watermark_us"] >= watermark.get(record["stream"], 0)
            watermark[record["stream"]] = record["watermark_us"]
            continue
        key = (record["stream"], record["source_id"], record["seq"])
        if ".late." in topic:
            late.add(key)
            continue
        stream_key = (record["stream"], record["source_id"])
        assert record["seq"] > last_seq.get(stream_key, -1), record
        last_seq[stream_key] = record["seq"]
        assert record["ref_ts_us"] >= watermark.get(record["stream"], 0), record
        on_time.add(key)
    return on_time, late


def test_the_join_entry_waits_for_silent_newcomers_at_least_as_one_merge_entry_per_newcomer_did():
    """The merge waits for silent newcomers through one join entry per stream (rule 11) instead of an entry per
    (newcomer, stream) made at hello. On random runs of hellos (some naming streams they never use, some never
    speaking), events with gaps, heartbeats, byes and freed sources against the reference that registers each
    newcomer at hello: the events topic keeps its order and punctuation promises, nothing is lost or duplicated, and
    no event goes late that did not go late in the reference. (The join entry gives up a newcomer's join wait at once
    only when the newest hello of its window is older than the wait itself, where the reference judges each
    newcomer by its own hello: it may hold the others up to the window's end instead, never less.)"""
    config = IngestConfig(idle_source_retention_us=2_000_000)
    identical = 0
    for seed in range(60):
        joined = _scenario(seed, IngestCore(TOPICS, _identity(), config))
        reference = _scenario(seed, RegisteringAtHello(TOPICS, _identity(), config))
        on_time, late = _outcome(joined)
        reference_on_time, reference_late = _outcome(reference)
        assert on_time | late == reference_on_time | reference_late, seed
        assert not on_time & late, seed
        assert late <= reference_late, seed
        identical += joined == reference
    assert identical >= 20, identical  # most runs publish exactly the same records, release times included
