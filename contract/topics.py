"""Topic names of the Kafka record contract (docs/record-contract.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "skewless"
# Kafka topic names allow [a-zA-Z0-9._-] up to 249 chars; a stream name becomes part of one.
_STREAM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


class InvalidStreamName(ValueError):
    pass


def validate_stream_name(stream: str) -> str:
    if not _STREAM_NAME.fullmatch(stream):
        raise InvalidStreamName(f"stream name {stream!r} must match {_STREAM_NAME.pattern}")
    return stream


@dataclass(frozen=True)
class TopicNames:
    prefix: str = DEFAULT_PREFIX

    def events(self, stream: str) -> str:
        return f"{self.prefix}.events.{validate_stream_name(stream)}"

    def late(self, stream: str) -> str:
        return f"{self.prefix}.late.{validate_stream_name(stream)}"

    @property
    def sources(self) -> str:
        return f"{self.prefix}.sources"

    @property
    def cluster(self) -> str:
        """The compacted control topic: partition 0 holds the cluster record, partition k the owner of shard k."""
        return f"{self.prefix}.cluster"

    @property
    def gateway_group(self) -> str:
        """The consumer group whose members are the cluster's gateways (it assigns the control topic's
        partitions, i.e. the shards)."""
        return f"{self.prefix}.gateways"

    def results(self, job: str) -> str:
        return f"{self.prefix}.results.{validate_stream_name(job)}"

    @property
    def events_pattern(self) -> str:
        """Java regex (Spark subscribePattern) matching every ordered-stream topic."""
        return re.escape(self.prefix) + r"\.events\..+"

    @property
    def events_and_late_pattern(self) -> str:
        """Java regex matching every events topic and every late topic (what the Spark jobs read)."""
        return re.escape(self.prefix) + r"\.(events|late)\..+"
