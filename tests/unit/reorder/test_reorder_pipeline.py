"""The ordering pipeline (the gateway's, and the replay's) in virtual time: reorder per source, merge by reference
time, side outputs."""

from dataclasses import replace

from contract.wire.messages import IncomingEvent
from reorder.merger import MergerConfig
from reorder.pipeline import IngestPipeline, PipelineConfig, PublishPunctuation, PublishRecord, PublishRefused
from reorder.sequence import SequenceConfig
from tests.mapping_reference import map_at_every_stage
from timesync.clocks import FixedOffsetMapping, IdentityMapping

T0 = 1_000_000_000


def ev(seq, ts, stream="s"):
    return IncomingEvent(stream, seq, ts, {"seq": seq})


def records(outputs, topic="events"):
    return [(o.record.source_id, o.record.seq, o.record.ref_ts_us) for o in outputs
            if isinstance(o, PublishRecord) and o.topic == topic]


def test_single_source_out_of_order_released_in_seq_order():
    pipe = IngestPipeline(IdentityMapping())
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(1, T0 + 20), T0 + 1)
    assert records(out) == []
    out = pipe.push("a", ev(0, T0 + 10), T0 + 2)
    assert records(out) == [("a", 0, T0 + 10), ("a", 1, T0 + 20)]
    (first, _second) = [o.record for o in out if isinstance(o, PublishRecord)]
    assert first.arrival_ts_us == T0 + 2
    assert first.release_ts_us == T0 + 2
    assert first.uncertainty_us == 0


def test_two_sources_merged_by_reference_time_with_offsets():
    # b's clock is 1000 us behind: its source time T0+500 is reference time T0+1500.
    pipe = IngestPipeline(FixedOffsetMapping({"a": 0, "b": 1_000}, error_bound_us=7))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 1_000), T0 + 10)
    out += pipe.push("a", ev(1, T0 + 2_000), T0 + 11)
    assert records(out) == []  # b has said nothing yet: a must wait for it
    out = pipe.push("b", ev(0, T0 + 500), T0 + 12)
    assert records(out) == [("a", 0, T0 + 1_000), ("b", 0, T0 + 1_500)]
    out = pipe.heartbeat("b", {"s": 1}, T0 + 5_000, T0 + 13)
    assert records(out) == [("a", 1, T0 + 2_000)]
    assert [o.record.uncertainty_us for o in out if isinstance(o, PublishRecord)] == [7]


def test_silent_source_times_out_then_merge_proceeds():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(merger=MergerConfig(default_timeout_us=1_000)))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    assert records(pipe.push("a", ev(0, T0), T0)) == []
    deadline = pipe.next_deadline_us()
    assert deadline is not None
    assert records(pipe.advance(deadline - 1)) == []
    assert records(pipe.advance(deadline)) == [("a", 0, T0)]
    assert pipe.counters.source_timeouts == 1


def test_gap_skipped_after_timeout_and_late_arrival_goes_to_late_topic():
    config = PipelineConfig(sequence=SequenceConfig(latency_threshold_us=5_000, drop_late=True))
    pipe = IngestPipeline(IdentityMapping(), config)
    pipe.register("a", ("s",), T0)
    pipe.push("a", ev(0, T0), T0)
    assert records(pipe.push("a", ev(2, T0 + 2), T0 + 100)) == []
    out = pipe.advance(T0 + 100 + 5_000)
    assert records(out) == [("a", 2, T0 + 2)]
    assert pipe.counters.gaps == 1
    late = pipe.push("a", ev(1, T0 + 1), T0 + 9_000)
    assert records(late) == []
    (record,) = [o.record for o in late if isinstance(o, PublishRecord) and o.topic == "late"]
    assert (record.seq, record.late, record.late_reason) == (1, True, "late_after_skip")
    assert record.lateness_us == 9_000 - 5_100


def test_future_dated_event_quarantined_not_merged():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(max_future_us=1_000))
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 1_001), T0)
    (record,) = [o.record for o in out if isinstance(o, PublishRecord)]
    assert (record.late_reason, record.lateness_us) == ("future_dated", 1_001)
    assert pipe.counters.quarantined == 1
    # The next, sane event is not held back by the quarantined one.
    assert records(pipe.push("a", ev(1, T0 + 5), T0 + 1)) == [("a", 1, T0 + 5)]


def test_resume_from_starts_at_the_recovered_seq():
    pipe = IngestPipeline(IdentityMapping())
    pipe.resume_from("a", "s", 40)
    pipe.register("a", ("s",), T0)
    assert records(pipe.push("a", ev(40, T0), T0)) == [("a", 40, T0)]
    late = pipe.push("a", ev(39, T0), T0 + 1)
    assert [o.record.late_reason for o in late if isinstance(o, PublishRecord)] == ["before_start"]


def test_punctuation_follows_merged_events():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(merger=MergerConfig(punctuation_interval_us=0)))
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 50), T0 + 1)
    punctuations = [o for o in out if isinstance(o, PublishPunctuation)]
    assert records(out) == [("a", 0, T0 + 50)]
    assert punctuations == [PublishPunctuation("s", T0 + 50, T0 + 1)]


def test_recovered_source_holds_the_merge_until_it_reconnects_or_the_grace_ends():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(reconnect_grace_us=10_000))
    pipe.resume_from("b", "s", 7)
    pipe.expect("b", "s", T0)
    pipe.register("a", ("s",), T0)
    # a is back first; b (recovered, not reconnected yet) may still resend older events: a waits.
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 1)) == []
    assert pipe.next_deadline_us() == T0 + 10_000
    assert records(pipe.advance(T0 + 9_999)) == []
    # Grace over: b is given up (counted as a source timeout) and a flows.
    assert records(pipe.advance(T0 + 10_000)) == [("a", 0, T0 + 5)]
    assert pipe.counters.source_timeouts == 1


