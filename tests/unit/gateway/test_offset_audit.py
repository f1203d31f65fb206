"""The offset audit (gateway.offset_audit): Kafka's delivery reports against the count of what the shard wrote.

Hand-made cases name the failures the audit exists for (a new partition's first records missing, a batch answered
with another batch's offsets, a report without an offset); a property drives it with a model of a partition log
(records and commit markers take consecutive offsets) and requires: truthful reports never fail, and one record
missing or answered twice always fails once the partition was anchored before it."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.offset_audit import OffsetAudit

EVENTS = "skewless.events.s"
LATE = "skewless.late.s"


def test_a_new_partition_checked_from_offset_0_across_a_commit() -> None:
    audit = OffsetAudit()
    audit.starts_empty(EVENTS)
    audit.produced(EVENTS, 3)
    audit.reported(EVENTS, 2, failed=False)
    assert audit.verdict() is None
    audit.committed()  # the marker takes offset 3
    audit.produced(EVENTS, 2)
    audit.reported(EVENTS, 5, failed=False)
    assert audit.verdict() is None


def test_the_first_records_of_a_new_partition_missing_fail_the_transaction() -> None:
    """The benchmark's loss: the first frame's records not on the topic, the rest of the batch reported after 0."""
    audit = OffsetAudit()
    audit.starts_empty(EVENTS)
    audit.produced(EVENTS, 29)
    audit.reported(EVENTS, 26, failed=False)
    assert audit.verdict() == (f"{EVENTS}: the last of 29 records reported at offset 26, expected 28 "
                               "(the first of them belongs at 0)")


def test_a_batch_answered_with_the_offsets_of_the_batch_before_fails() -> None:
    audit = OffsetAudit()
    audit.produced(EVENTS, 4)
    audit.reported(EVENTS, 103, failed=False)  # anchors: the first report of this owner
    audit.produced(EVENTS, 4)
    audit.reported(EVENTS, 103, failed=False)
    assert audit.verdict() == (f"{EVENTS}: the last of 4 records reported at offset 103, expected 107 "
                               "(the first of them belongs at 104)")


def test_a_delivered_record_without_an_offset_fails() -> None:
    for offset in (None, -1):
        audit = OffsetAudit()
        audit.produced(EVENTS, 1)
        audit.reported(EVENTS, offset, failed=False)
        assert audit.verdict() == f"{EVENTS}: a record reported delivered without an offset ({offset})"


def test_partitions_are_counted_apart_and_a_missing_report_holds_the_commit() -> None:
    audit = OffsetAudit()
    audit.starts_empty(EVENTS)
    audit.produced(EVENTS, 2)
    audit.produced(LATE, 1)
    audit.reported(LATE, 40, failed=False)  # the late topic is anchored by its first report
    assert audit.verdict() == f"no delivery report yet for the last record of {EVENTS}"
    audit.reported(EVENTS, 1, failed=False)
    assert audit.verdict() is None
    audit.committed()
    audit.produced(LATE, 2)  # only the late topic is written in this transaction: the events one gets no marker
    audit.reported(LATE, 43, failed=False)
    audit.committed()
    audit.produced(EVENTS, 1)
    audit.reported(EVENTS, 3, failed=False)
    assert audit.verdict() is None


def test_a_failed_report_fails_nothing_itself_and_the_next_report_anchors_again() -> None:
    audit = OffsetAudit()
    audit.starts_empty(EVENTS)
    audit.produced(EVENTS, 2)
    audit.produced(EVENTS, 2)
    audit.reported(EVENTS, None, failed=True)  # librdkafka fails the commit for it
    audit.reported(EVENTS, 9, failed=False)
    assert audit.verdict() is None


@st.composite
def _history(draw: st.DrawFn) -> list[tuple[str, int] | None]:
    """Batches (topic, records) and commits (None)."""
    steps = draw(st.lists(st.one_of(st.tuples(st.sampled_from([EVENTS, LATE]), st.integers(1, 6)), st.none()),
                          min_size=1, max_size=30))
    return list(steps)


def _replay(history: list[tuple[str, int] | None], start: dict[str, int], fault: tuple[int, str] | None
            ) -> tuple[OffsetAudit, list[bool]]:
    """Play ``history`` against a partition-log model; ``fault`` (batch index, kind) breaks one batch's offsets:
    ``drop`` its first record never takes an offset, ``repeat`` it is answered with the batch before's last offset.
    Returns the audit and, per commit, whether its verdict allowed it (a refused commit aborts: the run stops)."""
    audit = OffsetAudit()
    log_end = dict(start)  # the next free offset of each partition
    for topic, offset in start.items():
        if offset == 0:
            audit.starts_empty(topic)
    touched: set[str] = set()
    last_reported: dict[str, int] = {}
    verdicts: list[bool] = []
    for index, step in enumerate(history):
        if step is None:
            verdict = audit.verdict()
            verdicts.append(verdict is None)
            if verdict is not None:
                break
            audit.committed()
            for topic in touched:
                log_end[topic] += 1  # the marker
            touched.clear()
            continue
        topic, records = step
        audit.produced(topic, records)
        touched.add(topic)
        taken = records
        if fault is not None and fault[0] == index and fault[1] == "drop":
            taken -= 1
        log_end[topic] += taken
        offset = log_end[topic] - 1
        if fault is not None and fault[0] == index and fault[1] == "repeat" and topic in last_reported:
            offset = last_reported[topic]
        if offset >= 0:
            last_reported[topic] = offset
        audit.reported(topic, offset, failed=False)
    else:
        verdicts.append(audit.verdict() is None)
    return audit, verdicts


@settings(max_examples=300, deadline=None)
@given(history=_history(), events_start=st.sampled_from([0, 57]), late_start=st.sampled_from([0, 12]))
def test_truthful_reports_never_fail(history: list[tuple[str, int] | None], events_start: int,
                                     late_start: int) -> None:
    _audit, verdicts = _replay(history, {EVENTS: events_start, LATE: late_start}, None)
    assert all(verdicts)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), history=_history(), kind=st.sampled_from(["drop", "repeat"]))
def test_one_record_missing_or_answered_twice_always_fails_once_anchored(
        data: st.DataObject, history: list[tuple[str, int] | None], kind: str) -> None:
    batches = [index for index, step in enumerate(history) if step is not None]
    assume(batches)
    faulty = data.draw(st.sampled_from(batches))
    step = history[faulty]
    assert step is not None
    topic = step[0]
    earlier = [h for h in history[:faulty] if h is not None and h[0] == topic]
    anchored_at_0 = data.draw(st.booleans())
    assume(earlier or kind == "drop")  # a repeat needs an earlier batch to answer with
    assume(earlier or anchored_at_0)  # an unanchored partition's first report anchors it: nothing to compare
    _audit, verdicts = _replay(history, {EVENTS: 0 if anchored_at_0 else 57, LATE: 0 if anchored_at_0 else 12},
                               (faulty, kind))
    assert not all(verdicts)
