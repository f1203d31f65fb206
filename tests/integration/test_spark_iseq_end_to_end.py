"""SDK -> gateway -> real Kafka -> the Spark iseq job: intervals sent as atomic intervals (send_interval), as
endpoints (send_interval_start / send_interval_end) and as point events, results equal to the brute-force reference
evaluator over the intervals the records carry."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import orjson
import pytest

from broker.admin import partition_count
from broker.reader import read_stream, read_topic
from cep.intervals import Interval, parse_iseq, reference_keys
from clients.client import SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway
from spark_jobs import iseq as iseq_job

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BASE_US = 1_700_000_000_000_000
MS = 1_000
STREAM = "plant"
# No D entirely inside the gap between a and b.
QUERY = "EVENT ISEQ[a.te < b.ts AND a.te < d.ts AND d.te < b.ts](A a, !D d, B b; 5 s)"

Send = tuple[int, str, tuple[Any, ...]]  # (item time, method, arguments)


def planned(seed: int = 7) -> dict[str, list[Send]]:
    """Per source, its sends in item-time order: A atomic intervals, D endpoint pairs, B points and intervals."""
    rng = random.Random(seed)
    plans: dict[str, list[Send]] = {"src-a": [], "src-d": [], "src-b": []}
    for i in range(60):
        start_us = BASE_US + rng.randrange(0, 20_000) * MS
        end_us = start_us + rng.choice([100, 400, 1200]) * MS
        kind = rng.choice("AABBD")
        if kind == "A":
            plans["src-a"].append((end_us, "send_interval", (STREAM, {"type": "A"}, start_us, end_us)))
        elif kind == "D":
            plans["src-d"].append((start_us, "send_interval_start", (STREAM, f"d{i}", {"type": "D"}, start_us)))
            plans["src-d"].append((end_us, "send_interval_end", (STREAM, f"d{i}", {"type": "D"}, end_us)))
        elif rng.random() < 0.5:
            plans["src-b"].append((start_us, "send", (STREAM, {"type": "B"}, start_us)))
        else:
            plans["src-b"].append((end_us, "send_interval", (STREAM, {"type": "B"}, start_us, end_us)))
    for sends in plans.values():
        sends.sort(key=lambda s: s[0])
    return plans


async def send_all(port: int, plans: dict[str, list[Send]]) -> None:
    clients = {name: SkewlessClient("127.0.0.1", port, name, [STREAM], batch_events=16) for name in plans}
    # Every source registers before any sends: the merger can only wait for sources it knows.
    await asyncio.gather(*(c.connect() for c in clients.values()))

    async def one(name: str) -> None:
        client = clients[name]
        for _at, method, args in plans[name]:
            await getattr(client, method)(*args)
        await client.flush()
        await client.close()

    await asyncio.gather(*(one(name) for name in plans))


def start_of(record: dict[str, Any]) -> int:
    """A record's start: a point event's record may leave its start fields out (absent = start = end)."""
    start: int = record.get("start_ts_us", record["ref_ts_us"])
    return start


def intervals_of(records: list[dict[str, Any]]) -> list[Interval]:
    """The intervals the event records stand for, with the job's event ids (endpoints paired per source and id)."""
    out: list[Interval] = []
    starts: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        kind = r["payload"]["type"]
        if "interval_id" not in r:
            out.append(Interval(kind, start_of(r), r["ref_ts_us"], r["payload"], f"{r['source_id']}:{r['seq']}"))
        elif r["endpoint"] == "start":
            starts[(r["source_id"], r["interval_id"])] = r
        else:
            start = starts.pop((r["source_id"], r["interval_id"]))
            out.append(Interval(kind, start["ref_ts_us"], r["ref_ts_us"], r["payload"],
                                f"{r['source_id']}#{r['interval_id']}"))
    return out


async def test_sdk_intervals_through_the_gateway_give_the_reference_results(gateway: Gateway, kafka: Any, spark: Any,
                                                                           topic_prefix: str) -> None:
    plans = planned()
    await send_all(gateway.port, plans)
    # The sources' byes make the merge punctuate what they promised (rule 14): the job must see the promise this
    # test computes its expectation from, so read once those punctuations are committed (0.1 s commit interval).
    for _ in range(100):
        if gateway.counters.byes >= len(plans):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    bootstrap = kafka.bootstrap_servers
    topics = TopicNames(topic_prefix)
    events, punctuations = read_stream(bootstrap, topics.events(STREAM))
    assert len(events) == sum(len(p) for p in plans.values())
    # The records carry what was sent: atomic intervals their start, endpoints their id and side, points start = end
    # (v2 records; a point's may leave its start fields out).
    assert {r["v"] for r in events} == {2}
    assert {(r["source_id"], r.get("endpoint"), start_of(r) < r["ref_ts_us"]) for r in events} == {
        ("src-a", None, True), ("src-d", "start", False), ("src-d", "end", False), ("src-b", None, False),
        ("src-b", None, True)}
    # Loopback sources map with offset 0: the reference times are the times sent.
    sent = sorted((name, args[-2] if method == "send_interval" else args[-1], args[-1])
                  for name, sends in plans.items() for _at, method, args in sends)
    assert sorted((r["source_id"], start_of(r), r["ref_ts_us"]) for r in events) == sent
    assert partition_count(bootstrap, topics.events(STREAM)) == 1
    promise_us = max(p["watermark_us"] for p in punctuations)
    intervals = intervals_of(events)
    query = parse_iseq(QUERY)
    # Results are built when their last member is fed, and the job feeds what the promise has passed (the last
    # promise is the latest release: the events at it and after are not covered yet).
    covered = [i for i in intervals if i.end_ts_us < promise_us]
    assert len(covered) >= len(intervals) - 3, (len(covered), len(intervals), max(i.end_ts_us for i in intervals)
                                                 - promise_us)
    expected = reference_keys(query, covered)
    assert len(expected) >= 3
    assert len(reference_keys(query, [i for i in intervals if i.event_type != "D"])) > len(
        reference_keys(query, intervals))

    started = iseq_job.start(spark, iseq_job.IseqOptions(
        bootstrap_servers=bootstrap, query=QUERY, topic_prefix=topic_prefix, streams=(STREAM,),
        available_now=True, console=False))
    await asyncio.get_running_loop().run_in_executor(None, started.awaitTermination)
    assert started.exception() is None
    results = [orjson.loads(v) for _k, v in read_topic(bootstrap, topics.results("iseq"))]
    assert [r["record"] for r in results] == ["match"] * len(expected)
    assert sorted(tuple((m["event_type"], m["start_ts_us"], m["end_ts_us"], m["event_id"]) for m in r["members"])
                  for r in results) == expected
