"""The Spark shell's per-stream loop, without Spark: ordering, the per-partition promise, T_a, state round trip."""

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.monitor import WatermarkDropReport, dropped_by_watermark
from spark_jobs.stateful import StreamReadProgress, run_stream_batch


class RecordingCore:
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []  # (seq, ref_ts_us) in the order fed
        self.watermarks: list[int] = []
        self.ta: list[int] = []
        self.fed_after: list[tuple[int, int]] = []  # (watermark in force, ref_ts_us) of every event fed

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        for r in rows:
            self.seen.append((int(r["seq"]), int(r["ref_ts_us"])))
            if self.watermarks:
                self.fed_after.append((self.watermarks[-1], int(r["ref_ts_us"])))
        return [("rows", {"seqs": [r["seq"] for r in rows]})]

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        self.watermarks.append(watermark_us)
        return [("wm", {"watermark_us": watermark_us})]

    def set_ta_us(self, ta_us: int) -> None:
        self.ta.append(ta_us)

    def snapshot(self) -> bytes:
        return b"core"


def event(seq: int, ts: int, offset: int, partition: int = 0, **more: Any) -> dict[str, Any]:
    return {"kind": "event", "seq": seq, "ref_ts_us": ts, "partition": partition, "offset": offset,
            "topic": "p.events.s", "source_id": f"src-{partition}", **more}


def punctuation(watermark_us: int, offset: int, partition: int = 0) -> dict[str, Any]:
    return {"kind": "punctuation", "watermark_us": watermark_us, "partition": partition, "offset": offset,
            "topic": "p.events.s", "ref_ts_us": None, "seq": None}


