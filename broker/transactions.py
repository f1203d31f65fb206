"""A transactional producer for one shard: Kafka's fencing (one ``transactional.id`` per shard) with our own errors.

The Kafka Streams exactly-once model: every shard has one transactional id, and whoever calls ``init()`` with it
last is the only one whose transactions can commit. ``init()`` bumps the producer epoch on the transaction
coordinator, which aborts the previous holder's open transaction and makes every later produce or commit of the
previous holder fail with PRODUCER_FENCED. Readers with ``isolation.level=read_committed`` never see aborted
records, so a paused gateway that wakes up after losing its shard cannot make anything visible.

Threading. The transaction calls (``init``, ``commit``, ``abort``) block on broker round trips: run them in an
executor thread. What may overlap:

- ``produce()`` and ``poll()`` may run on the caller's thread while a transaction is open and no transaction
  call runs; both are thread-safe in librdkafka.
- **Never ``produce()`` while ``commit()`` or ``abort()`` runs**: librdkafka's transactional API allows no
  produce between the start of commit_transaction/abort_transaction and the next begin_transaction (such a
  record would belong to no transaction). Stop producing, call ``commit()``, and produce again only after it
  returned and ``begin()`` opened the next transaction. ``poll()`` may keep running during ``commit()``.
- Two transaction calls must not overlap each other.

Delivery callbacks always run on the thread that calls ``poll()``: commit_transaction flushes the queue itself and
would otherwise run the callbacks on the executor thread that commits, so reports are handed over through a
queue and run by the next ``poll()``. A successful delivery report means "written, not yet committed": only the
return of ``commit()`` makes a transaction's records visible to committed readers.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from broker.client import KafkaClientConfig, Servers
from broker.producer import DeliveryCallback, Headers, ProduceCall, QueueFull, kafka_headers

__all__ = ["TRANSACTION_DEFAULTS", "ProducerFenced", "TransactionAbortable", "TransactionRetriable",
           "TransactionalPublisher", "classify"]

log = logging.getLogger(__name__)

TRANSACTION_DEFAULTS: dict[str, Any] = {
    # Kafka Streams' exactly-once default: a gateway that dies mid-transaction blocks committed readers of its
    # partition (the last stable offset) for at most this long when nobody takes the shard over sooner.
    "transaction.timeout.ms": 10_000,
    # Kafka Streams' exactly-once producers linger 100 ms too. A transaction's records are invisible until its
    # commit, whose flush sends whatever still lingers at once, so sending them sooner buys no reader anything; it
    # costs requests. At 20 sources x 500 events/s (a frame every 5 ms) with 2 ms the broker spent 0.60-0.73 of a
    # core and librdkafka's broker thread 0.09-0.11; with 100 ms 0.12-0.14 and 0.01, on a 2-core host where that
    # CPU was what the gateway's reads waited for (docs/gateway-latency.md). Full batches go at once regardless.
    "linger.ms": 100,
}

LEADER_POLL_INTERVAL_S = 0.05

# librdkafka reports a fenced producer as the fatal _FENCED; the broker codes can surface before it maps them.
_FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class ProducerFenced(Exception):
    """Another instance called ``init()`` with this transactional id: it owns the shard now. Stop writing for good
    (every later call raises this again); nothing of the open transaction will ever be visible."""


class TransactionAbortable(Exception):
    """The open transaction cannot commit: call ``abort()``, then the caller may retry in a new transaction."""


class TransactionRetriable(Exception):
    """A transient failure (timeout, coordinator moving): the same call may be retried as it is."""


def classify(exc: KafkaException, fatal_error: KafkaError | None = None) -> Exception:
    """Our exception for a confluent-kafka failure; a fatal error that is not fencing stays a KafkaException.

    ``fatal_error`` is the producer's fatal error if one was reported: after it every call fails with the
    generic _FATAL code, and only the original error says whether the producer was fenced."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if error is None:
        return exc
    code = error.code()
    if code in _FENCED_CODES or (code == KafkaError._FATAL and fatal_error is not None
                                 and fatal_error.code() in _FENCED_CODES):
        return ProducerFenced(str(error))
    if error.fatal():
        return exc
    if error.txn_requires_abort():
        return TransactionAbortable(str(error))
    if error.retriable():
        return TransactionRetriable(str(error))
    return exc


