"""NTPv4 packet codec and the Skewless sync extension field.  Pure functions over bytes.

Wire format (RFC 5905 section 7.3): a 48-byte header, optionally followed by extension fields
(RFC 7822: 16-bit type, 16-bit length incl. the 4-byte field header, value padded to a multiple
of 4 bytes, at least 16 bytes long).

Source identification
---------------------
A Skewless source sends, after the standard header, one extension field of type
:data:`SYNC_EXTENSION_TYPE` (from the range RFC 7822 leaves unassigned) with this value::

    0   u8   extension version (1)
    1   u8   flags: 1 = carries a report, 2 = end of burst, 4 = report only (send no reply),
                    8 = carries a MAC
    2   u8   length of the source id in bytes (1..64, UTF-8)
    3   u8   reserved, 0
    4   u64  report: the transmit timestamp (raw NTP 64-bit) of the source's previous request
    12  i64  report: T4 of that exchange, source clock, Unix microseconds
    20  ...  source id, zero-padded to a multiple of 4
    ..  16   HMAC-SHA256 of every datagram byte before it, truncated to 16 bytes (flag 8 only)

The server never learns T4 from a plain NTP exchange; the report in the *next* request (or in a
final report-only datagram) closes the previous exchange, so the server can compute Eq. 3.12 and
3.13 itself.  The MAC, when present, must be the last 16 bytes of the datagram.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

__all__ = [
    "HEADER_LEN",
    "MAX_DATAGRAM_LEN",
    "MAX_SOURCE_ID_LEN",
    "MODE_CLIENT",
    "MODE_SERVER",
    "NTP_UNIX_EPOCH_DELTA_S",
    "SYNC_EXTENSION_TYPE",
    "TRANSMIT_OFFSET",
    "NtpCodecError",
    "NtpPacket",
    "SyncExtension",
    "compute_mac",
    "decode_packet",
    "decode_sync_extension",
    "encode_packet",
    "encode_request",
    "encode_unsigned_request",
    "find_sync_extension",
    "iter_extension_fields",
    "ntp_short_from_us",
    "ntp_to_unix_us",
    "stamp_transmit",
    "unix_us_to_ntp",
    "us_from_ntp_short",
]

HEADER_LEN = 48
#: Byte offset of the transmit timestamp in the header (stamped last, see Responder.prepare).
TRANSMIT_OFFSET = 40
#: Longest datagram the server parses.  Real requests are 48 bytes, 68/72 with a symmetric-key MAC
#: and up to about 1 KiB with NTS cookies; anything longer is not an NTP request.
MAX_DATAGRAM_LEN = 1024
MAX_SOURCE_ID_LEN = 64
MAC_LEN = 16
#: Extension field type of the Skewless sync field (unassigned in the IANA NTP registry).
SYNC_EXTENSION_TYPE = 0x5EC5
SYNC_EXTENSION_VERSION = 1
FLAG_REPORT = 0x01
FLAG_END_OF_BURST = 0x02
FLAG_REPORT_ONLY = 0x04
FLAG_MAC = 0x08
_KNOWN_FLAGS = FLAG_REPORT | FLAG_END_OF_BURST | FLAG_REPORT_ONLY | FLAG_MAC

MODE_SYMMETRIC_ACTIVE = 1
MODE_CLIENT = 3
MODE_SERVER = 4
MODE_BROADCAST = 5

#: Seconds from 1900-01-01 (NTP era 0) to 1970-01-01.
NTP_UNIX_EPOCH_DELTA_S = 2_208_988_800
_ERA_S = 1 << 32
_FRAC = 1 << 32
_US_PER_S = 1_000_000

_HEADER = struct.Struct("!BBbbII4sQQQQ")
_EXT_HEADER = struct.Struct("!HH")
_SYNC_FIXED = struct.Struct("!BBBBQq")


def _check_layout() -> None:
    # Asserted once at import, as chrony's do_size_checks(): the layout must never drift.
    assert _HEADER.size == HEADER_LEN
    assert _SYNC_FIXED.size == 20
    assert _HEADER.size - 8 == TRANSMIT_OFFSET


_check_layout()


class NtpCodecError(ValueError):
    """The bytes are not a packet this codec understands.  The only exception decoding raises."""


# -- timestamps ---------------------------------------------------------------------------------


def unix_us_to_ntp(unix_us: int, low_bits: int = 0) -> int:
    """Unix microseconds -> NTP 32.32 fixed point (era wrap-around modulo 2**32 seconds).

    ``low_bits`` (< 2048, i.e. below half a microsecond) randomises the fraction the way chrony does
    so that replies cannot be predicted; :func:`ntp_to_unix_us` still gives back ``unix_us``.
    """
    if not 0 <= low_bits < 2048:
        raise ValueError("low_bits must be in [0, 2048)")
    seconds, micros = divmod(unix_us, _US_PER_S)
    frac = (micros * _FRAC) // _US_PER_S + low_bits
    return (((seconds + NTP_UNIX_EPOCH_DELTA_S) % _ERA_S) << 32) | frac


def ntp_to_unix_us(ntp: int) -> int:
    """NTP 32.32 -> Unix microseconds (rounded).  Seconds below 2**31 are taken as era 1 (>= 2036)."""
    seconds = ntp >> 32
    frac = ntp & 0xFFFFFFFF
    if seconds < (1 << 31):
        seconds += _ERA_S
    micros = (frac * _US_PER_S + (1 << 31)) >> 32
    return (seconds - NTP_UNIX_EPOCH_DELTA_S) * _US_PER_S + micros


def ntp_short_from_us(us: int) -> int:
    """Non-negative microseconds -> NTP 16.16 short format (saturating)."""
    return min(max((us * 65_536) // _US_PER_S, 0), 0xFFFFFFFF)


def us_from_ntp_short(short: int) -> int:
    return (short * _US_PER_S) >> 16


# -- header -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NtpPacket:
    """The 48-byte NTP header, timestamps kept raw (64-bit ints) so they can be echoed bit for bit."""

    leap: int = 0
    version: int = 4
    mode: int = MODE_CLIENT
    stratum: int = 0
    poll: int = 0
    precision: int = 0
    root_delay: int = 0
    """16.16 seconds, raw."""
    root_dispersion: int = 0
    """16.16 seconds, raw."""
    ref_id: bytes = b"\x00\x00\x00\x00"
    ref_ts: int = 0
    origin_ts: int = 0
    receive_ts: int = 0
    transmit_ts: int = 0
    extensions: bytes = b""
    """Everything after the 48-byte header (extension fields, MAC or garbage), unparsed."""


def encode_packet(packet: NtpPacket) -> bytes:
    if not (0 <= packet.leap <= 3 and 0 <= packet.version <= 7 and 0 <= packet.mode <= 7):
        raise NtpCodecError("leap/version/mode out of range")
    if len(packet.ref_id) != 4:
        raise NtpCodecError("ref_id must be 4 bytes")
    try:
        header = _HEADER.pack(
            (packet.leap << 6) | (packet.version << 3) | packet.mode,
            packet.stratum,
            packet.poll,
            packet.precision,
            packet.root_delay,
            packet.root_dispersion,
            packet.ref_id,
            packet.ref_ts,
            packet.origin_ts,
            packet.receive_ts,
            packet.transmit_ts,
        )
    except struct.error as exc:
        raise NtpCodecError(f"field out of range: {exc}") from None
    return header + packet.extensions


def decode_packet(data: bytes) -> NtpPacket:
    """Parse one datagram.  Raises :class:`NtpCodecError` and nothing else."""
    if len(data) < HEADER_LEN:
        raise NtpCodecError(f"short datagram: {len(data)} < {HEADER_LEN} bytes")
    if len(data) > MAX_DATAGRAM_LEN:
        raise NtpCodecError(f"long datagram: {len(data)} > {MAX_DATAGRAM_LEN} bytes")
    (lvm, stratum, poll, precision, root_delay, root_disp, ref_id, ref_ts, org, rec, xmt) = (
        _HEADER.unpack_from(data)
    )
    return NtpPacket(
        leap=lvm >> 6,
        version=(lvm >> 3) & 0x7,
        mode=lvm & 0x7,
        stratum=stratum,
        poll=poll,
        precision=precision,
        root_delay=root_delay,
        root_dispersion=root_disp,
        ref_id=ref_id,
        ref_ts=ref_ts,
        origin_ts=org,
        receive_ts=rec,
        transmit_ts=xmt,
        extensions=bytes(data[HEADER_LEN:]),
    )


def iter_extension_fields(trailer: bytes) -> list[tuple[int, int, bytes]]:
    """Split the bytes after the header into ``(offset, type, value)`` extension fields.

    Raises :class:`NtpCodecError` if the trailer is not a well-formed sequence of fields (it may
    then be a legacy MAC or garbage; the caller decides what that means).
    """
    fields: list[tuple[int, int, bytes]] = []
    pos = 0
    while pos < len(trailer):
        if len(trailer) - pos < _EXT_HEADER.size:
            raise NtpCodecError("truncated extension field header")
        ftype, flen = _EXT_HEADER.unpack_from(trailer, pos)
        if flen < 16 or flen % 4 != 0 or pos + flen > len(trailer):
            raise NtpCodecError(f"bad extension field length {flen}")
        fields.append((pos, ftype, bytes(trailer[pos + 4 : pos + flen])))
        pos += flen
    return fields


# -- sync extension -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncExtension:
    """Skewless' per-source data carried in a client request."""

    source_id: str
    report_t1_ntp: int | None = None
    """Raw transmit timestamp of the previous request being reported (its T1)."""
    report_t4_us: int | None = None
    """T4 of that exchange: source clock, Unix microseconds."""
    end_of_burst: bool = False
    report_only: bool = False
    mac: bytes | None = None
    """Truncated HMAC-SHA256; filled in by :func:`encode_request` when a key is given."""

    @property
    def has_report(self) -> bool:
        return self.report_t1_ntp is not None and self.report_t4_us is not None


