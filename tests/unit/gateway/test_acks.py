from gateway.acks import DeliveryTracker


def test_cumulative_ack_waits_for_the_gap():
    tracker = DeliveryTracker()
    for seq in range(4):
        assert tracker.accept("s", "a", seq)
    assert tracker.confirmed("s", "a", 1) is None
    assert tracker.confirmed("s", "a", 3) is None
    assert tracker.confirmed("s", "a", 0) == 1
    assert tracker.confirmed("s", "a", 2) == 3
    assert tracker.acked_through("s", "a") == 3


def test_duplicates_detected_before_and_after_confirmation():
    tracker = DeliveryTracker()
    assert tracker.accept("s", "a", 0)
    assert not tracker.accept("s", "a", 0)  # in flight
    tracker.confirmed("s", "a", 0)
    assert not tracker.accept("s", "a", 0)  # already acknowledged
    assert tracker.accept("s", "b", 0)  # other stream
    assert tracker.accept("t", "a", 0)  # other source


def test_failed_delivery_can_be_resent():
    tracker = DeliveryTracker()
    tracker.accept("s", "a", 0)
    tracker.failed("s", "a", 0)
    assert tracker.accept("s", "a", 0)
    assert tracker.confirmed("s", "a", 0) == 0


def test_range_starts_at_zero_whatever_arrives_first():
    tracker = DeliveryTracker()
    assert tracker.accept("s", "a", 2)
    assert tracker.confirmed("s", "a", 2) is None
    assert tracker.accept("s", "a", 0)  # sent before 2, arrived after it: not a duplicate
    assert tracker.accept("s", "a", 1)
    assert tracker.confirmed("s", "a", 0) == 0
    assert tracker.confirmed("s", "a", 1) == 2


def test_resume_marks_everything_below_as_published():
    tracker = DeliveryTracker()
    tracker.resume("s", "a", 10)
    assert tracker.acked_through("s", "a") == 9
    assert not tracker.accept("s", "a", 9)
    assert tracker.accept("s", "a", 10)
    assert tracker.confirmed("s", "a", 10) == 10


def test_stream_progress_round_trip():
    from contract.records import ProgressRecord, decode_record
    from gateway.ingest import StreamProgress

    progress = StreamProgress("s")
    progress.observe("x", 4, offset=17, released_us=100)
    progress.observe("x", 2, offset=18, released_us=90)
    progress.observe("y", 0, offset=19, released_us=120)
    assert progress == StreamProgress("s", 20, {"x": 5, "y": 1}, None, {"x": 100, "y": 120})
    assert progress.to_json() == (b'{"kind":"progress","stream":"s","next_offset":20,"next_seq":{"x":5,"y":1},'
                                  b'"watermark_us":null,"seen_us":{"x":100,"y":120}}')
    assert decode_record(progress.to_json()) == ProgressRecord("s", 20, {"x": 5, "y": 1}, None, {"x": 100, "y": 120})
    # A checkpoint written before seen_us existed still reads.
    assert decode_record(b'{"kind":"progress","stream":"s","next_offset":3,"next_seq":{"x":1},"watermark_us":null}'
                         ) == ProgressRecord("s", 3, {"x": 1})


def test_stream_progress_keeps_the_highest_promised_watermark():
    from contract.records import ProgressRecord, decode_record
    from gateway.ingest import StreamProgress

    progress = StreamProgress("s")
    progress.promise(50)
    progress.promise(40)
    assert progress.watermark_us == 50
    decoded = decode_record(progress.to_json())
    assert isinstance(decoded, ProgressRecord) and decoded.watermark_us == 50


# -- issue 24 items 2, 3, 8: given-up gaps, ranges, conflicts, seq jumps -------------------------------------------


