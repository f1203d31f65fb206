"""Payloads the JSON record contract cannot carry (docs/wire-protocol.md, "Payloads"): each is refused on its own with
a non-fatal `invalid_payload` error frame naming its stream and seq, counted, kept out of Kafka, and the connection
goes on serving; the gateway still stops promptly afterwards."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from broker.reader import read_stream
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import build_event, build_events, build_hello
from gateway.server import Gateway, GatewayConfig

pytestmark = pytest.mark.integration

# A gateway that stops within this after a hostile input is not stalled (the stop itself drains Kafka, ~1 s).
STOP_BUDGET_S = 5.0


async def _read_until(reader: asyncio.StreamReader, decoder: FrameDecoder, replies: list[dict],
                      done: object, timeout_s: float = 15.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not done(replies):  # type: ignore[operator]
            data = await reader.read(65536)
            if not data:
                return
            replies += decoder.feed(data)


async def test_bin_and_nan_payloads_are_refused_per_event_and_the_gateway_still_stops(kafka, topic_prefix):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    max_frame_bytes=64 * 1024))
    await gateway.start()
    stopped = False
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        decoder = FrameDecoder()
        replies: list[dict] = []
        writer.write(encode_frame(build_hello("raw", ["s"])))
        writer.write(encode_frame(build_events([
            build_event("s", 0, 1_000, {"i": 0}),
            build_event("s", 1, 1_001, b"\x00\x01binary"),
            build_event("s", 2, 1_002, {"x": math.nan}),
            build_event("s", 3, 1_003, {"i": 3}),
        ])))
        await writer.drain()

        def acked_through(seq: int) -> object:
            return lambda rs: any(r["type"] == "ack" and r["seq"] >= seq for r in rs)

        await _read_until(reader, decoder, replies, acked_through(3))
        errors = [r for r in replies if r["type"] == "error"]
        assert [(e["code"], e["stream"], e["seq"], e["fatal"]) for e in errors] == [
            ("invalid_payload", "s", 1, False), ("invalid_payload", "s", 2, False)]
        assert "bytes" in errors[0]["message"] and "NaN" in errors[1]["message"]
        assert any(r["type"] == "ack" and r["seq"] == 3 for r in replies), replies
        assert gateway.counters.invalid_payloads == 2

        # The same connection keeps serving the next valid event.
        writer.write(encode_frame(build_events([build_event("s", 4, 1_004, {"i": 4})])))
        await writer.drain()
        await _read_until(reader, decoder, replies, acked_through(4))
        assert any(r["type"] == "ack" and r["seq"] == 4 for r in replies), replies
        assert gateway.counters.task_failures == 0
        assert gateway.health()["status"] == "ok"

        loop = asyncio.get_running_loop()
        started_s = loop.time()
        await asyncio.wait_for(gateway.stop(), STOP_BUDGET_S)
        stopped = True
        assert loop.time() - started_s < STOP_BUDGET_S
        writer.close()
    finally:
        if not stopped:
            await gateway.stop()

    values, _punctuations = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [(v["seq"], v["payload"]) for v in values] == [(0, {"i": 0}), (3, {"i": 3}), (4, {"i": 4})]
    late, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).late("s"))
    assert late == []


async def _http_get(port: int | None, path: str) -> str:
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    return response.split(b"\r\n\r\n", 1)[1].decode()


async def test_a_failing_connection_worker_is_answered_counted_and_does_not_block_shutdown(kafka, topic_prefix,
                                                                                            monkeypatch):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    max_frame_bytes=64 * 1024, metrics_port=0))
    await gateway.start()
    stopped = False
    try:
        def broken(*_args: object) -> list:
            raise RuntimeError("injected core failure")

        # Any exception on the worker's path stands for a bug the payload rules did not foresee.
        monkeypatch.setattr(gateway.core, "events_received", broken)
        replies = await _one_event_until_closed(gateway.port, "victim")
        assert [r["type"] for r in replies] == ["welcome", "error"]
        assert replies[1] == {"type": "error", "code": "internal_error", "fatal": True,
                              "message": "the gateway failed processing this connection (events): RuntimeError"}
        assert gateway.worker_errors == {"session": 0, "register": 0, "events": 1, "heartbeat": 0, "worker": 0}
        # Out of the core: its state is suspect (see the mid-batch test below), so its shard restarts from Kafka.
        assert gateway.counters.task_failures == 1
        health = gateway.health()
        assert health["status"] == "ok"
        assert health["last_shard_failure"] == "shard 0: the ingest core raised RuntimeError('injected core failure')"
        assert health["last_connection_failure"] == "source victim (events): RuntimeError('injected core failure')"
        metrics = await _http_get(gateway.metrics_port, "/metrics")
        assert 'skewless_gateway_worker_errors_total{stage="events"} 1.0' in metrics.splitlines()
        assert 'skewless_gateway_worker_errors_total{stage="session"} 0.0' in metrics.splitlines()

        loop = asyncio.get_running_loop()
        started_s = loop.time()
        await asyncio.wait_for(gateway.stop(), STOP_BUDGET_S)
        stopped = True
        assert loop.time() - started_s < STOP_BUDGET_S
    finally:
        if not stopped:
            await gateway.stop()


# Where each core's session can be made to raise while it decodes an events frame.
SESSION_FAULT_POINT = {"python": "gateway.session.messages.parse_events", "native": "gateway.native.EventsReceived"}


def _parser_bug(*_args: object) -> object:
    raise ZeroDivisionError("injected parser failure")


def _rust_panic(*_args: object) -> object:
    import skewless_native

    # A real panic inside the extension, caught at its boundary: it reaches Python as a RuntimeError.
    skewless_native.ConnectionDecoder()._panic_for_test()
    raise AssertionError("the panic did not raise")


@pytest.mark.parametrize(("core", "broken", "raised"), [
    ("python", _parser_bug, "ZeroDivisionError"),
    ("native", _parser_bug, "ZeroDivisionError"),
    ("native", _rust_panic, "RuntimeError"),
])
async def test_a_session_that_raises_is_answered_and_counted_and_other_connections_go_on(
        kafka, topic_prefix, monkeypatch, core: str, broken: Any, raised: str):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    core=core))
    await gateway.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(encode_frame(build_hello("victim", ["s"])))
        await writer.drain()
        decoder = FrameDecoder()
        replies: list[dict] = []
        await _read_until(reader, decoder, replies, lambda rs: len(rs) == 1)
        # A parser bug raises inside asyncio's data_received: before, asyncio closed the socket with no error
        # frame, no count and no log line naming the source.
        monkeypatch.setattr(SESSION_FAULT_POINT[core], broken)
        writer.write(encode_frame(build_events([build_event("s", 0, 1_000, {"i": 0})])))
        await writer.drain()
        await _read_until(reader, decoder, replies, lambda rs: False)
        assert replies[1:] == [{"type": "error", "code": "internal_error", "fatal": True,
                                "message": f"the gateway failed processing this connection (session): {raised}"}]
        assert gateway.worker_errors["session"] == 1
        writer.close()

        monkeypatch.undo()
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(encode_frame(build_hello("victim", ["s"])))
        writer.write(encode_frame(build_events([build_event("s", 0, 1_000, {"i": 0})])))
        await writer.drain()
        replies = []
        await _read_until(reader, FrameDecoder(), replies, lambda rs: any(r["type"] == "ack" for r in rs))
        assert [r["type"] for r in replies] == ["welcome", "ack"]
        assert replies[1] == {"type": "ack", "stream": "s", "seq": 0}
        assert gateway.health()["status"] == "ok"
        writer.close()
    finally:
        await gateway.stop()


async def test_a_stuck_connection_and_a_client_that_never_reads_delay_stop_by_the_flush_timeout_at_most(
        kafka, topic_prefix, monkeypatch):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix))
    await gateway.start()
    never = asyncio.Event()

    async def stuck(*_args: object) -> None:
        await never.wait()

    # A worker that never finishes its batch: the drain cannot tell it from a slow one and waits, but only once.
    monkeypatch.setattr(gateway, "receive_events", stuck)
    _reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    writer.write(encode_frame(build_hello("stuck", ["s"])))
    writer.write(encode_frame(build_events([build_event("s", 0, 1_000, {"i": 0})])))
    await writer.drain()
    await asyncio.sleep(0.5)
    (handler,) = gateway.connections_of("stuck")
    assert not handler.idle
    loop = asyncio.get_running_loop()
    started_s = loop.time()
    await asyncio.wait_for(gateway.stop(flush_timeout_s=2.0), 10.0)
    # Both drains share the 2 s (before, each waited its own 2 s for the stuck worker).
    assert 2.0 <= loop.time() - started_s < 3.0
    writer.close()


async def test_the_sdk_gets_a_refused_seq_with_its_reason_resends_nothing_and_the_rest_is_published_in_order(
        kafka, topic_prefix):
    from clients import RefusedEvent, SkewlessClient

    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix))
    await gateway.start()
    try:
        client = SkewlessClient("127.0.0.1", gateway.port, "sdk", ["s"], heartbeat_interval_s=None)
        await client.connect()
        assert [await client.send("s", payload, 1_000 + i) for i, payload in enumerate(
            [{"i": 0}, {"blob": b"\x00\x01"}, {"i": 2}])] == [0, 1, 2]
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        await client.flush(15.0)
        # Far below any gap timeout: seq 1 held its place and was never waited for.
        assert loop.time() - started_s < 2.0
        assert list(client.refused) == [RefusedEvent(
            "s", 1, "invalid_payload",
            "payload.blob: bytes (msgpack bin) are not JSON; encode them into a string (e.g. base64) before sending")]
        assert (client.stats.events_refused, client.stats.events_sent, client.stats.events_resent,
                client.stats.events_acked) == (1, 3, 0, 3)
        assert client.acked_through("s") == 2 and client.unacked_count == 0
        assert client.error is None
        await client.close()
        assert (gateway.pipeline.counters.gaps, gateway.counters.invalid_payloads) == (0, 1)
    finally:
        await gateway.stop()
    values, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [(v["seq"], v["payload"]) for v in values] == [(0, {"i": 0}), (2, {"i": 2})]


async def test_an_internal_error_makes_the_sdk_reconnect_and_resend_not_fail(kafka, topic_prefix, monkeypatch):
    from clients import Backoff, SkewlessClient

    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix))
    await gateway.start()
    try:
        real = gateway.core.events_received
        failures = [RuntimeError("transient gateway bug")]

        def fails_once(*args: object) -> object:
            if failures:
                raise failures.pop()
            return real(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(gateway.core, "events_received", fails_once)
        client = SkewlessClient("127.0.0.1", gateway.port, "sdk", ["s"], heartbeat_interval_s=None,
                                backoff=Backoff(initial_s=0.05, max_s=0.1))
        await client.connect()
        await client.send("s", {"i": 0}, 1_000)
        await client.flush(15.0)
        # The gateway's fault, not the source's: the client reconnected and resent instead of failing for good.
        assert client.error is None
        assert (client.stats.reconnects, client.stats.events_resent, client.stats.events_acked) == (1, 1, 1)
        assert gateway.worker_errors["events"] == 1
        await client.close()
    finally:
        await gateway.stop()
    values, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [v["seq"] for v in values] == [0]


async def test_a_dead_producer_task_restarts_its_shard_from_kafka_and_the_source_is_served_exactly_once(
        kafka, topic_prefix, monkeypatch):
    from clients import Backoff, SkewlessClient

    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    metrics_port=0))
    await gateway.start()
    try:
        def broken(*_args: object, **_kwargs: object) -> None:
            raise MemoryError("injected producer failure")

        first = gateway.shards[0]
        # The shard can no longer publish anything: its runtime is given up and a new one recovers from Kafka.
        # The shard's produce loop takes the client's produce from batch_produce once per batch (gateway/shard.py).
        monkeypatch.setattr(first._publisher, "batch_produce", lambda: broken)
        replies = await _one_event_until_closed(gateway.port, "p")
        assert [r["type"] for r in replies] == ["welcome", "error"]
        assert replies[1] == {"type": "error", "code": "shard_moved", "fatal": True,
                              "message": "this gateway no longer serves the source's shard"}
        await gateway.wait_serving(timeout_s=15)
        assert gateway.shards[0] is not first
        health = gateway.health()
        assert health["status"] == "ok" and "MemoryError('injected producer failure')" in health["last_shard_failure"]
        assert gateway.counters.task_failures == 1 and gateway.worker_errors["events"] == 0
        client = SkewlessClient("127.0.0.1", gateway.port, "p", ["s"], heartbeat_interval_s=None,
                                backoff=Backoff(initial_s=0.05, max_s=0.1))
        await client.connect()
        for seq in range(3):
            await client.send("s", {"i": seq}, 1_000 + seq, seq=seq)
        await client.flush(15.0)
        await client.close()
    finally:
        await gateway.stop(flush_timeout_s=2.0)
    values, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [(v["source_id"], v["seq"]) for v in values] == [("p", 0), ("p", 1), ("p", 2)]


async def _one_event_until_closed(port: int, source_id: str) -> list[dict]:
    """Hello and one event as ``source_id``; every reply until the gateway closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_frame(build_hello(source_id, ["s"])))
    writer.write(encode_frame(build_events([build_event("s", 0, 1_000, {"i": 0})])))
    await writer.drain()
    replies: list[dict] = []
    await _read_until(reader, FrameDecoder(), replies, lambda rs: False)
    writer.close()
    return replies


