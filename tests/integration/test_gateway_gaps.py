"""Issue 24 item 2 through the real gateway and broker: a gap the gateway gives up does not stall its source.

c005711: skip one seq and the cumulative ack stayed below it for good; resends after a reconnect were dropped with
no ack; through the SDK, ``send(seq=1)`` then automatic seqs made ``flush()`` raise FlushTimeout with
acked_through=-1 while all 21 events were in Kafka.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import pytest

from broker.reader import read_stream
from clients import Backoff, SkewlessClient
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.server import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = Backoff(initial_s=0.02, max_s=0.2)
BASE_TS_US = 1_700_000_000_000_000


def records(bootstrap: str, prefix: str, stream: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    topics = TopicNames(prefix)
    events, _ = read_stream(bootstrap, topics.events(stream))
    late, _ = read_stream(bootstrap, topics.late(stream), timeout_s=5.0)
    return events, late


class RawSource:
    """A client written from docs/wire-protocol.md: msgpack frames over one TCP connection."""

    def __init__(self, port: int, source_id: str) -> None:
        self.port = port
        self.source_id = source_id
        self.replies: list[dict[str, Any]] = []
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._decoder = FrameDecoder()
        self._pending: deque[dict[str, Any]] = deque()

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._decoder = FrameDecoder()
        self._pending.clear()
        self._writer.write(encode_frame({"type": "hello", "version": 1, "source_id": self.source_id,
                                         "streams": ["s"]}))
        assert (await self.next_reply(10))["type"] == "welcome"

    def send(self, seqs: list[int]) -> None:
        assert self._writer is not None
        self._writer.write(encode_frame({"type": "events", "events": [
            {"stream": "s", "seq": q, "source_ts_us": BASE_TS_US + q, "payload": {"i": q}} for q in seqs]}))

    async def next_reply(self, timeout_s: float) -> dict[str, Any]:
        assert self._reader is not None
        async with asyncio.timeout(timeout_s):
            while not self._pending:
                data = await self._reader.read(65536)
                if not data:
                    raise ConnectionError("the gateway closed the connection")
                self._pending.extend(self._decoder.feed(data))
        message = self._pending.popleft()
        self.replies.append(message)
        return message

    async def wait_for(self, predicate: Any, timeout_s: float) -> list[dict[str, Any]]:
        """Every reply until one satisfies ``predicate`` (included)."""
        seen: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout_s):
            while True:
                message = await self.next_reply(timeout_s)
                seen.append(message)
                if predicate(message):
                    return seen

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()


async def test_a_raw_source_skipping_a_seq_is_told_acked_past_it_and_its_resend_lands_late_once(
        gateway: Gateway, kafka, topic_prefix):
    source = RawSource(gateway.port, "skipper")
    await source.connect()
    source.send([q for q in range(10) if q != 3])
    seen = await source.wait_for(lambda m: m["type"] == "ack" and m["seq"] == 9, 20)
    gaps = [m for m in seen if m["type"] == "gap"]
    assert gaps == [{"type": "gap", "stream": "s", "first_seq": 3, "last_seq": 3, "reason": "timeout"}]
    assert seen.index(gaps[0]) < len(seen) - 1  # the gap notice comes before the ack that passes it
    await source.close()

    # Reconnect and resend everything: 3 is published once (late topic), the rest are duplicates: one ack per frame.
    await source.connect()
    source.send(list(range(10)))
    seen = await source.wait_for(lambda m: m["type"] == "ack", 10)
    assert seen == [{"type": "ack", "stream": "s", "seq": 9}]
    source.send([3])
    assert await source.wait_for(lambda m: m["type"] == "ack", 10) == [{"type": "ack", "stream": "s", "seq": 9}]
    await source.close()
    await asyncio.sleep(1.0)  # the late record's delivery

    events, late = records(kafka.bootstrap_servers, topic_prefix, "s")
    assert [r["seq"] for r in events if r["source_id"] == "skipper"] == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    assert [(r["seq"], r["late_reason"]) for r in late] == [(3, "late_after_skip")]
    counters = gateway.counters
    assert (counters.gaps_given_up, counters.seqs_given_up) == (1, 1)


async def test_an_sdk_source_starting_at_seq_1_flushes_and_is_told_seq_0_was_given_up(
        gateway: Gateway, kafka, topic_prefix):
    client = SkewlessClient("127.0.0.1", gateway.port, "from-one", ["s"], backoff=FAST)
    await client.connect()
    assert await client.send("s", {"i": 1}, seq=1) == 1
    for i in range(2, 22):
        assert await client.send("s", {"i": i}) == i
    await client.flush(timeout_s=20)  # c005711: FlushTimeout, acked_through -1
    assert client.acked_through("s") == 21
    assert (client.stats.seqs_given_up, client.stats.events_given_up) == (1, 0)
    await client.close()
    events, late = records(kafka.bootstrap_servers, topic_prefix, "s")
    assert [r["seq"] for r in events] == list(range(1, 22))
    assert late == []