def _source_id_bytes(source_id: str) -> bytes:
    raw = source_id.encode("utf-8")
    if not 1 <= len(raw) <= MAX_SOURCE_ID_LEN:
        raise NtpCodecError(f"source id must be 1..{MAX_SOURCE_ID_LEN} UTF-8 bytes")
    if not source_id.isprintable():
        raise NtpCodecError("source id must be printable")
    return raw


def _encode_sync_extension(ext: SyncExtension, with_mac: bool) -> bytes:
    sid = _source_id_bytes(ext.source_id)
    flags = 0
    if ext.has_report:
        flags |= FLAG_REPORT
    if ext.end_of_burst:
        flags |= FLAG_END_OF_BURST
    if ext.report_only:
        flags |= FLAG_REPORT_ONLY
    if with_mac:
        flags |= FLAG_MAC
    try:
        fixed = _SYNC_FIXED.pack(
            SYNC_EXTENSION_VERSION,
            flags,
            len(sid),
            0,
            ext.report_t1_ntp or 0,
            ext.report_t4_us or 0,
        )
    except struct.error as exc:
        raise NtpCodecError(f"report out of range: {exc}") from None
    body = fixed + sid + b"\x00" * (-len(sid) % 4)
    total = _EXT_HEADER.size + len(body) + (MAC_LEN if with_mac else 0)
    return _EXT_HEADER.pack(SYNC_EXTENSION_TYPE, total) + body


