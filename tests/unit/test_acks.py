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