def run(progress: StreamReadProgress, core: RecordingCore, rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return run_stream_batch(progress, core, rows, job="test", stream="s")


def test_events_are_fed_in_reference_time_then_release_order_and_the_promise_comes_last() -> None:
    core = RecordingCore()
    outputs = run(StreamReadProgress(1), core, [event(2, 30, 5), event(0, 10, 9), punctuation(20, 3), event(1, 10, 7)])
    assert outputs == [("rows", {"seqs": [1, 0, 2]}), ("wm", {"watermark_us": 20})]


def test_the_stream_watermark_is_the_minimum_over_every_partition_and_waits_for_each() -> None:
    progress, core = StreamReadProgress(2), RecordingCore()
    run(progress, core, [punctuation(500, 0, partition=0)])
    assert core.watermarks == []  # partition 1 has promised nothing yet: nothing is known of it
    run(progress, core, [punctuation(300, 0, partition=1)])
    run(progress, core, [punctuation(900, 1, partition=0)])
    assert core.watermarks == [300, 300]
    run(progress, core, [punctuation(700, 1, partition=1), punctuation(650, 2, partition=1)])
    assert core.watermarks[-1] == 700  # a partition's promise never goes back


def test_a_partition_the_job_did_not_know_of_joins_the_minimum() -> None:
    progress, core = StreamReadProgress(1), RecordingCore()
    run(progress, core, [punctuation(500, 0, partition=0), punctuation(100, 0, partition=1)])
    assert (progress.partitions, core.watermarks) == (2, [100])


def test_t_a_is_the_largest_latest_round_trip_over_the_sources_and_follows_resyncs() -> None:
    progress, core = StreamReadProgress(1), RecordingCore()
    run(progress, core, [event(0, 10, 0, rtt_us=900, source_id="a"), event(1, 11, 1, rtt_us=4000, source_id="b")])
    run(progress, core, [event(2, 12, 2, rtt_us=1500, source_id="b")])
    run(progress, core, [event(3, 13, 3, rtt_us=1500, source_id="b")])  # unchanged: not set again
    assert core.ta == [4000, 1500]


def test_rows_that_are_not_events_are_reported_with_their_place_in_kafka() -> None:
    core = RecordingCore()
    outputs = run(StreamReadProgress(1), core, [{"kind": None, "topic": "p.events.s", "partition": 0, "offset": 7}])
    assert len(outputs) == 1
    key, value = outputs[0]
    assert (value["record"], value["reason"], value["offset"]) == ("rejected", "not_an_event", 7)
    assert key == "s|rejected|p.events.s|0|7"
    assert core.seen == []


def test_float_columns_from_pandas_become_ints_again() -> None:
    core = RecordingCore()
    run(StreamReadProgress(1), core, [event(3.0, 10.0, 1.0)])  # type: ignore[arg-type]
    assert core.seen == [(3, 10)] and isinstance(core.seen[0][0], int)


def test_punctuations_outside_the_events_topic_are_not_promises() -> None:
    progress, core = StreamReadProgress(1, "p.events.s"), RecordingCore()
    outputs = run(progress, core, [{**punctuation(500, 0), "topic": "p.late.s"}])
    assert [v["reason"] for _k, v in outputs] == ["misplaced_punctuation"]
    assert progress.watermark_us is None


def test_progress_round_trips_through_the_state_blob() -> None:
    progress = StreamReadProgress(3, "p.events.s", {0: 5, 2: 7}, {"a": 10})
    again, core_blob = StreamReadProgress.from_blob(progress.to_blob(b"xyz"))
    assert (again, core_blob) == (progress, b"xyz")


# A stream as the gateway writes it: per partition, events and punctuations in offset order; every event after a
# punctuation is at or above it, but events may invert among themselves above it (a source that timed out).
@st.composite
def partitioned_stream(draw: st.DrawFn) -> tuple[int, list[list[dict[str, Any]]]]:
    partitions = draw(st.integers(1, 3))
    logs: list[list[dict[str, Any]]] = []
    seq = 0
    for p in range(partitions):
        log: list[dict[str, Any]] = []
        promised = 0
        for _ in range(draw(st.integers(0, 25))):
            if draw(st.booleans()):
                promised += draw(st.integers(0, 30))
                log.append(punctuation(promised, len(log), p))
            else:
                log.append(event(seq, promised + draw(st.integers(0, 60)), len(log), p))
                seq += 1
        logs.append(log)
    return partitions, logs


@settings(max_examples=300, deadline=None)
@given(partitioned_stream(), st.randoms(use_true_random=False))
def test_no_event_is_ever_fed_below_a_watermark_already_given(stream: tuple[int, list[list[dict[str, Any]]]],
                                                              rnd: Any) -> None:
    """Exactness: however Kafka interleaves partitions into micro-batches, the core never sees an on-time event
    below a watermark it was given (Spark's max-over-rows watermark breaks this, see the test below)."""
    partitions, logs = stream
    positions = [0] * partitions
    progress, core = StreamReadProgress(partitions), RecordingCore()
    total = sum(len(log) for log in logs)
    fed = 0
    while fed < total:
        batch: list[dict[str, Any]] = []
        for p, log in enumerate(logs):
            take = rnd.randint(0, len(log) - positions[p])
            batch.extend(log[positions[p]:positions[p] + take])
            positions[p] += take
            fed += take
        run(progress, core, batch)
    assert all(ts >= watermark for watermark, ts in core.fed_after)
    assert sorted(seq for seq, _ts in core.seen) == list(range(len(core.seen)))  # every event, once
    assert core.watermarks == sorted(core.watermarks)


def test_a_max_over_rows_watermark_cuts_a_legal_inversion() -> None:
    """What Spark's own watermark does (max event time seen, delay 0) on the same contract: it would drop the
    inverted event; the per-partition promise does not."""
    rows = [event(0, 100, 0), punctuation(50, 1), event(1, 60, 2)]
    spark_watermark = max(r["ref_ts_us"] for r in rows[:2] if r["kind"] == "event")
    assert rows[2]["ref_ts_us"] < spark_watermark  # Spark would drop seq 1
    progress, core = StreamReadProgress(1), RecordingCore()
    run(progress, core, rows[:2])
    run(progress, core, rows[2:])
    assert [seq for seq, _ in core.seen] == [0, 1]
    assert core.fed_after == [(50, 60)]


def test_watermark_drops_in_a_progress_become_one_counted_record() -> None:
    progress = {"id": "q1", "batchId": 4, "stateOperators": [{"numRowsDroppedByWatermark": 3},
                                                             {"numRowsDroppedByWatermark": 2}]}
    assert dropped_by_watermark(progress) == 5
    report = WatermarkDropReport("window_count")
    assert report.on_progress({"id": "q1", "batchId": 3, "stateOperators": []}) is None
    key, value = report.on_progress(progress) or ("", {})
    assert key == "*|dropped_by_watermark|q1|4"
    assert (value["record"], value["rows"], value["dropped_total"], value["batch_id"]) == (
        "dropped_by_watermark", 5, 5, 4)
    assert report.dropped_total == 5


def test_while_the_partition_count_is_unknown_nothing_is_promised() -> None:
    progress, core = StreamReadProgress(0), RecordingCore()
    run(progress, core, [event(0, 10, 0), punctuation(500, 1, partition=0)])
    assert (progress.partitions, core.watermarks, core.seen) == (0, [], [(0, 10)])
    progress.partitions = 2  # the topic was found: two partitions, one of which has punctuated
    run(progress, core, [punctuation(300, 0, partition=1)])
    assert core.watermarks == [300]


class FakeGroupState:
    """Spark's GroupState as the state function uses it."""

    def __init__(self, blob: bytes | None = None) -> None:
        self.exists = blob is not None
        self.get = (blob,) if blob is not None else None

    def update(self, value: tuple[bytes]) -> None:
        self.exists, self.get = True, value


def window_count_function(live_cores: Any) -> tuple[Any, list[bytes | None]]:
    from spark_jobs.stateful import MicroBatchColumns, make_stream_function
    from spark_jobs.window_count import WindowCountCore, WindowCountOptions

    built: list[bytes | None] = []  # the blob of every core the factory had to build (None: a new stream)

    class FailingOnSeq99(WindowCountCore):
        def on_events(self, batch: MicroBatchColumns) -> list[tuple[str, dict[str, Any]]]:
            outputs = super().on_events(batch)  # counted first: a failure after the core changed
            if 99 in batch.column("seq"):
                raise RuntimeError("the task dies half way")
            return outputs

    def factory(stream: str, blob: bytes | None) -> WindowCountCore:
        built.append(blob)
        return FailingOnSeq99(stream, WindowCountOptions(bootstrap_servers="", width_us=100), blob)

    return make_stream_function("window_count", factory, lambda _s: ("p.events.s", 1), live_cores), built


def frame(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


BATCHES = [[event(0, 10, 0), event(1, 150, 1), punctuation(120, 2)],
           [event(2, 160, 3), event(3, 260, 4), punctuation(300, 5)],
           [event(4, 310, 6), punctuation(500, 7)]]


def run_function(function: Any, state: FakeGroupState, rows: list[dict[str, Any]]) -> list[str]:
    return [v for out in function(("s",), iter([frame(rows)]), state) for v in out["value"]]


def test_a_kept_core_is_reused_only_for_the_blob_it_was_snapshotted_to() -> None:
    from spark_jobs.stateful import LiveCores

    kept, built = window_count_function(LiveCores())
    restored, _ = window_count_function(LiveCores(capacity=0))  # keeps nothing: restores every batch
    state, state_restored = FakeGroupState(), FakeGroupState()
    blobs = []
    for rows in BATCHES:
        assert run_function(kept, state, rows) == run_function(restored, state_restored, rows)
        blobs.append(state.get[0] if state.get else None)
    assert state.get == state_restored.get
    assert built == [None]  # one core for the stream, kept from batch to batch
    # A replay (Spark hands the blob of batch 0 again, e.g. after a failed batch): restored from it, same records.
    replay = FakeGroupState(blobs[0])
    assert run_function(kept, replay, BATCHES[1]) == run_function(restored, FakeGroupState(blobs[0]), BATCHES[1])
    assert built == [None, _core_blob(blobs[0])]


def _core_blob(blob: bytes | None) -> bytes:
    from spark_jobs.stateful import StreamReadProgress

    assert blob is not None
    return StreamReadProgress.from_blob(blob)[1]


def test_a_batch_that_fails_half_way_leaves_no_kept_core() -> None:
    from spark_jobs.stateful import LiveCores

    cores = LiveCores()
    function, built = window_count_function(cores)
    state = FakeGroupState()
    run_function(function, state, BATCHES[0])
    good = state.get
    with pytest.raises(RuntimeError):
        run_function(function, state, [event(99, 200, 9)])
    retry = FakeGroupState(good[0] if good else None)
    # Spark retries with the last committed blob: restored from it, not the core the failed attempt changed.
    again = run_function(function, retry, BATCHES[1])
    assert len(built) == 2
    fresh, _ = window_count_function(LiveCores(capacity=0))
    assert again == run_function(fresh, FakeGroupState(good[0] if good else None), BATCHES[1])


def test_live_cores_keep_a_bounded_number_of_streams() -> None:
    from spark_jobs.stateful import LiveCores

    cores, core = LiveCores(capacity=2), RecordingCore()
    for stream in ("a", "b", "c"):
        cores.keep("q", stream, stream.encode(), StreamReadProgress(1), core)
    assert cores.take("q", "a", b"a") is None  # the oldest went
    assert cores.take("q", "c", b"c") is not None
    assert cores.take("q", "c", b"c") is None  # taken out while in use
    assert cores.take("other query", "b", b"b") is None
