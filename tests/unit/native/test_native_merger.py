"""The compiled merger (skewless_native.MultiSourceMerger) against its executable specification, reorder.merger.

Differential: both are driven with the same calls (registrations, pushes, runs, heartbeats with and without
caught_up, byes, forgets, timer firings, flushes, restarts that restore the watermark) on random sources, stamps,
error bounds and configs; every call's outputs, the ``timeout_for`` calls each makes, and every query (deadline,
watermark, queues, sources, give-ups, counters) must be identical. Plus the native side's own errors."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reorder.merger import VIRTUAL_TIME_FLOOR_US, MergerConfig, MultiSourceMerger
from reorder.records import Late, Merged, Punctuation, SourceEvent, SourceTimedOut

native = pytest.importorskip("skewless_native")

KIND = {Merged: 0, Punctuation: 1, SourceTimedOut: 2, Late: 3}
# Names whose order (the heaps break ties by name) differs from the order they register in.
NAMES = ("m", "b", "zz", "a", "c1", "c")


def tagged(outputs: list[Any]) -> list[tuple[Any, ...]]:
    """The Python core's records as the native core returns them: the kind, then the record's fields."""
    return [(KIND[type(o)], *o) for o in outputs]


class PerSourceMapping:
    """``t_ref = t_source + offset``, a per-source error bound; the same object maps for both cores."""

    def __init__(self, offsets_us: dict[str, int], errors_us: dict[str, int]) -> None:
        self.offsets_us = offsets_us
        self.errors_us = errors_us

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us + self.offsets_us.get(source_id, 0), self.errors_us.get(source_id, 0)

    def rtt_us(self, source_id: str) -> int | None:
        return None


class Twin:
    """A Python and a native merger fed the same calls, compared after each."""

    def __init__(self, config: MergerConfig, clock: PerSourceMapping,
                 waits: Callable[[str, int], int] | None) -> None:
        self.config, self.clock, self.waits = config, clock, waits
        self.calls: tuple[list[tuple[str, int]], list[tuple[str, int]]] = ([], [])
        self.py, self.native = self._pair()

    def _pair(self) -> tuple[Any, Any]:
        def recorder(calls: list[tuple[str, int]]) -> Callable[[str, int], int] | None:
            waits = self.waits
            if waits is None:
                return None

            def timeout_for(source_id: str, now_us: int) -> int:
                calls.append((source_id, now_us))
                return waits(source_id, now_us)
            return timeout_for

        return (MultiSourceMerger("R", self.clock, self.config, timeout_for=recorder(self.calls[0])),
                native.MultiSourceMerger("R", self.clock, self.config, timeout_for=recorder(self.calls[1])))

    def restart(self) -> None:
        """A cut: both restart with the watermark they had promised (all the merge keeps across a restart)."""
        watermark = self.py.watermark_us
        self.py, self.native = self._pair()
        if watermark is not None:
            self.call("restore_watermark", watermark)

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        expected = getattr(self.py, name)(*args, **kwargs)
        actual = getattr(self.native, name)(*args, **kwargs)
        if isinstance(expected, list):
            assert actual == tagged(expected), name
            for want, got in zip(expected, actual, strict=True):
                if isinstance(want, (Merged, Late)):
                    assert got[1] is want.event  # the handle given, handed back
        else:
            assert actual == expected, name
        self.check()

    def check(self) -> None:
        py, nat = self.py, self.native
        assert self.calls[1] == self.calls[0]
        assert nat.next_deadline_us() == py.next_deadline_us()
        assert nat.watermark_us == py.watermark_us
        assert nat.queued == py.queued
        assert nat.queued_by_source() == py.queued_by_source()
        assert nat.sources() == py.sources()
        assert nat.counters.as_dict() == dataclasses.asdict(py.counters)
        for source_id in NAMES:
            assert nat.queued_of(source_id) == py.queued_of(source_id)
            assert nat.waits_for(source_id) == py.waits_for(source_id)
            if source_id in py.sources():
                assert nat.is_timed_out(source_id) == py.is_timed_out(source_id)
            else:
                with pytest.raises(KeyError):
                    nat.is_timed_out(source_id)


@st.composite
def configs(draw: st.DrawFn) -> MergerConfig:
    return MergerConfig(
        mode=draw(st.sampled_from(["watermark", "watermark", "thesis"])),
        default_timeout_us=draw(st.integers(0, 400)),
        punctuation_interval_us=draw(st.sampled_from([0, 1, 7, 50, 10**6])),
        max_queued_per_source=draw(st.sampled_from([1, 2, 3, 5, 200_000])),
        learn_wait=draw(st.booleans()),
        learned_wait_cap_us=draw(st.sampled_from([0, 1, 2, 30, 90, 500, 2_000])),
        wait_quantile=draw(st.sampled_from([0.5, 0.9, 0.99, 0.9999])),
        wait_factor=draw(st.sampled_from([0.5, 1.0, 2.0, 3.3])),
        wait_half_life=draw(st.sampled_from([1.0, 3.0, 10_000.0])),
        min_wait_samples=draw(st.integers(0, 4)),
        min_watermark_us=draw(st.sampled_from([0, VIRTUAL_TIME_FLOOR_US, 300])),
    )


def wait_policy(kind: int) -> Callable[[str, int], int] | None:
    if kind == 0:
        return None
    if kind == 1:
        return lambda source_id, now_us: 10 * len(source_id) + now_us % 37
    return lambda source_id, now_us: 0 if source_id < "c" else 150


@settings(max_examples=250, deadline=None)
@given(st.data(), configs(), st.integers(0, 2), st.sampled_from([0, -5_000, 1_700_000_000_000_000]))
def test_native_merger_decides_exactly_as_the_python_core(
        data: st.DataObject, config: MergerConfig, policy: int, epoch_us: int) -> None:
    names = data.draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=len(NAMES), unique=True), "sources")
    offsets = {n: data.draw(st.integers(-300, 300)) for n in names}
    errors = {n: data.draw(st.sampled_from([0, 0, 3, 20, 200])) for n in names}
    twin = Twin(config, PerSourceMapping(offsets, errors), wait_policy(policy))
    seq = dict.fromkeys(names, 0)
    ts = dict.fromkeys(names, epoch_us)
    now = epoch_us
    payload = 0

    def next_event(source_id: str) -> SourceEvent:
        nonlocal payload
        # Mostly the next seq with a later stamp; sometimes a seq jump (a gap the reorderer skipped), a stamp that
        # goes backwards, or an older seq (a late event passed through).
        seq[source_id] += data.draw(st.sampled_from([1, 1, 1, 2, 5, -2]))
        ts[source_id] += data.draw(st.sampled_from([0, 1, 5, 20, 60, 300, -10, -400]))
        payload += 1
        return SourceEvent(source_id, "R", seq[source_id], ts[source_id], payload)

    def mapping(source_id: str, source_ts_us: int) -> tuple[int, int] | None:
        choice = data.draw(st.integers(0, 3))
        if choice == 0:
            return None  # mapped by the clock, inside each core
        ref, err = twin.clock.to_reference(source_id, source_ts_us)
        return ref + data.draw(st.sampled_from([0, -7, 40])), data.draw(st.sampled_from([err, 0, 15, 500]))

    for _ in range(data.draw(st.integers(1, 70))):
        now += data.draw(st.sampled_from([0, 1, 3, 10, 40, 100, 400, -3]))
        source_id = data.draw(st.sampled_from(names))
        op = data.draw(st.sampled_from(
            ["push"] * 6 + ["run"] * 3 + ["beat"] * 3 + ["advance"] * 3
            + ["register", "hear", "heard", "leave", "forget", "flush", "restart", "restore"]))
        if op == "push":
            event = next_event(source_id)
            late = data.draw(st.booleans()) and data.draw(st.booleans())
            twin.call("push", event, now - data.draw(st.sampled_from([0, 2, 50])), now, late=late,
                      mapped=mapping(source_id, event.source_ts_us))
        elif op == "run":
            run = []
            for _ in range(data.draw(st.integers(0, 6))):
                event = next_event(source_id)
                mapped = mapping(source_id, event.source_ts_us) or twin.clock.to_reference(source_id,
                                                                                           event.source_ts_us)
                run.append((event, now - data.draw(st.sampled_from([0, 9])), mapped))
            twin.call("push_run", source_id, run, now)
        elif op == "beat":
            beat_seq = seq[source_id] + data.draw(st.sampled_from([0, 0, -1, 1, 3]))
            clock_us = ts[source_id] + data.draw(st.sampled_from([0, 10, 100, 1_000, -50]))
            twin.call("heartbeat", source_id, beat_seq, clock_us, now, caught_up=data.draw(st.booleans()),
                      mapped=mapping(source_id, clock_us))
        elif op == "advance":
            deadline = twin.py.next_deadline_us()
            if deadline is not None and data.draw(st.booleans()):
                now = max(now, deadline + data.draw(st.sampled_from([-1, 0, 0, 5])))
            twin.call("advance", now)
        elif op == "register":
            twin.call("register", source_id, now)
        elif op == "hear":
            twin.call("hear", source_id, now)
        elif op == "heard":
            twin.call("note_heard", source_id, now)
        elif op == "leave":
            twin.call("leave", source_id, now)
        elif op == "forget":
            twin.call("forget", source_id)
        elif op == "flush":
            twin.call("flush", now)
        elif op == "restart":
            twin.restart()
            twin.check()
        else:
            twin.call("restore_watermark", now + data.draw(st.sampled_from([-1_000, 0, 200])))
    twin.call("flush", now + 10**6)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2_000), st.integers(0, 50), st.booleans()),
                min_size=1, max_size=120), configs())
def test_many_sources_under_learned_waits_and_give_ups(
        pushes: list[tuple[int, int, int, bool]], config: MergerConfig) -> None:
    """Long interleavings with heartbeats on the same sources: the learned waits warm up and give sources up."""
    names = ["s0", "s1", "s2", "s3"]
    twin = Twin(config, PerSourceMapping({"s1": 7, "s2": -5}, {"s3": 11}), None)
    for source_id in names[1:]:
        twin.call("register", source_id, 0)
    seqs = dict.fromkeys(names, 0)
    now = 0
    for index, ts, step, beat in pushes:
        now += step
        source_id = names[index]
        twin.call("advance", now)
        if beat:
            twin.call("heartbeat", source_id, seqs[source_id] - 1, ts, now)
        else:
            twin.call("push", SourceEvent(source_id, "R", seqs[source_id], ts), now, now)
            seqs[source_id] += 1
    twin.call("flush", now + 10**6)


def test_a_late_event_and_the_records_it_makes_come_back_tagged_by_kind() -> None:
    """Hand-computed (the Python suite's timed-out-source example): the native tuples are the records' fields."""
    m = native.MultiSourceMerger("R1", PerSourceMapping({}, {}), MergerConfig(
        default_timeout_us=100, punctuation_interval_us=0, learn_wait=False))
    m.heartbeat("A", -1, 0, 0)
    m.heartbeat("B", -1, 0, 0)
    a0, a1, b0 = SourceEvent("A", "R1", 0, 500), SourceEvent("A", "R1", 1, 600), SourceEvent("B", "R1", 0, 200)
    assert m.push(a0, 10, 10) == []
    assert m.advance(110) == [(m.SOURCE_TIMED_OUT, "R1", "B", 110), (m.MERGED, a0, 10, 110, 500, 0),
                              (m.PUNCTUATION, "R1", 500, 110)]
    assert m.push(a1, 120, 120) == [(m.MERGED, a1, 120, 120, 600, 0), (m.PUNCTUATION, "R1", 600, 120)]
    assert m.push(b0, 130, 130) == [(m.LATE, b0, 130, "after_punctuation", 400, False)]
    assert (m.counters.late, m.counters.timeouts, m.watermark_us) == (1, 1, 600)


def test_given_the_record_classes_it_returns_the_python_cores_records() -> None:
    """``records=`` (how the gateway and the replay build it): the same example, as reorder.records objects."""
    m = native.MultiSourceMerger("R1", PerSourceMapping({}, {}), MergerConfig(
        default_timeout_us=100, punctuation_interval_us=0, learn_wait=False),
        records=(Merged, Punctuation, SourceTimedOut, Late))
    m.heartbeat("A", -1, 0, 0)
    m.heartbeat("B", -1, 0, 0)
    a0, b0 = SourceEvent("A", "R1", 0, 500), SourceEvent("B", "R1", 0, 200)
    assert m.push(a0, 10, 10) == []
    outputs = m.advance(110)
    assert outputs == [SourceTimedOut("R1", "B", 110), Merged(a0, 10, 110, 500, 0), Punctuation("R1", 500, 110)]
    assert [type(o) for o in outputs] == [SourceTimedOut, Merged, Punctuation]
    late = m.push(b0, 130, 130)
    assert late == [Late(b0, 130, "after_punctuation", 300, False)] and type(late[0]) is Late


def test_the_native_config_check_says_what_the_python_one_says_and_refuses_what_it_would_fail_on_later() -> None:
    fields = {f.name: getattr(MergerConfig(), f.name) for f in dataclasses.fields(MergerConfig)}
    cases: list[tuple[dict[str, object], str]] = [
        ({"wait_quantile": 1.0}, "wait_quantile must be in (0, 1)"),
        ({"learned_wait_cap_us": -1}, "learned_wait_cap_us must be >= 0"),
        ({"min_wait_samples": -1}, "min_wait_samples must be >= 0"),
        ({"wait_half_life": 0.0}, "wait_half_life must be finite and > 0"),
        ({"mode": "fifo"}, "mode 'fifo' is not watermark or thesis"),
        ({"default_timeout_us": 1 << 62}, "default_timeout_us"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            native.MultiSourceMerger("R", PerSourceMapping({}, {}), SimpleNamespace(**{**fields, **bad}))


def test_times_beyond_two_to_the_61_us_are_refused_before_anything_changes() -> None:
    m = native.MultiSourceMerger("R", PerSourceMapping({}, {}))
    with pytest.raises(ValueError, match=r"now_us .* outside"):
        m.register("a", 1 << 62)
    with pytest.raises(ValueError, match=r"error_us -1 is outside"):
        m.push(SourceEvent("a", "R", 0, 5), 0, 0, mapped=(5, -1))
    with pytest.raises(ValueError, match=r"ref_us .* outside"):
        m.push_run("a", [(SourceEvent("a", "R", 0, 5), 0, (5, 0)), (SourceEvent("a", "R", 1, 6), 0, (1 << 62, 0))], 0)
    with pytest.raises(OverflowError):
        m.advance(1 << 64)
    assert (m.sources(), m.queued, m.counters.merged) == ([], 0, 0)


def test_an_error_in_timeout_for_reaches_the_caller() -> None:
    def broken(source_id: str, now_us: int) -> int:
        raise LookupError(source_id)

    m = native.MultiSourceMerger("R", PerSourceMapping({}, {}), MergerConfig(mode="thesis"), timeout_for=broken)
    m.register("a", 0)
    m.register("b", 0)
    with pytest.raises(LookupError, match="b"):
        m.push(SourceEvent("a", "R", 0, 5), 0, 0)


CHURN_OPS = ["beat"] * 3 + ["forget"] * 4 + ["push", "leave", "register"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 79), st.sampled_from(CHURN_OPS), st.integers(0, 30)),
                min_size=100, max_size=600),
       st.booleans())
def test_sources_joining_and_being_forgotten_by_the_hundred(
        ops: list[tuple[int, str, int]], learn_wait: bool) -> None:
    """Churn: the native core compacts its source list as sources are forgotten; order (registration order, which the
    watermark scan and sources() follow) and every decision stay the Python core's."""
    config = MergerConfig(default_timeout_us=50, punctuation_interval_us=3, learn_wait=learn_wait,
                          learned_wait_cap_us=80, min_wait_samples=2)
    twin = Twin(config, PerSourceMapping({}, {}), None)
    seqs: dict[str, int] = {}
    now = 0
    for index, op, step in ops:
        now += step
        source_id = f"s{index:02d}"
        if op == "beat":
            twin.call("heartbeat", source_id, seqs.get(source_id, 0) - 1, now + index, now)
        elif op == "push":
            seqs[source_id] = seqs.get(source_id, 0) + 1
            twin.call("push", SourceEvent(source_id, "R", seqs[source_id], now + index), now, now)
        elif op == "forget":
            twin.call("forget", source_id)
        else:
            twin.call(op, source_id, now)
        twin.call("advance", now)
    twin.call("flush", now + 10**6)


def test_frames_handled_out_of_read_order_release_alike_and_never_before_arrival() -> None:
    """The native merger stamps a release as the Python one does when a call's now is older than a queued event's
    arrival (a frame read earlier on another connection, handled later): at the event's arrival."""
    twin = Twin(MergerConfig(default_timeout_us=1_000_000, learn_wait=False), PerSourceMapping({}, {}), None)
    twin.call("register", "S1", 0)
    twin.call("register", "S2", 0)
    twin.call("push", SourceEvent("S1", "R", 0, 10), 100, 100)
    released = twin.py.push(SourceEvent("S2", "R", 0, 20), 90, 90)
    assert [(o.arrival_us, o.release_us) for o in released if isinstance(o, Merged)] == [(100, 100)]
    native_released = twin.native.push(SourceEvent("S2", "R", 0, 20), 90, 90)
    assert [(o[2], o[3]) for o in native_released if o[0] == KIND[Merged]] == [(100, 100)]
