"""MultiSourceMerger: thesis section 3.2.2 rules, watermark / punctuation, and properties."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from reorder.merger import MergerConfig, MultiSourceMerger
from reorder.records import Late, Merged, Punctuation, SourceEvent, SourceTimedOut
from timesync.clocks import EstimateMapping, FixedOffsetMapping, IdentityMapping


def ev(source: str, seq: int, ts: int) -> SourceEvent:
    return SourceEvent(source, "R1", seq, ts)


def merged(outs: Sequence[object]) -> list[tuple[str, int, int]]:
    return [(o.event.source_id, o.event.seq, o.ref_ts_us) for o in outs if isinstance(o, Merged)]


def test_releases_smallest_reference_time_using_each_sources_offset() -> None:
    # S2's clock is 1000 us behind the reference, S3's 500 us ahead (t_ref = t_source + offset)
    clock = FixedOffsetMapping({"S1": 0, "S2": 1000, "S3": -500})
    m = MultiSourceMerger("R1", clock, MergerConfig(mode="thesis", default_timeout_us=10_000))
    for s in ("S1", "S2", "S3"):
        m.register(s, 0)
    out = m.push(ev("S1", 0, 1200), 1, 1)  # S2, S3 empty: wait
    out += m.push(ev("S2", 0, 0), 2, 2)  # ref 1000
    assert merged(out) == []
    out = m.push(ev("S3", 0, 1600), 3, 3)  # ref 1100: all heads known, release 1000 (S2), then S2 empty
    assert merged(out) == [("S2", 0, 1000)]
    out = m.push(ev("S2", 1, 300), 4, 4)  # ref 1300 -> releases S3 (1100); then S3 is empty: wait for it
    assert merged(out) == [("S3", 0, 1100)]
    out = m.push(ev("S3", 1, 1900), 5, 5)  # ref 1400 -> S1 (1200); then S1 is empty: wait for it
    assert merged(out) == [("S1", 0, 1200)]
    assert m.next_deadline_us() == 5 + 10_000


def test_sources_gone_silent_together_cost_the_merge_one_wait_not_one_each() -> None:
    """Twenty sources speak once and go (no bye reaches the merge); a new source's event then waits for them. Silent
    already for longer than their wait, they are all given up at once, not one after another 20 waits later."""
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=1_000_000, learn_wait=False))
    gone = [f"gone-{i:02d}" for i in range(20)]
    for source_id in gone:
        m.register(source_id, 0)
    out = []
    for source_id in gone:
        out += m.push(ev(source_id, 0, 100), 10, 10)
    assert merged(out) == [(source_id, 0, 100) for source_id in gone]
    m.register("new", 5_000_000)
    assert merged(m.push(ev("new", 0, 5_000_000), 5_000_000, 5_000_000)) == []
    assert m.next_deadline_us() == 5_000_000
    out = m.advance(5_000_000)
    assert sorted(o.source_id for o in out if isinstance(o, SourceTimedOut)) == gone
    assert merged(out) == [("new", 0, 5_000_000)]


def test_a_source_silent_for_less_than_its_wait_still_gets_the_whole_wait_from_now() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=1_000_000, learn_wait=False))
    m.register("quiet", 0)
    m.register("busy", 0)
    m.push(ev("quiet", 0, 100), 10, 10)
    m.push(ev("busy", 0, 100), 10, 10)
    # quiet last spoke at 10; at 600,000 (silent 0.6 s, less than its 1 s wait) busy's next event waits for it
    assert merged(m.push(ev("busy", 1, 600_000), 600_000, 600_000)) == []
    assert m.next_deadline_us() == 600_000 + 1_000_000


def test_thesis_waits_for_an_empty_source_then_flags_it_timed_out_until_its_next_event() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(mode="thesis", default_timeout_us=100))
    m.register("A", 0)
    m.register("B", 0)
    assert m.push(ev("A", 0, 10), 10, 10) == []
    assert m.next_deadline_us() == 110
    assert m.advance(109) == []
    out = m.advance(110)
    assert out == [SourceTimedOut("R1", "B", 110), Merged(ev("A", 0, 10), 10, 110, 10)]
    assert m.is_timed_out("B")
    # while B is flagged the merge does not wait for it
    assert merged(m.push(ev("A", 1, 20), 120, 120)) == [("A", 1, 20)]
    # B's next event drops the flag; thesis mode releases it even though it is older
    out = m.push(ev("B", 0, 15), 130, 130)
    assert not m.is_timed_out("B")
    assert out == []  # A is now empty and live again: wait for it
    assert merged(m.advance(230)) == [("B", 0, 15)]


def test_watermark_mode_does_not_wait_for_a_source_whose_frontier_is_ahead() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=1000, punctuation_interval_us=0))
    m.heartbeat("A", -1, 0, 0)
    m.heartbeat("B", -1, 0, 0)
    out = m.push(ev("B", 0, 50), 60, 60)  # A's frontier is 0 < 50: A may still send ts 1..49
    assert merged(out) == []
    out = m.push(ev("A", 0, 40), 70, 70)  # now A's frontier is 40 -> release A(40); then B waits for A
    assert merged(out) == [("A", 0, 40)]
    # A quiet but alive: a heartbeat with its seq and clock 55 proves nothing older than 55 will come
    out = m.heartbeat("A", 0, 55, 80)
    assert merged(out) == [("B", 0, 50)]
    # the watermark is now B's frontier (50): B is empty and could still send 50
    assert [o.watermark_us for o in out if isinstance(o, Punctuation)] == [50]
    assert not m.is_timed_out("A")
    assert m.next_deadline_us() is None


def test_heartbeat_only_counts_once_every_event_up_to_its_seq_was_delivered() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=1000))
    m.heartbeat("A", -1, 0, 0)
    m.push(ev("B", 0, 50), 1, 1)
    # A claims seq 3 at clock 100, but the merger has seen none of A's events 0..3 yet
    assert merged(m.heartbeat("A", 3, 100, 2)) == []
    out = m.push(ev("A", 3, 30), 3, 3)  # (its reorderer skipped 0..2) now seq 3 is delivered
    assert merged(out) == [("A", 3, 30), ("B", 0, 50)]


def test_timed_out_source_coming_back_below_the_punctuation_goes_to_the_late_side_output() -> None:
    # the given 100 us wait alone: with the learned wait B's heartbeat would have it waited for up to the 2 s cap
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=100, punctuation_interval_us=0,
                                                                learn_wait=False))
    m.heartbeat("A", -1, 0, 0)
    m.heartbeat("B", -1, 0, 0)
    m.push(ev("A", 0, 500), 10, 10)
    out = m.advance(110)  # B timed out -> A(500) released, watermark from A alone
    assert merged(out) == [("A", 0, 500)]
    out = m.push(ev("A", 1, 600), 120, 120)
    wm = m.watermark_us
    assert wm == 600
    out = m.push(ev("B", 0, 200), 130, 130)
    assert out == [Late(ev("B", 0, 200), 130, "after_punctuation", 400, False)]
    assert m.counters.late == 1


def test_watermark_subtracts_the_error_bound() -> None:
    m = MultiSourceMerger("R1", FixedOffsetMapping({}, error_bound_us=7), MergerConfig(punctuation_interval_us=0))
    out = m.push(ev("A", 0, 100), 0, 0)
    assert [o.watermark_us for o in out if isinstance(o, Punctuation)] == [93]


def test_unknown_estimate_holds_the_watermark_back_by_its_unknown_error() -> None:
    m = MultiSourceMerger("R1", EstimateMapping(), MergerConfig(punctuation_interval_us=0))
    out = m.push(ev("A", 0, 100), 0, 0)
    assert merged(out) == [("A", 0, 100)]
    # 100 - the unknown error is below 0: no watermark is promised outside the contract's range (issue 24 item 7)
    assert m.watermark_us is None
    unknown_us = EstimateMapping.UNKNOWN_ERROR_US
    out = m.push(ev("A", 1, unknown_us + 100), 1, 1)
    assert merged(out) == [("A", 1, unknown_us + 100)]
    assert m.watermark_us == 100


@st.composite
def source_streams(draw: st.DrawFn) -> list[tuple[str, int, int, int]]:
    """Per source an increasing clock; each event arrives after it happened; (source, seq, ts, arrival)."""
    n_sources = draw(st.integers(1, 4))
    events = []
    for s in range(n_sources):
        ts = draw(st.lists(st.integers(0, 1000), min_size=1, max_size=15))
        ts.sort()
        for seq, t in enumerate(ts):
            events.append((f"S{s}", seq, t, t + draw(st.integers(0, 300))))
    # per-source order of delivery must follow seq (the reorderer's job): arrival made monotone per source
    out = []
    last: dict[str, int] = {}
    for src, seq, t, arrival in events:
        monotone = max(arrival, last.get(src, 0))
        last[src] = monotone
        out.append((src, seq, t, monotone))
    return sorted(out, key=lambda e: (e[3], e[0], e[1]))


@settings(max_examples=150, deadline=None)
@given(source_streams(), st.sampled_from(["thesis", "watermark"]))
def test_output_is_sorted_by_reference_time_when_no_source_timed_out(
    events: list[tuple[str, int, int, int]], mode: str
) -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(mode=mode, default_timeout_us=10**9))  # type: ignore[arg-type]
    for s in {e[0] for e in events}:
        m.register(s, 0)
    out: list[object] = []
    for src, seq, ts, arrival in events:
        out += m.advance(arrival)
        out += m.push(ev(src, seq, ts), arrival, arrival)
    assert not any(isinstance(o, SourceTimedOut) for o in out)
    out += m.flush(10**9)
    refs = [r for _, _, r in merged(out)]
    assert refs == sorted(refs)
    assert len(refs) == len(events)


@settings(max_examples=150, deadline=None)
@given(
    source_streams(),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1500), st.integers(0, 1500)), max_size=10),
    st.integers(1, 400),
)
def test_watermark_never_goes_backwards_and_nothing_below_it_follows(
    events: list[tuple[str, int, int, int]], beats: list[tuple[int, int, int]], timeout: int
) -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=timeout, punctuation_interval_us=0))
    timeline: list[tuple[int, int, object]] = [(a, 1, (s, q, t)) for s, q, t, a in events]
    timeline += [(at, 0, (f"S{s}", clock)) for s, clock, at in beats]
    timeline.sort(key=lambda x: (x[0], x[1]))
    delivered: dict[str, int] = {}
    out: list[object] = []
    for at, kind, data in timeline:
        out += m.advance(at)
        if kind == 1:
            src, seq, ts = data  # type: ignore[misc]
            delivered[src] = ts
            out += m.push(ev(src, seq, ts), at, at)
        else:
            src, _ = data  # type: ignore[misc]
            if src in delivered:  # a heartbeat can only vouch for a clock at or after what was sent
                out += m.heartbeat(src, 10**6, delivered[src], at)
    out += m.flush(10**9)
    watermark = None
    for o in out:
        if isinstance(o, Punctuation):
            assert watermark is None or o.watermark_us > watermark
            watermark = o.watermark_us
        elif isinstance(o, Merged) and watermark is not None:
            assert o.ref_ts_us >= watermark
    n_late = sum(1 for o in out if isinstance(o, Late))
    assert len(merged(out)) + n_late == len(events)


def test_the_awaited_source_sending_only_stale_events_does_not_leave_the_merge_without_a_deadline() -> None:
    # b is what the merge waits for; its next event is older than the punctuation, so it goes to the late output
    # without entering the merge. That event still revives b (and cancels the wait on it): the merge must wait for
    # b again, with a deadline, or a's queued event waits for whatever input comes next, forever at end of stream.
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(punctuation_interval_us=0),
                          timeout_for=lambda _sid, _now: 1_000)
    assert merged(m.push(ev("a", 0, 10), 0, 0)) == [("a", 0, 10)]  # punctuation 10
    (late,) = m.push(ev("b", 0, 5), 1, 1)
    assert isinstance(late, Late)
    assert (late.reason, late.lateness_us) == ("after_punctuation", 5)
    assert merged(m.push(ev("a", 1, 20), 2, 2)) == []  # b might still send something in 10..20
    assert m.next_deadline_us() == 2 + 1_000
    out = m.push(ev("b", 1, 6), 3, 3)
    assert [type(o) for o in out] == [Late]
    assert m.next_deadline_us() == 3 + 1_000  # waits for b anew, from its last sign of life
    out = m.advance(3 + 1_000)
    assert [type(o) for o in out if not isinstance(o, Punctuation)] == [SourceTimedOut, Merged]
    assert merged(out) == [("a", 1, 20)]


def test_a_late_event_passed_through_by_the_awaited_source_keeps_the_merge_deciding() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(mode="thesis"), timeout_for=lambda _sid, _now: 1_000)
    m.register("a", 0)
    m.register("b", 0)
    assert merged(m.push(ev("a", 0, 20), 1, 1)) == []  # waits for b
    assert m.next_deadline_us() == 1 + 1_000
    out = m.push(ev("b", 3, 5), 2, 2, late=True)  # passed through by b's reorderer: released at once
    assert merged(out) == [("b", 3, 5)]
    assert m.next_deadline_us() == 2 + 1_000
    assert merged(m.advance(2 + 1_000)) == [("a", 0, 20)]


class _ScanEveryTime(MultiSourceMerger):
    """The reference: forgets which source held the watermark, so every punctuation check scans every source."""

    def _punctuate(self, now_us: int, out: list) -> None:  # type: ignore[override,type-arg]
        self._watermark_holder = None
        super()._punctuate(now_us, out)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.booleans(), st.integers(0, 50), st.integers(0, 30)),
                max_size=80),
       st.sampled_from([0, 5]), st.booleans())
def test_skipping_scans_while_the_holder_is_below_the_watermark_changes_no_output(
        ops: list[tuple[str, bool, int, int]], interval_us: int, learn_wait: bool) -> None:
    # Differential: the merger that skips scans emits exactly what one that scans on every call emits (events,
    # punctuations, timeouts), on random interleavings of events, heartbeats and timer firings; with the learned
    # merge wait too (a short cap and warm-up, so learned waits both hold the merge and run out within the ops).
    config = MergerConfig(default_timeout_us=40, punctuation_interval_us=interval_us, learn_wait=learn_wait,
                          learned_wait_cap_us=90, min_wait_samples=2)
    fast = MultiSourceMerger("R", FixedOffsetMapping({"b": 7, "c": -5}, error_bound_us=3), config)
    reference = _ScanEveryTime("R", FixedOffsetMapping({"b": 7, "c": -5}, error_bound_us=3), config)
    seq = dict.fromkeys("abcd", 0)
    ts = dict.fromkeys("abcd", 0)
    now = 0
    for merger in (fast, reference):  # "a" joins with its first event or heartbeat
        for source in "bcd":
            merger.register(source, now)
    for source, is_event, step_ts, step_now in ops:
        now += step_now
        ts[source] += step_ts
        if is_event:
            outs = [m.push(ev(source, seq[source], ts[source]), now, now) for m in (fast, reference)]
            seq[source] += 1
        else:
            outs = [m.heartbeat(source, seq[source], ts[source], now) for m in (fast, reference)]
        assert outs[0] == outs[1]
        assert fast.advance(now) == reference.advance(now)


# -- the learned merge wait ------------------------------------------------------------------------------------------

LEARN = MergerConfig(default_timeout_us=10, punctuation_interval_us=0, learn_wait=True, learned_wait_cap_us=5_000,
                     min_wait_samples=3)


def _silence(m: MultiSourceMerger, ref_us: int, silent_for_us: int) -> list[object]:
    """a sends an event at ``ref_us`` (the merge starts waiting for b), b follows ``silent_for_us`` later."""
    out: list[object] = list(m.push(ev("a", ref_us, ref_us), ref_us, ref_us))
    out += m.push(ev("b", ref_us, ref_us), ref_us + silent_for_us, ref_us + silent_for_us)
    return out


def test_before_it_has_seen_enough_silences_the_merge_waits_the_cap_not_the_short_given_wait() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), LEARN)
    for source in "ab":
        m.heartbeat(source, -1, 0, 0)
    assert merged(m.push(ev("a", 0, 100), 100, 100)) == []
    assert m.next_deadline_us() == 100 + 5_000  # the cap: nothing says yet how long b goes quiet
    # b's uplink stalled 3 ms: no gap showed, b was just silent; the learned wait outlasts it, nothing is diverted
    out = m.push(ev("b", 0, 100), 3_100, 3_100)
    assert merged(out) == [("a", 0, 100), ("b", 0, 100)]
    assert m.counters.timeouts == 0


def test_once_trusted_the_wait_is_twice_the_quantile_of_the_sources_silences() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), LEARN)
    for source in "ab":
        m.heartbeat(source, -1, 0, 0)
    for k in range(1, 4):  # three silences of 30 us each
        assert len(merged(_silence(m, 1_000 * k, 30))) == 2
    # b last spoke at 3,030; 20 us later a's next event waits for it
    m.push(ev("a", 4_000, 3_050), 3_050, 3_050)
    # 30 us falls in the 5 % bucket whose upper edge is 31 us: the wait is 2 x 31, above the given 10 us
    assert m.next_deadline_us() == 3_050 + 62


def test_a_silence_that_outlasted_the_wait_still_teaches_it_when_the_source_comes_back() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), LEARN)
    for source in "ab":
        m.heartbeat(source, -1, 0, 0)
    for k in range(1, 4):
        _silence(m, 1_000 * k, 30)
    m.push(ev("a", 4_000, 4_000), 4_000, 4_000)
    out = m.advance(4_000 + 62)  # b stays quiet past its learned wait: the merge gives up on it
    assert [type(o) for o in out] == [SourceTimedOut, Merged, Punctuation]
    (late,) = m.push(ev("b", 3_999, 3_999), 4_500, 4_500)  # back 500 us after the wait began, behind the watermark
    assert isinstance(late, Late) and late.reason == "after_punctuation"
    m.push(ev("a", 5_000, 5_000), 5_000, 5_000)
    # the 500 us silence lands in the bucket with edge 516 us, the highest seen: the wait is now 2 x 516
    assert m.next_deadline_us() == 5_000 + 1_032


def test_the_learned_wait_never_exceeds_its_cap_and_thesis_mode_ignores_it() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), LEARN)
    for source in "ab":
        m.heartbeat(source, -1, 0, 0)
    for k in range(1, 4):
        _silence(m, 10_000 * k, 4_000)  # 2 x the 4 ms quantile is above the 5 ms cap
    m.push(ev("a", 40_000, 36_000), 36_000, 36_000)  # b last spoke at 34,000
    assert m.next_deadline_us() == 36_000 + 5_000
    thesis = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(
        mode="thesis", default_timeout_us=10, learn_wait=True, learned_wait_cap_us=5_000, min_wait_samples=0))
    for source in "ab":
        thesis.register(source, 0)
    thesis.push(ev("a", 0, 100), 100, 100)
    assert thesis.next_deadline_us() == 100 + 10  # Eq. 3.11's wait, as the thesis runs it


def test_a_source_that_never_delivered_is_waited_for_its_given_wait_alone() -> None:
    # b said hello but has sent nothing: no silence of its own to learn from, so the given wait (in the pipeline its
    # join or reconnect grace, shared by every newcomer) is not stretched to the learned wait's cap
    m = MultiSourceMerger("R1", IdentityMapping(), LEARN)
    m.register("a", 0)
    m.register("b", 0)
    m.push(ev("a", 0, 100), 5, 5)
    assert m.next_deadline_us() == 5 + 10
    out = m.advance(110)
    assert [type(o) for o in out] == [SourceTimedOut, Merged, Punctuation]


# -- issue 24 item 6 / issue 25 item 6: reference order holds whatever the sources' stamps do --------------------


class _PerSourceError:
    def __init__(self, errors_us: dict[str, int]) -> None:
        self.errors_us = errors_us

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us, self.errors_us.get(source_id, 0)

    def rtt_us(self, source_id: str) -> int | None:
        return None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2_000), st.integers(0, 50)), min_size=1, max_size=60),
    st.lists(st.integers(0, 300), min_size=4, max_size=4),
    st.integers(1, 400),
    st.booleans(),
    st.integers(0, 1_000),
)
def test_main_output_is_in_reference_order_and_every_event_leaves_once_whatever_the_stamps(
    pushes: list[tuple[int, int, int]], errors: list[int], timeout: int, runs: bool, punctuation_interval: int
) -> None:
    """Stamps in any order (regressions along seqs), per-source error bounds, timeouts giving sources up and their
    return: the main output never goes below what it released, every event is merged or late exactly once, and a
    late one from the order rule names its cause; a raised one stays within its error bound."""
    mapping = _PerSourceError({f"S{i}": e for i, e in enumerate(errors)})
    m = MultiSourceMerger("R1", mapping, MergerConfig(default_timeout_us=timeout, learn_wait=False,
                                                      punctuation_interval_us=punctuation_interval))
    for i in range(4):
        m.register(f"S{i}", 0)
    seqs = [0, 0, 0, 0]
    now = 0
    out: list[object] = []
    pushed = 0
    for source, ts, step in pushes:
        now += step
        out += m.advance(now)
        sid = f"S{source}"
        event = ev(sid, seqs[source], ts)
        seqs[source] += 1
        pushed += 1
        if runs:
            out += m.push_run(sid, [(event, now, mapping.to_reference(sid, ts))], now)
        else:
            out += m.push(event, now, now)
    out += m.flush(now + 10**6)
    released = [o for o in out if isinstance(o, Merged)]
    refs = [o.ref_ts_us for o in released]
    assert refs == sorted(refs)
    late = [o for o in out if isinstance(o, Late)]
    assert len(released) + len(late) == pushed
    assert len({(o.event.source_id, o.event.seq) for o in (*released, *late)}) == pushed
    for o in released:
        assert o.ref_ts_us - o.event.source_ts_us == o.raised_us
        # Own bound plus the frontier's (review B3); a frontier raised to the others' releases carries its raise too.
        assert 0 <= o.raised_us <= 3 * errors[int(o.event.source_id[1:])]
    assert {o.reason for o in late} <= {"after_punctuation", "stamp_regression", "after_give_up"}


def test_leave_gives_an_empty_source_up_at_once_and_a_queued_one_once_its_queue_is_empty() -> None:
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=10**9, learn_wait=False))
    for s in ("A", "B"):
        m.register(s, 0)
    out = m.push(ev("A", 0, 10), 10, 10)
    assert merged(out) == []
    out = m.leave("B", 11)
    assert merged(out) == [("A", 0, 10)]
    assert [o for o in out if isinstance(o, SourceTimedOut)] == []  # given up, as a departure, not a timeout
    assert m.is_timed_out("B")
    assert (m.counters.departures, m.counters.timeouts) == (1, 0)
    assert m.next_deadline_us() is None
    assert m.leave("B", 12) == []  # already gone: nothing more


def test_a_departure_punctuates_what_its_last_heartbeat_promised_before_it_stops_counting() -> None:
    """The last source of a stream says bye right after a heartbeat promising 8,000 (inside the punctuation
    interval, so not punctuated yet): the stream's last punctuation is that promise, not its last event (a window
    ending at 8,000 stayed open forever once the departure took the source out of the watermark)."""
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(learn_wait=False, punctuation_interval_us=10**9))
    for s in ("A", "B"):
        m.register(s, 0)
    out = m.push(ev("A", 0, 7_000), 10, 10)
    out += m.push(ev("B", 0, 7_500), 11, 11)
    out += m.heartbeat("A", 0, 8_100, 12, caught_up=True)
    out += m.heartbeat("B", 0, 8_000, 13, caught_up=True)
    out += m.leave("A", 14)
    out += m.leave("B", 15)
    assert merged(out) == [("A", 0, 7_000), ("B", 0, 7_500)]
    assert [p.watermark_us for p in out if isinstance(p, Punctuation)][-1] == 8_000


def test_the_source_the_merge_waits_for_is_not_forgotten_and_its_wait_still_fires() -> None:
    """Review B1: forgetting the blocker left the others' events queued with no deadline."""
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(learn_wait=False, default_timeout_us=1_000))
    m.register("A", 0)
    m.register("B", 0)
    out = m.push(ev("A", 0, 10), 10, 10)
    out += m.push(ev("B", 0, 20), 20, 20)
    assert merged(out) == [("A", 0, 10)]  # B's event waits for A
    assert (m.waits_for("A"), m.next_deadline_us()) == (True, 1_020)
    assert m.forget("A") is False
    assert (m.sources(), m.next_deadline_us()) == (["A", "B"], 1_020)
    out = m.advance(1_020)
    assert merged(out) == [("B", 0, 20)]
    assert [o.source_id for o in out if isinstance(o, SourceTimedOut)] == ["A"]
    assert (m.waits_for("A"), m.forget("A"), m.sources(), m.queued) == (False, True, ["B"], 0)


