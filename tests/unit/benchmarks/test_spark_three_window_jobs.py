"""benchmarks/spark_three_window.py: choosing a subset of the jobs, and the page section such a run writes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from benchmarks import spark_three_window as bench


def test_a_subset_runs_in_the_benchmarks_order_after_the_native_count() -> None:
    assert bench.selected_jobs("iseq, window_count") == ("native_window", "window_count", "iseq")
    assert bench.selected_jobs("native_window,iseq") == ("native_window", "iseq")


def test_an_unknown_job_is_refused_by_name() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="unknown job\\(s\\) seq, x"):
        bench.selected_jobs("iseq,seq,x")


def figures(job: str, events_per_s: float, cpu_us: float) -> dict[str, Any]:
    return {f"{job}_events_per_s": events_per_s, f"{job}_ratio": events_per_s / 20_000.0,
            f"{job}_ratio_min": 0.25, f"{job}_ratio_max": 0.5, f"{job}_cpu_us_per_event": cpu_us,
            f"{job}_cpu_ratio": 20.0 / cpu_us}


SUBSET_RUN: dict[str, Any] = {
    **figures("native_window", 20_000.0, 20.0), **figures("iseq", 5_000.0, 80.0),
    "jobs": "native_window,iseq", "events": 40_000, "rounds": 2.0, "load_min": 1.0, "load_max": 3.0,
    "load_median": 2.0, "cores": 2.0, "machine_busy_share": 0.5, "jobs_cpu_share": 0.25,
    "run_start_utc": "2026-11-28 15:10", "run_end_utc": "2026-11-28 15:20", "commit": "abc1234",
    "iseq_engine_events_per_cpu_s": 8_000.0, "iseq_engine_share": 12_500.0 / 8_000.0,
}


def test_the_iseq_row_gives_its_ratios_to_the_native_count_and_the_verdicts() -> None:
    assert bench.job_row(SUBSET_RUN, "iseq") == (
        f"| {bench.JOB_LABELS['iseq']} | 5,000 | **0.25x** (0.25-0.50) | 80.0 | **0.25x** | **missed** / **missed** |")


def test_a_subset_run_replaces_its_own_section_and_keeps_the_rest_of_the_page(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "DOCS", tmp_path)
    page = tmp_path / "spark-benchmark.md"
    page.write_text("# full run\n\ntable\n\n## Where the Python time goes\n\nprofile\n")
    bench.write_subset_section(SUBSET_RUN, "first reading")
    bench.write_subset_section(SUBSET_RUN, "second reading")
    text = page.read_text()
    assert text.startswith("# full run\n\ntable\n\n" + bench.SUBSET_BEGIN + "\n## iseq next to the native count: "
                           "a separate run (run of 2026-11-28 15:10-15:20 UTC, commit abc1234)\n")
    assert text.endswith("second reading\n" + bench.SUBSET_END + "\n\n## Where the Python time goes\n\nprofile\n")
    assert text.count(bench.SUBSET_BEGIN) == 1
    assert "first reading" not in text
    assert "| 8,000 | 12,500 | **156.2%** |" in text


def test_a_page_without_a_place_for_the_section_is_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "DOCS", tmp_path)
    page = tmp_path / "spark-benchmark.md"
    page.write_text("# something else\n")
    with pytest.raises(SystemExit, match="neither a subset section"):
        bench.write_subset_section(SUBSET_RUN)
    assert page.read_text() == "# something else\n"