def test_a_recovered_source_whose_events_were_all_published_before_is_not_waited_for_once_it_heartbeats():
    """b's events up to seq 6 went out before the handover; it resends nothing (they were acked) and only heartbeats.
    Its heartbeat says it has sent everything below 7, which its reorderer (resumed at 7) confirms: the merge takes
    its clock as b's frontier at once. Before, the merger waited to see seq 6 itself, which never came, and each
    heartbeat restarted its wait for b: the merge stood still for as long as b kept heartbeating."""
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(reconnect_grace_us=10_000))
    pipe.resume_from("b", "s", 7)
    pipe.expect("b", "s", T0)
    pipe.register("a", ("s",), T0)
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 1)) == []
    pipe.register("b", ("s",), T0 + 2)
    assert records(pipe.heartbeat("b", {"s": 7}, T0 + 100, T0 + 3)) == [("a", 0, T0 + 5)]
    assert pipe.counters.source_timeouts == 0


def test_recovered_source_reconnecting_in_time_is_merged_in_order():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(reconnect_grace_us=10_000))
    pipe.resume_from("b", "s", 7)
    pipe.expect("b", "s", T0)
    pipe.register("a", ("s",), T0)
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 1)) == []
    pipe.register("b", ("s",), T0 + 2)
    assert records(pipe.push("b", ev(7, T0 + 3), T0 + 3)) == [("b", 7, T0 + 3)]
    assert records(pipe.heartbeat("b", {"s": 8}, T0 + 100, T0 + 4)) == [("a", 0, T0 + 5)]
    assert pipe.counters.source_timeouts == 0


def test_a_recovered_source_is_waited_for_until_the_grace_ends_when_the_wait_starts_past_half_of_it():
    """The merge gives a silent source up at once when it has been silent for longer than the wait it would get from
    now (a join wait's rule): for a recovered source, judged from its recovery, that gave it up at once whenever the
    first other source came back past half of the reconnect grace, and its resends went late (the SIGKILL failover
    test's sensor-18 could be one). Its wait is the grace's end, whenever it starts."""
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(reconnect_grace_us=10_000))
    pipe.resume_from("b", "s", 7)
    pipe.expect("b", "s", T0)
    pipe.register("a", ("s",), T0 + 6_000)
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 6_000)) == []
    assert pipe.next_deadline_us() == T0 + 10_000
    assert records(pipe.advance(T0 + 9_999)) == []
    assert records(pipe.push("b", ev(7, T0 + 3), T0 + 9_999)) == [("b", 7, T0 + 3)]
    assert records(pipe.heartbeat("b", {"s": 8}, T0 + 100, T0 + 9_999)) == [("a", 0, T0 + 5)]
    assert pipe.counters.source_timeouts == 0


def test_a_recovered_source_silent_past_the_grace_is_given_up_at_its_end():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(reconnect_grace_us=10_000))
    pipe.expect("b", "s", T0)
    pipe.register("a", ("s",), T0 + 10_000)
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 10_000)) == []
    assert pipe.next_deadline_us() == T0 + 10_000
    assert records(pipe.advance(T0 + 10_000)) == [("a", 0, T0 + 5)]
    assert pipe.counters.source_timeouts == 1


def test_restored_watermark_sends_older_events_to_the_late_topic():
    pipe = IngestPipeline(IdentityMapping())
    pipe.restore_watermark("s", T0 + 100)
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 99), T0)
    assert [(o.record.late_reason, o.record.lateness_us) for o in out
            if isinstance(o, PublishRecord) and o.topic == "late"] == [("after_punctuation", 1)]
    assert records(pipe.push("a", ev(1, T0 + 100), T0 + 1)) == [("a", 1, T0 + 100)]


def test_silent_newcomers_share_one_join_deadline_instead_of_one_wait_each():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(join_grace_us=2_000_000))
    pipe.register("good", ("s",), T0)
    for k in range(50):  # a crowd that says hello and then nothing
        pipe.register(f"silent-{k}", ("s",), T0 + k)
    out = pipe.push("good", ev(0, T0 + 10), T0 + 100)
    assert records(out) == []  # the merge waits for the newcomers...
    released: list = []
    now = T0 + 100
    while not released:
        deadline = pipe.next_deadline_us()
        assert deadline is not None
        now = max(now, deadline)
        released = records(pipe.advance(now))
    # ...for one shared grace, not 50 consecutive waits.
    assert released == [("good", 0, T0 + 10)]
    assert now <= T0 + 50 + 2_000_000
    assert pipe.counters.source_timeouts == 50


def _skip_then_late(config: PipelineConfig) -> tuple[IngestPipeline, list]:
    """seq 1 is given up after 5 ms (seq 2 released at T0 + 5100), then arrives at T0 + 9000."""
    pipe = IngestPipeline(IdentityMapping(), config)
    pipe.register("a", ("s",), T0)
    pipe.push("a", ev(0, T0), T0)
    pipe.push("a", ev(2, T0 + 2), T0 + 100)
    assert records(pipe.advance(T0 + 5_100)) == [("a", 2, T0 + 2)]
    return pipe, pipe.push("a", ev(1, T0 + 1), T0 + 9_000)