def test_a_given_up_gap_lets_the_ack_pass_and_its_seq_is_accepted_once_later():
    tracker = DeliveryTracker()
    for seq in (0, 1, 3, 4):
        assert tracker.accept("s", "a", seq)
    assert tracker.confirmed("s", "a", 0) == 0
    assert tracker.confirmed("s", "a", 1) == 1
    assert tracker.confirmed("s", "a", 3) is None
    assert tracker.confirmed("s", "a", 4) is None
    assert tracker.give_up("s", "a", 2, 2) == ([(2, 2)], 4)  # the reorderer stopped waiting for 2: the ack passes it
    assert tracker.unacked("s", "a") == 0
    assert not tracker.accept("s", "a", 3)  # resends of published seqs stay duplicates
    assert tracker.accept("s", "a", 2)  # the given-up seq itself, once: it goes to the late topic
    assert tracker.confirmed("s", "a", 2) is None  # its late record does not move the ack (it is past)
    assert not tracker.accept("s", "a", 2)  # and only once
    assert tracker.acked_through("s", "a") == 4


def test_a_given_up_seq_whose_late_record_failed_is_accepted_again():
    tracker = DeliveryTracker()
    assert tracker.accept("s", "a", 1)
    assert tracker.confirmed("s", "a", 1) is None
    assert tracker.give_up("s", "a", 0, 0) == ([(0, 0)], 1)
    assert tracker.accept("s", "a", 0)
    tracker.failed("s", "a", 0)
    assert tracker.accept("s", "a", 0)
    assert not tracker.accept("s", "a", 0)


def test_give_up_leaves_out_the_seqs_already_accepted():
    tracker = DeliveryTracker()
    assert tracker.accept("s", "a", 1)  # held by rule 9 when the reorderer skipped 0..2
    assert tracker.give_up("s", "a", 0, 2) == ([(0, 0), (2, 2)], 0)  # 0 is passed, 1 is still owed to Kafka
    assert tracker.confirmed("s", "a", 1) == 2
    assert not tracker.accept("s", "a", 1)
    assert tracker.accept("s", "a", 2)


