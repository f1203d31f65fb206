"""Key groups (Flink's model): the partitioning key a query implies, and a stable key -> key group routing.

A query whose events only ever combine within equal values of one attribute can run as G independent parts: each
part (a key group) holds the state of the keys routed to it, and a key's events all reach the same part. The key
is read from the query, never guessed:

* a SASE sequence query: the equality class of its WHERE that names one attribute per element (``a.id = b.id =
  c.id``), exactly the class the engine partitions its AIS by (``Query.partition_attributes``);
* an ISEQ query: the equality class of its WHERE that names one attribute per element, the same way (an
  interval's attributes are its payload; a level interval made from a source's readings carries ``source``);
* a pattern: its ``PARTITION BY`` path.

A query without such a key has none (``None``): it runs as one group.

The routing is a CRC-32 of the key's text modulo G: it does not depend on Python's per-process hash seed, and
Spark's ``crc32`` function computes the same number in the JVM (the Spark jobs route in a Python stage,
``spark_jobs.key_routing``, with the numbers their earlier JVM routing gave).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from cep.intervals.query import IntervalQuery
from cep.patterns import PatternSpec
from cep.query_ast import equality_key_attributes
from cep.sase.query import Query

__all__ = ["EqualityKey", "iseq_partition_key", "key_group", "pattern_partition_key", "sequence_partition_key"]


@dataclass(frozen=True)
class EqualityKey:
    """Where a query's equality key is in an event: the attribute per event type of the query."""

    attribute_of_type: dict[str, str]
    """Event type -> the attribute of the equality class (every element of the query has one)."""

    @property
    def trace_attribute(self) -> str | None:
        """The attribute of an event whose type is not in the query, as the engine's constraint monitor reads its
        trace (``SequenceEngine.trace_key``): the class's attribute when every type uses the same one, else None
        (such an event has no key; the engine only counts it as ignored)."""
        names = set(self.attribute_of_type.values())
        return next(iter(names)) if len(names) == 1 else None

    def attribute(self, event_type: str) -> str | None:
        """The attribute holding an event's key (None: the event has none)."""
        return self.attribute_of_type.get(event_type, self.trace_attribute)


def sequence_partition_key(query: Query) -> EqualityKey | None:
    """The key of a SASE sequence query: the equality class of its WHERE that covers every element with one
    attribute per event type, or None when the equalities do not connect every element."""
    if not query.partition_attributes:
        return None
    return EqualityKey(dict(query.partition_attributes))


def iseq_partition_key(query: IntervalQuery) -> EqualityKey | None:
    """The key of an ISEQ query: the equality class of its WHERE that covers every element, negated ones
    included, with one attribute per event type (``a.id = b.id AND b.id = d.id``), or None.  With it, a result
    and every interval that can negate it share the key's value (a missing attribute makes a condition false)."""
    attributes = equality_key_attributes(query.elements, query.predicates)
    return EqualityKey(attributes) if attributes else None


def pattern_partition_key(spec: PatternSpec) -> tuple[str, ...] | None:
    """The key of a pattern: its ``PARTITION BY`` path in the payload (``a.b`` -> ``("a", "b")``), or None."""
    if not spec.partition_by:
        return None
    return tuple(spec.partition_by.split("."))


def key_group(key_text: str, groups: int) -> int:
    """The key group, in ``[0, groups)``, of a key given as text: CRC-32 of its UTF-8 bytes modulo ``groups``
    (Spark: ``pmod(crc32(cast(text as binary)), groups)``)."""
    if groups < 1:
        raise ValueError(f"key groups must be at least 1, got {groups}")
    return zlib.crc32(key_text.encode()) % groups
