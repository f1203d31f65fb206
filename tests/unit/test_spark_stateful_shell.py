"""The Spark shell's per-group loop, without Spark: ordering, punctuation filtering, timeouts, watermark."""

from collections.abc import Mapping, Sequence
from typing import Any

from spark_jobs.stateful import run_group, sort_rows


class RecordingCore:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.watermarks: list[int] = []

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        self.seen.extend(int(r["seq"]) for r in rows)
        return [("rows", {"seqs": [int(r["seq"]) for r in rows]})]

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        self.watermarks.append(watermark_us)
        return [("wm", {"watermark_us": watermark_us})]

    def next_timer_us(self) -> int | None:
        return None

    def is_empty(self) -> bool:
        return not self.seen

    def snapshot(self) -> bytes:
        return b""


def event(seq: int, ts: int, offset: int, kind: str = "event") -> dict[str, Any]:
    return {"kind": kind, "seq": seq, "ref_ts_us": ts, "partition": 0, "offset": offset}


def test_rows_are_fed_in_reference_time_then_offset_order_and_punctuations_skipped() -> None:
    core = RecordingCore()
    batches = iter([[event(2, 30, 5), event(0, 10, 9), event(-1, 20, 3, kind="punctuation"), event(1, 10, 7)]])
    outputs = run_group(core, batches, watermark_us=25, timed_out=False)
    assert outputs == [("rows", {"seqs": [1, 0, 2]}), ("wm", {"watermark_us": 25})]


def test_a_timed_out_group_only_advances_its_watermark() -> None:
    core = RecordingCore()
    outputs = run_group(core, iter([[event(0, 10, 1)]]), watermark_us=99, timed_out=True)
    assert outputs == [("wm", {"watermark_us": 99})]
    assert core.seen == []


def test_without_a_watermark_nothing_is_released() -> None:
    core = RecordingCore()
    assert run_group(core, iter([]), watermark_us=None, timed_out=False) == []
    assert core.watermarks == []


def test_sort_rows_tolerates_missing_fields() -> None:
    assert sort_rows([{"offset": 2}, {"ref_ts_us": None, "offset": 1}]) == [{"ref_ts_us": None, "offset": 1},
                                                                           {"offset": 2}]


def test_a_punctuation_in_the_groups_own_batch_advances_the_core_at_once() -> None:
    core = RecordingCore()
    punctuation = {"kind": "punctuation", "watermark_us": 40, "partition": 0, "offset": 4}
    outputs = run_group(core, iter([[event(0, 10, 1), punctuation]]), watermark_us=25, timed_out=False)
    assert outputs == [("rows", {"seqs": [0]}), ("wm", {"watermark_us": 40})]
    # Spark's watermark wins when it is the later one; a timed-out group has no rows to read promises from.
    assert run_group(RecordingCore(), iter([[punctuation]]), watermark_us=90, timed_out=False)[-1] == (
        "wm", {"watermark_us": 90})
    assert run_group(RecordingCore(), iter([]), watermark_us=None, timed_out=True) == []