def decode_sync_extension(value: bytes) -> SyncExtension:
    """Parse the value of a :data:`SYNC_EXTENSION_TYPE` field.  Raises :class:`NtpCodecError`."""
    if len(value) < _SYNC_FIXED.size + 4:
        raise NtpCodecError("sync extension too short")
    version, flags, sid_len, reserved, t1_ntp, t4_us = _SYNC_FIXED.unpack_from(value)
    if version != SYNC_EXTENSION_VERSION:
        raise NtpCodecError(f"unknown sync extension version {version}")
    if flags & ~_KNOWN_FLAGS or reserved != 0:
        raise NtpCodecError("unknown sync extension flags")
    if not 1 <= sid_len <= MAX_SOURCE_ID_LEN:
        raise NtpCodecError("bad source id length")
    padded = sid_len + (-sid_len % 4)
    mac_len = MAC_LEN if flags & FLAG_MAC else 0
    if len(value) != _SYNC_FIXED.size + padded + mac_len:
        raise NtpCodecError("sync extension length does not match its contents")
    sid_raw = value[_SYNC_FIXED.size : _SYNC_FIXED.size + sid_len]
    if any(value[_SYNC_FIXED.size + sid_len : _SYNC_FIXED.size + padded]):
        raise NtpCodecError("non-zero source id padding")
    try:
        source_id = sid_raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NtpCodecError("source id is not UTF-8") from None
    if not source_id.isprintable():
        raise NtpCodecError("source id is not printable")
    has_report = bool(flags & FLAG_REPORT)
    if not has_report and (t1_ntp or t4_us):
        raise NtpCodecError("report fields set without the report flag")
    return SyncExtension(
        source_id=source_id,
        report_t1_ntp=t1_ntp if has_report else None,
        report_t4_us=t4_us if has_report else None,
        end_of_burst=bool(flags & FLAG_END_OF_BURST),
        report_only=bool(flags & FLAG_REPORT_ONLY),
        mac=bytes(value[-MAC_LEN:]) if mac_len else None,
    )


