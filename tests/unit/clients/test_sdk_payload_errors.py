"""A payload msgpack cannot encode (a datetime, a set, an object) is refused at ``send`` with the SDK's own error,
naming the field and what a payload may hold, instead of msgpack's bare TypeError (issue 28 item 5)."""

from __future__ import annotations

import datetime

import pytest

from clients import InvalidPayload, SkewlessClient, SkewlessError

ACCEPTED = ("a payload holds None, bool, int (64 bits), finite float, str, lists and maps with string keys (send "
            "a time as integer microseconds or an ISO 8601 string)")


@pytest.mark.parametrize(("payload", "where"), [
    ({"reading": {"at": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)}}, "payload.reading.at: datetime"),
    ([1, {2, 3}], "payload[1]: set"),
    (datetime.date(2026, 1, 1), "payload: date"),
])
async def test_a_payload_msgpack_cannot_encode_names_the_field(payload: object, where: str) -> None:
    # Never connected: the payload is checked before anything is queued.
    client = SkewlessClient("127.0.0.1", 1, "s1", ["sensors"])
    with pytest.raises(InvalidPayload) as raised:
        await client.send("sensors", payload)
    assert str(raised.value) == f"stream 'sensors': cannot send {where} is not JSON; {ACCEPTED}"
    assert isinstance(raised.value, SkewlessError) and isinstance(raised.value, TypeError)
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    # Nothing was queued and no seq was used: the next good event is seq 0.
    assert client.unacked_count == 0
    assert await client.send("sensors", {"ok": 1}) == 0
