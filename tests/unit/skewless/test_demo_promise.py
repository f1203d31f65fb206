"""The demo's check of the gateway's promise: an event's true time lies within its reported uncertainty of its
reference time (inclusive); the demo fails when any does not."""

from __future__ import annotations

from typing import Any

from skewless.demo import outside_uncertainty


def record(source_id: str, seq: int, ref_ts_us: int, uncertainty_us: int) -> dict[str, Any]:
    return {"source_id": source_id, "seq": seq, "ref_ts_us": ref_ts_us, "uncertainty_us": uncertainty_us}


def test_only_events_beyond_their_own_uncertainty_count() -> None:
    true_us = {("a", 0): 1_000_000, ("a", 1): 2_000_000, ("b", 0): 1_000_000, ("b", 1): 5_000}
    records = [record("a", 0, 1_000_040, 40),     # exactly on the bound: kept
               record("a", 1, 1_999_959, 40),     # 41 us early with 40 us: broken
               record("b", 0, 1_000_041, 40),     # 41 us late: broken
               record("b", 1, 5_000, 0)]          # no uncertainty, exact: kept
    assert outside_uncertainty(records, true_us) == 2
    assert outside_uncertainty(records[::3], true_us) == 0
    assert outside_uncertainty([], true_us) == 0
