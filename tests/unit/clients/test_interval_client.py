"""The SDK's interval sends against the in-process fake gateway: exact event maps on the wire, the keys again on a
resend, arguments the gateway would refuse refused by the SDK first."""

from __future__ import annotations

from typing import Any

import pytest

from clients import InvalidInterval, SkewlessClient
from tests.unit.clients.test_client_loopback import FAST, FakeGateway, until

pytestmark = pytest.mark.timeout(30)


def sent_events(gw: FakeGateway) -> list[dict[str, Any]]:
    return [e for _n, m in gw.frames if m["type"] == "events" for e in m["events"]]


async def test_interval_sends_put_their_keys_in_the_event_maps() -> None:
    async with FakeGateway() as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["m"], time_sync=False) as client:
            assert await client.send("m", {"p": 0}, 1_000) == 0
            assert await client.send_interval("m", {"run": 1}, 1_500, 2_500) == 1
            assert await client.send_interval_start("m", "run-2", None, 3_000) == 2
            assert await client.send_interval_end("m", "run-2", {"kwh": 3}, 4_000) == 3
            assert await client.send_interval("m", "zero", 5_000, 5_000, seq=4) == 4
            delivered = await client.send_interval_end_tracked("m", "run-3", None, 6_000)
            await client.flush()
            assert await delivered == 5
        assert sent_events(gw) == [
            {"stream": "m", "seq": 0, "source_ts_us": 1_000, "payload": {"p": 0}},
            {"stream": "m", "seq": 1, "source_ts_us": 2_500, "payload": {"run": 1}, "source_start_ts_us": 1_500},
            {"stream": "m", "seq": 2, "source_ts_us": 3_000, "payload": None, "interval_id": "run-2",
             "endpoint": "start"},
            {"stream": "m", "seq": 3, "source_ts_us": 4_000, "payload": {"kwh": 3}, "interval_id": "run-2",
             "endpoint": "end"},
            {"stream": "m", "seq": 4, "source_ts_us": 5_000, "payload": "zero", "source_start_ts_us": 5_000},
            {"stream": "m", "seq": 5, "source_ts_us": 6_000, "payload": None, "interval_id": "run-3",
             "endpoint": "end"},
        ]


async def test_a_resend_carries_the_interval_keys_again() -> None:
    async with FakeGateway(acking=False) as gw:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["m"], time_sync=False, backoff=FAST)
        await client.connect()
        await client.send_interval("m", 1, 100, 200)
        await client.send_interval_start("m", "x", 2, 300)
        await client.send_pending()
        await until(lambda: len(gw.received[("s1", "m")]) == 2)
        assert gw.kill_all("s1") == 1
        await until(lambda: len(gw.received[("s1", "m")]) == 4)  # both resent on the new connection
        gw.set_acking(True)
        await client.flush(timeout_s=10)
        await client.close()
    copies = sent_events(gw)
    assert copies == 2 * [
        {"stream": "m", "seq": 0, "source_ts_us": 200, "payload": 1, "source_start_ts_us": 100},
        {"stream": "m", "seq": 1, "source_ts_us": 300, "payload": 2, "interval_id": "x", "endpoint": "start"},
    ]


@pytest.mark.parametrize(("start", "end", "message"), [
    (11, 10, "start_ts_us=11, end_ts_us=10"),
    (-1, 10, "start_ts_us=-1, end_ts_us=10"),
    (0, 2**63, "start_ts_us=0, end_ts_us=9223372036854775808"),
    (True, 10, "start_ts_us=True, end_ts_us=10"),
    (1.0, 10, "start_ts_us=1.0, end_ts_us=10"),
])
async def test_an_interval_the_gateway_would_refuse_is_refused_by_the_sdk(start: Any, end: Any,
                                                                           message: str) -> None:
    client = SkewlessClient("127.0.0.1", 1, "s1", ["m"], time_sync=False)
    with pytest.raises(InvalidInterval, match=message):
        await client.send_interval("m", None, start, end)
    assert client.unacked_count == 0 and client.next_seq("m") == 0  # nothing queued, no seq used


