"""How soon a SIGKILLed gateway's shards move is the session timeout -/+ the group's heartbeat interval (issue 24
item 10): the membership consumer heartbeats every 100 ms, never less than three times a session, unless told."""

from __future__ import annotations

import pytest

from broker import membership
from broker.membership import GroupMembership


class Built(Exception):
    def __init__(self, properties: dict[str, object]) -> None:
        super().__init__("built")
        self.properties = properties


def built(properties: dict[str, object], *_args: object, **_kwargs: object) -> None:
    raise Built(properties)


@pytest.mark.parametrize(("session_timeout_ms", "given_ms", "heartbeat_ms"),
                         [(6000, None, 100), (45_000, None, 100), (240, None, 80), (6000, 2000, 2000)])
def test_heartbeat_interval(monkeypatch: pytest.MonkeyPatch, session_timeout_ms: int, given_ms: int | None,
                            heartbeat_ms: int) -> None:
    monkeypatch.setattr(membership, "Consumer", built)
    with pytest.raises(Built) as made:
        GroupMembership("k:9092", "p.gateways", "p.cluster", instance_id=None, session_timeout_ms=session_timeout_ms,
                        heartbeat_interval_ms=given_ms)
    assert made.value.properties["heartbeat.interval.ms"] == heartbeat_ms
    assert made.value.properties["session.timeout.ms"] == session_timeout_ms
