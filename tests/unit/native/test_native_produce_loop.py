"""A transactional shard's produce loop with the Rust loop of its plain records (native/src/produce_loop.rs,
gateway.native.native_produce_loop) against the Python loop alone (gateway.shard ``ShardRuntime._produce_from``,
the specification): the same produce calls with the same arguments in the same order (a mark's record with its
callback, headers as lists, WriteCheckpoints), the same deliveries kept for the commit, the same counts and
the same index returned, through librdkafka's full queue (BufferError) at any record and a Kafka error."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.ingest import (
    ConnectionId,
    DeliveryRef,
    PauseReading,
    Produce,
    ResumeReading,
    SendFrame,
    SendToSource,
    WriteCheckpoint,
)
from gateway.native import native_produce_loop
from gateway.shard import ShardRuntime

HEADERS = ((("kind", b"event"), ("source_id", b"a")), (("kind", b"late"),), ())


class Publisher:
    """The transactional publisher's loop calls, recorded; ``fail_at``: the produce call that raises ``error``."""

    def __init__(self, fail_at: int | None, error: type[Exception]) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_at = fail_at
        self.error = error

    def batch_produce(self) -> Any:
        def produce(*args: Any) -> None:
            if len(self.calls) == self.fail_at:
                self.fail_at = None  # full once: the retry goes on
                raise self.error(KafkaError(KafkaError._FATAL)) if self.error is KafkaException else self.error()
            topic, value, key, shard, on_delivery, partitioner, ts, headers = args
            self.calls.append((topic, value, key, shard, on_delivery, partitioner, ts,
                               None if headers is None else (type(headers), tuple(headers))))
        return produce

    @staticmethod
    def produce_error(exc: KafkaException) -> Exception:
        return exc


def shard(publisher: Publisher, native: bool) -> Any:
    runtime = types.SimpleNamespace(_publisher=publisher, shard=3, _transactional=True, _uncommitted=[],
                                    _produced_in_transaction=0, _unproduced_records=0, _reported=None,
                                    _produce_loop=native_produce_loop() if native else None, _direct=None)
    runtime._queue_full_at = types.MethodType(ShardRuntime._queue_full_at, runtime)
    return runtime


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[Any], dict[int, Any]]:
    actions: list[Any] = []
    for seq in range(draw(st.integers(0, 30))):
        headers = draw(st.sampled_from([*HEADERS, None, [("kind", b"event")]]))
        if draw(st.integers(0, 9)) == 0:
            actions.append(WriteCheckpoint("sources", b"k", b"v", headers))  # type: ignore[arg-type]
            continue
        delivery = draw(st.sampled_from([DeliveryRef("a", "s", seq, "events", 7), None]))
        actions.append(Produce("t.events", b"a", b"{}", delivery, draw(st.integers(0, 2**40)), headers))  # type: ignore[arg-type]
    # The records whose delivery reports the shard wants, with their callbacks (ShardRuntime._report_marks).
    marks = {index: ("callback", index) for index in draw(st.sets(st.integers(0, max(0, len(actions) - 1)),
                                                                  max_size=3))}
    return actions, marks


def run(actions: list[Any], marks: dict[int, Any], native: bool, fail_at: int | None,
        error: type[Exception]) -> tuple[Any, ...]:
    publisher = Publisher(fail_at, error)
    runtime = shard(publisher, native)
    returned: list[Any] = []
    index = 0
    try:
        while index < len(actions):
            index = ShardRuntime._produce_from(runtime, actions, index, marks)
            returned.append(index)
    except KafkaException as exc:
        returned.append(type(exc))
    return (publisher.calls, returned, runtime._uncommitted, runtime._produced_in_transaction,
            runtime._unproduced_records)


@settings(max_examples=300, deadline=None)
@given(batch=batches(), fail_at=st.none() | st.integers(0, 30),
       error=st.sampled_from([BufferError, BufferError, KafkaException]))
def test_the_rust_loop_produces_as_the_python_loop(batch: tuple[list[Any], dict[int, Any]], fail_at: int | None,
                                                    error: type[Exception]) -> None:
    actions, marks = batch
    assert run(actions, marks, True, fail_at, error) == run(actions, marks, False, fail_at, error)


def test_the_rust_loop_shares_a_headers_list_and_stops_at_a_mark() -> None:
    publisher = Publisher(None, BufferError)
    runtime = shard(publisher, native=True)
    delivery = DeliveryRef("a", "s", 1, "events", 7)
    actions: list[Any] = [Produce("t", b"k", b"v", delivery, 5, HEADERS[0]) for _ in range(3)]
    loop = runtime._produce_loop
    seen: list[Any] = []
    assert loop.run(lambda *args: seen.append(args[7]), actions, 0, 3, {2: "s"}, runtime._uncommitted) == (2, False)
    assert seen[0] is seen[1] and seen[0] == list(HEADERS[0])
    assert runtime._uncommitted == [delivery, delivery]


@settings(max_examples=300, deadline=None)
@given(batch=batches(), streams=st.lists(st.sampled_from(["s", "t", "u1"]), min_size=30, max_size=30),
       topics=st.lists(st.sampled_from(["events", "late"]), min_size=30, max_size=30),
       record_topics=st.lists(st.sampled_from(["t.events", "t.late", "t.progress1"]), min_size=30, max_size=30))
