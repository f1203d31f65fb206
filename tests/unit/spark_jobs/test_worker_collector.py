"""spark_jobs.stateful.WorkerCollector: a group runs with the automatic collector off, the garbage cycles it made
are collected right after it (young collections back off while they find none), the kept objects are frozen
between groups, and every full_every-th group leaves them to pyspark's full collection after the task, which then
collects garbage among them."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from spark_jobs.stateful import LiveCores, MicroBatchColumns, WorkerCollector, make_stream_function
from tests.unit.spark_jobs.test_spark_stateful_shell import BATCHES, FakeGroupState, run_function


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


class CyclingCore:
    """A core that makes a garbage cycle per batch and keeps one cycle alive until the next batch drops it."""

    def __init__(self) -> None:
        self.garbage: list[weakref.ref[Node]] = []
        self.kept: Node | None = None
        self.dropped: list[weakref.ref[Node]] = []
        self.collector_on: list[bool] = []

    def on_events(self, batch: MicroBatchColumns) -> list[Any]:
        self.collector_on.append(gc.isenabled())
        self.garbage.append(weakref.ref(cycle()))
        if self.kept is not None:
            self.dropped.append(weakref.ref(self.kept))
        self.kept = cycle()
        return []

    def on_rows(self, rows: Any) -> list[Any]:
        raise AssertionError("columnar")

    def on_watermark(self, watermark_us: int) -> list[Any]:
        return []

    def set_ta_us(self, ta_us: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return b"state %d" % len(self.garbage)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.enable()


def test_groups_run_without_the_collector_and_their_garbage_cycles_go_right_after(unfrozen: None) -> None:
    core = CyclingCore()
    collector = WorkerCollector(full_every=3)
    function = make_stream_function("j", lambda _s, _b: core, lambda _s: ("p.events.s", 1), LiveCores(),
                                    collector_policy=collector)
    state = FakeGroupState()
    gc.enable()
    frozen_after = []
    for rows in BATCHES:
        run_function(function, state, rows)
        assert gc.isenabled()
        frozen_after.append(gc.get_freeze_count() > 0)
        # pyspark's worker after the task: a full collection of everything not frozen.
        gc.collect()
    assert core.collector_on == [False, False, False]
    # Each batch's own garbage cycle is gone as soon as its group ends (a young collection).
    assert all(ref() is None for ref in core.garbage)
    # Groups 1 and 2 froze what they kept; group 3 (full_every) left it to the full collection.
    assert frozen_after == [True, True, False]
    # The cycle kept by batch 1 and dropped in batch 2 was frozen by then: collected by the full collection of
    # group 3, not before.
    assert len(core.dropped) == 2 and all(ref() is None for ref in core.dropped)
    assert core.kept is not None


def test_a_kept_cycle_dropped_while_frozen_waits_for_the_full_collection(unfrozen: None) -> None:
    core = CyclingCore()
    collector = WorkerCollector(full_every=4)
    function = make_stream_function("j", lambda _s, _b: core, lambda _s: ("p.events.s", 1), LiveCores(),
                                    collector_policy=collector)
    state = FakeGroupState()
    run_function(function, state, BATCHES[0])
    run_function(function, state, BATCHES[1])  # drops the cycle batch 0 kept: it was frozen, it is old now
    gc.collect()
    assert core.dropped[0]() is not None  # not collected by the young collection nor by pyspark's while frozen
    run_function(function, state, BATCHES[2])
    run_function(function, state, BATCHES[0])  # the 4th group: not frozen after it
    gc.collect()
    assert core.dropped[0]() is None


def test_a_failing_group_turns_the_collector_back_on(unfrozen: None) -> None:
    class Failing(CyclingCore):
        def on_events(self, batch: MicroBatchColumns) -> list[Any]:
            raise RuntimeError("the task dies")

    function = make_stream_function("j", lambda _s, _b: Failing(), lambda _s: ("p.events.s", 1), LiveCores(),
                                    collector_policy=WorkerCollector())
    gc.enable()
    with pytest.raises(RuntimeError):
        run_function(function, FakeGroupState(), BATCHES[0])
    assert gc.isenabled()


class SometimesCyclingCore(CyclingCore):
    """A core that makes a garbage cycle only in the batches it is told to."""

    def __init__(self) -> None:
        super().__init__()
        self.cycle_now = False

    def on_events(self, batch: MicroBatchColumns) -> list[Any]:
        if self.cycle_now:
            self.garbage.append(weakref.ref(cycle()))
        return []


def test_young_collections_back_off_while_they_find_nothing_and_return_with_garbage(unfrozen: None) -> None:
    core = SometimesCyclingCore()
    collector = WorkerCollector(full_every=12, young_every_max=4)
    function = make_stream_function("j", lambda _s, _b: core, lambda _s: ("p.events.s", 1), LiveCores(),
                                    collector_policy=collector)
    state = FakeGroupState()

    def group(with_cycle: bool) -> None:
        core.cycle_now = with_cycle
        run_function(function, state, BATCHES[collector.groups % len(BATCHES)])
        gc.collect()  # pyspark's worker after the task

    for _ in range(7):
        group(False)
    # Young collections after groups 1, 3 and 7: each found nothing, so the next waits twice as long (at most 4).
    assert collector.young_collections == 3
    group(True)  # group 8: no young collection; its cycle is frozen with the rest
    group(False)
    group(False)
    group(True)  # group 11: a young collection, which finds this group's cycle
    assert collector.young_collections == 4
    assert core.garbage[0]() is not None and core.garbage[1]() is None
    group(False)  # group 12: young collection again (garbage was found), then the full collection
    assert collector.young_collections == 5
    assert core.garbage[0]() is None
