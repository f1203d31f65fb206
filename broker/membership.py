"""Shard ownership through Kafka's group membership: the gateways are the members of one consumer group on the
control topic, whose S partitions are the S shards; the group coordinator assigns them to live gateways.

The protocol is the classic consumer group with the ``cooperative-sticky`` assignor: a rebalance moves only the
partitions that must move (a gateway keeps serving its other shards meanwhile), and on_assign / on_revoke / on_lost
hand over incremental sets. With ``group.instance.id`` (static membership) a restarted gateway that comes back
within the session timeout gets its shards back without a rebalance, and a static member's close() does not leave
the group: its shards move only when its session times out.

A member loses its shards when the coordinator hears no heartbeat for ``session_timeout_ms`` (process frozen,
host partitioned away) or when the caller stops calling ``poll()`` for ``max_poll_interval_ms`` (librdkafka
heartbeats from a background thread, so a stuck event loop alone would not stop them). Either way the other
members take the shards over; the frozen one sees SharesLost when it wakes, and fencing (broker.transactions)
makes anything it writes meanwhile invisible.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from broker.client import KafkaClientConfig, Servers, librdkafka_logger

__all__ = ["GroupMembership", "MembershipChange", "SharesAssigned", "SharesLost", "SharesRevoked"]


@dataclass(frozen=True)
class SharesAssigned:
    """These partitions (shards) are now ours, in addition to those owned before."""

    partitions: frozenset[int]


@dataclass(frozen=True)
class SharesRevoked:
    """These partitions go to another member in an orderly rebalance: stop serving them now. The coordinator may
    hand them on as soon as the poll() that returned this one did, so fencing, not this notice, keeps the two
    writers apart."""

    partitions: frozenset[int]


@dataclass(frozen=True)
class SharesLost:
    """These partitions were taken from us without a handover (session timed out, poll interval exceeded): another
    member may already serve them, so whatever we write for them is fenced."""

    partitions: frozenset[int]


MembershipChange = SharesAssigned | SharesRevoked | SharesLost

HEARTBEAT_INTERVAL_MS = 100


class GroupMembership:
    """One gateway's membership. ``poll()`` never blocks; call it often (well within ``max_poll_interval_ms``)
    from one thread: the rebalance callbacks run inside it."""

    def __init__(self, servers: Servers, group_id: str, topic: str, *, instance_id: str | None,
                 session_timeout_ms: int = 6000, max_poll_interval_ms: int = 20_000,
                 heartbeat_interval_ms: int | None = None, overrides: Mapping[str, Any] | None = None) -> None:
        self.topic = topic
        self._owned: set[int] = set()
        self._changes: list[MembershipChange] = []
        settings: dict[str, Any] = {
            "group.id": group_id,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session_timeout_ms,
            # A running member learns of a rebalance from a heartbeat response, and a dead one's session runs
            # from its last heartbeat: the shards of a SIGKILLed member move session timeout -/+ one interval
            # after the kill. Measured (3 members, 6 s session, 6 kills each): 5.53-6.51 s at 500 ms, 5.58-6.07 s
            # at 100 ms (issue 24 item 10). Many heartbeats per session: one lost does not cost a shard.
            "heartbeat.interval.ms": (heartbeat_interval_ms if heartbeat_interval_ms is not None
                                      else min(HEARTBEAT_INTERVAL_MS, session_timeout_ms // 3)),
            # librdkafka requires it >= the session timeout.
            "max.poll.interval.ms": max(max_poll_interval_ms, session_timeout_ms),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # The group exists for its assignment; its members have no use for the records they fetch.
            "auto.offset.reset": "latest",
            "fetch.max.bytes": 1024 * 1024,
            "queued.max.messages.kbytes": 1024,
        }
        if instance_id is not None:
            settings["group.instance.id"] = instance_id
        self._consumer: Consumer | None = Consumer(
            {**KafkaClientConfig.of(servers).properties(settings, overrides), "logger": librdkafka_logger()})
        self._consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_lost)

    def poll(self) -> list[MembershipChange]:
        """The ownership changes since the last call, in the order they happened (never blocks)."""
        consumer = self._client()
        # consume() serves the rebalance callbacks; fetched records are dropped unread.
        for message in consumer.consume(num_messages=1000, timeout=0):
            error = message.error()
            if error is not None and error.fatal():
                raise KafkaException(error)
        changes, self._changes = self._changes, []
        return changes

    def owned(self) -> frozenset[int]:
        return frozenset(self._owned)

    def close(self) -> None:
        """Leave the group (a dynamic member's partitions move at once; a static member's after its session
        timeout, unless it comes back with the same instance id first)."""
        if self._consumer is None:
            return
        consumer, self._consumer = self._consumer, None
        try:
            consumer.close()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._DESTROY:
                raise
        self._owned.clear()

    def _client(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("membership is closed")
        return self._consumer

    def _mine(self, partitions: list[TopicPartition]) -> frozenset[int]:
        return frozenset(tp.partition for tp in partitions if tp.topic == self.topic)

    # Cooperative protocol: the callbacks carry only what changes, and the assignment must be updated with
    # incremental_assign / incremental_unassign (a plain assign() would replace the whole assignment).
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        added = self._mine(partitions) - self._owned
        self._owned |= added
        if added:
            self._changes.append(SharesAssigned(added))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._unassign(consumer, partitions, SharesRevoked)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._unassign(consumer, partitions, SharesLost)

    def _unassign(self, consumer: Consumer, partitions: list[TopicPartition],
                  change: type[SharesRevoked | SharesLost]) -> None:
        consumer.incremental_unassign(partitions)
        removed = self._mine(partitions) & self._owned
        self._owned -= removed
        if removed:
            self._changes.append(change(removed))