def test_late_events_only_go_to_the_late_topic_whatever_the_sequence_config_says():
    # SequenceConfig's own default passes late events on; the pipeline's drop_late (default True) decides.
    _pipe, out = _skip_then_late(PipelineConfig(sequence=SequenceConfig(latency_threshold_us=5_000)))
    assert records(out) == []
    assert [(o.record.seq, o.record.late_reason) for o in out if isinstance(o, PublishRecord)] == [
        (1, "late_after_skip")]


def test_drop_late_false_publishes_a_late_event_once_flagged_on_the_events_topic():
    config = PipelineConfig(sequence=SequenceConfig(latency_threshold_us=5_000), drop_late=False,
                            merger=MergerConfig(mode="thesis"))
    pipe, out = _skip_then_late(config)
    (record,) = [o.record for o in out if isinstance(o, PublishRecord)]
    assert [o.topic for o in out if isinstance(o, PublishRecord)] == ["events"]
    assert (record.seq, record.late, record.late_reason, record.lateness_us, record.extra) == (
        1, True, "late_after_skip", 9_000 - 5_100, {})
    assert (pipe.counters.released, pipe.counters.late) == (3, 0)


def test_drop_late_false_still_keeps_the_punctuation_promise():
    # the watermark merger punctuated past T0 + 1 when it released seq 2: seq 1 cannot follow on the events topic
    config = PipelineConfig(sequence=SequenceConfig(latency_threshold_us=5_000), drop_late=False,
                            merger=MergerConfig(punctuation_interval_us=0))
    pipe, out = _skip_then_late(config)
    assert [(o.topic, o.record.seq, o.record.late_reason, o.record.lateness_us) for o in out
            if isinstance(o, PublishRecord)] == [("late", 1, "after_punctuation", 1)]
    assert (pipe.counters.released, pipe.counters.late) == (2, 1)


def test_at_equal_deadlines_a_reorderer_releases_before_the_merge_gives_up_on_its_source():
    # Thesis mode waits for a silent source as long as that source's own gap timeout (Eq. 3.11), so the two
    # deadlines coincide: a's gap (seq 2) times out at T0 + 250, when the merge's wait for a ends too. a's held
    # event (t = 120) must reach the merge before it gives up on a, or it follows b's later event (t = 150).
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(sequence=SequenceConfig.thesis(),
                                                            merger=MergerConfig(mode="thesis")))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    pipe.push("a", ev(0, T0), T0)
    pipe.push("a", ev(1, T0 + 100), T0 + 100)  # learns t_inter = 100 us: the timeout of a's next gap
    assert records(pipe.push("b", ev(0, T0 + 150), T0 + 150)) == [("a", 0, T0), ("a", 1, T0 + 100)]
    assert records(pipe.push("a", ev(3, T0 + 120), T0 + 150)) == []  # seq 2 missing
    assert pipe.next_deadline_us() == T0 + 250
    assert records(pipe.advance(T0 + 250)) == [("a", 3, T0 + 120)]
    assert pipe.counters.source_timeouts == 0
    # now the merge waits for a again (its next gap timeout, 100 us), then b's event goes
    assert records(pipe.advance(T0 + 350)) == [("b", 0, T0 + 150)]
    assert pipe.counters.source_timeouts == 1


class _CountingMapping:
    """An EstimateMapping that counts how often it is asked, to pin down how often an event is mapped."""

    def __init__(self) -> None:
        from timesync.clocks import EstimateMapping

        self.inner = EstimateMapping()
        self.mapped = 0
        self.rtts = 0

    def to_reference(self, source_id, source_ts_us):
        self.mapped += 1
        return self.inner.to_reference(source_id, source_ts_us)

    def rtt_us(self, source_id):
        self.rtts += 1
        return self.inner.rtt_us(source_id)


def _skewed(offset_us, sync_ref_us, rtt_us=400):
    from timesync.estimator import ClockEstimate

    # skew and growth make (ref, err) depend on the timestamp and on the estimate, so a stale reuse would show
    return ClockEstimate(offset_us=offset_us, skew_ppm=35.0, rtt_us=rtt_us, sync_ref_us=sync_ref_us, sample_count=9,
                         root_error_us=150.5, skew_error_ppm=2.0)


def _carried_mapping_scenario(carry):
    """Three sources; `carry`: push with the mapping just made, as the gateway's clock-step check does. Includes
    a re-sync while an event waits in its reorderer and one while events wait in the merge."""
    mapping = _CountingMapping()
    for source, offset in (("a", -1_000), ("b", 2_000), ("c", 0)):
        mapping.inner.update(source, _skewed(offset, T0))
    pipe = IngestPipeline(mapping)
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    pipe.register("c", ("s",), T0)
    out = []

    def push(source, event, arrival_us):
        mapped = mapping.to_reference(source, event.source_ts_us) if carry else None
        out.extend(pipe.push(source, event, arrival_us, mapped=mapped))

    for i in range(3):  # in order, every source
        for source, ahead in (("a", 1_000), ("b", -2_000), ("c", 0)):
            push(source, ev(i, T0 + 100_000 * (i + 1) + ahead), T0 + 100_000 * (i + 1) + 900)
    push("b", ev(4, T0 + 500_000 - 2_000), T0 + 500_900)  # seq 3 of b is missing: 4 waits in b's reorderer
    push("a", ev(3, T0 + 400_000 + 1_000), T0 + 400_900)  # waits in the merge for b and c
    mapping.inner.update("b", _skewed(2_500, T0 + 450_000, rtt_us=300))  # re-sync with both waiting
    mapping.inner.update("a", _skewed(-1_200, T0 + 450_000, rtt_us=500))
    push("b", ev(3, T0 + 400_000 - 2_000), T0 + 501_000)  # releases b's 3 and the buffered 4
    push("c", ev(3, T0 + 400_000), T0 + 501_100)
    push("c", ev(4, T0 + 500_000), T0 + 501_200)
    push("a", ev(4, T0 + 500_000 + 1_000), T0 + 501_300)
    out += pipe.advance(T0 + 10_000_000)
    return out, mapping


