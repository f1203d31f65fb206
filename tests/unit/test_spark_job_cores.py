"""The Spark jobs' core adapters without Spark: the columnar path equals the row path, records are exact."""

from typing import Any

import orjson
import pandas as pd

from spark_jobs.stateful import event_frame
from spark_jobs.three_window import ThreeWindowCore, ThreeWindowOptions

BASE = 1_700_000_000_000_000
ROWS = [  # (ref offset us, uncertainty us, payload, partition, offset)
    (990_000, 20_000, {"value": 20}, 0, 1),
    (100_000, 20_000, {"value": 10}, 0, 0),
    (1_010_000, 20_000, {"value": "n/a"}, 0, 2),
    (1_500_000, 0, {"other": 1}, 0, 3),
]


def rows() -> list[dict[str, Any]]:
    return [{"kind": "event", "stream": "s", "source_id": "a", "seq": off, "ref_ts_us": BASE + ts,
             "uncertainty_us": unc, "payload": orjson.dumps(p).decode(), "partition": part, "offset": off}
            for ts, unc, p, part, off in ROWS]


def frame() -> pd.DataFrame:
    df = pd.DataFrame(rows())
    values = [p.get("value") for _ts, _u, p, _pa, _o in ROWS]
    # What Spark's get_json_object(...).cast("double") yields: numbers, else null.
    df["value"] = [float(v) if isinstance(v, int | float) else None for v in values]
    punctuation = {"kind": "punctuation", "stream": "s", "ref_ts_us": None, "offset": 9, "partition": 0}
    return pd.concat([df, pd.DataFrame([punctuation])], ignore_index=True)


def core() -> ThreeWindowCore:
    return ThreeWindowCore("s", ThreeWindowOptions(bootstrap_servers="", width_us=1_000_000, max_shift_us=50_000),
                           0, None)


def test_event_frame_drops_punctuations_and_sorts_by_reference_time() -> None:
    assert event_frame(frame())["offset"].tolist() == [0, 1, 2, 3]


def test_columnar_and_row_paths_release_the_same_windows() -> None:
    by_rows, by_columns = core(), core()
    assert by_rows.on_rows(sorted(rows(), key=lambda r: r["ref_ts_us"])) == []
    assert by_columns.on_frame(event_frame(frame())) == []
    released_rows = by_rows.on_watermark(BASE + 10_000_000)
    assert released_rows == by_columns.on_watermark(BASE + 10_000_000)
    finals = {v["nominal_start_us"] - BASE: v for _k, v in released_rows if v["record"] == "final"}
    # MIDDLE 0 = {100 ms: 10, 990 ms: 20}; 1 010 ms carries no number, 1 500 ms no value field: counted only.
    middle0 = next(v for _k, v in released_rows
                   if v["record"] == "window" and v["window_type"] == "MIDDLE" and v["nominal_start_us"] == BASE)
    assert (middle0["count"], middle0["sum"], middle0["value_count"]) == (2, 30.0, 2)
    # LOW 1 = 990+20, 1010+20, 1500 ; MIDDLE 1 = 1010, 1500 ; HIGH 1 = 1500 (990-20 and 1010-20 fall in HIGH 0).
    assert finals[1_000_000]["window_counts"] == [3, 2, 1]


def test_a_snapshot_restores_the_same_core() -> None:
    first = core()
    first.on_frame(event_frame(frame()))
    again = ThreeWindowCore("s", ThreeWindowOptions(bootstrap_servers=""), 0, first.snapshot())
    assert again.on_watermark(BASE + 10_000_000) == first.on_watermark(BASE + 10_000_000)
