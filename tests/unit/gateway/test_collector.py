"""gateway.collector: the serving process's collector settings, and that cyclic garbage is still collected; its GIL
switch interval."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator

import pytest

from gateway.collector import (
    LOOP_SWITCH_INTERVAL_S,
    YOUNG_COLLECTION_ALLOCATIONS,
    settle_collector,
    settle_switch_interval,
)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.mark.usefixtures("restored_collector")
def test_settle_freezes_what_exists_and_raises_only_the_young_threshold() -> None:
    before = gc.get_threshold()
    existing = _Node()
    settle_collector()
    assert gc.get_threshold() == (YOUNG_COLLECTION_ALLOCATIONS, before[1], before[2])
    assert gc.get_freeze_count() > 0
    assert not any(o is existing for o in gc.get_objects())  # frozen: no collection traverses it again


@pytest.mark.usefixtures("restored_collector")
def test_a_cycle_made_after_settling_is_still_collected() -> None:
    settle_collector()
    first, second = _Node(), _Node()
    first.other, second.other = second, first
    alive = weakref.ref(first)
    del first, second
    assert alive() is not None  # reference counting alone cannot free a cycle
    gc.collect()
    assert alive() is None


def test_the_switch_interval_is_ten_times_cpythons_and_only_that_changes() -> None:
    before = sys.getswitchinterval()
    try:
        assert before == pytest.approx(0.005)  # CPython's, as the interpreter starts (and this suite leaves it)
        threshold = gc.get_threshold()
        settle_switch_interval()
        assert sys.getswitchinterval() == pytest.approx(LOOP_SWITCH_INTERVAL_S) == pytest.approx(0.05)
        assert gc.get_threshold() == threshold
    finally:
        sys.setswitchinterval(before)
