"""The Rust reference mapping (native/src/clocks.rs, built by gateway.native.native_reference_mapping) against the
Python mapping it stands for (timesync.clocks, the specification): the same ``to_reference`` and ``rtt_us`` results,
int for int, or the same error, for identity, fixed offsets and estimates (a SourceInfoStore's, read live through
updates and removals, and an EstimateMapping's own dict), including estimates whose fields the Rust arithmetic
does not take (the Python mapping then answers) and results beyond 64 bits or from non-finite floats."""

from __future__ import annotations

from typing import Any

import pytest
import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.native import native_reference_mapping
from timesync.clocks import (
    UNKNOWN_ERROR_BOUND_US,
    EstimateMapping,
    FixedOffsetMapping,
    IdentityMapping,
    ReferenceErrorMapping,
    ReferenceMapping,
)
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfoStore

T0 = 1_800_000_000_000_000
SOURCES = ("a", "é-b", "c")
big_ints = st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**70, -(2**64)])
timestamps = st.integers(T0 - 10**12, T0 + 10**12) | st.integers(-(2**64), 2**64) | big_ints
floats = st.floats(-2e3, 2e3) | st.floats(allow_nan=True, allow_infinity=True)
float_fields = floats | st.integers(-(2**60), 2**60) | st.sampled_from([0.0, 0.5, 1e-300, True])
estimates = st.builds(
    ClockEstimate,
    offset_us=st.integers(-10**9, 10**9) | big_ints | st.sampled_from([0, 1.5]),
    skew_ppm=float_fields, rtt_us=st.integers(-5, 10**6) | st.none(),
    sync_ref_us=st.integers(T0 - 10**12, T0 + 10**12) | big_ints, sample_count=st.just(3),
    root_error_us=float_fields, skew_error_ppm=float_fields, dispersion_ppm=float_fields)


def answer(call: Any) -> tuple[str, Any]:
    """The call's result with its type (an int and an equal float differ), or its error's type."""
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001  (the two mappings must raise the same)
        return "raised", type(exc)
    if isinstance(result, tuple):
        return "tuple", [(type(value), value) for value in result]
    return "value", (type(result), result)


def same_answers(python: ReferenceMapping, native: ReferenceMapping, source_id: Any, source_ts_us: Any) -> None:
    expected = answer(lambda: python.to_reference(source_id, source_ts_us))
    assert answer(lambda: native.to_reference(source_id, source_ts_us)) == expected
    assert answer(lambda: native.rtt_us(source_id)) == answer(lambda: python.rtt_us(source_id))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_store_s_estimates_map_as_the_python_mapping_does(data: st.DataObject) -> None:
    store = SourceInfoStore()
    python = EstimateMapping(store.get)
    native = native_reference_mapping(EstimateMapping(store.get))
    assert isinstance(native, skewless_native.ReferenceClocks)
    for _ in range(data.draw(st.integers(1, 30))):
        source_id = data.draw(st.sampled_from(SOURCES))
        op = data.draw(st.sampled_from(["map"] * 4 + ["update", "remove"]))
        if op == "update":
            store.update(source_id, data.draw(estimates), T0)
        elif op == "remove":
            store.remove(source_id)
        else:
            same_answers(python, native, source_id, data.draw(timestamps))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_an_estimate_mapping_s_own_dict_maps_as_the_python_mapping_does(data: st.DataObject) -> None:
    python = EstimateMapping()
    native = native_reference_mapping(python)
    assert isinstance(native, skewless_native.ReferenceClocks)
    for _ in range(data.draw(st.integers(1, 20))):
        source_id = data.draw(st.sampled_from(SOURCES))
        if data.draw(st.booleans()):
            python.update(source_id, data.draw(estimates))
        same_answers(python, native, source_id, data.draw(timestamps))


@settings(max_examples=200, deadline=None)
@given(offsets=st.dictionaries(st.sampled_from(SOURCES), st.integers(-10**9, 10**9) | big_ints, max_size=3),
       error_bound_us=st.integers(0, 10**6) | big_ints, source_id=st.sampled_from(SOURCES),
       source_ts_us=timestamps)
def test_fixed_offsets_and_identity_map_as_the_python_mappings_do(offsets: dict[str, int], error_bound_us: int,
                                                                   source_id: str, source_ts_us: int) -> None:
    fixed = FixedOffsetMapping(offsets, error_bound_us)
    same_answers(fixed, native_reference_mapping(fixed), source_id, source_ts_us)
    identity = IdentityMapping()
    same_answers(identity, native_reference_mapping(identity), source_id, source_ts_us)


def test_hand_computed_estimate() -> None:
    """1 ms behind the reference, 20 ppm fast, synced 10 s before the event: t - 1000 + 200 (the drift of 10 s),
    bound ceil(200 + (15 + 1) ppm * 10.0002 s) = ceil(360.0032) = 361 us."""
    store = SourceInfoStore()
    store.update("a", ClockEstimate(offset_us=-1_000, skew_ppm=20.0, rtt_us=400, sync_ref_us=T0, sample_count=10,
                                    root_error_us=200.0, skew_error_ppm=1.0, dispersion_ppm=15.0), T0)
    native = native_reference_mapping(EstimateMapping(store.get))
    t = T0 + 10_001_000
    assert native.to_reference("a", t) == (t - 800, 361)
    assert native.rtt_us("a") == 400
    assert native.to_reference("b", t) == (t, UNKNOWN_ERROR_BOUND_US) and native.rtt_us("b") is None


def test_a_forgotten_source_s_estimate_is_not_kept() -> None:
    """Memory stays bounded by the store: a source time sync forgot leaves the Rust mapping's parsed estimates at
    its next lookup."""
    store = SourceInfoStore()
    native = native_reference_mapping(EstimateMapping(store.get))
    assert isinstance(native, skewless_native.ReferenceClocks)
    for source_id in SOURCES:
        store.update(source_id, ClockEstimate(offset_us=5, skew_ppm=0.0, rtt_us=1, sync_ref_us=T0, sample_count=1),
                     T0)
        native.to_reference(source_id, T0)
    assert native.parsed_sources == 3
    for source_id in SOURCES[1:]:
        store.remove(source_id)
        assert native.to_reference(source_id, T0) == (T0, UNKNOWN_ERROR_BOUND_US)
    assert native.parsed_sources == 1


def test_odd_arguments_get_the_python_mapping_s_answer() -> None:
    store = SourceInfoStore()
    store.update("a", ClockEstimate(offset_us=5, skew_ppm=0.0, rtt_us=1, sync_ref_us=T0, sample_count=1), T0)
    python = EstimateMapping(store.get)
    native = native_reference_mapping(EstimateMapping(store.get))
    for source_id, source_ts_us in [("a", 1.5), ("a", True), ("a", "x"), (["a"], 3), (None, 3), ("a", 2**80)]:
        same_answers(python, native, source_id, source_ts_us)


class OwnMapping(IdentityMapping):
    pass


@pytest.mark.parametrize("mapping", [
    OwnMapping(), ReferenceErrorMapping(IdentityMapping(), lambda: 5), EstimateMapping(lambda source_id: None),
])
def test_other_mappings_are_kept_as_they_are(mapping: ReferenceMapping) -> None:
    """A subclass may map otherwise, and a mapping whose lookup is not a dict's is read by calling it."""
    assert native_reference_mapping(mapping) is mapping


def test_the_wrapped_mapping_is_kept() -> None:
    mapping = IdentityMapping()
    native = native_reference_mapping(mapping)
    assert isinstance(native, skewless_native.ReferenceClocks)
    assert native.mapping is mapping
