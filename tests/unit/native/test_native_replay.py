"""Issue 26 item 3: the replay (reorder/eval/replay.py, the figures of docs/reorder-benchmark.md) gives the same
figures with the native reorderer and merger as with the Python ones, their specification, on every disorder
profile, one source and several, for both approaches that run the pipeline (sequence: adaptive; thesis: Eq. 3.11)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.native import NATIVE_PIPELINE_CORES
from reorder.eval.replay import ReplayOptions, replay
from reorder.eval.traces import PROFILES, TraceSpec, generate

# Replay metrics that measure this machine rather than the replay (none today; kept explicit so a new one is seen).
MACHINE_DEPENDENT: frozenset[str] = frozenset()


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize(("approach", "sources"), [("sequence", 1), ("thesis", 1), ("sequence", 3)])
def test_the_replay_gives_the_same_figures_with_either_core(profile: str, approach: str, sources: int) -> None:
    trace = generate(TraceSpec(PROFILES[profile], events_per_source=4_000 // sources, sources=sources, seed=5,
                               payload=False))
    options = ReplayOptions(approach=approach)  # type: ignore[arg-type]
    python = replay(trace, options)
    native = replay(trace, replace(options, cores=NATIVE_PIPELINE_CORES))
    assert python.metrics["events"] > 0
    differing = {key: (python.metrics[key], native.metrics.get(key)) for key in python.metrics
                 if key not in MACHINE_DEPENDENT and native.metrics.get(key) != python.metrics[key]}
    assert differing == {}
    assert native.series == python.series