def test_a_carried_mapping_gives_byte_identical_records_and_maps_each_event_at_most_twice(monkeypatch):
    carried, fast = _carried_mapping_scenario(carry=True)
    # The reference, as before the mapping was carried: the caller maps (the clock-step check), then the pipeline
    # and the merger each map the event again themselves.
    map_at_every_stage(monkeypatch)
    independent, slow = _carried_mapping_scenario(carry=True)
    assert [o.record.to_json() if isinstance(o, PublishRecord) else o for o in carried] == \
        [o.record.to_json() if isinstance(o, PublishRecord) else o for o in independent]
    assert carried == independent
    assert [(s, q) for s, q, _ in records(carried)] == [
        ("a", 0), ("b", 0), ("c", 0), ("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("c", 2),
        ("a", 3), ("c", 3), ("b", 3), ("a", 4), ("c", 4), ("b", 4)]
    assert records(carried, "late") == []
    by_key = {(o.record.source_id, o.record.seq): o.record for o in carried if isinstance(o, PublishRecord)}
    # Pushed under the old estimate, released under the new one: ref_ts_us is the push's (the merge order rests on
    # it), uncertainty_us and rtt_us the release's, as before.
    a3 = by_key[("a", 3)]
    old, new = _skewed(-1_000, T0), _skewed(-1_200, T0 + 450_000, rtt_us=500)
    assert a3.ref_ts_us == old.to_reference_us(T0 + 401_000) != new.to_reference_us(T0 + 401_000)
    assert a3.uncertainty_us == new.error_bound_us(new.to_reference_us(T0 + 401_000)) != \
        old.error_bound_us(a3.ref_ts_us)
    assert a3.rtt_us == 500
    # b's 4 waited in its reorderer across the re-sync: mapped when it left, with the new estimate.
    assert by_key[("b", 4)].ref_ts_us == _skewed(2_500, T0 + 450_000).to_reference_us(T0 + 498_000)
    # 15 events: the caller's map and the release's, against four before. b's 4, buffered, is mapped once more
    # when it leaves its reorderer (the caller's mapping is not reused for it); c's 0 to 3 and a's 4, each the one
    # the merge waited for, are released by their own push: their records take its mapping. One rtt each on both.
    assert (fast.mapped, slow.mapped) == (2 * 15 + 1 - 5, 4 * 15)
    assert fast.rtts == slow.rtts == 15


def _frames_workload():
    """Frames of three sources over two streams: in-order runs, a gap closed by the next frame, a duplicate, a
    future-dated event, an event behind the punctuation, and a source whose clock runs 40 us behind the others."""
    def frame(stream, seqs, base_us, step_us=10):
        return [IncomingEvent(stream, q, base_us + q * step_us, {"q": q}) for q in seqs]

    frames = []
    for tick in range(6):
        now_us = 1_000_000 + tick * 1_000
        frames.append(("a", frame("s", range(tick * 5, tick * 5 + 5), 1_000_000), now_us))
        frames.append(("b", frame("s", range(tick * 4, tick * 4 + 4), 999_960, 12), now_us + 1))
        frames.append(("c", frame("t", range(tick * 3, tick * 3 + 3), 1_000_000), now_us + 2))
    frames.append(("a", frame("s", [32, 30, 31, 31], 1_000_000), 1_010_000))  # a gap, its closing, a duplicate
    frames.append(("b", [IncomingEvent("s", 24, 999_000_000_000, None), *frame("s", [25], 999_960, 12)], 1_010_001))
    frames.append(("c", [*frame("t", [18, 19], 1_000_000), IncomingEvent("t", 20, 500, None)], 1_010_002))  # late
    return frames


def _run_frames(many):
    pipeline = IngestPipeline(IdentityMapping(), PipelineConfig(max_future_us=1_000_000))
    out = []
    for source_id in ("a", "b"):
        out += pipeline.register(source_id, ("s",), 1_000_000)
    out += pipeline.register("c", ("t",), 1_000_000)
    for source_id, frame, arrival_us in _frames_workload():
        if many:
            out += pipeline.push_many(source_id, frame, arrival_us)
        else:
            for event in frame:
                out += pipeline.push(source_id, event, arrival_us)
    out += pipeline.advance(10_000_000)
    return pipeline, out


def test_pushing_a_frame_at_once_releases_the_same_records_in_the_same_order_as_pushing_each_event():
    one_by_one, single = _run_frames(many=False)
    at_once, many = _run_frames(many=True)
    def published(outputs):
        # How far behind the punctuation a late event was depends on where the punctuation fell: compared apart.
        return [(o.topic, replace(o.record, extra={}) if o.record.late_reason == "after_punctuation" else o.record)
                for o in outputs if isinstance(o, PublishRecord)]

    as_records = published(single)
    assert published(many) == as_records
    # c's seq 20 is stamped below c's own seq 19 (issue 24 item 6): late as a stamp regression, however far the
    # punctuation got, by how far it is behind c's frontier (seq 19), the same in both modes.
    lateness = [o.record.lateness_us for outputs in (single, many) for o in outputs
                if isinstance(o, PublishRecord) and o.record.late_reason == "stamp_regression"]
    assert lateness == [999_690, 999_690]
    late = [(r.source_id, r.seq, r.late_reason) for topic, r in as_records if topic == "late"]
    assert late == [("a", 31, "duplicate"), ("b", 24, "future_dated"), ("c", 20, "stamp_regression")]
    assert len([1 for topic, _r in as_records if topic == "events"]) == 33 + 25 + 20  # a: 0-32; b: 0-25 but 24; c: 0-19
    assert (at_once.counters, at_once.buffered()) == (one_by_one.counters.__class__(
        **{**vars(one_by_one.counters), "punctuations": at_once.counters.punctuations}), one_by_one.buffered())
    # Punctuations may fall later (after a frame's run, not among it), never breaking their promise.
    for outputs in (single, many):
        watermark = {"s": -1, "t": -1}
        for output in outputs:
            if isinstance(output, PublishPunctuation):
                assert output.watermark_us > watermark[output.stream]
                watermark[output.stream] = output.watermark_us
            elif output.topic == "events":
                assert output.record.ref_ts_us >= watermark[output.record.stream]


# -- issue 24 items 1, 6, 7: heartbeats validated like events, reference order, timestamps in range ----------------

DAY_US = 86_400_000_000
HOUR_US = 3_600_000_000
MAX_TS_US = 2**63 - 1


def _late(outputs):
    return [(o.record.source_id, o.record.seq, o.record.late_reason, o.record.lateness_us)
            for o in outputs if isinstance(o, PublishRecord) and o.topic == "late"]


def test_a_runaway_heartbeat_is_refused_and_moves_no_watermark_so_a_newcomer_is_on_time():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(join_grace_us=1_000))
    pipe.register("runaway", ("s",), T0)
    out = pipe.heartbeat("runaway", {"s": 0}, T0 + DAY_US, T0 + 10)
    assert [o for o in out if isinstance(o, PublishPunctuation)] == []
    (refused,) = [o for o in out if isinstance(o, PublishRefused)]
    assert (refused.source_id, refused.stream, refused.seq, refused.reason) == ("runaway", None, None, "future_dated")
    assert pipe.counters.heartbeats_refused == 1
    assert pipe.watermark_us("s") is None
    pipe.register("a", ("s",), T0 + 20)
    out = pipe.push("a", ev(0, T0 + 30), T0 + 40)
    out += pipe.advance(T0 + 2_000)  # the runaway said nothing acceptable: given up after its join grace
    assert records(out) == [("a", 0, T0 + 30)]
    assert _late(out) == []
    assert pipe.watermark_us("s") == T0 + 30


