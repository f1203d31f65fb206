"""Clock state records carry the whole estimate, and a restarted gateway can read it back exactly."""

import orjson

from gateway.clock_state import clock_state_record, estimate_from_record
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfo

ESTIMATE = ClockEstimate(offset_us=-250_012, skew_ppm=-79.8, rtt_us=41, sync_ref_us=1_700_000_000_000_000,
                         sample_count=24, root_error_us=20.5, skew_error_ppm=0.4, dispersion_ppm=15.0,
                         points_used=3, burst_count=3)


def test_a_clock_record_round_trips_the_estimate() -> None:
    info = SourceInfo("sensor-1", ESTIMATE, last_sync_us=1_700_000_000_000_100)
    record = orjson.loads(clock_state_record(info, 1_700_000_001_000_000, t_a_us=41).to_json())
    assert estimate_from_record(record) == ("sensor-1", ESTIMATE, 1_700_000_000_000_100)
    assert record["offset_us"] == -250_012 and record["rtt_us"] == 41  # the flat fields stay for jobs


def test_records_without_a_full_estimate_are_skipped() -> None:
    info = SourceInfo("sensor-1", ESTIMATE, last_sync_us=5)
    record = orjson.loads(clock_state_record(info, 10, t_a_us=41).to_json())
    partial = {**record, "estimate": {k: v for k, v in record["estimate"].items() if k != "skew_ppm"}}
    wrong_type = {**record, "estimate": {**record["estimate"], "offset_us": "12"}}
    assert estimate_from_record(partial) is None
    assert estimate_from_record(wrong_type) is None
    assert estimate_from_record({**record, "kind": "progress"}) is None
    assert estimate_from_record({k: v for k, v in record.items() if k != "estimate"}) is None
