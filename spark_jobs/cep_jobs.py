"""What the CEP jobs (pattern, sequence, iseq) do alike, written once: the side record that reports an event the
engine did not take, the key groups of a query keyed by its equality class, and the start of a job with its
key-group routing.

Each job keeps what is its own (its core, its query's refusals of key groups, its routing); a job reads, runs and
writes through :func:`spark_jobs.stateful.start_core_job` like every other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cep.key_groups import EqualityKey
from contract.records import result_key, result_value
from spark_jobs.key_routing import KeyGroups
from spark_jobs.stateful import CoreFactory, JobOptions, Output, checked_key_groups, start_core_job

log = logging.getLogger("skewless.spark")
NO_EQUALITY_KEY = "one key group per stream: the query's WHERE has no equality class covering every element"


@dataclass(frozen=True)
class TypedQueryOptions(JobOptions):
    """The options of a job that runs a query over events typed by a payload field (sequence, iseq); a job's
    options derive from it and add their own."""

    query: str
    type_field: str = "type"
    """The payload field holding an event's type."""
    mode: Literal["conservative", "aggressive"] = "conservative"
    k_slack_us: int | None = None
    """The engine's K. None: the stream's promise alone moves the engine (exact); what a number does is the
    job's (a K-slack bound for sequence, K-ISlack for iseq)."""


def side_record(job: str, stream: str, record: str, source_id: Any, seq: Any, ref_ts_us: int, reason: str,
                detail: str, **more: Any) -> Output:
    """A record about one input event rather than a result (``rejected``, ``too_late``): keyed by the event, with
    the reason and its detail (docs/record-contract.md); ``more`` are the job's own fields, after those."""
    key = result_key(stream, record, source_id, seq)
    return key, result_value(job, record, stream, source_id=source_id, seq=seq, ref_ts_us=ref_ts_us, reason=reason,
                             detail=detail, **more)


def equality_key_groups_plan(requested: int | None, key: EqualityKey | None, refusals: Sequence[tuple[bool, str]],
                             *, not_given: str) -> tuple[int, str]:
    """G for a job whose query is keyed by its equality class, and why: ``requested`` (``--key-groups``), or one
    group when it is not given (``not_given`` says why), when the query has no ``key``, or at the first of the
    job's ``refusals`` that holds (a condition, and why it keeps the stream in one group)."""
    if requested is None:
        return 1, not_given
    groups = checked_key_groups(requested)
    if key is None:
        return 1, NO_EQUALITY_KEY
    for refused, why in refusals:
        if refused:
            return 1, why
    attrs = ", ".join(f"{t}.{a}" for t, a in sorted(key.attribute_of_type.items()))
    return groups, f"{groups} key group(s) per stream, keyed by {attrs}"


def start_cep_job(spark: Any, job: str, options: JobOptions, factory: CoreFactory, input_columns: Sequence[str],
                  plan: tuple[int, str], routing: Callable[[int], KeyGroups | None]) -> Any:
    """Log the job's key-group ``plan`` (G and why), then start the streaming query with the ``routing`` of its
    events over those G groups; returns the query (call awaitTermination / stop on it)."""
    groups, why = plan
    log.info("%s: %s", job, why)
    return start_core_job(spark, job, options, factory, input_columns=input_columns, key_groups=routing(groups))