@pytest.mark.parametrize("interval_id", ["", "x" * 129, 5, None])
async def test_an_endpoint_needs_an_id_of_1_to_128_chars(interval_id: Any) -> None:
    client = SkewlessClient("127.0.0.1", 1, "s1", ["m"], time_sync=False)
    for send in (client.send_interval_start, client.send_interval_end):
        with pytest.raises(InvalidInterval, match=r"interval_id must be a string of 1\.\.128 characters"):
            await send("m", interval_id, None, 10)
    assert await client.send_interval_start("m", "x" * 128, None, 10) == 0
    assert isinstance(InvalidInterval("x"), ValueError)


async def test_a_spooled_interval_is_resent_as_an_interval_after_a_restart(tmp_path: Any) -> None:
    spool = tmp_path / "spool"
    first = SkewlessClient("127.0.0.1", 1, "s1", ["m"], time_sync=False, spool_path=spool)
    await first.send_interval("m", "a", 1, 2)
    await first.send_interval_end("m", "x", "b", 3)
    await first.send("m", "c", 4)
    await first.close()  # never connected: all three stay in the spool
    async with FakeGateway() as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["m"], time_sync=False, spool_path=spool) as client:
            assert client.stats.recovered_from_spool == 3
            await client.flush()
        assert sent_events(gw) == [
            {"stream": "m", "seq": 0, "source_ts_us": 2, "payload": "a", "source_start_ts_us": 1},
            {"stream": "m", "seq": 1, "source_ts_us": 3, "payload": "b", "interval_id": "x", "endpoint": "end"},
            {"stream": "m", "seq": 2, "source_ts_us": 4, "payload": "c"},
        ]


def test_the_unacked_store_keeps_the_interval_through_a_requeue_and_a_recovery() -> None:
    from clients.core import UnackedStore, encode_batches
    from contract.wire.frames import FrameDecoder
    from contract.wire.messages import AtomicInterval, IntervalEndpoint

    store = UnackedStore(["m"], 10)
    store.add("m", 0, 20, "a", AtomicInterval(5))
    store.add_recovered("m", 1, 30, "b", IntervalEndpoint("x", "end"))
    batch = store.take_batch(10)
    store.mark_sent(batch, 0)
    store.connection_lost(0)
    again = store.take_batch(10)
    ((_events, frame),) = encode_batches(again, 10, 1 << 20)
    (message,) = FrameDecoder().feed(frame)
    assert message["events"] == [
        {"stream": "m", "seq": 0, "source_ts_us": 20, "payload": "a", "source_start_ts_us": 5},
        {"stream": "m", "seq": 1, "source_ts_us": 30, "payload": "b", "interval_id": "x", "endpoint": "end"}]


def test_the_blocking_client_sends_intervals_and_endpoints_with_their_keys() -> None:
    import asyncio
    import threading

    from clients import SyncSkewlessClient

    loop = asyncio.new_event_loop()
    gw = FakeGateway()
    loop.run_until_complete(gw.__aenter__())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with SyncSkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
            assert client.send_interval("a", {"m": 1}, 100, 250) == 0
            assert client.send_interval_start("a", "door", None, 300) == 1
            assert client.send_interval_end("a", "door", None, 400) == 2
            delivered = [client.send_interval_tracked("a", None, 500, 600),
                         client.send_interval_start_tracked("a", "lid", None, 700),
                         client.send_interval_end_tracked("a", "lid", None, 800)]
            assert [f.result(5) for f in delivered] == [3, 4, 5]
            with pytest.raises(InvalidInterval):
                client.send_interval("a", None, 900, 800)
            client.flush()
    finally:
        asyncio.run_coroutine_threadsafe(gw.__aexit__(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert [{k: v for k, v in e.items() if k != "payload"} for e in sent_events(gw)] == [
        {"stream": "a", "seq": 0, "source_ts_us": 250, "source_start_ts_us": 100},
        {"stream": "a", "seq": 1, "source_ts_us": 300, "interval_id": "door", "endpoint": "start"},
        {"stream": "a", "seq": 2, "source_ts_us": 400, "interval_id": "door", "endpoint": "end"},
        {"stream": "a", "seq": 3, "source_ts_us": 600, "source_start_ts_us": 500},
        {"stream": "a", "seq": 4, "source_ts_us": 700, "interval_id": "lid", "endpoint": "start"},
        {"stream": "a", "seq": 5, "source_ts_us": 800, "interval_id": "lid", "endpoint": "end"},
    ]
