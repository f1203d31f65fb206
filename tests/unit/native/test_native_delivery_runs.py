"""``IngestCore.on_committed``'s per-record loops in Rust (native/src/deliveries.rs, gateway.native.
native_delivery_runs) against the Python functions they replace (gateway.ingest ``_observed_groups``, ``_seq_runs``
and the latencies; the specification): the same latencies, the same ``observe_seq`` calls in the same order, the
same groups with the same runs, on random transactions (sources whose strings are equal but other objects, other
topics, gaps, repeats, seqs at the ends of 64 bits); None for what it does not take; and ``on_committed`` with
them against ``on_delivered`` per record (tests/unit/gateway/test_acks_confirmed_run.py)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ingest import DeliveryRef, IngestConfig, IngestCore, _seq_runs
from gateway.native import native_delivery_runs
from tests.unit.gateway.test_acks_confirmed_run import on_committed_against_on_delivered

T0 = 1_700_000_000_000_000
seqs = st.integers(0, 40) | st.sampled_from([2**63 - 2, 2**63 - 1, -(2**63)])


class RecordedProgress:
    """A stream's StreamProgress that records its ``observe_seq`` calls."""

    def __init__(self, stream: str, calls: list[tuple[Any, ...]]) -> None:
        self.stream = stream
        self.calls = calls

    def observe_seq(self, source_id: str, seq: int, seen_us: int) -> None:
        self.calls.append((self.stream, source_id, seq, seen_us))


def python_groups(deliveries: list[DeliveryRef], now_us: int) -> tuple[Any, ...]:
    calls: list[tuple[Any, ...]] = []
    core = IngestCore.__new__(IngestCore)
    core._progress = {stream: RecordedProgress(stream, calls) for stream in ("s", "t")}  # type: ignore[misc]
    groups = IngestCore._observed_groups(core, deliveries)
    return ([now_us - d.released_us for d in deliveries], calls,
            [(key, indices, list(_seq_runs(deliveries, indices))) for key, indices in groups.items()])


@st.composite
def transactions(draw: st.DrawFn) -> list[DeliveryRef]:
    deliveries = []
    for _ in range(draw(st.integers(0, 40))):
        source = draw(st.sampled_from(["a1", "b2", "é3"]))
        if draw(st.booleans()):
            source = "".join(list(source))  # an equal str, another object
        deliveries.append(DeliveryRef(source, draw(st.sampled_from(["s", "t"])), draw(seqs),
                                      draw(st.sampled_from(["events", "events", "late", "other"])),
                                      T0 + draw(st.integers(-5, 5))))
    return deliveries


@settings(max_examples=400, deadline=None)
@given(deliveries=transactions(), now_us=st.integers(T0, T0 + 10))
def test_groups_are_the_python_functions(deliveries: list[DeliveryRef], now_us: int) -> None:
    native = native_delivery_runs().group(deliveries, now_us)
    assert native is not None
    latencies, observed, groups = native
    assert (latencies, observed, groups) == python_groups(deliveries, now_us)


def test_what_it_does_not_take_is_left_to_python() -> None:
    runs = native_delivery_runs()
    good = DeliveryRef("a", "s", 1, "events", T0)
    assert runs.group([], T0) == ([], [], [])
    for odd in (DeliveryRef("a", "s", 2**64, "events", T0), DeliveryRef("a", "s", 1.0, "events", T0),  # type: ignore[arg-type]
                DeliveryRef("a", "s", True, "events", T0), DeliveryRef("\ud800", "s", 1, "events", T0),
                DeliveryRef("a", "s", 1, "events", None), ("a", "s", 1, "events", T0)):  # type: ignore[arg-type]
        assert runs.group([good, odd], T0) is None  # type: ignore[list-item]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_on_committed_with_the_native_loops_is_on_delivered_per_record(data: st.DataObject) -> None:
    on_committed_against_on_delivered(data, IngestConfig(checkpoint_interval_us=1_000_000,
                                                         delivery_runs=native_delivery_runs))
