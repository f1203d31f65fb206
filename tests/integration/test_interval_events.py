"""Interval events end to end (issue 16 item 1): two SDK sources send point events, atomic intervals and start/end
endpoint pairs through the real gateway into Kafka; the events topic, read committed, holds every one as a contract
version 2 record with its exact interval fields, in end order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from broker.client import KafkaClientConfig
from broker.reader import read_topic
from clients import SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BASE = 1_700_000_000_000_000
# (kind, times, interval_id) per source, in send order: ("point", (t,)), ("interval", (start, end)),
# ("start" | "end", (t,), id). Every end is distinct across both sources, so the merged order is exact.
PLANS: dict[str, list[tuple[str, tuple[int, ...], str | None]]] = {
    "src-a": [("point", (BASE + 1_000,), None), ("interval", (BASE + 500, BASE + 3_000), None),
              ("start", (BASE + 3_500,), "run-1"), ("point", (BASE + 4_000,), None),
              ("end", (BASE + 6_000,), "run-1"), ("interval", (BASE + 2_000, BASE + 7_000), None)],
    "src-b": [("interval", (BASE + 100, BASE + 2_500), None), ("point", (BASE + 5_000,), None),
              ("start", (BASE + 5_500,), "run-1"), ("interval", (BASE + 5_800, BASE + 5_800), None),
              ("end", (BASE + 6_500,), "run-1")],
}


def expected_record(source_id: str, seq: int, kind: str, times: tuple[int, ...], interval_id: str | None,
                    ) -> dict[str, Any]:
    """The record by the contract; the gateway runs without time sync, so reference time = source time and every
    bound is 0. A point event's record has no interval fields (start = end)."""
    end = times[-1]
    record: dict[str, Any] = {"v": 2, "kind": "event", "stream": "m", "source_id": source_id, "seq": seq,
                              "source_ts_us": end, "ref_ts_us": end, "uncertainty_us": 0, "late": False,
                              "payload": {"n": seq, "kind": kind}}
    if kind != "point":
        record |= {"start_ts_us": times[0], "end_ts_us": end, "start_uncertainty_us": 0,
                   "source_start_ts_us": times[0]}
    if interval_id is not None:
        record |= {"interval_id": interval_id, "endpoint": kind}
    return record


async def send_plan(client: SkewlessClient, source_id: str) -> None:
    for seq, (kind, times, interval_id) in enumerate(PLANS[source_id]):
        payload = {"n": seq, "kind": kind}
        if kind == "point":
            sent = await client.send("m", payload, times[0])
        elif kind == "interval":
            sent = await client.send_interval("m", payload, times[0], times[1])
        elif kind == "start":
            assert interval_id is not None
            sent = await client.send_interval_start("m", interval_id, payload, times[0])
        else:
            assert interval_id is not None
            sent = await (await client.send_interval_end_tracked("m", interval_id, payload, times[0]))
        assert sent == seq
    await client.flush(timeout_s=60)
    await client.close()


def read_events_with_headers(servers: str, topic: str, expected: int, timeout_s: float = 60.0,
                             ) -> list[tuple[dict[str, bytes], dict[str, Any]]]:
    """The event records (headers, value) of partition 0 of ``topic``, read committed, until ``expected`` came."""
    consumer = KafkaClientConfig.of(servers).consumer("interval-test", {"isolation.level": "read_committed"})
    out: list[tuple[dict[str, bytes], dict[str, Any]]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while len(out) < expected:
            assert time.monotonic() < deadline, f"{len(out)} of {expected} event records in {topic}"
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            value = orjson.loads(message.value() or b"{}")
            if value.get("kind") == "event":
                out.append(({k: bytes(v) for k, v in message.headers() or []}, value))
    finally:
        consumer.close()
    return out


async def test_points_intervals_and_endpoints_reach_kafka_as_v2_records_in_end_order(gateway: Gateway, kafka: Any,
                                                                                     topic_prefix: str) -> None:
    clients = {s: SkewlessClient("127.0.0.1", gateway.port, s, ["m"], time_sync=False, batch_events=3)
               for s in PLANS}
    # Both register before either sends: the merge can only wait for sources it knows.
    await asyncio.gather(*(c.connect() for c in clients.values()))
    await asyncio.gather(*(send_plan(c, s) for s, c in clients.items()))

    total = sum(len(plan) for plan in PLANS.values())
    got = await asyncio.get_running_loop().run_in_executor(
        None, read_events_with_headers, kafka.bootstrap_servers, TopicNames(topic_prefix).events("m"), total)
    expected = sorted((expected_record(s, seq, *step) for s, plan in PLANS.items() for seq, step in enumerate(plan)),
                      key=lambda r: r["ref_ts_us"])
    values = [value for _headers, value in got]
    for value in values:
        assert value["arrival_ts_us"] <= value["release_ts_us"]
        del value["arrival_ts_us"], value["release_ts_us"]
        value.pop("rtt_us", None)
    assert values == expected
    assert [value["ref_ts_us"] for value in values] == sorted(value["ref_ts_us"] for value in values)
    assert [headers for headers, _value in got] == [
        {"kind": b"event", "source_id": value["source_id"].encode(), "contract_version": b"2"} for value in values]
    # Nothing refused, nothing late: every event is on the events topic exactly once.
    assert all(c.stats.events_refused == 0 for c in clients.values())
    late = await asyncio.get_running_loop().run_in_executor(
        None, read_topic, kafka.bootstrap_servers, TopicNames(topic_prefix).late("m"), 10.0)
    assert late == []
