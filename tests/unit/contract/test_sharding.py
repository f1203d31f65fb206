"""contract.sharding: Kafka's murmur2 bit for bit, and shard_of = Kafka's default partition for the source id."""

from __future__ import annotations

import pytest

from contract.sharding import murmur2, shard_of

# Kafka's own test vectors for Utils.murmur2: apache/kafka, clients/src/test/java/org/apache/kafka/common/utils/
# UtilsTest.java, testMurmur2 (commit f55581dc73953c3509a4702433aeeeddc2970779). Java ints, hence the signs.
KAFKA_MURMUR2_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]
# librdkafka's vectors for rd_murmur2 (the murmur2 / murmur2_random partitioners), checked there against Java's
# output: confluentinc/librdkafka, src/rdmurmur2.c, unittest_murmur2 (java_murmur2_results, unsigned hex there).
# They add the 1-byte tail and the empty key the Kafka vectors lack.
LIBRDKAFKA_MURMUR2_VECTORS = [
    (b"kafka", 0xD067CF64),
    (b"giberish123456789", 0x8F552B0C),
    (b"1234", 0x9FC97B14),
    (b"234", 0xE7C009CA),
    (b"34", 0x873930DA),
    (b"4", 0x5A4B5CA1),
    (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 0x78424F1C),
    (b"reAmbleWillBeRemoved,ThePrePartThatIs", 0x4A62B377),
    (b"eAmbleWillBeRemoved,ThePrePartThatIs", 0xE0E4E09E),
    (b"AmbleWillBeRemoved,ThePrePartThatIs", 0x62B8B43F),
    (b"", 0x106E08D9),
]


@pytest.mark.parametrize(("data", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_utils_murmur2(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected_unsigned"), LIBRDKAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_librdkafka(data: bytes, expected_unsigned: int) -> None:
    # The same 32 bits; Java (and this function) read them as a signed int.
    assert murmur2(data) & 0xFFFFFFFF == expected_unsigned
    assert murmur2(data) == (expected_unsigned - (1 << 32) if expected_unsigned >= 1 << 31 else expected_unsigned)


def test_the_vectors_cover_every_tail_length_and_both_signs() -> None:
    # A vector set that missed a tail length (len % 4) would let a wrong fall-through pass.
    signed = [(data, v - (1 << 32) if v >= 1 << 31 else v) for data, v in LIBRDKAFKA_MURMUR2_VECTORS]
    vectors = [*KAFKA_MURMUR2_VECTORS, *signed]
    assert {len(data) % 4 for data, _ in vectors} == {0, 1, 2, 3}
    assert {expected < 0 for _, expected in vectors} == {True, False}


def test_murmur2_is_a_signed_32_bit_int() -> None:
    for n in range(200):
        value = murmur2(f"sensor-{n}".encode())
        assert -(2**31) <= value < 2**31


def test_shard_of_is_kafkas_partition_for_the_key() -> None:
    # (murmur2 & 0x7fffffff) % S, worked by hand from the vectors: "21" -> -973932308 & 0x7fffffff = 1173551340.
    assert -973932308 & 0x7FFFFFFF == 1173551340
    assert shard_of("21", 7) == 1173551340 % 7 == 3
    assert shard_of("foobar", 12) == (-790332482 & 0x7FFFFFFF) % 12 == 6
    assert shard_of("abc", 4) == 479470107 % 4 == 3


def test_shard_of_hashes_the_utf8_bytes() -> None:
    source_id = "capteur-é-温度"
    assert shard_of(source_id, 1000) == (murmur2(source_id.encode("utf-8")) & 0x7FFFFFFF) % 1000
    assert murmur2(source_id.encode("utf-8")) != murmur2(source_id.encode("utf-16-le"))


def test_shard_of_is_stable_and_in_range() -> None:
    for shards in (1, 2, 3, 16, 97):
        seen = set()
        for n in range(500):
            shard = shard_of(f"sensor-{n}", shards)
            assert 0 <= shard < shards
            assert shard_of(f"sensor-{n}", shards) == shard
            seen.add(shard)
        # 500 ids spread over every shard of a small deployment (a constant or biased hash would not).
        assert seen == set(range(shards)) or (shards == 97 and len(seen) > 90)
    assert {shard_of(f"s{n}", 1) for n in range(50)} == {0}


@pytest.mark.parametrize("shards", [0, -1, True, 2.0])
def test_shard_of_refuses_a_deployment_without_shards(shards: object) -> None:
    with pytest.raises(ValueError, match="shards must be an integer >= 1"):
        shard_of("s1", shards)  # type: ignore[arg-type]


def test_the_shard_cache_is_bounded_and_gives_the_hash_s_answer() -> None:
    from contract.sharding import SHARD_CACHE_ENTRIES, _shard_of

    ids = [f"flood-{n}" for n in range(SHARD_CACHE_ENTRIES + 500)]
    shards = [shard_of(source_id, 7) for source_id in ids]
    assert _shard_of.cache_info().currsize <= SHARD_CACHE_ENTRIES
    assert shards == [(murmur2(source_id.encode()) & 0x7FFFFFFF) % 7 for source_id in ids]
    assert shard_of(ids[0], 7) == shards[0]  # evicted, computed again
