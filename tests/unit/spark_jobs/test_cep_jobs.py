"""spark_jobs.cep_jobs: the side record and the key-group plan the CEP jobs share, exactly."""

from __future__ import annotations

import pytest

from cep.key_groups import EqualityKey
from spark_jobs.cep_jobs import NO_EQUALITY_KEY, equality_key_groups_plan, side_record

KEY = EqualityKey({"B": "id", "A": "tag"})


def test_a_side_record_is_keyed_by_the_event_and_carries_the_job_s_fields_last() -> None:
    key, value = side_record("iseq", "s1", "rejected", "src", 7, 1_000, "bad_payload", "not JSON", item=None)
    assert key == "s1|rejected|src|7"
    assert list(value.items()) == [
        ("job", "iseq"), ("record", "rejected"), ("stream", "s1"), ("source_id", "src"), ("seq", 7),
        ("ref_ts_us", 1_000), ("reason", "bad_payload"), ("detail", "not JSON"), ("item", None)]


def test_the_plan_spreads_a_key_over_the_requested_groups_and_names_its_attributes_in_order() -> None:
    assert equality_key_groups_plan(4, KEY, [(False, "no")], not_given="unasked") == (
        4, "4 key group(s) per stream, keyed by A.tag, B.id")


def test_one_group_when_not_asked_without_a_key_or_at_the_first_refusal_that_holds() -> None:
    assert equality_key_groups_plan(None, KEY, [], not_given="unasked") == (1, "unasked")
    assert equality_key_groups_plan(4, None, [(True, "refused")], not_given="unasked") == (1, NO_EQUALITY_KEY)
    refusals = [(False, "first"), (True, "second"), (True, "third")]
    assert equality_key_groups_plan(4, KEY, refusals, not_given="unasked") == (1, "second")


def test_fewer_than_one_group_is_refused_before_the_key_is_looked_at() -> None:
    with pytest.raises(ValueError, match="key groups must be at least 1, got 0"):
        equality_key_groups_plan(0, None, [], not_given="unasked")