def test_a_heartbeat_within_max_future_still_moves_the_frontier():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(max_future_us=1_000))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 1)) == []
    out = pipe.heartbeat("b", {"s": 0}, T0 + 1_001, T0 + 1)  # exactly max_future ahead: accepted
    assert records(out) == [("a", 0, T0 + 5)]
    assert pipe.counters.heartbeats_refused == 0


def test_a_restored_watermark_beyond_max_future_of_now_is_not_trusted():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(max_future_us=1_000))
    assert pipe.restore_watermark("s", T0 + DAY_US, now_us=T0) is False
    assert pipe.watermark_us("s") is None
    pipe.register("a", ("s",), T0)
    assert records(pipe.push("a", ev(0, T0 + 5), T0 + 6)) == [("a", 0, T0 + 5)]
    # A watermark at most max_future ahead is a promise kept.
    other = IngestPipeline(IdentityMapping(), PipelineConfig(max_future_us=1_000))
    assert other.restore_watermark("s", T0 + 1_000, now_us=T0) is True
    assert other.watermark_us("s") == T0 + 1_000


def test_a_source_whose_stamps_go_backwards_keeps_the_events_topic_in_reference_order():
    for many in (True, False):
        pipe = IngestPipeline(IdentityMapping())
        pipe.register("a", ("s",), T0)
        frame = [ev(seq, T0 + 1_000 - 100 * seq) for seq in range(10)]
        if many:  # one frame: the path that published 9 inversions among 10 events
            out = pipe.push_many("a", frame, T0 + 10)
        else:
            out = [o for seq, event in enumerate(frame) for o in pipe.push("a", event, T0 + 10 * seq)]
        assert records(out) == [("a", 0, T0 + 1_000)]
        assert _late(out) == [("a", seq, "stamp_regression", 100 * seq) for seq in range(1, 10)]
        assert pipe.counters.stamp_regressions == 9


def test_a_backwards_stamp_in_a_frame_goes_late_and_the_rest_of_the_frame_flows():
    pipe = IngestPipeline(IdentityMapping())
    pipe.register("a", ("s",), T0)
    out = pipe.push_many("a", [ev(0, T0 + 10), ev(1, T0 + 30), ev(2, T0 + 20), ev(3, T0 + 40)], T0 + 50)
    assert records(out) == [("a", 0, T0 + 10), ("a", 1, T0 + 30), ("a", 3, T0 + 40)]
    assert _late(out) == [("a", 2, "stamp_regression", 10)]


