"""Which shard a source belongs to: Kafka's default partitioner rule on the UTF-8 bytes of the source id.

``shard_of(source_id, shards) = (murmur2(source_id.encode()) & 0x7fffffff) % shards``, the rule of Kafka's Java
``DefaultPartitioner`` / ``BuiltInPartitioner.partitionForKey`` (``Utils.toPositive(Utils.murmur2(key)) %
numPartitions``) and of librdkafka's ``murmur2`` and ``murmur2_random`` partitioners. Why this hash and not our
own: a plain Kafka producer keyed by the source id (the Java client, or librdkafka with
``partitioner=murmur2_random``) lands on the same partition as the gateway's shard, so third-party tools agree
with us without a custom partitioner. The rule is part of the deployment contract (docs/wire-protocol.md,
"Shards and routing"): changing it, or S, moves sources between shards.
"""

from __future__ import annotations

import functools

__all__ = ["MURMUR2_SEED", "murmur2", "shard_of"]

# Kafka's Utils.murmur2 constants (seed, multiplier, shift): the hash must match Java's bit for bit.
MURMUR2_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF
# The gateway asks for a source's shard on every frame it reads; the hash in Python is a few microseconds, the
# cache's hit a fraction of one. Bounded: a flood of new source ids evicts entries, which only costs the hash again.
SHARD_CACHE_ENTRIES = 4096


def murmur2(data: bytes) -> int:
    """MurmurHash2 (32-bit) of ``data`` as Kafka's ``Utils.murmur2`` computes it: a signed 32-bit int, like Java's.

    Java's ``int`` arithmetic wraps at 32 bits; here every product is masked to 32 bits instead, and the result is
    read back as signed at the end, so ``>>>`` (Java's unsigned shift) is a plain ``>>`` on the unsigned value.
    """
    length = len(data)
    h = (MURMUR2_SEED ^ length) & _MASK32
    whole = length - length % 4
    for i in range(0, whole, 4):
        # Little-endian 4-byte words, as Java assembles them from (data[i] & 0xff) + ... << 24.
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length % 4
    # Java's switch falls through: 3 mixes bytes 2, 1 and 0; 2 mixes 1 and 0; 1 mixes 0; then one multiply.
    if tail >= 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def shard_of(source_id: str, shards: int) -> int:
    """The shard (0 .. shards-1) of ``source_id`` among ``shards``: Kafka's partition for that key.

    ``& 0x7fffffff`` is Kafka's ``Utils.toPositive``: it clears the sign bit rather than taking ``abs`` (which
    would overflow on Java's ``Integer.MIN_VALUE``), so the result matches Java for every hash.
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    return _shard_of(source_id, shards)


@functools.lru_cache(maxsize=SHARD_CACHE_ENTRIES)
def _shard_of(source_id: str, shards: int) -> int:
    return (murmur2(source_id.encode("utf-8")) & 0x7FFFFFFF) % shards
