"""The Spark CEP jobs' state with incremental snapshots (issue 27 item 2), through the state function Spark runs
(``make_stream_function``): random micro-batches of many keys with late and too-late events and punctuations,
the kept core lost at random batch ends (the state restored from the blob, as on another executor or after a
restart), must give every record of one core that was never snapshotted, byte for byte; and a checkpoint written
by the previous build (a full snapshot in the state blob) restores and goes on exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import orjson
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.patterns import PatternSpec
from cep.sase import EngineConfig, parse_query
from spark_jobs.pattern import PatternStreamCore
from spark_jobs.sequence import SequenceStreamCore
from spark_jobs.stateful import LiveCores, StreamReadProgress, make_stream_function, run_stream_batch

TOPIC = "p.events.s"
SEQUENCE_QUERY = parse_query("EVENT SEQ(A a, !(C c), B b) WHERE a.id = c.id AND c.id = b.id WITHIN 8 ms")
PATTERNS = {
    "pattern_eager": "SEQ(a: type == 'A', b: type == 'B') PARTITION BY id WITHIN 8 ms MODE per_event "
                     "MAX_UNCERTAINTY 1 ms",
    "pattern_watermark": "SEQ(a: type == 'A', b: type == 'B', c: type == 'C') PARTITION BY id WITHIN 8 ms "
                         "MODE per_event MAX_UNCERTAINTY 1 ms EMIT watermark",
    # T_a read from the records' rtt_us while the job runs: a new T_a reaches every matcher.
    "pattern_thesis": "SEQ(a: type == 'A', b: type == 'B') PARTITION BY id WITHIN 8 ms MODE thesis",
}
JOBS = ["sequence", *PATTERNS]
ALLOWED_LATENESS_US = 2_000
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Rows = list[dict[str, Any]]
Factory = Callable[[str, bytes | None], Any]


@st.composite
def micro_batches(draw: st.DrawFn) -> list[Rows]:
    """Micro-batches of one stream (one partition): events of up to 12 keys around a moving event time, some
    far behind it (late, too late for the allowed lateness of 2 ms), and punctuations that follow event time."""
    keys = draw(st.integers(1, 12))
    now_us = 1_000_000
    offset = 0
    batches: list[Rows] = []
    for _ in range(draw(st.integers(1, 8))):
        rows: Rows = []
        for _ in range(draw(st.integers(0, 20))):
            now_us += draw(st.integers(0, 2_000))
            ts = now_us - draw(st.sampled_from([0, 0, 0, 500, 3_000, 12_000]))
            payload = {"type": draw(st.sampled_from("AABBCX")), "id": draw(st.integers(0, keys - 1))}
            rows.append({"kind": "event", "seq": offset, "ref_ts_us": ts,
                         "uncertainty_us": draw(st.sampled_from([0, 100, 900])),
                         "rtt_us": draw(st.sampled_from([None, None, 200, 700])), "source_id": "src",
                         "payload": orjson.dumps(payload).decode(), "topic": TOPIC, "partition": 0,
                         "offset": offset})
            offset += 1
        if draw(st.booleans()):
            rows.append({"kind": "punctuation", "watermark_us": now_us - draw(st.integers(0, 4_000)),
                         "topic": TOPIC, "partition": 0, "offset": offset, "ref_ts_us": None, "seq": None})
            offset += 1
        batches.append(rows)
    return batches


class FakeGroupState:
    def __init__(self) -> None:
        self.exists = False
        self.get: tuple[bytes] | None = None

    def update(self, value: tuple[bytes]) -> None:
        self.exists, self.get = True, value


class PreviousSequenceCore(SequenceStreamCore):
    """The adapter as the previous build had it: a full (version 2) engine snapshot in every state blob."""

    def snapshot(self) -> bytes:
        return self.engine.snapshot()


class PreviousPatternCore(PatternStreamCore):
    """The adapter as the previous build had it: every matcher encoded, no version (1)."""

    def snapshot(self) -> bytes:
        packed: bytes = msgpack.packb({"ta_us": self.ta_us, "watermark_us": self.watermark_us,
                                       "truncated": [self._truncated_matches, self._dropped_candidates],
                                       "parts": {p: m.snapshot() for p, m in self.matchers.items()}},
                                      use_bin_type=True)
        return packed


def factory_of(job: str, previous_build: bool = False) -> Factory:
    if job == "sequence":
        config = EngineConfig(allowed_lateness_us=ALLOWED_LATENESS_US)
        sequence_class = PreviousSequenceCore if previous_build else SequenceStreamCore
        return lambda stream, blob: sequence_class(stream, SEQUENCE_QUERY, config, "type", blob)
    spec = PatternSpec.parse(PATTERNS[job])
    pattern_class = PreviousPatternCore if previous_build else PatternStreamCore
    return lambda stream, blob: pattern_class(stream, spec, 0, False, ALLOWED_LATENESS_US, blob)


def full_state(core: Any) -> Any:
    """Everything a core holds, every partition encoded anew (in key order: a dict's order is not state)."""
    if isinstance(core, SequenceStreamCore):
        doc = msgpack.unpackb(core.engine.snapshot(), raw=False, strict_map_key=False)
        doc["partitions"] = sorted(doc["partitions"], key=lambda p: repr(p[0]))
        return doc
    return [core.ta_us, core.watermark_us, core.truncated_matches(), core.dropped_candidates(),
            sorted((p, msgpack.unpackb(m.snapshot(), raw=False)) for p, m in core.matchers.items())]


def uninterrupted_records(factory: Factory, batches: list[Rows]) -> list[list[tuple[str, str]]]:
    """One core, never snapshotted, fed batch after batch by the shell's Spark-free loop."""
    progress, core = StreamReadProgress(1, TOPIC), factory("s", None)
    return [[(k, orjson.dumps(v).decode()) for k, v in run_stream_batch(progress, core, rows, job="j", stream="s")]
            for rows in batches]


def state_function_records(factory: Factory, batches: list[Rows], lose_kept_core: list[bool],
                           previous_build: Factory | None = None) -> list[list[tuple[str, str]]]:
    """The state function over the batches, as Spark runs it. After every batch the state blob restores to the
    kept core's full state; where ``lose_kept_core`` says so, the next batch runs in a worker without the kept
    core (a fresh ``LiveCores``): restored from the blob. ``previous_build`` runs the first batch (a checkpoint
    written by the build before incremental snapshots)."""
    state = FakeGroupState()
    built: list[Any] = []

    def recording(stream: str, blob: bytes | None) -> Any:
        built.append((previous_build if previous_build is not None and not built else factory)(stream, blob))
        return built[-1]

    function = make_stream_function("j", recording, lambda _s: (TOPIC, 1), LiveCores())
    out = []
    for i, rows in enumerate(batches):
        frames = iter([pd.DataFrame(rows)]) if rows else iter([pd.DataFrame({"kind": []})])
        out.append([(k, v) for frame in function(("s",), frames, state)
                    for k, v in zip(frame["key"], frame["value"], strict=True)])
        assert state.get is not None
        _, core_blob = StreamReadProgress.from_blob(state.get[0])
        assert full_state(factory("s", core_blob)) == full_state(built[-1])  # built[-1]: the kept core
        if lose_kept_core[i % len(lose_kept_core)] or (previous_build is not None and i == 0):
            function = make_stream_function("j", recording, lambda _s: (TOPIC, 1), LiveCores())
    return out


@pytest.mark.parametrize("job", JOBS)
@SETTINGS
@given(batches=micro_batches(), lose=st.lists(st.booleans(), min_size=1, max_size=6))
def test_a_job_restored_at_random_batch_ends_gives_every_record_of_an_uninterrupted_core(
        job: str, batches: list[Rows], lose: list[bool]) -> None:
    assert state_function_records(factory_of(job), batches, lose) == uninterrupted_records(factory_of(job), batches)


@pytest.mark.parametrize("job", JOBS)
@SETTINGS
@given(batches=micro_batches(), lose=st.lists(st.booleans(), min_size=1, max_size=6))
def test_a_checkpoint_of_the_previous_build_restores_and_goes_on_exactly(job: str, batches: list[Rows],
                                                                         lose: list[bool]) -> None:
    got = state_function_records(factory_of(job), batches, lose, previous_build=factory_of(job, True))
    assert got == uninterrupted_records(factory_of(job), batches)


def test_a_pattern_state_of_an_unknown_version_is_refused_by_name() -> None:
    blob = msgpack.packb({"v": 7, "ta_us": 0, "watermark_us": None, "parts": {}}, use_bin_type=True)
    with pytest.raises(ValueError, match="version 7"):
        factory_of("pattern_eager")("s", blob)


def test_a_watermark_alone_reaches_the_pattern_blob() -> None:
    """Key 1's only event is of no element (its matcher buffers nothing), key 2's A is buffered; a later watermark
    with no event drops key 1's idle matcher and moves key 2's A past the on-time horizon (kept for late events):
    both must reach the next blob, and a late B of key 2 (at 9 ms: behind the watermark by the allowed 2 ms, within
    8 ms of the A) then matches the A in the restored core as in the kept one."""
    core = factory_of("pattern_eager")("s", None)
    payloads = [{"type": "X", "id": 1}, {"type": "A", "id": 2}]
    assert core.on_rows([{"payload": orjson.dumps(p).decode(), "ref_ts_us": 1_000 + i, "uncertainty_us": 0,
                          "source_id": "src", "seq": i} for i, p in enumerate(payloads)]) == []
    assert sorted(core.matchers) == ["1", "2"]
    core.snapshot()
    assert core.on_watermark(11_000) == []  # 1_001 + 8 ms window + 1 ms uncertainty bound < 11_000
    assert sorted(core.matchers) == ["2"] and core.matchers["2"].retained == 1
    restored = factory_of("pattern_eager")("s", core.snapshot())
    assert full_state(restored) == full_state(core)
    late_b = [{"payload": orjson.dumps({"type": "B", "id": 2}).decode(), "ref_ts_us": 9_000, "uncertainty_us": 0,
               "source_id": "src", "seq": 9}]
    matched = restored.on_rows(late_b)
    assert [v["late"] for _, v in matched] == [True]
    assert matched == core.on_rows(late_b)