async def _http_get_status(port: int | None, path: str) -> str:
    assert port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    return response.decode()


async def test_a_core_that_raises_mid_batch_restarts_its_shard_and_nothing_is_lost_or_duplicated(
        kafka, topic_prefix, monkeypatch):
    from clients import Backoff, SkewlessClient

    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix))
    await gateway.start()
    try:
        real_push = gateway.core.pipeline.push
        failures = [RuntimeError("pipeline bug at seq 1")]

        def push_many(source_id: str, events: list[Any], arrival_us: int, mappings: object = None) -> list[Any]:
            out: list[Any] = []
            for event in events:  # one by one, so seq 0 is released before seq 1 raises
                if event.seq == 1 and failures:
                    raise failures.pop()
                out += real_push(source_id, event, arrival_us)
            return out

        # Seq 0 was accepted and released, seq 1 accepted, then the core raised: that core cannot be trusted any
        # more. Its shard restarts from what Kafka committed; the client resends what was not acknowledged. (A
        # frame's events reach the pipeline through push_many.)
        monkeypatch.setattr(gateway.core.pipeline, "push_many", push_many)
        client = SkewlessClient("127.0.0.1", gateway.port, "mid", ["s"], heartbeat_interval_s=None,
                                backoff=Backoff(initial_s=0.05, max_s=0.1))
        await client.connect()
        for seq in range(3):
            await client.send("s", {"i": seq}, 1_000 + seq)
        await client.flush(20.0)
        assert client.acked_through("s") == 2 and client.stats.events_resent >= 2
        health = gateway.health()
        assert health["status"] == "ok" and "pipeline bug at seq 1" in health["last_shard_failure"]
        assert gateway.counters.task_failures == 1
        await client.close()
    finally:
        await gateway.stop(flush_timeout_s=1.0)
    values, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [v["seq"] for v in values] == [0, 1, 2]