def find_sync_extension(packet: NtpPacket) -> SyncExtension | None:
    """The sync extension of a request, None if it carries none.

    Raises :class:`NtpCodecError` if a sync field is present but malformed, or is not the last
    field while carrying a MAC.  A trailer that is not a sequence of extension fields at all (a
    legacy MAC, NTS, garbage) yields None: such a request still gets plain NTP service.
    """
    if not packet.extensions:
        return None
    try:
        fields = iter_extension_fields(packet.extensions)
    except NtpCodecError:
        return None
    found: SyncExtension | None = None
    for index, (_, ftype, value) in enumerate(fields):
        if ftype != SYNC_EXTENSION_TYPE:
            continue
        if found is not None:
            raise NtpCodecError("duplicate sync extension")
        found = decode_sync_extension(value)
        if found.mac is not None and index != len(fields) - 1:
            raise NtpCodecError("a sync extension with a MAC must be the last field")
    return found


def compute_mac(key: bytes, signed: bytes) -> bytes:
    return hmac.new(key, signed, hashlib.sha256).digest()[:MAC_LEN]


def verify_mac(datagram: bytes, key: bytes) -> bool:
    """True if the datagram's last 16 bytes are the MAC of everything before them under ``key``."""
    if len(datagram) < HEADER_LEN + MAC_LEN:
        return False
    return hmac.compare_digest(compute_mac(key, datagram[:-MAC_LEN]), datagram[-MAC_LEN:])


def stamp_transmit(unsigned: bytes | bytearray, transmit_ts: int, key: bytes | None = None) -> bytes:
    """Write the transmit timestamp into an encoded request (and MAC it): T1 is read last."""
    buf = bytearray(unsigned)
    struct.pack_into("!Q", buf, TRANSMIT_OFFSET, transmit_ts)
    if key is None:
        return bytes(buf)
    return bytes(buf) + compute_mac(key, bytes(buf))


def encode_unsigned_request(header: NtpPacket, ext: SyncExtension | None, with_mac: bool) -> bytes:
    """A request without its MAC (the MAC flag is set when ``with_mac``); see :func:`stamp_transmit`."""
    if ext is None:
        if with_mac:
            raise NtpCodecError("a MAC needs a sync extension")
        return encode_packet(header)
    return encode_packet(header) + _encode_sync_extension(ext, with_mac)


def encode_request(header: NtpPacket, ext: SyncExtension | None = None, key: bytes | None = None) -> bytes:
    """A client request: header plus, optionally, the sync extension (MAC'ed if ``key`` is given)."""
    if ext is None:
        if key is not None:
            raise NtpCodecError("a MAC needs a sync extension")
        return encode_packet(header)
    with_mac = key is not None
    unsigned = encode_packet(header) + _encode_sync_extension(ext, with_mac)
    if key is None:
        return unsigned
    return unsigned + compute_mac(key, unsigned)