def test_a_million_seq_gap_costs_one_range_and_no_per_seq_state():
    import tracemalloc

    tracker = DeliveryTracker()
    assert tracker.accept("s", "a", 0)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        assert tracker.accept("s", "a", 1_000_000)
        assert tracker.confirmed("s", "a", 1_000_000) is None
        assert tracker.confirmed("s", "a", 0) == 0
        assert tracker.give_up("s", "a", 1, 999_999) == ([(1, 999_999)], 1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 16 * 1024
    assert tracker.ranges("s", "a") == 1 and tracker.unacked("s", "a") == 0
    # The newest 100,000 given-up seqs are remembered (as the reorderer remembers its skipped ones), each accepted
    # once if it turns up; older ones are forgotten: a resend of one is a duplicate.
    assert tracker.accept("s", "a", 999_999)
    assert tracker.accept("s", "a", 900_000)
    assert not tracker.accept("s", "a", 899_999)
    assert tracker.ranges("s", "a") == 1


def test_a_seq_jump_beyond_the_limit_is_refused_without_state():
    from gateway.acks import ACCEPTED, SEQ_JUMP

    tracker = DeliveryTracker(max_seq_jump=100)
    assert tracker.admit("s", "a", 0, None) == ACCEPTED  # the first seq: never a jump (B6)
    assert tracker.admit("s", "a", 101, None) == SEQ_JUMP  # from 0: a jump of 101
    assert tracker.admit("s", "a", 100, None) == ACCEPTED
    assert tracker.admit("s", "a", 201, None) == SEQ_JUMP
    assert tracker.admit("s", "a", 200, None) == ACCEPTED
    assert tracker.unacked("s", "a") == 3


def test_a_duplicate_with_another_payload_or_timestamp_is_a_conflict_while_pending_and_once_acked():
    from gateway.acks import ACCEPTED, CONFLICT, DUPLICATE, RECENT_ACKED_DIGESTS

    tracker = DeliveryTracker()
    assert tracker.admit("s", "a", 0, (10, {"v": 1})) == ACCEPTED
    assert tracker.admit("s", "a", 0, (10, {"v": 1})) == DUPLICATE
    assert tracker.admit("s", "a", 0, (10, {"v": 2})) == CONFLICT
    assert tracker.admit("s", "a", 0, (11, {"v": 1})) == CONFLICT
    assert tracker.confirmed("s", "a", 0) == 0
    assert tracker.admit("s", "a", 0, (10, {"v": 1})) == DUPLICATE
    assert tracker.admit("s", "a", 0, (10, {"v": 2})) == CONFLICT
    # The ring holds the last RECENT_ACKED_DIGESTS acked seqs: older duplicates are not compared.
    for seq in range(1, RECENT_ACKED_DIGESTS + 1):
        assert tracker.admit("s", "a", seq, (seq, seq)) == ACCEPTED
    for seq in range(RECENT_ACKED_DIGESTS, 0, -1):
        tracker.confirmed("s", "a", seq)
    assert tracker.acked_through("s", "a") == RECENT_ACKED_DIGESTS
    assert tracker.admit("s", "a", 0, (10, {"v": 2})) == DUPLICATE
    assert tracker.admit("s", "a", 1, (1, 2)) == CONFLICT
    assert tracker.admit("s", "a", RECENT_ACKED_DIGESTS, (0, 0)) == CONFLICT
    assert tracker.admit("s", "a", 5, None) == DUPLICATE  # nothing to compare


def test_conflict_check_is_the_same_before_and_after_the_ack_key_order_ignored_types_distinguished():
    # Review B4: the pending window compared payloads with Python == (1 == True, so {"v": True} passed as a
    # duplicate of {"v": 1} and its sender was acked though Kafka holds 1), the acked ring compared digests of
    # unsorted JSON (the same object with its keys reordered was a conflict once acked). Both compare one digest now.
    from gateway.acks import ACCEPTED, CONFLICT, DUPLICATE

    tracker = DeliveryTracker()
    assert tracker.admit("s", "a", 0, (10, {"x": 1, "y": 2})) == ACCEPTED
    assert tracker.admit("s", "a", 0, (10, {"y": 2, "x": 1})) == DUPLICATE  # pending
    assert tracker.admit("s", "a", 1, (10, {"v": 1})) == ACCEPTED
    assert tracker.admit("s", "a", 1, (10, {"v": True})) == CONFLICT  # pending: 1 == True in Python
    assert tracker.admit("s", "a", 1, (10, {"v": 1.0})) == CONFLICT
    assert tracker.confirmed("s", "a", 0) == 0
    assert tracker.confirmed("s", "a", 1) == 1
    assert tracker.admit("s", "a", 0, (10, {"y": 2, "x": 1})) == DUPLICATE  # acked: same verdicts
    assert tracker.admit("s", "a", 0, (10, {"x": 1, "y": 2})) == DUPLICATE
    assert tracker.admit("s", "a", 1, (10, {"v": True})) == CONFLICT
    assert tracker.admit("s", "a", 1, (10, {"v": 1})) == DUPLICATE


def test_the_first_seq_of_a_fresh_stream_is_accepted_however_high_and_the_limit_applies_after_it():
    # Review B6: a long-lived source (seq past 1,000,000) the gateway has no progress for was refused on every
    # event, its first seq measured from -1. The first seq costs one range whatever it is; the jump limit is for
    # the seqs after it.
    from gateway.acks import ACCEPTED, SEQ_JUMP

    tracker = DeliveryTracker(max_seq_jump=100)
    assert tracker.admit("s", "a", 2_500_000, None) == ACCEPTED
    assert tracker.admit("s", "a", 2_500_100, None) == ACCEPTED  # a jump of 100: within the limit
    assert tracker.admit("s", "a", 2_500_201, None) == SEQ_JUMP  # a jump of 101 after the first seq
    assert tracker.confirmed("s", "a", 2_500_000) is None
    assert tracker.give_up("s", "a", 0, 2_499_999) == ([(0, 2_499_999)], 2_500_000)
    assert tracker.ranges("s", "a") == 1 and tracker.unacked("s", "a") == 1
    # A stream with progress (resume) is not fresh: the limit holds from its next seq.
    tracker.resume("t", "a", 10)
    assert tracker.admit("t", "a", 110, None) == SEQ_JUMP  # 101 above seq 9
    assert tracker.admit("t", "a", 109, None) == ACCEPTED
