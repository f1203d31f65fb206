"""Codec tests: round trip whole / byte by byte / with trailing data, timestamps, hypothesis fuzz."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timesync.codec import (
    HEADER_LEN,
    MAX_DATAGRAM_LEN,
    SYNC_EXTENSION_TYPE,
    NtpCodecError,
    NtpPacket,
    SyncExtension,
    decode_packet,
    decode_sync_extension,
    encode_packet,
    encode_request,
    find_sync_extension,
    iter_extension_fields,
    ntp_short_from_us,
    ntp_to_unix_us,
    unix_us_to_ntp,
    us_from_ntp_short,
    verify_mac,
)

SAMPLE = NtpPacket(
    leap=0,
    version=4,
    mode=4,
    stratum=1,
    poll=6,
    precision=-20,
    root_delay=0x00000010,
    root_dispersion=0x00000123,
    ref_id=b"XSKW",
    ref_ts=0xE9000000_00000000,
    origin_ts=0xE9000001_12345678,
    receive_ts=0xE9000002_9ABCDEF0,
    transmit_ts=0xE9000003_0FEDCBA9,
)


def test_round_trip_whole() -> None:
    data = encode_packet(SAMPLE)
    assert len(data) == HEADER_LEN
    assert data[0] == 0b00_100_100
    assert decode_packet(data) == SAMPLE


def test_every_truncation_raises() -> None:
    data = encode_packet(SAMPLE)
    for n in range(HEADER_LEN):
        with pytest.raises(NtpCodecError):
            decode_packet(data[:n])


def test_byte_by_byte_reassembly_only_completes_at_48() -> None:
    data = encode_packet(SAMPLE)
    buf = b""
    parsed = None
    for i in range(len(data)):
        buf += data[i : i + 1]
        try:
            parsed = decode_packet(buf)
        except NtpCodecError:
            assert len(buf) < HEADER_LEN
    assert parsed == SAMPLE


def test_trailing_data_is_kept_unparsed() -> None:
    trailer = b"\x01\x02\x03garbage" * 3
    pkt = decode_packet(encode_packet(SAMPLE) + trailer)
    assert pkt.extensions == trailer
    assert pkt == NtpPacket(**{**_fields(SAMPLE), "extensions": trailer})
    # Garbage after the header is not a sync extension.
    assert find_sync_extension(pkt) is None


def _fields(p: NtpPacket) -> dict[str, object]:
    return {name: getattr(p, name) for name in NtpPacket.__slots__}


def test_too_long_is_rejected() -> None:
    with pytest.raises(NtpCodecError):
        decode_packet(b"\x23" + bytes(MAX_DATAGRAM_LEN))


def test_unix_ntp_timestamps() -> None:
    assert unix_us_to_ntp(0) == 2_208_988_800 << 32
    assert ntp_to_unix_us(2_208_988_800 << 32) == 0
    half = unix_us_to_ntp(1_500_000)
    assert half & 0xFFFFFFFF == 1 << 31
    # Era 1 (after 2036-02-07) wraps the seconds and still decodes.
    t_2040 = 2_219_000_000 * 1_000_000  # 2040-04-26, NTP seconds past 2**32
    assert ntp_to_unix_us(unix_us_to_ntp(t_2040)) == t_2040


@given(st.integers(min_value=-2_000_000_000 * 1_000_000, max_value=4_000_000_000 * 1_000_000),
       st.integers(min_value=0, max_value=2047))
def test_timestamp_round_trip_exact_with_random_low_bits(us: int, low: int) -> None:
    # Within NTP's 136-year window around 1968..2104 the microsecond survives the round trip.
    if not -2_208_988_800 * 1_000_000 + 2**31 * 1_000_000 <= us < (2**32 + 2**31 - 2_208_988_800) * 1_000_000:
        return
    assert ntp_to_unix_us(unix_us_to_ntp(us, low)) == us


def test_short_format() -> None:
    assert ntp_short_from_us(1_000_000) == 65_536
    assert us_from_ntp_short(65_536) == 1_000_000
    assert ntp_short_from_us(-5) == 0


def test_sync_extension_round_trip_and_mac() -> None:
    ext = SyncExtension(source_id="sensor-ü1", report_t1_ntp=123456789, report_t4_us=-42, end_of_burst=True)
    header = NtpPacket(version=4, mode=3, transmit_ts=0xE9000003_0FEDCBA9)
    plain = encode_request(header, ext)
    assert len(plain) % 4 == 0
    pkt = decode_packet(plain)
    fields = iter_extension_fields(pkt.extensions)
    assert [f[1] for f in fields] == [SYNC_EXTENSION_TYPE]
    assert find_sync_extension(pkt) == ext
    signed = encode_request(header, ext, key=b"k" * 32)
    got = find_sync_extension(decode_packet(signed))
    assert got is not None and got.mac is not None
    assert got.source_id == ext.source_id and got.report_t4_us == -42
    assert verify_mac(signed, b"k" * 32)
    assert not verify_mac(signed, b"x" * 32)
    tampered = bytearray(signed)
    tampered[40] ^= 1
    assert not verify_mac(bytes(tampered), b"k" * 32)


def test_sync_extension_rejects_bad_values() -> None:
    with pytest.raises(NtpCodecError):
        encode_request(NtpPacket(transmit_ts=1), SyncExtension(source_id=""))
    with pytest.raises(NtpCodecError):
        encode_request(NtpPacket(transmit_ts=1), SyncExtension(source_id="x" * 65))
    with pytest.raises(NtpCodecError):
        encode_request(NtpPacket(transmit_ts=1), SyncExtension(source_id="bad\nid"))
    good = encode_request(NtpPacket(transmit_ts=1), SyncExtension(source_id="abc"))
    value = good[HEADER_LEN + 4 :]
    assert decode_sync_extension(value).source_id == "abc"
    for i in range(len(value)):
        with pytest.raises(NtpCodecError):
            decode_sync_extension(value[:i])
    bad_version = b"\x02" + value[1:]
    with pytest.raises(NtpCodecError):
        decode_sync_extension(bad_version)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=MAX_DATAGRAM_LEN + 8))
def test_fuzz_decode_parses_or_raises_codec_error(data: bytes) -> None:
    try:
        pkt = decode_packet(data)
    except NtpCodecError:
        return
    assert HEADER_LEN <= len(data) <= MAX_DATAGRAM_LEN
    with contextlib.suppress(NtpCodecError):
        find_sync_extension(pkt)
    # Re-encoding reproduces the input exactly.
    assert encode_packet(pkt) == data


@settings(max_examples=300, deadline=None)
@given(
    st.binary(min_size=HEADER_LEN, max_size=HEADER_LEN),
    st.binary(max_size=200),
    st.integers(min_value=0, max_value=0xFFFF),
)
def test_fuzz_extension_fields(header: bytes, value: bytes, length: int) -> None:
    trailer = SYNC_EXTENSION_TYPE.to_bytes(2, "big") + length.to_bytes(2, "big") + value
    try:
        pkt = decode_packet(header + trailer)
    except NtpCodecError:
        return
    try:
        ext = find_sync_extension(pkt)
    except NtpCodecError:
        return
    if ext is not None:
        assert 1 <= len(ext.source_id.encode()) <= 64


def test_stamping_transmit_after_encoding_matches_direct_encoding() -> None:
    from timesync.codec import encode_unsigned_request, stamp_transmit

    ext = SyncExtension(source_id="s1", report_t1_ntp=7, report_t4_us=9)
    header = NtpPacket(version=4, mode=3, transmit_ts=0)
    direct = encode_request(NtpPacket(version=4, mode=3, transmit_ts=0xABCDEF), ext, key=b"k")
    stamped = stamp_transmit(encode_unsigned_request(header, ext, with_mac=True), 0xABCDEF, key=b"k")
    assert stamped == direct
    assert verify_mac(stamped, b"k")
    assert stamp_transmit(encode_packet(header), 5) == encode_packet(NtpPacket(version=4, mode=3, transmit_ts=5))