def test_a_regression_within_the_error_bound_is_raised_to_keep_order_and_marked():
    pipe = IngestPipeline(FixedOffsetMapping({}, error_bound_us=50))
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 100), T0 + 200)
    out += pipe.push("a", ev(1, T0 + 80), T0 + 201)  # 20 us back: within its 50 us bound
    # 101 us back: beyond its bound and the frontier's together (review B3: 70 us back, two 50 us bounds can explain)
    out += pipe.push("a", ev(2, T0 - 1), T0 + 202)
    assert records(out) == [("a", 0, T0 + 100), ("a", 1, T0 + 100)]
    raised = [o.record for o in out if isinstance(o, PublishRecord) and o.topic == "events"][1]
    assert (raised.source_ts_us, raised.extra, raised.uncertainty_us) == (T0 + 80, {"ref_raised_us": 20}, 70)
    assert _late(out) == [("a", 2, "stamp_regression", 101)]


class _ErrorBounds:
    """Source clocks taken as they are, each with its own error bound."""

    def __init__(self, errors_us):
        self.errors_us = errors_us

    def to_reference(self, source_id, source_ts_us):
        return source_ts_us, self.errors_us[source_id]

    def rtt_us(self, source_id):
        return None


def test_a_given_up_source_back_below_what_was_released_goes_late_after_give_up():
    """Issue 25 item 6: the merge gave b up and released a's events; b's later event is above the watermark (a's
    error bound keeps it low) but below what was released: late, never an inversion on the events topic."""
    pipe = IngestPipeline(_ErrorBounds({"a": 1_000, "b": 10}),
                          PipelineConfig(join_grace_us=100, merger=MergerConfig(learn_wait=False)))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 100), T0 + 10)
    out += pipe.advance(T0 + 100)
    out += pipe.push("a", ev(1, T0 + 500), T0 + 200)
    assert records(out) == [("a", 0, T0 + 100), ("a", 1, T0 + 500)]
    assert pipe.counters.source_timeouts == 1
    out = pipe.push("b", ev(0, T0 + 200), T0 + 300)
    assert records(out) == []
    assert _late(out) == [("b", 0, "after_give_up", 300)]
    out = pipe.push("b", ev(1, T0 + 600), T0 + 301)
    out += pipe.push("a", ev(2, T0 + 700), T0 + 302)
    assert records(out) == [("b", 1, T0 + 600)]


def test_timestamps_outside_0_to_2_63_are_refused_never_published():
    behind = IngestPipeline(FixedOffsetMapping({"a": HOUR_US}))  # a's clock an hour behind
    behind.register("a", ("s",), T0)
    out = behind.push("a", ev(0, MAX_TS_US - 1_000), T0)
    assert [o for o in out if isinstance(o, PublishRecord)] == []
    (refused,) = [o for o in out if isinstance(o, PublishRefused)]
    assert (refused.source_id, refused.stream, refused.seq, refused.reason) == ("a", "s", 0, "timestamp_out_of_range")
    assert behind.counters.timestamps_refused == 1
    ahead = IngestPipeline(FixedOffsetMapping({"a": -HOUR_US}))  # an hour ahead
    ahead.register("a", ("s",), T0)
    out = ahead.push_many("a", [ev(0, 0), ev(1, HOUR_US + 5)], T0)
    assert [o.seq for o in out if isinstance(o, PublishRefused)] == [0]
    assert records(out) == [("a", 1, 5)]
    assert ahead.heartbeat("a", {"s": 2}, 0, T0)[0].reason == "timestamp_out_of_range"
    assert ahead.counters.heartbeats_refused == 1


def test_no_punctuation_promises_a_negative_watermark():
    pipe = IngestPipeline(FixedOffsetMapping({}, error_bound_us=1_000),
                          PipelineConfig(merger=MergerConfig(punctuation_interval_us=0)))
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(0, 5), T0)
    out += pipe.push("a", ev(1, 2_000), T0 + 1)
    assert records(out) == [("a", 0, 5), ("a", 1, 2_000)]
    assert [o.watermark_us for o in out if isinstance(o, PublishPunctuation)] == [1_000]


# -- issue 25 item 7: a clean bye tells the merge the source left ---------------------------------------------------


def test_a_source_that_said_bye_is_not_waited_for_and_is_welcomed_back_as_after_a_give_up():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(merger=MergerConfig(learn_wait=False,
                                                                                default_timeout_us=10**9)))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 10), T0 + 10)
    out += pipe.push("b", ev(0, T0 + 20), T0 + 20)
    out += pipe.push("a", ev(1, T0 + 30), T0 + 30)
    assert records(out) == [("a", 0, T0 + 10), ("b", 0, T0 + 20)]  # a's seq 1 waits for b
    # b leaves cleanly: the merge stops waiting for it at once, not after its wait.
    out = pipe.source_left("b", T0 + 40)
    assert records(out) == [("a", 1, T0 + 30)]
    assert (pipe.counters.departures, pipe.counters.source_timeouts) == (1, 0)  # a departure is no timeout
    assert records(pipe.push("a", ev(2, T0 + 50), T0 + 50)) == [("a", 2, T0 + 50)]
    # b comes back: in order if above what was released, late with a reason if below it (the punctuation, 1 ms
    # apart, is still at a's seq 0: below a's seq 2 it is late as after a give-up, issue 25 item 6).
    pipe.register("b", ("s",), T0 + 60)
    out = pipe.push("b", ev(1, T0 + 45), T0 + 60)
    assert (records(out), _late(out)) == ([], [("b", 1, "after_give_up", 5)])
    out = pipe.push("b", ev(2, T0 + 70), T0 + 70)
    out += pipe.push("a", ev(3, T0 + 80), T0 + 80)
    assert records(out) == [("b", 2, T0 + 70)]  # and the merge waits for it again (a's seq 3 waits for b)


