"""Job `pattern`: SEQ patterns under clock uncertainty (Pseudocode 3.1, Query 4.6/5.9, and any n).

Spark groups the stream's records (events and late topics) by stream and key group (the PARTITION BY value spread
over `--key-groups` groups, each of which gets every punctuation of the stream: docs/spark-jobs.md); each group
keeps one cep.patterns UncertainPatternMatcher per PARTITION BY value, advanced by the stream's promise
(spark_jobs/stateful.py). Every match goes to `skewless.results.pattern` with its confidence (Confirmed/Uncertain),
the matched events, the gaps that decided it and `late` (a late event completed it); key `<stream>|<partition
value>|<source:seq of each event>`. T_a for thesis mode is read from the records while the job runs (the maximum
round trip over the stream's sources), or fixed with `ta_us`.

Nothing is cut short silently: when an event completes more matches than the pattern's `max_matches_per_event`, the
matches past it are counted and one `truncated` record says so (reason `max_matches_per_event`, `truncated_matches`,
`reported_matches`, `limit`); when an element's buffer passes `max_candidates`, the evicted candidates are counted
and reported the same way (reason `max_candidates`, `dropped_candidates`). Key `<stream>|truncated|<reason>|<source:
seq>`. The totals stay in the state (`truncated_matches()`, `dropped_candidates()`), restored with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from cep.key_groups import pattern_partition_key
from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from cep.patterns import PatternMatch, PatternSpec, UncertainPatternMatcher
from contract.records import (
    RESULT_MATCH,
    RESULT_REJECTED,
    RESULT_TOO_LATE,
    RESULT_TRUNCATED,
    result_key,
    result_value,
)
from spark_jobs.cep_jobs import start_cep_job
from spark_jobs.key_routing import KeyGroups, PayloadKey
from spark_jobs.stateful import SHELL_COLUMNS, JobOptions, MicroBatchColumns, checked_key_groups, decode_payload

JOB_NAME = "pattern"
# What crosses into Python: the shell's columns, the payload and the event's clock uncertainty.
PATTERN_COLUMNS = (*SHELL_COLUMNS, "payload", "uncertainty_us")
REASON_MAX_MATCHES = "max_matches_per_event"
REASON_MAX_CANDIDATES = "max_candidates"
STATE_VERSION = 2
"""Version 2 (incremental snapshots): a matcher's encoding may carry an older watermark than the stream's, which
replaces it on restore. Version 1 (no ``v``, the builds before) restores the same way."""


@dataclass(frozen=True)
class PatternOptions(JobOptions):
    pattern: str
    ta_us: int | None = None
    allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US
    key_groups: int | None = None
    """G: key groups per stream (None: the session's spark.sql.shuffle.partitions; spark_jobs/stateful.py)."""


def event_ref(source_id: Any, seq: Any, ref_ts_us: int, uncertainty_us: int | None,
              payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a match record carries of each event: enough to find it in Kafka and to check the decision."""
    return {"source_id": source_id, "seq": seq, "ref_ts_us": ref_ts_us, "uncertainty_us": uncertainty_us,
            "payload": dict(payload)}


def partition_text(value: Any) -> str:
    """A PARTITION BY value as it appears in result keys: strings as they are, other values as JSON text."""
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


class PatternStreamCore:
    """StreamCore adapter: one matcher per PARTITION BY value of one stream."""

    def __init__(self, stream: str, spec: PatternSpec, ta_us: int, fixed_ta: bool, allowed_lateness_us: int,
                 blob: bytes | None) -> None:
        self.stream = stream
        self.allowed_lateness_us = allowed_lateness_us
        self.spec = spec
        self.ta_us = ta_us
        self.fixed_ta = fixed_ta
        self.matchers: dict[str, UncertainPatternMatcher] = {}
        # The stream's promise so far: a matcher made for a new (or forgotten) partition key starts from it, so it
        # judges a late event as late, not as the first event of a fresh stream.
        self.watermark_us: int | None = None
        # Totals over the stream's partitions (a matcher is dropped once idle, its counters with it).
        self._truncated_matches = 0
        self._dropped_candidates = 0
        # Incremental snapshots: each matcher's encoding as of the last snapshot, and the partitions changed since
        # (None: not tracked before the first snapshot, which encodes every matcher).
        self._encoded: dict[str, bytes] = {}
        self._dirty: set[str] | None = None
        if blob is not None:
            state = msgpack.unpackb(blob, raw=False)
            version = state.get("v", 1)
            if version not in (1, STATE_VERSION):
                raise ValueError(f"pattern job state of version {version!r}: this build reads versions 1 and "
                                 f"{STATE_VERSION}")
            self.ta_us = state["ta_us"]
            self.watermark_us = state["watermark_us"]
            self._truncated_matches, self._dropped_candidates = state.get("truncated", (0, 0))
            for part, encoded in state["parts"].items():
                matcher = self.matchers[part] = UncertainPatternMatcher.restore(encoded, spec)
                # A matcher no event, expiry or release touched since its encoding kept an older watermark; every
                # matcher has seen every watermark of the stream, so the stream's is its own.
                matcher.watermark_us = self.watermark_us
            self._encoded = {part: bytes(encoded) for part, encoded in state["parts"].items()}
            self._dirty = set()

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        for row in rows:
            self._on_event(row.get("payload"), int(row["ref_ts_us"]), row.get("uncertainty_us"), row.get("source_id"),
                           row.get("seq"), outputs)
        return outputs

    def on_events(self, batch: MicroBatchColumns) -> list[tuple[str, dict[str, Any]]]:
        """The batch's events as columns (the shell's columnar path): no row dict per event."""
        outputs: list[tuple[str, dict[str, Any]]] = []
        on_event = self._on_event
        for payload, ts, uncertainty, source_id, seq in zip(
                batch.column("payload"), batch.column("ref_ts_us"), batch.column("uncertainty_us"),
                batch.column("source_id"), batch.column("seq"), strict=True):
            on_event(payload, ts, uncertainty, source_id, seq, outputs)
        return outputs

    def _on_event(self, payload_text: Any, ts_us: int, uncertainty_us: int | None, source_id: Any, seq: Any,
                  outputs: list[tuple[str, dict[str, Any]]]) -> None:
        """One event (its contract columns as they came); matches, too-late and rejected records to ``outputs``."""
        try:
            # The worker's parse gives the payload as a dict already: decode only what is not one.
            payload = payload_text if type(payload_text) is dict else decode_payload(payload_text)
        except ValueError as exc:
            key = result_key(self.stream, RESULT_REJECTED, source_id, seq)
            outputs.append((key, result_value(JOB_NAME, RESULT_REJECTED, self.stream, source_id=source_id, seq=seq,
                                              reason="bad_payload", detail=str(exc))))
            return
        part = partition_text(self.spec.partition_key(payload))
        if self._dirty is not None:
            self._dirty.add(part)
        matcher = self.matchers.get(part)
        if matcher is None:
            matcher = self.matchers[part] = UncertainPatternMatcher(
                self.spec, ta_us=self.ta_us, allowed_lateness_us=self.allowed_lateness_us)
            if self.watermark_us is not None:
                matcher.on_watermark(self.watermark_us)
        ref = event_ref(source_id, seq, ts_us, uncertainty_us, payload)
        matches = matcher.on_event(ts_us, int(uncertainty_us or 0), payload, ref)
        if matcher.last_lateness == "too_late":
            key = result_key(self.stream, RESULT_TOO_LATE, source_id, seq)
            outputs.append((key, result_value(
                JOB_NAME, RESULT_TOO_LATE, self.stream, partition=part, source_id=source_id,
                seq=seq, ref_ts_us=ts_us, reason="beyond_allowed_lateness",
                detail=f"older than the watermark {self.watermark_us} minus the allowed lateness")))
        outputs.extend(self._record(part, m) for m in matches)
        self._truncated_matches += matcher.last_truncated
        self._dropped_candidates += matcher.last_candidates_dropped
        if matcher.last_truncated:
            outputs.append((result_key(self.stream, RESULT_TRUNCATED, REASON_MAX_MATCHES, f"{source_id}:{seq}"),
                            result_value(JOB_NAME, RESULT_TRUNCATED, self.stream, partition=part, source_id=source_id,
                                         seq=seq, ref_ts_us=ts_us, reason=REASON_MAX_MATCHES,
                                         truncated_matches=matcher.last_truncated, reported_matches=len(matches),
                                         limit=self.spec.max_matches_per_event)))
        if matcher.last_candidates_dropped:
            # The matches the evicted candidates would have completed later cannot be counted: say the eviction.
            outputs.append((result_key(self.stream, RESULT_TRUNCATED, REASON_MAX_CANDIDATES, f"{source_id}:{seq}"),
                            result_value(JOB_NAME, RESULT_TRUNCATED, self.stream, partition=part, source_id=source_id,
                                         seq=seq, ref_ts_us=ts_us, reason=REASON_MAX_CANDIDATES,
                                         dropped_candidates=matcher.last_candidates_dropped,
                                         limit=self.spec.max_candidates)))

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        self.watermark_us = watermark_us if self.watermark_us is None else max(self.watermark_us, watermark_us)
        outputs: list[tuple[str, dict[str, Any]]] = []
        dirty = self._dirty
        for part in sorted(self.matchers):
            matcher = self.matchers[part]
            # Besides its watermark (the stream's, set on restore), a watermark changes a matcher only by expiring
            # or forgetting candidates (counted) or releasing held matches.
            counters = matcher.counters
            before = (counters.expired, counters.forgotten, matcher.held)
            released = matcher.on_watermark(watermark_us)
            outputs.extend(self._record(part, m) for m in released)
            if dirty is not None and (released or (counters.expired, counters.forgotten, matcher.held) != before):
                dirty.add(part)
            if matcher.is_idle():
                del self.matchers[part]
                if dirty is not None:
                    dirty.add(part)
        return outputs

    def truncated_matches(self) -> int:
        """Matches counted but not reported (``max_matches_per_event``) on this stream so far."""
        return self._truncated_matches

    def dropped_candidates(self) -> int:
        """Candidates evicted by ``max_candidates`` on this stream so far."""
        return self._dropped_candidates

    def set_ta_us(self, ta_us: int) -> None:
        if self.fixed_ta:
            return
        self.ta_us = ta_us
        for matcher in self.matchers.values():
            matcher.set_ta_us(ta_us)
        if self._dirty is not None:
            self._dirty.update(self.matchers)

    def snapshot(self) -> bytes:
        """The core's state, re-encoding only the matchers of the partitions that changed since the previous
        snapshot (an event, an expiry, a release, a dropped matcher, a new T_a); the others keep their encoding."""
        encoded = self._encoded
        if self._dirty is None:
            encoded.clear()
            changed: list[str] | set[str] = list(self.matchers)
        else:
            changed = self._dirty
        for part in changed:
            matcher = self.matchers.get(part)
            if matcher is None:
                encoded.pop(part, None)
            else:
                encoded[part] = matcher.snapshot()
        self._dirty = set()
        packed: bytes = msgpack.packb({"v": STATE_VERSION, "ta_us": self.ta_us, "watermark_us": self.watermark_us,
                                       "truncated": [self._truncated_matches, self._dropped_candidates],
                                       "parts": encoded}, use_bin_type=True)
        return packed

    def _record(self, part: str, match: PatternMatch) -> tuple[str, dict[str, Any]]:
        # One key per match (its events): a compacted results topic keeps every match, not the last per partition.
        ids = [f"{e.get('source_id')}:{e.get('seq')}" for e in match.events]
        return result_key(self.stream, part, *ids), result_value(JOB_NAME, RESULT_MATCH, self.stream, partition=part,
                                                                 **match.to_dict())


def key_groups_plan(spec: PatternSpec, options: PatternOptions, default_groups: int) -> tuple[int, str]:
    """G for the job and why: the PARTITION BY key spread over ``options.key_groups`` (default:
    ``default_groups``), or one group when there is no key, or when thesis mode reads T_a live (the maximum round
    trip over all the stream's sources: a group sees only its own keys' events)."""
    requested = checked_key_groups(default_groups if options.key_groups is None else options.key_groups)
    key = pattern_partition_key(spec)
    if key is None:
        return 1, "one key group per stream: the pattern has no PARTITION BY"
    if spec.mode == "thesis" and options.ta_us is None:
        return 1, "one key group per stream: thesis mode reads T_a from every source of the stream (fix --ta-us)"
    return requested, f"{requested} key group(s) per stream, keyed by PARTITION BY {spec.partition_by}"


def pattern_key_groups(spec: PatternSpec, groups: int) -> KeyGroups | None:
    """The routing of a partitioned pattern's events over ``groups`` key groups (None: one group): by the payload
    field at the ``PARTITION BY`` path."""
    key = pattern_partition_key(spec)
    if key is None or groups < 2:
        return None
    return KeyGroups(groups, PayloadKey(key))


def start(spark: Any, options: PatternOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    spec = PatternSpec.parse(options.pattern)
    plan = key_groups_plan(spec, options, int(spark.conf.get("spark.sql.shuffle.partitions")))

    def factory(stream: str, blob: bytes | None) -> PatternStreamCore:
        return PatternStreamCore(stream, spec, options.ta_us or 0, options.ta_us is not None,
                                 options.allowed_lateness_us, blob)

    return start_cep_job(spark, JOB_NAME, options, factory, PATTERN_COLUMNS, plan,
                         lambda groups: pattern_key_groups(spec, groups))
