"""The reference path of the byte-identical mapping tests: every stage maps the event itself, as the pipeline did
before the clock-step check's mapping was carried through it."""

from __future__ import annotations

from typing import Any

import pytest


def map_at_every_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from reorder.merger import MultiSourceMerger
    from reorder.pipeline import IngestPipeline

    merger_push, pipeline_push = MultiSourceMerger.push, IngestPipeline.push
    merge_outputs = IngestPipeline._merge_outputs

    def merger_maps(self: Any, event: Any, arrival_us: int, now_us: int, *, late: bool = False,
                    mapped: Any = None) -> Any:
        return merger_push(self, event, arrival_us, now_us, late=late)

    def pipeline_maps(self: Any, source_id: str, event: Any, arrival_us: int, *, mapped: Any = None) -> Any:
        return pipeline_push(self, source_id, event, arrival_us)

    def release_maps(self: Any, pipeline: Any, outputs: Any, out: Any, passed: Any = None, pushed: Any = None,
                     mapped: Any = None) -> Any:
        return merge_outputs(self, pipeline, outputs, out, passed)

    pipeline_push_many, records = IngestPipeline.push_many, IngestPipeline._records

    def pipeline_many_maps(self: Any, source_id: str, events: Any, arrival_us: int, mappings: Any = None) -> Any:
        return pipeline_push_many(self, source_id, events, arrival_us)

    def records_map(self: Any, outputs: Any, out: Any, passed: Any, pushed: Any, mapped: Any,
                    run_errors: Any) -> Any:
        return records(self, outputs, out, passed, None, None, None)

    monkeypatch.setattr(IngestPipeline, "push_many", pipeline_many_maps)
    monkeypatch.setattr(IngestPipeline, "_records", records_map)
    monkeypatch.setattr(MultiSourceMerger, "push", merger_maps)
    monkeypatch.setattr(IngestPipeline, "push", pipeline_maps)
    monkeypatch.setattr(IngestPipeline, "_merge_outputs", release_maps)