def test_a_source_leaving_with_events_queued_releases_them_and_is_then_not_waited_for():
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(merger=MergerConfig(learn_wait=False,
                                                                                default_timeout_us=10**9)))
    for source in ("a", "b", "c"):
        pipe.register(source, ("s",), T0)
    out = pipe.push("b", ev(0, T0 + 20), T0 + 20)
    out += pipe.push("b", ev(1, T0 + 40), T0 + 21)
    out += pipe.push("a", ev(0, T0 + 30), T0 + 22)
    assert records(out) == []  # c has said nothing: everyone waits for it
    out = pipe.source_left("b", T0 + 23)  # b's queue is not empty: still released, in order
    assert records(out) == []
    out = pipe.source_left("c", T0 + 24)
    assert records(out) == [("b", 0, T0 + 20), ("a", 0, T0 + 30)]  # a (live, at 30) may still send below 40
    out = pipe.push("a", ev(1, T0 + 50), T0 + 50)  # b is given up once its last event is out: a is not held
    assert records(out) == [("b", 1, T0 + 40), ("a", 1, T0 + 50)]
    assert (pipe.counters.departures, pipe.counters.source_timeouts) == (2, 0)
    assert pipe.advance(T0 + 10**7) == []  # no wait left to fire (stale heap entries fire nothing)


def test_heartbeats_that_promise_nothing_new_do_not_hold_the_merge_forever():
    """Issue 24 item 1's family: b heartbeats on, but its clock readings stay below its own frontier (a stuck clock,
    or the SDK's promise after a far-off application stamp). Each one used to restart the merge's wait for b, so a's
    event waited for as long as b kept heartbeating; now only a heartbeat that moves b's frontier counts."""
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(merger=MergerConfig(learn_wait=False,
                                                                                default_timeout_us=1_000)))
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    out = pipe.push("b", ev(0, T0 + 50), T0 + 50)
    out += pipe.push("a", ev(0, T0 + 100), T0 + 100)
    assert records(out) == [("b", 0, T0 + 50)]  # a's event waits for b (at 50)
    for i in range(1, 40):  # heartbeats every 100 ms (shorter than the merge's wait for b), stamped below b's frontier
        now = T0 + 100 + 100_000 * i
        out += pipe.advance(now)
        out += pipe.heartbeat("b", {"s": 1}, T0 + 10, now)
    assert records(out) == [("b", 0, T0 + 50), ("a", 0, T0 + 100)]
    assert pipe.counters.source_timeouts == 1
    # A heartbeat that does move b's frontier brings it back into the merge.
    now = T0 + 4_000_000
    out = pipe.heartbeat("b", {"s": 1}, now, now)
    out += pipe.push("a", ev(1, now + 1_000), now + 1)
    assert records(out) == []  # a's next event waits for b again (b's frontier is now)


# -- review B1: freeing an idle source must not strand the events the merge holds for it ---------------------------


def test_a_source_the_merge_waits_for_is_not_freed_until_the_wait_gives_it_up():
    """Rule 11 frees an idle source that holds nothing; the source the merge is waiting for holds the others' events
    (they wait for it). Freed then, the merge lost its wait: b's event stayed queued with no deadline, unpublished
    until the stream got another push."""
    pipe = IngestPipeline(IdentityMapping())
    pipe.register("a", ("s",), T0)
    pipe.register("b", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 10), T0 + 10)
    out += pipe.push("b", ev(0, T0 + 20), T0 + 20)
    assert records(out) == [("a", 0, T0 + 10)]  # b's event waits for a (its frontier at 10)
    assert pipe.buffered() == {"b": 1}
    assert pipe.forget_source("a", ("s",)) is False  # the merge waits for it: not idle
    later = T0 + 10**8  # past any wait
    out = pipe.advance(later)
    assert records(out) == [("b", 0, T0 + 20)]
    assert (pipe.counters.source_timeouts, pipe.buffered()) == (1, {})
    assert pipe.forget_source("a", ("s",)) is True  # given up: now it holds nothing
    out = pipe.push("a", ev(1, T0 + 30), later + 1)  # it comes back at its next seq (no gap wait for seq 0)
    out += pipe.push("b", ev(1, T0 + 40), later + 2)
    assert records(out) == [("a", 1, T0 + 30)]


# -- review B3: a re-sync within both estimates' bounds is no stamp regression ----------------------------------------


class _ResyncingClock:
    """One source's estimate: an offset and its error bound, both changed by a re-sync."""

    def __init__(self, offset_us, error_us):
        self.offset_us, self.error_us = offset_us, error_us

    def to_reference(self, source_id, source_ts_us):
        return source_ts_us + self.offset_us, self.error_us

    def rtt_us(self, source_id):
        return 1_000