class TransactionalPublisher:
    """confluent-kafka's Producer with ``transactional.id``, built from the shared client configuration (security
    settings included): the gateway's producer defaults, then ``TRANSACTION_DEFAULTS``, then the shared settings,
    then ``overrides``."""

    def __init__(self, servers: Servers, transactional_id: str, overrides: Mapping[str, Any] | None = None) -> None:
        self.transactional_id = transactional_id
        self._fatal: KafkaError | None = None
        self._fenced = False
        # Filled by whichever thread serves delivery reports (poll or commit's internal flush); drained by poll().
        self._reports: collections.deque[tuple[DeliveryCallback, KafkaError | None, Message]] = collections.deque()
        self._producer: Producer | None = KafkaClientConfig.of(servers).producer(
            {**(overrides or {}), "transactional.id": transactional_id}, TRANSACTION_DEFAULTS,
            error_cb=self._on_error)

    @property
    def fenced(self) -> bool:
        return self._fenced

    def init(self, timeout_s: float, *, connect_topic: str | None = None) -> None:
        """Register the transactional id: fences any earlier producer with the same id and aborts its open
        transaction (or waits until its commit completed). Call once, before the first ``begin()``.

        ``connect_topic``: fetch this topic's metadata twice first. librdkafka asks for the producer id at once
        only if a connection to a broker it learned from metadata is up, else 500 ms later (its fixed retry), and a
        predecessor's open transaction costs one such retry more. The first fetch learns the brokers (librdkafka
        then drops its bootstrap connection), the second waits for a learned broker's connection. Fencing a
        predecessor that died inside a transaction, on a quiet broker: 1.0 s in 6 of 8 tries without, 0.5 s in 6
        of 6 with it, which costs ~0.05 s (issue 24 item 10)."""
        if connect_topic is not None:
            for _ in range(2):
                self._call(lambda p: p.list_topics(connect_topic, timeout=timeout_s))
        self._call(lambda p: p.init_transactions(timeout_s))

    def await_leader(self, topic: str, partition: int, timeout_s: float) -> bool:
        """Fetch ``topic``'s metadata until ``partition`` has a leader, for at most ``timeout_s``; returns whether it
        has one. For a topic created just now: the first produce then finds the partition and its leader in the
        client's metadata cache, instead of queueing on an unknown partition while the topic's metadata (its id and
        leader) changes under it."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            remaining_s = max(0.01, deadline_s - time.monotonic())
            metadata = self._client().list_topics(topic, timeout=remaining_s)
            described = metadata.topics.get(topic)
            if described is not None and described.error is None:
                known = described.partitions.get(partition)
                if known is not None and known.leader >= 0:
                    return True
            if time.monotonic() >= deadline_s:
                return False
            time.sleep(LEADER_POLL_INTERVAL_S)

    def begin(self) -> None:
        """Open a transaction (local, no broker round trip)."""
        self._call(lambda p: p.begin_transaction())

    def produce(self, topic: str, key: bytes | None, value: bytes | None, on_delivery: DeliveryCallback | None,
                partition: int, *, timestamp_ms: int = 0, headers: Headers | None = None) -> None:
        """Queue one record for ``partition`` of ``topic`` in the open transaction; raises QueueFull when
        librdkafka's local queue is full (poll, then retry). ``timestamp_ms`` 0: CreateTime is the produce time."""
        callback = None if on_delivery is None else self._deferred(on_delivery)
        try:
            # Positional: with keywords, confluent-kafka's argument parsing builds and hashes a str per keyword and
            # call (0.8-1.7 us a record measured, half the call's cost); the order is its (topic, value, key,
            # partition, callback, on_delivery, timestamp, headers).
            self._client().produce(topic, value, key, partition, callback, None, timestamp_ms, kafka_headers(headers))
        except BufferError as exc:
            raise QueueFull(str(exc)) from exc
        except KafkaException as exc:
            raise self._classified(exc) from exc

    def batch_produce(self) -> ProduceCall:
        """``produce`` for a loop of records on this thread that runs nothing else in between (no poll, transaction
        call or close): the client's own produce, checked once here (fenced, closed) instead of per record: only
        those calls change what the check sees. Positional arguments as ProduceCall says (those ``produce``
        passes); a BufferError is QueueFull; a KafkaException is raised as ``produce_error`` gives it; a callback
        goes through ``report_to`` first, as ``produce`` does."""
        return self._client().produce

    def report_to(self, on_delivery: DeliveryCallback) -> DeliveryCallback:
        """The callback ``batch_produce``'s call takes for ``on_delivery``: handed to ``poll``'s thread."""
        return self._deferred(on_delivery)

    def produce_error(self, exc: KafkaException) -> Exception:
        """Our exception for a KafkaException of ``batch_produce``'s call (fencing noted, as ``produce`` does)."""
        return self._classified(exc)

    def poll(self, timeout_s: float = 0.0, max_callbacks: int | None = None) -> int:
        """Serve delivery reports and run their callbacks on this thread; returns how many callbacks ran.
        ``max_callbacks``: run at most this many, the rest stay queued (``reports_waiting``) for the next call, so
        that a caller on the event loop can let it turn in between."""
        if self._producer is not None:
            try:
                self._producer.poll(timeout_s)
            except KafkaException as exc:
                # confluent-kafka re-raises a fatal error (fencing included) from poll() as well.
                raise self._classified(exc) from exc
        ran = 0
        while self._reports and (max_callbacks is None or ran < max_callbacks):
            callback, error, message = self._reports.popleft()
            callback(error, message)
            ran += 1
        return ran

    @property
    def reports_waiting(self) -> int:
        """Delivery reports served and not yet handed to their callbacks (``poll`` with ``max_callbacks`` left them)."""
        return len(self._reports)

    def pending(self) -> int:
        """Records queued or in flight, plus reports not yet handed to their callbacks."""
        return len(self._reports) + (0 if self._producer is None else len(self._producer))

    def send_offsets(self, offsets: list[TopicPartition], group_metadata: Any, timeout_s: float) -> None:
        """Commit ``offsets`` for the consumer group of ``group_metadata`` (``Consumer.consumer_group_metadata()``)
        in the open transaction: they become the group's committed offsets exactly when its records become
        visible, and never if it aborts. Same errors as ``commit()``."""
        self._call(lambda p: p.send_offsets_to_transaction(offsets, group_metadata, timeout_s))

    def flush(self, timeout_s: float) -> int:
        """Wait, for at most ``timeout_s``, until every queued record was delivered or failed (their reports are then
        queued for ``poll``); returns how many are still queued or in flight. Never while ``commit()`` runs."""
        producer = self._client()
        try:
            return int(producer.flush(timeout_s))
        except KafkaException as exc:
            raise self._classified(exc) from exc

    def send_now(self) -> None:
        """Ask librdkafka to send what lingers (``linger.ms``) now, without waiting: a flush of timeout 0. It counts
        only if a broker thread wakes while the call runs, so call it again until what it waits for is delivered.
        Delivery reports it serves are queued for ``poll``, as ``flush``'s are."""
        producer = self._client()
        try:
            producer.flush(0)
        except KafkaException as exc:
            raise self._classified(exc) from exc

    def commit(self, timeout_s: float) -> None:
        """Flush and commit the open transaction: when this returns, its records are visible to committed readers.
        TransactionRetriable: call ``commit()`` again; TransactionAbortable: ``abort()``; ProducerFenced: stop."""
        self._call(lambda p: p.commit_transaction(timeout_s))

    def abort(self, timeout_s: float) -> None:
        """Abort the open transaction: its records (queued ones are purged) are never visible to committed
        readers; their delivery reports fail with _PURGE_QUEUE or succeed without ever becoming visible."""
        self._call(lambda p: p.abort_transaction(timeout_s))

    def close(self) -> None:
        """Drop the client now. An open transaction is not committed: the broker aborts it after
        ``transaction.timeout.ms``, or at once when the next owner calls ``init()``."""
        if self._producer is None:
            return
        producer, self._producer = self._producer, None
        try:
            producer.purge()
            producer.poll(0)
        except KafkaException as exc:
            # A fenced or otherwise failed producer is dropped all the same; its error was reported already.
            log.debug("closing transactional producer %s: %s", self.transactional_id, exc)
        self._reports.clear()

    def client(self) -> Producer:
        """The confluent-kafka client itself, for a native produce loop that hands it records (gateway.native);
        not to be kept past ``close()``."""
        return self._client()

    def _client(self) -> Producer:
        if self._fenced:
            raise ProducerFenced(f"transactional id {self.transactional_id!r} was taken over by another producer")
        if self._producer is None:
            raise RuntimeError("publisher is closed")
        return self._producer

    def _call(self, operation: Any) -> None:
        producer = self._client()
        try:
            operation(producer)
        except KafkaException as exc:
            raise self._classified(exc) from exc

    def _classified(self, exc: KafkaException) -> Exception:
        result = classify(exc, self._fatal)
        if isinstance(result, ProducerFenced):
            self._fenced = True
        return result

    def _deferred(self, callback: DeliveryCallback) -> DeliveryCallback:
        reports = self._reports

        def report(error: KafkaError | None, message: Message) -> None:
            reports.append((callback, error, message))
        return report

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error
            if error.code() in _FENCED_CODES:
                self._fenced = True
                log.info("transactional id %s fenced by a newer producer: %s", self.transactional_id, error)
                return
            log.error("fatal Kafka producer error (%s): %s", self.transactional_id, error)
        else:
            log.warning("Kafka producer error (retried by librdkafka): %s", error)
