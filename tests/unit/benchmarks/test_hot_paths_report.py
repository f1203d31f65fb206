"""benchmarks/hot_paths_report.py: the summary's figures are the pages' own, its verdicts follow the goals, and the
page outside its markers is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.hot_paths_report import (
    BEGIN,
    END,
    latency_page_rows,
    replace_section,
    section,
    stage_rows,
    throughput_rows,
    verdict,
    workers_rows,
)


def bench() -> dict[str, Any]:
    run = {"events": 100_000, "added_p50_us": 0.0}
    return {
        "results": [
            {**run, "sources": 20, "seconds": 10.0, "cpu_s": 4.0, "label": "python core", "core": "python"},
            {**run, "sources": 20, "seconds": 2.0, "cpu_s": 1.0, "label": "native core", "core": "native"},
            # another configuration of the native core: never read as the native core's row
            {**run, "sources": 20, "seconds": 1.0, "cpu_s": 0.5, "label": "no transactions", "core": "native"},
        ],
        "plain": [{"headers": True, "events": 100_000, "seconds": 2.0, "cpu_s": 1.0},
                  {"headers": False, "events": 100_000, "seconds": 1.25, "cpu_s": 1.0}],
        "paced": [{"label": "python core", "sources": 20, "frame_ms": 5.0, "p99_ms": 30.0, "gap_p99_ms": 31.0},
                  {"label": "native core", "sources": 20, "frame_ms": 5.0, "p99_ms": 5.5, "gap_p99_ms": 6.0}],
        "load_average": {"start": [1.0, 1.0, 1.0], "end": [2.0, 1.0, 1.0]},
    }


def hotpath() -> dict[str, Any]:
    stages = ("decode", "ingest", "produce", "commit", "total")
    return {"written": "2026-11-29", "rounds": 3, "load_average": [1.0, 2.0],
            "medians": {"python": dict(zip(stages, (4.0, 20.0, 3.0, 1.0, 28.0), strict=True)),
                        "native": dict(zip(stages, (0.5, 0.75, 2.0, 0.5, 3.75), strict=True))},
            "paced_virtual_time": [{"jitter_us": 0, "p99_ms": 4.75}, {"jitter_us": 1000, "p99_ms": 7.2}]}


def test_verdicts_say_how_far_off() -> None:
    assert verdict(0.5, 0.5, True) == "met"
    assert verdict(0.25, 0.5, True) == "missed (2.0x off)"
    assert verdict(1.5, 1.5, False) == "met"
    assert verdict(6.0, 1.5, False) == "missed (4.0x off)"
    assert verdict(6.26, 6.0, False) == "missed (1.04x off)"


def test_throughput_rows_read_the_cores_against_the_producer_without_headers() -> None:
    rows = throughput_rows(bench())
    # plain producer without headers: 80,000 events/s; python 10,000 (0.125x), native 50,000 (0.625x)
    # with the headers, the same records: 50,000 events/s; python 0.200x, native 1.000x
    assert [(r.python, r.native, r.status) for r in rows] == [
        ("10,000 (0.125x)", "50,000 (0.625x)", "met"),
        ("0.200x", "1.000x", "met"),
        ("40.0", "10.0", ""),
    ]
    assert "80,000" in rows[0].target


def test_stage_rows_give_both_readings_of_the_in_process_target() -> None:
    rows = {r.target: r for r in stage_rows(hotpath())}
    narrow = rows["2. in-process, decode -> record bytes (decode + ingest, us/event)"]
    assert (narrow.python, narrow.native, narrow.status) == ("24.00", "1.25", "met")
    total = rows["2. in-process, total with the client's produce call and the commit (us/event)"]
    assert (total.python, total.native, total.status) == ("28.00", "3.75", "missed (2.5x off)")


def test_workers_ratio_is_per_round() -> None:
    runs = [{"round": 1, "workers": 1, "events": 100, "seconds": 1.0},
            {"round": 1, "workers": 2, "events": 100, "seconds": 0.5},
            {"round": 2, "workers": 1, "events": 100, "seconds": 1.0},
            {"round": 2, "workers": 2, "events": 100, "seconds": 1.25}]
    [row] = workers_rows({"runs": runs, "meta": {"core": "native", "commit": "abc1234"}})
    assert row.native == "median 1.40x (0.80-2.00x)"


def test_the_section_replaces_only_what_is_between_its_markers() -> None:
    text = section(bench(), hotpath(), None, None)
    assert "| 3. 20 x 500 events/s, p99 added end to end (ms; frame gap p99 at the gateway) | 30.00 (31.00) | " \
           "5.50 (6.00) | <= 6 | met |" in text
    page = replace_section("# Title\n\nIntro.\n\nHistory.\n", text)
    assert page.startswith(f"# Title\n\n{BEGIN}\n") and page.endswith(f"{END}\n\nIntro.\n\nHistory.\n")
    again = replace_section(page, "new\n")
    assert again == f"# Title\n\n{BEGIN}\nnew\n{END}\n\nIntro.\n\nHistory.\n"


def test_the_stage_page_keeps_its_hand_written_notes(tmp_path: Path) -> None:
    from benchmarks.gateway_hotpath import NOTES_BEGIN, NOTES_END, kept_notes

    page = tmp_path / "page.md"
    assert kept_notes(page) == f"{NOTES_BEGIN}\n{NOTES_END}"
    page.write_text(f"generated\n\n{NOTES_BEGIN}\nmeasured by hand\n{NOTES_END}\n\nmore generated\n")
    assert kept_notes(page) == f"{NOTES_BEGIN}\nmeasured by hand\n{NOTES_END}"


def test_the_latency_page_gives_a_median_per_variant() -> None:
    def run(variant: str, core: str, p99: float, sources: int = 20) -> dict[str, Any]:
        return {"variant": variant, "core": core, "sources": sources, "added_p99_ms": p99}
    latency = {"frame_ms": 5.0, "rows": [run("same host", "native", 30.0), run("same host", "native", 10.0),
                                         run("same host", "native", 20.0), run("same host", "python", 90.0),
                                         run("same host", "native", 0.0, sources=1),
                                         run("gateway first", "native", 5.5)]}
    rows = latency_page_rows(latency)
    assert [(r.python, r.native, r.goal, r.status) for r in rows] == [
        ("90.00", "20.00", "<= 6", "missed (3.3x off)"),
        ("", "5.50", "<= 6", "met"),
    ]
    assert "same host" in rows[0].target and "gateway first" in rows[1].target