def test_wanted_reports_are_the_python_pass(batch: tuple[list[Any], dict[int, Any]], streams: list[str],
                                            topics: list[str], record_topics: list[str]) -> None:
    """Equal strings that are other objects ("".join), records of several topics, deliveries of two topics."""
    actions = [Produce("".join(list(record_topics[i])), a.key, a.value,
                       None if a.delivery is None else
                       DeliveryRef("a", "".join(list(streams[i])), i, topics[i], 7),  # type: ignore[arg-type]
                       a.timestamp_ms, a.headers) if type(a) is Produce else a
               for i, a in enumerate(batch[0])]
    python = shard(Publisher(None, BufferError), native=False)
    native = native_produce_loop().wanted_reports(actions)
    assert native is not None
    expected = ShardRuntime._wanted_reports(python, actions)
    assert native == expected
    assert [list(part) for part in native] == [list(part) for part in expected]  # the same order


def test_wanted_reports_of_odd_records_are_left_to_python() -> None:
    loop = native_produce_loop()
    for odd in (Produce("t", b"k", b"v", ("a", "s", 1, "events", 7), 0, None),  # type: ignore[arg-type]
                Produce(b"t", b"k", b"v", None, 0, None)):  # type: ignore[arg-type]
        assert loop.wanted_reports([odd]) is None


def test_another_class_is_left_to_the_python_loop() -> None:
    class NotProduce:
        pass

    actions: list[Any] = [Produce("t", b"k", b"v", None, 5, None), NotProduce()]
    produced: list[Any] = []
    assert native_produce_loop().run(lambda *args: produced.append(args), actions, 0, 0, {}, []) == (1, False)
    assert produced == [("t", b"v", b"k", 0, None, None, 5, None)]


class Host:
    """What ``_carry_out_now`` calls on the gateway, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def send_to_source(self, source_id: str, data: bytes) -> None:
        self.calls.append(("send_to_source", source_id, data))

    def send_frame(self, connection: Any, data: bytes) -> None:
        self.calls.append(("send_frame", connection, data))

    def set_throttled(self, source_id: str, throttled: bool) -> None:
        self.calls.append(("set_throttled", source_id, throttled))


@dataclass(slots=True)
class LateProduce(Produce):
    """A subclass: the native pass leaves the actions to the Python loop, whose isinstance takes it as a write."""


def carried_out(actions: list[Any], native: bool, queue_writes: bool) -> tuple[Any, ...]:
    host, queued = Host(), list[Any]()
    runtime = types.SimpleNamespace(_host=host, _produce_loop=native_produce_loop() if native else None,
                                    _enqueue=queued.append)
    try:
        returned: Any = ShardRuntime._carry_out_now(runtime, actions, queue_writes)  # type: ignore[arg-type]
    except TypeError as error:
        returned = ("TypeError", str(error))
    return returned, queued, host.calls


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), max_size=40), st.booleans())
def test_carry_out_now_sorts_actions_as_the_python_loop(kinds: list[int], queue_writes: bool) -> None:
    """The same writes returned or queued, in order, and the same host calls, in order, with the native pass
    (``ProduceLoop.split_writes``) and without: Produce (most), WriteCheckpoint, acks, frames, throttling, a
    subclass of Produce and, rarely, an object that is no action (a TypeError either way)."""
    delivery = DeliveryRef("a", "s", 1, "events", 7)
    made: list[Callable[[int], Any]] = [
            lambda i: SendToSource(f"s{i}", b"ack"), lambda i: SendFrame(ConnectionId(i), b"err"),
            lambda i: WriteCheckpoint("sources", b"k", bytes([i]), None), lambda i: PauseReading(f"s{i}"),
            lambda i: ResumeReading(f"s{i}"), lambda i: LateProduce("t", b"k", bytes([i]), None),
            lambda i: ("not", "an", "action")]
    actions = [Produce("t.events", b"a", bytes([i]), delivery, i, None) if kind >= len(made) else made[kind](i)
               for i, kind in enumerate(kinds)]
    assert carried_out(actions, True, queue_writes) == carried_out(actions, False, queue_writes)


def test_split_writes_by_exact_class() -> None:
    produce = Produce("t", b"k", b"v", None)
    ack, checkpoint = SendToSource("s", b"a"), WriteCheckpoint("sources", b"k", b"v")
    loop = native_produce_loop()
    assert loop.split_writes([ack, produce, checkpoint, ack], (Produce, WriteCheckpoint), (SendToSource,)) == (
        [produce, checkpoint], [ack, ack])
    assert loop.split_writes([], (Produce,), ()) == ([], [])
    assert loop.split_writes([produce, LateProduce("t", b"k", b"v", None)], (Produce,), (SendToSource,)) is None


@settings(max_examples=200, deadline=None)
@given(topics=st.lists(st.sampled_from(["t.events", "t.late", "sources", "cluster"]), max_size=20),
       unsettled=st.sets(st.sampled_from(["t.events", "t.late", "sources", "x"])), start=st.integers(0, 20))
def test_first_write_end_is_the_python_scan(topics: list[str], unsettled: set[str], start: int) -> None:
    """The native scan of ``_first_write_end`` against the Python one: Produce (read from its slot), WriteCheckpoint
    and a Produce subclass (read by getattr), from any start."""
    actions: list[Any] = []
    for index, topic in enumerate(topics):
        kind = index % 3
        actions.append(Produce(topic, b"k", b"v", None) if kind == 0 else WriteCheckpoint(topic, b"k", b"v")
                       if kind == 1 else LateProduce(topic, b"k", b"v", None))
    start = min(start, len(actions))
    python = types.SimpleNamespace(_unsettled_topics=unsettled, _produce_loop=None)
    native = types.SimpleNamespace(_unsettled_topics=unsettled, _produce_loop=native_produce_loop())
    expected = ShardRuntime._first_write_end(python, actions, start)  # type: ignore[arg-type]
    assert expected == next((i + 1 for i in range(start, len(topics)) if topics[i] in unsettled), len(topics))
    assert ShardRuntime._first_write_end(native, actions, start) == expected  # type: ignore[arg-type]