def test_a_resync_that_moves_the_mapping_back_within_the_old_and_new_bounds_diverts_nothing():
    """The old estimate (10 ms bound) and the new one (1 ms, 5 ms back) both hold for a true time: the events mapped
    with the new one may sit up to 10 + 1 ms below the frontier mapped with the old. Compared with the new bound
    alone, seqs 5-7 went late as stamp_regression; now they are raised to the frontier, their bound covering it."""
    clock = _ResyncingClock(0, 10_000)
    for many in (False, True):
        pipe = IngestPipeline(clock)
        clock.offset_us, clock.error_us = 0, 10_000
        pipe.register("a", ("s",), T0)
        out = [o for i in range(5) for o in pipe.push("a", ev(i, T0 + i * 1_000), T0 + i * 1_000 + 500)]
        clock.offset_us, clock.error_us = -5_000, 1_000  # the re-sync
        after = [ev(i, T0 + i * 1_000) for i in range(5, 10)]
        if many:
            out += pipe.push_many("a", after, T0 + 9_500)
        else:
            out += [o for e in after for o in pipe.push("a", e, T0 + e.seq * 1_000 + 500)]
        assert _late(out) == []
        published = [o.record for o in out if isinstance(o, PublishRecord) and o.topic == "events"]
        assert [(r.seq, r.ref_ts_us - T0, r.extra.get("ref_raised_us"), r.uncertainty_us) for r in published] == [
            (0, 0, None, 10_000), (1, 1_000, None, 10_000), (2, 2_000, None, 10_000), (3, 3_000, None, 10_000),
            (4, 4_000, None, 10_000),
            # raised to the frontier: the bound is the new mapping's plus the raise (the true time is within 1 ms
            # of the mapped time, which the raise moved that far)
            (5, 4_000, 4_000, 5_000), (6, 4_000, 3_000, 4_000), (7, 4_000, 2_000, 3_000), (8, 4_000, 1_000, 2_000),
            (9, 4_000, None, 1_000)]
        assert (pipe.counters.stamp_regressions, pipe.counters.refs_raised) == (0, 4)


def test_a_resync_beyond_both_bounds_is_still_a_stamp_regression():
    clock = _ResyncingClock(0, 10_000)
    pipe = IngestPipeline(clock)
    pipe.register("a", ("s",), T0)
    out = pipe.push("a", ev(0, T0 + 20_000), T0 + 20_500)
    clock.offset_us, clock.error_us = -5_000, 1_000
    out += pipe.push("a", ev(1, T0 + 13_999), T0 + 21_000)  # 11_001 us below the frontier: 1 us beyond 10 + 1 ms
    out += pipe.push("a", ev(2, T0 + 14_000), T0 + 21_500)  # 11_000 us below: raised
    assert _late(out) == [("a", 1, "stamp_regression", 11_001)]
    assert [(r[1], r[2] - T0) for r in records(out)] == [(0, 20_000), (2, 20_000)]



def _run_until(pipe: IngestPipeline, until_us: int, step_us: int, feed) -> list:
    """Virtual time from T0 to ``until_us`` in ``step_us`` steps: ``feed(now)`` pushes, then due deadlines run."""
    out: list = []
    now = T0
    while now <= until_us:
        out += feed(now)
        out += pipe.advance(now)
        now += step_us
    return out


def test_a_newcomer_whose_first_event_waits_behind_a_gap_holds_the_merge_past_its_join_wait():
    # A newcomer says hello (a 2 s join wait) and speaks 1.9 s later with seq 1: seq 0 never comes. Its reorderer
    # holds seq 1 for the gap timeout, which ends after the join wait. The merge must wait for that gap (the
    # pipeline's promise: it waits for a source as long as its reorderer holds a gap), not give the newcomer up
    # when its join wait ends: that let a good source's events run the watermark past seq 1, and 21 events of an
    # SDK source that skipped seq 0 went late (`after_punctuation`) in a CI run on 7e58ccf.
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(join_grace_us=2_000_000))
    pipe.register("good", ("s",), T0)
    pipe.register("skipper", ("s",), T0)
    good_seq = iter(range(10**6))

    def feed(now: int) -> list:
        out = pipe.push("good", ev(next(good_seq), now), now)
        if now == T0 + 1_900_000:
            out += pipe.push("skipper", ev(1, now), now)
        return out

    out = _run_until(pipe, T0 + 5_000_000, 10_000, feed)
    assert pipe.counters.gaps == 1
    assert records(out, "late") == []
    assert ("skipper", 1, T0 + 1_900_000) in records(out)
    refs = [ref for _source, _seq, ref in records(out)]
    assert refs == sorted(refs)


def test_next_deadline_is_the_live_one_once_a_later_wait_replaced_it():
    # The merge waits for b from T0+10; b speaks at T0+100, so the merge waits for c instead, as long, from then.
    # The replaced deadline must not be reported: the gateway's timer would wake at it for nothing (once per frame
    # at 20 sources).
    pipe = IngestPipeline(IdentityMapping(), PipelineConfig(merger=MergerConfig(learn_wait=False)))
    for source_id in ("a", "b", "c"):
        pipe.register(source_id, ("s",), T0)
    out = pipe.push("a", ev(0, T0), T0) + pipe.push("b", ev(0, T0), T0) + pipe.push("c", ev(0, T0), T0)
    assert records(out) == [("a", 0, T0), ("b", 0, T0), ("c", 0, T0)]
    assert records(pipe.push("a", ev(1, T0 + 10), T0 + 10)) == []
    replaced = pipe.next_deadline_us()
    assert replaced is not None
    wait_us = replaced - (T0 + 10)
    assert records(pipe.push("b", ev(1, T0 + 11), T0 + 100)) == []
    assert pipe.next_deadline_us() == T0 + 100 + wait_us
    assert records(pipe.advance(replaced)) == []
    assert pipe.next_deadline_us() == T0 + 100 + wait_us
    assert records(pipe.advance(T0 + 100 + wait_us)) == [("a", 1, T0 + 10), ("b", 1, T0 + 11)]
    # c given up; then b's event waits for a, silent since T0+10, longer than its whole wait: given up at once.
    assert pipe.counters.source_timeouts == 2