def test_a_frontier_keeps_the_bound_of_the_mapping_that_set_it() -> None:
    """Review B3: a heartbeat mapped with a 500 us bound sets A's frontier at 1000; an event mapped after a re-sync
    with a 100 us bound may sit up to 600 us below it without any stamp going backwards. Compared with its own
    100 us alone, seq 1 went late as stamp_regression."""
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(learn_wait=False, punctuation_interval_us=0))
    m.register("A", 0)
    out = m.push(ev("A", 0, 100), 1, 1, mapped=(100, 10))
    out += m.heartbeat("A", 0, 1_000, 2, mapped=(1_000, 500))
    out += m.push(ev("A", 1, 600), 3, 3, mapped=(600, 100))  # 400 below the frontier: within 500 + 100
    out += m.push(ev("A", 2, 399), 4, 4, mapped=(399, 100))  # 601 below: beyond both
    assert merged(out) == [("A", 0, 100), ("A", 1, 600)]
    assert [(o.event.seq, o.reason, o.lateness_us) for o in out if isinstance(o, Late)] == [
        (2, "stamp_regression", 601)]
    assert [o.watermark_us for o in out if isinstance(o, Punctuation)] == [90, 500, 900]


def test_an_event_is_never_released_before_it_arrived_when_frames_are_handled_out_of_read_order() -> None:
    """Connections queue their frames apart: S2's frame, read at 90, is handled after S1's, read at 100, and releases
    S1's event. The call's now is 90; the release is stamped 100, when the event arrived, not before."""
    m = MultiSourceMerger("R1", IdentityMapping(), MergerConfig(default_timeout_us=1_000_000, learn_wait=False))
    m.register("S1", 0)
    m.register("S2", 0)
    assert merged(m.push(ev("S1", 0, 10), 100, 100)) == []  # waits for S2
    out = m.push(ev("S2", 0, 20), 90, 90)
    releases = [(o.event.source_id, o.arrival_us, o.release_us) for o in out if isinstance(o, Merged)]
    assert releases == [("S1", 100, 100)]  # S2's own event (ref 20) waits for S1's next
