"""The SDK's sans-IO core: seqs, the unacked store, batching, pool scheduling, backoff, idleness, auth, clocks."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clients.auth import hmac_provider, hmac_token, parse_hmac_token
from clients.core import (
    Backoff,
    EventTooLarge,
    HeartbeatPromise,
    IdleTimer,
    PendingEvent,
    PoolScheduler,
    ResyncGate,
    SeqAssigner,
    StoreFull,
    UnackedStore,
    encode_batches,
    heartbeat_next_seq,
)
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import MAX_SEQ, AtomicInterval, IntervalEndpoint, build_events
from timesync.clocks import SimulatedClock


def filled_store(n: int, streams: tuple[str, ...] = ("a",), max_unacked: int = 1000, *,
                 written: bool = False) -> UnackedStore:
    """``n`` events added; ``written``: and taken by the sender (written on connection 0)."""
    store = UnackedStore(streams, max_unacked)
    seqs = SeqAssigner(streams)
    for i in range(n):
        stream = streams[i % len(streams)]
        store.add(stream, seqs.next(stream), 1_000 + i, {"i": i})
    if written:
        store.mark_sent(store.take_batch(n), 0)
    return store


# -- seqs --------------------------------------------------------------------------------------------------------


def test_seqs_are_per_stream_from_zero_without_gaps():
    seqs = SeqAssigner(["a", "b"])
    assert [seqs.next("a"), seqs.next("a"), seqs.next("b"), seqs.next("a")] == [0, 1, 0, 2]
    assert seqs.snapshot() == {"a": 3, "b": 1}
    with pytest.raises(ValueError, match="'c' was not declared"):
        seqs.next("c")


def test_seqs_resume_from_a_start_and_continue_above_claimed():
    seqs = SeqAssigner(["a", "b"], {"a": 10})
    assert seqs.next("a") == 10
    seqs.claim("b", 7)
    seqs.claim("b", 3)  # a lower explicit seq (a replayed trace) does not move the counter back
    assert seqs.next("b") == 8
    with pytest.raises(ValueError, match="outside"):
        seqs.claim("a", -1)
    with pytest.raises(ValueError, match="not declared"):
        SeqAssigner(["a"], {"zz": 1})


# -- unacked store -----------------------------------------------------------------------------------------------


def test_store_is_bounded_and_acks_release_cumulatively():
    store = filled_store(5, max_unacked=5, written=True)
    assert len(store) == 5
    assert not store.has_room
    with pytest.raises(StoreFull):
        store.add("a", 5, 0, None)
    assert store.ack("a", 2) == 3
    assert store.ack("a", 1) == 0  # stale ack
    assert store.ack("zz", 9) == 0  # unknown stream
    assert store.acked_through("a") == 2
    assert len(store) == 2
    assert store.has_room
    assert [e.seq for e in store.unacked()] == [3, 4]


def test_store_refuses_a_seq_twice_or_below_the_ack():
    store = filled_store(3)
    with pytest.raises(ValueError, match="already sent"):
        store.add("a", 1, 0, None)
    store.ack("a", 2)
    with pytest.raises(ValueError, match="already sent"):
        store.add("a", 0, 0, None)


def test_store_releases_out_of_order_explicit_seqs():
    store = UnackedStore(["a"], 100)
    for seq in (5, 1, 3, 0, 2, 4):
        store.add("a", seq, seq, None)
    store.mark_sent(store.take_batch(6), 0)
    assert store.ack("a", 3) == 4
    assert sorted(e.seq for e in store.unacked()) == [4, 5]


def test_batches_come_out_in_send_order_and_skip_events_acked_meanwhile():
    store = filled_store(10, streams=("a", "b"))
    first = store.take_batch(4)
    assert [(e.stream, e.seq) for e in first] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    store.mark_sent(first, 0)
    second = store.take_batch(4)
    store.mark_sent(second, 1)
    assert store.connection_lost(1) == 4  # a2, b2, a3, b3 queued again: they may have reached the gateway...
    store.ack("a", 3)  # ...and a2, a3 had (acked before they were written again): skipped
    rest = store.take_batch(100)
    assert [(e.stream, e.seq) for e in rest] == [("b", 2), ("b", 3), ("a", 4), ("b", 4)]
    assert store.pending_count == 0


def test_an_ack_passing_events_never_written_gives_them_up_and_they_go_out_once():
    """The gateway passes a seq it never received only by giving it up; its gap notice may come later (another pool
    connection) or came before the application sent the seq while its ack had not (a replayed trace's late arrival
    queued for the linger). Taken for acked, such an event was skipped unsent: lost (issue 25, 3x5000 newcomer)."""
    store = filled_store(5)
    store.mark_sent(store.take_batch(1), 0)  # 0 written; 1..4 queued
    released, passed = store.ack_passing("a", 2)
    assert released == 1
    assert [(e.seq, e.given_up) for e in passed] == [(1, True), (2, True)]
    assert len(store) == 2  # 3 and 4 are unacknowledged; flush() does not wait for 1 and 2
    assert [e.seq for e in store.take_batch(10)] == [1, 2, 3, 4]  # each written once
    assert store.take_batch(10) == []
    assert store.ack("a", 4) == 2 and len(store) == 0


def test_a_seq_of_a_gap_notice_sent_before_its_ack_came_is_given_up_at_once():
    store = UnackedStore(["s"], max_unacked=10)
    store.add("s", 0, 1000, 0)
    assert store.give_up("s", 1, 1, "timeout") == []  # the notice came; the ack passing 1 has not yet
    late = store.add("s", 1, 1001, 1)
    assert (late.given_up, late.gap_reason, len(store)) == (True, "timeout", 1)
    assert [e.seq for e in store.take_batch(10)] == [0, 1]
    assert store.ack("s", 1) == 1 and len(store) == 0


def test_connection_loss_requeues_exactly_what_that_connection_carried_in_send_order():
    store = filled_store(9)
    b0, b1, b2 = store.take_batch(3), store.take_batch(3), store.take_batch(3)
    store.mark_sent(b0, 0)
    store.mark_sent(b1, 1)
    store.mark_sent(b2, 0)
    store.ack("a", 1)
    assert store.connection_lost(0) == 4  # seqs 2, 6, 7, 8 (0 and 1 are acked)
    assert store.connection_lost(0) == 0  # nothing is requeued twice
    again = store.take_batch(100)
    assert [e.seq for e in again] == [2, 6, 7, 8]
    assert all(e.resend for e in again)
    assert not any(e.resend for e in b1)


def test_requeued_events_go_before_newer_ones():
    store = filled_store(3)
    sent = store.take_batch(3)
    store.mark_sent(sent, 1)
    store.add("a", 3, 0, None)
    store.connection_lost(1)
    assert [e.seq for e in store.take_batch(10)] == [0, 1, 2, 3]


def test_requeue_front_and_recovered_events():
    store = UnackedStore(["a"], 2)
    store.add("a", 0, 0, None)
    store.add("a", 1, 0, None)
    recovered = store.add_recovered("a", 2, 0, None)  # beyond the bound: it was accepted before a restart
    assert recovered.resend
    assert len(store) == 3
    assert store.max_unacked == 2
    batch = store.take_batch(2)
    store.requeue_front(batch)
    assert [e.seq for e in store.take_batch(10)] == [0, 1, 2]


def test_heartbeat_next_seq_never_claims_an_event_still_queued():
    seqs = SeqAssigner(["a", "b"])
    store = UnackedStore(["a", "b"], 100)
    for _ in range(3):
        store.add("a", seqs.next("a"), 0, None)
    assert heartbeat_next_seq(seqs, store) == {"a": 0, "b": 0}
    store.mark_sent(store.take_batch(2), 0)
    assert heartbeat_next_seq(seqs, store) == {"a": 2, "b": 0}
    store.mark_sent(store.take_batch(2), 0)
    assert heartbeat_next_seq(seqs, store) == {"a": 3, "b": 0}


# -- batching ----------------------------------------------------------------------------------------------------


def events(n: int, payload_bytes: int = 10) -> list[PendingEvent]:
    return [PendingEvent("s", i, 1_000 + i, "x" * payload_bytes, i) for i in range(n)]


def decode_all(frames: list[bytes]) -> list[dict]:
    decoder = FrameDecoder(10**9)
    return [m for f in frames for m in decoder.feed(f)]


def test_batches_respect_the_event_count():
    out = encode_batches(events(7), 3, 1 << 20)
    assert [len(chunk) for chunk, _ in out] == [3, 3, 1]
    messages = decode_all([frame for _, frame in out])
    assert [e["seq"] for m in messages for e in m["events"]] == list(range(7))
    assert messages[0]["type"] == "events"
    assert messages[0]["events"][0] == {"stream": "s", "seq": 0, "source_ts_us": 1_000, "payload": "x" * 10}


def test_batches_respect_the_gateway_frame_limit():
    limit = 1_000
    out = encode_batches(events(50, payload_bytes=100), 500, limit)
    assert all(len(frame) - 4 <= limit for _, frame in out)
    assert len(out) > 5
    messages = decode_all([frame for _, frame in out])
    assert [e["seq"] for m in messages for e in m["events"]] == list(range(50))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(
    st.sampled_from(["s", "tank-7", "ü"]), st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1),
    st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=30)
                 | st.binary(max_size=30),
                 lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
                 max_leaves=8),
    st.sampled_from([None, AtomicInterval(5), IntervalEndpoint("x", "start"), IntervalEndpoint("y", "end")])),
    min_size=1, max_size=40), st.integers(1, 50))
def test_frames_from_wire_bytes_equal_the_frames_of_the_message_maps(specs, max_events):
    """Encoding each payload once and splicing the bytes gives the very frame msgpack gives for the whole message."""
    pending = [PendingEvent(stream, seq, ts, payload, i, None, False, interval)
               for i, (stream, seq, ts, payload, interval) in enumerate(specs)]
    out = encode_batches(pending, max_events, 1 << 30)
    assert [len(chunk) for chunk, _ in out] == [min(max_events, len(pending) - i)
                                                 for i in range(0, len(pending), max_events)]
    for chunk, frame in out:
        assert frame == encode_frame(build_events([e.to_wire() for e in chunk]))


async def test_the_sdk_encodes_each_payload_once_through_send_frame_and_resend(monkeypatch) -> None:
    import msgpack

    import clients.core
    import clients.window
    from clients import SkewlessClient

    payload = {"reading": [1.5, 2.5], "unit": "kPa"}
    calls = []
    real = msgpack.packb

    def counting(value, **kwargs):
        calls.append(value)
        return real(value, **kwargs)

    monkeypatch.setattr(clients.window.msgpack, "packb", counting)
    monkeypatch.setattr(clients.core.msgpack, "packb", counting)
    client = SkewlessClient("127.0.0.1", 9, "src", ["s"])
    await client.send("s", payload)
    store = client._store
    (event,) = store.take_batch(10)
    first = encode_batches([event], 10, 1 << 20)
    store.mark_sent([event], 0)
    store.connection_lost(0)
    again = encode_batches(store.take_batch(10), 10, 1 << 20)
    assert first[0][1] == again[0][1]
    assert sum(1 for value in calls if value is payload) == 1


def test_an_event_that_can_never_fit_is_refused():
    with pytest.raises(EventTooLarge, match="seq 0 encodes to"):
        encode_batches(events(1, payload_bytes=5_000), 10, 1_000)


# -- pool, backoff, idleness -------------------------------------------------------------------------------------


def test_pool_round_robins_over_live_connections_only():
    pool = PoolScheduler(3)
    assert pool.next_slot() is None
    for i in range(3):
        pool.up(i)
    assert [pool.next_slot() for _ in range(4)] == [0, 1, 2, 0]
    pool.down(1)
    assert [pool.next_slot() for _ in range(4)] == [2, 0, 2, 0]
    assert pool.next_slot(pinned=True) == 0
    pool.down(0)
    assert pool.next_slot(pinned=True) == 2
    assert pool.live == [2]


def test_backoff_grows_exponentially_with_jitter_and_is_bounded():
    backoff = Backoff(initial_s=0.1, max_s=1.0, multiplier=2.0, jitter=0.5, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(10)]
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    for delay, ceiling in zip(delays, ceilings, strict=True):
        assert delay is not None
        assert ceiling * 0.5 <= delay <= ceiling
    assert len(set(delays)) == 10  # jittered
    backoff.reset()
    first = backoff.next_delay()
    assert first is not None
    assert first <= 0.1


def test_backoff_gives_up_after_max_attempts_and_copies_are_independent():
    backoff = Backoff(initial_s=0.01, max_s=0.02, max_attempts=2, rng=random.Random(3))
    assert backoff.next_delay() is not None
    assert backoff.next_delay() is not None
    assert backoff.next_delay() is None
    a, b = backoff.copy(), backoff.copy()
    assert a.attempts == 0
    assert a.next_delay() != b.next_delay()
    with pytest.raises(ValueError):
        Backoff(initial_s=2.0, max_s=1.0)
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)


def test_idle_timer_is_due_once_per_source_on_the_longest_silent_connection():
    timer = IdleTimer(3, 1.0, keepalive_s=30.0)
    timer.wrote(0, 10.0)
    timer.wrote(1, 10.5)
    timer.wrote(2, 10.2)
    # The source wrote at 10.5: nothing is due before 11.5, whichever connection wrote.
    assert timer.due([0, 1, 2], 11.4) == []
    assert timer.next_due_in([0, 1, 2], 11.4) == pytest.approx(0.1)
    # One heartbeat for the source, on the connection silent longest (0), not one per idle connection.
    assert timer.due([0, 1, 2], 11.5) == [0]
    timer.wrote(0, 11.5)
    assert timer.due([0, 1, 2], 12.0) == []
    # The duty rotates: 2 is silent longest now, then 1, then 0 again.
    assert timer.due([0, 1, 2], 12.5) == [2]
    timer.wrote(2, 12.5)
    assert timer.due([0, 1, 2], 13.5) == [1]
    timer.wrote(1, 13.5)
    assert timer.due([0, 1, 2], 14.5) == [0]
    # Only live connections count.
    assert timer.due([1, 2], 14.5) == [2]
    assert timer.next_due_in([], 14.5) is None
    disabled = IdleTimer(1, None)
    assert disabled.due([0], 1e9) == []
    assert disabled.next_due_in([0], 0.0) is None


def test_idle_timer_keeps_every_connection_alive_below_the_gateway_idle_timeout():
    # Events keep the source-level timer fresh while going out on connection 0 only: connection 1 still writes a
    # keepalive once it has been silent for keepalive_s.
    timer = IdleTimer(2, 1.0, keepalive_s=30.0)
    timer.wrote(0, 0.0)
    timer.wrote(1, 0.0)
    for t in range(1, 30):
        timer.wrote(0, float(t))
        assert timer.due([0, 1], t + 0.5) == []
    assert timer.next_due_in([0, 1], 29.5) == pytest.approx(0.5)
    assert timer.due([0, 1], 30.0) == [1]
    # A pool larger than keepalive_s / interval_s: the rotation alone would leave a connection silent too long.
    big = IdleTimer(4, 1.0, keepalive_s=2.5)
    for slot in range(4):
        big.wrote(slot, 0.0)
    assert big.due(range(4), 1.0) == [0]
    big.wrote(0, 1.0)
    assert big.due(range(4), 2.0) == [1]
    big.wrote(1, 2.0)
    assert big.due(range(4), 2.5) == [2, 3]
    with pytest.raises(ValueError):
        IdleTimer(1, 1.0, keepalive_s=0)


# -- auth and clocks ---------------------------------------------------------------------------------------------


def test_hmac_token_matches_the_gateway_vector():
    # Same vector as the gateway's tests (computed independently with openssl).
    assert hmac_token(b"k" * 32, "s1", 5) == "5:8308149faea0c9c1fa925f0b4c74e75c9056a526c6cd2bb3e9df12315ae4a949"
    assert parse_hmac_token(hmac_token(b"secret", "s", 1_700_000_000_000_000))[0] == 1_700_000_000_000_000
    for bad in ("garbage", "12:abc", "x:" + "0" * 64):
        with pytest.raises(ValueError):
            parse_hmac_token(bad)
    with pytest.raises(ValueError):
        hmac_token(b"", "s", 1)
    ticks = iter([10, 20])
    provider = hmac_provider(b"k", "s", lambda: next(ticks))
    assert provider().startswith("10:")
    assert provider().startswith("20:")


@pytest.mark.parametrize(("ahead_us", "skew_ppm"), [(1_000, 0.0), (3_600_000_000, 200.0), (-3_600_000_000, -200.0),
                                                     (-1_000, 37.5)])
def test_simulated_clock_ahead_and_skew(ahead_us, skew_ppm):
    now = [1_700_000_000_000_000]
    clock = SimulatedClock(ahead_us, skew_ppm, base=lambda: now[0])
    assert clock() == now[0] + ahead_us
    now[0] += 10_000_000  # 10 s of base time
    assert clock() == now[0] + ahead_us + round(skew_ppm * 10)
    assert clock.ahead_of_base_us(now[0]) == ahead_us + round(skew_ppm * 10)
    assert clock.at(now[0]) == clock()


def test_simulated_clock_refuses_broken_hardware():
    with pytest.raises(ValueError):
        SimulatedClock(0, 5_000.0)
    assert "skew_ppm=1.0" in repr(SimulatedClock(0, 1.0, base=lambda: 0))


def test_max_seq_constant_is_the_wire_limit():
    assert MAX_SEQ == 2**63 - 1


def test_time_sync_clock_converts_kernel_timestamps_only_for_realtime_bases():
    from timesync.clocks import SimulatedClock, for_time_sync, system_time_us

    realtime_ns = 1_800_000_000_123_456_789
    stamped = for_time_sync(SimulatedClock(ahead_us=5_000, skew_ppm=100.0, origin_us=1_800_000_000_000_000))
    # 123_456 us after the origin at +100 ppm: 12.3456 us of drift, rounded, on top of the 5 ms offset.
    assert stamped.from_realtime_ns(realtime_ns) == 1_800_000_000_123_456 + 5_000 + 12  # type: ignore[attr-defined]
    assert for_time_sync(system_time_us).from_realtime_ns(realtime_ns) == 1_800_000_000_123_456  # type: ignore[attr-defined]
    virtual = SimulatedClock(ahead_us=1, base=lambda: 10)
    assert for_time_sync(virtual) is virtual  # a virtual base has no relation to CLOCK_REALTIME
    assert not hasattr(for_time_sync(virtual), "from_realtime_ns")


# -- resync requests (a clock step the gateway saw) ----------------------------------------------------------------


def test_a_resync_request_starts_a_burst_at_once():
    gate = ResyncGate(min_interval_s=1.0)
    assert gate.request(10.0) == 0.0
    gate.started(10.0)
    assert gate.finished(10.05) is None


def test_requests_while_a_burst_is_scheduled_cost_nothing_more():
    gate = ResyncGate(min_interval_s=1.0)
    assert gate.request(10.0) == 0.0
    assert gate.request(10.0) is None  # a second pool connection delivering the same request
    gate.started(10.0)
    assert gate.finished(10.05) is None
    assert gate.requests == 2


def test_a_request_during_a_burst_gets_one_more_burst_after_it_no_sooner_than_the_interval():
    gate = ResyncGate(min_interval_s=1.0)
    gate.request(10.0)
    gate.started(10.0)
    # The running burst may have measured before the step: it cannot answer this request.
    assert gate.request(10.02) is None
    assert gate.request(10.03) is None
    assert gate.finished(10.05) == pytest.approx(0.95)  # one more, a second after the last start
    gate.started(11.0)
    assert gate.finished(11.05) is None


def test_requests_more_than_the_interval_apart_each_start_a_burst_at_once():
    gate = ResyncGate(min_interval_s=1.0)
    for now_s in (10.0, 12.0, 14.0):
        assert gate.request(now_s) == 0.0
        gate.started(now_s)
        assert gate.finished(now_s + 0.05) is None
    assert gate.request(14.5) == pytest.approx(0.5)  # too soon after the last one: deferred, never dropped


def test_a_heartbeat_promises_now_less_the_largest_recent_send_lag_never_below_the_newest_stamp() -> None:
    promise = HeartbeatPromise(window=3)
    assert promise.promise_us(1_000) is None
    promise.sent(1_000, 1_000)  # stamped by the SDK: lag 0
    assert promise.promise_us(1_500) == 1_500
    # the application's own stamps, sent 2 ms then 5 ms then 1 ms after their reading
    promise.sent(10_000, 12_000)
    promise.sent(20_000, 25_000)
    promise.sent(30_000, 31_000)
    # a heartbeat at 40,000: the next reading could be as old as 40,000 - 5,000 (the largest recent lag), and the
    # newest lag alone (1 ms) would have promised 39,000
    assert promise.promise_us(40_000) == 35_000
    # right after a send the promise never falls below the newest stamp
    assert promise.promise_us(31_000) == 30_000
    # the 5 ms lag leaves the window of 3 after three more sends
    for ts_us in (41_000, 42_000, 43_000):
        promise.sent(ts_us, ts_us + 1_000)
    assert promise.promise_us(50_000) == 49_000


def test_with_a_jittery_reading_to_send_delay_no_event_is_stamped_behind_a_heartbeat_sent_before_it() -> None:
    """Readings every 10 ms, each sent 4, 0, 1 or 3 ms after it; a heartbeat may go out at any instant before the next
    send. Every event's stamp must be at or after every heartbeat sent before it. The newest stamp carried forward
    by the clock (the promise before HeartbeatPromise) breaks that whenever a send lags more than the previous one."""
    lags_us = (4_000, 0, 1_000, 3_000)
    promise = HeartbeatPromise()
    broken_by_newest_lag = 0
    for n in range(400):
        reading_us = 1_000_000 + n * 10_000
        send_us = reading_us + lags_us[n % 4]
        promise.sent(reading_us, send_us)
        next_reading_us = reading_us + 10_000
        next_send_us = next_reading_us + lags_us[(n + 1) % 4]
        for heartbeat_us in range(send_us, next_send_us, 100):
            promised = promise.promise_us(heartbeat_us)
            assert promised is not None and promised <= next_reading_us, (n, heartbeat_us, promised)
            broken_by_newest_lag += reading_us + (heartbeat_us - send_us) > next_reading_us
    assert broken_by_newest_lag > 0


# -- issue 24 items 2, 3: gap notices and refused seq jumps ----------------------------------------------------------


def test_a_given_up_range_stops_being_unacked_and_its_held_events_go_out_once_more_first():
    store = UnackedStore(["s"], max_unacked=10)
    for seq in range(5):
        store.add("s", seq, 1000 + seq, seq)
    assert [e.seq for e in store.take_batch(5)] == [0, 1, 2, 3, 4]
    store.add("s", 5, 1005, 5)  # queued, never sent
    given_up = store.give_up("s", 2, 3)
    assert [(e.seq, e.given_up) for e in given_up] == [(2, True), (3, True)]
    assert len(store) == 4  # flush no longer waits for them
    assert store.ack("s", 4) == 3  # 0, 1 and 4: the given-up seqs are not counted twice
    assert len(store) == 1
    # Written once more although the ack passed them (the gateway publishes them on the late topic), ahead of 5.
    assert [e.seq for e in store.take_batch(10)] == [2, 3, 5]
    assert store.take_batch(10) == []
    assert [e.seq for e in store.give_up("s", 0, 100)] == [5]  # only what is still held
    assert len(store) == 0


def test_a_seq_given_up_before_it_was_sent_is_taken_once_and_written_once():
    """A replayed trace's late arrival: the gateway gave the seq up (its ack passed it) before the application sent
    it. It is still sent, once, for the late topic; any other seq at or below the ack is a repeat."""
    store = UnackedStore(["s"], max_unacked=10)
    for seq in (0, 1, 4):
        store.add("s", seq, 1000 + seq, seq)
    assert [e.seq for e in store.take_batch(10)] == [0, 1, 4]
    assert [e.seq for e in store.give_up("s", 2, 3, "buffer_full")] == []  # held nothing of 2..3
    assert store.ack("s", 4) == 3 and len(store) == 0
    late = store.add("s", 3, 1003, 3)
    assert (late.given_up, late.gap_reason, len(store)) == (True, "buffer_full", 0)
    assert [e.seq for e in store.take_batch(10)] == [3]
    for repeat in (3, 1, 4):
        with pytest.raises(ValueError, match=f"seq {repeat} was already sent"):
            store.add("s", repeat, 1, repeat)
    assert store.add("s", 2, 1002, 2).gap_reason == "buffer_full"
    with pytest.raises(ValueError, match="seq 2 was already sent"):
        store.add("s", 2, 1002, 2)
    # A held event of a gap went out again already: its seq is not taken a second time.
    store.add("s", 5, 1005, 5)
    assert [e.seq for e in store.give_up("s", 5, 6)] == [5]
    assert store.ack("s", 6) == 0
    with pytest.raises(ValueError, match="seq 5 was already sent"):
        store.add("s", 5, 1005, 5)
    assert store.add("s", 6, 1006, 6).given_up


async def test_an_ack_passing_tracked_events_not_yet_written_fails_their_futures_and_writes_each_once() -> None:
    """The gateway's ack passed seqs 0 and 1 before the sender wrote them (their gap notice not read yet): they
    were given up, not acknowledged. Their futures fail, they are counted, and each is still written once."""
    from clients import EventGivenUp, SkewlessClient
    from contract.wire.messages import build_ack

    client = SkewlessClient("127.0.0.1", 9, "src", ["s"])
    futures = [await client.send_tracked("s", {"i": i}) for i in range(3)]
    client._on_message(build_ack("s", 1))
    for seq, future in enumerate(futures[:2]):
        error = future.exception()
        assert isinstance(error, EventGivenUp) and (error.seq, error.reason, error.resent) == (seq, "timeout", True)
    assert not futures[2].done()
    assert (client.unacked_count, client.stats.events_given_up, client.stats.events_acked) == (1, 2, 0)
    assert [e.seq for e in client._window.store.take_batch(10)] == [0, 1, 2]
    client._on_message(build_ack("s", 2))
    assert futures[2].result() == 2 and client.stats.events_acked == 1


async def test_a_tracked_send_into_a_given_up_gap_fails_at_once_with_event_given_up() -> None:
    from clients import EventGivenUp, SkewlessClient
    from contract.wire.messages import build_ack, build_gap

    client = SkewlessClient("127.0.0.1", 9, "src", ["s"])
    await client.send("s", {"i": 0}, seq=0)
    await client.send("s", {"i": 2}, seq=2)
    client._window.store.take_batch(10)  # the sender wrote them
    client._on_message(build_gap("s", 1, 1, "timeout"))
    client._on_message(build_ack("s", 2))
    late = await client.send_tracked("s", {"i": 1}, seq=1)
    error = late.exception()
    assert isinstance(error, EventGivenUp) and (error.seq, error.reason, error.resent) == (1, "timeout", True)
    assert (client.unacked_count, client.stats.events_given_up) == (0, 1)
    with pytest.raises(ValueError, match="seq 1 was already sent"):
        await client.send("s", {"i": 1}, seq=1)


def test_a_forgotten_seq_jump_is_no_longer_unacked_nor_sent():
    store = UnackedStore(["s"], max_unacked=10)
    store.add("s", 0, 1000, 0)
    store.add("s", 2_000_000, 1001, 1)
    assert store.forget("s", 2_000_000)
    assert not store.forget("s", 2_000_000)
    assert len(store) == 1
    assert [e.seq for e in store.take_batch(10)] == [0]
    assert store.ack("s", 0) == 1 and len(store) == 0


async def test_the_client_fails_given_up_futures_resends_them_once_and_counts_them() -> None:
    import asyncio

    from clients import EventGivenUp, EventRefused, SkewlessClient
    from contract.wire.messages import SEQ_CONFLICT, SEQ_JUMP, build_ack, build_error, build_gap

    client = SkewlessClient("127.0.0.1", 9, "src", ["s"])
    futures = [await client.send_tracked("s", {"i": i}) for i in range(4)]
    client._window.store.take_batch(10)  # the sender wrote them
    client._on_message(build_gap("s", 1, 2, "timeout"))
    assert client.unacked_count == 2
    assert (client.stats.seqs_given_up, client.stats.events_given_up) == (2, 2)
    for future in futures[1:3]:
        error = future.exception()
        assert isinstance(error, EventGivenUp) and (error.reason, error.resent) == ("timeout", True)
    client._on_message(build_error(SEQ_CONFLICT, "conflict", False, "s", 3))
    error = futures[3].exception()
    assert isinstance(error, EventRefused) and error.code == SEQ_CONFLICT
    client._on_message(build_ack("s", 3))
    assert futures[0].result() == 0
    assert client.unacked_count == 0 and client.stats.conflicts == 1
    # A refused seq jump is never acked: forgotten at once, so flush() does not wait for it.
    jump = await client.send_tracked("s", "far", seq=5_000_000)
    assert client.unacked_count == 1
    client._on_message(build_error(SEQ_JUMP, "too far", False, "s", 5_000_000))
    assert client.unacked_count == 0
    with pytest.raises(EventRefused):
        await asyncio.wait_for(jump, 1)
    # A gap naming seqs this client never sent (an explicit seq= skipped them) is only counted.
    client._on_message(build_gap("s", 5_000_001, 5_000_009, "buffer_full"))
    assert (client.stats.seqs_given_up, client.stats.events_given_up) == (11, 2)
