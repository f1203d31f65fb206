"""Sans-IO NTP server core: datagram in, reply bytes out, per-source samples into the store.

The network shell calls :meth:`Responder.handle` with the datagram, a key for the sender's address
and T2 (reference clock, microseconds), then :meth:`Responder.complete` with T3 read just before
sending.  Nothing here reads a clock, sleeps or touches a socket.

Checks on a request, in order (each failure drops the datagram and bumps one counter):

1. length: 48 <= len <= MAX_DATAGRAM_LEN (``dropped_short`` / ``dropped_long``)
2. per-address rate limit (``dropped_rate_limited``)
3. version 1..4 (``dropped_version``)
4. mode 3, client (``dropped_mode``)
5. non-zero transmit timestamp (``dropped_zero_transmit``)
6. a sync extension, if present, is well-formed (``dropped_bad_extension``)

A request that passes gets a 48-byte reply (never larger than the request: no amplification),
unless it is a report-only datagram.  Its sync extension registers samples only if it passes
authentication when keys are configured (``auth_failed`` otherwise; the time is still served).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from timesync.codec import (
    HEADER_LEN,
    MAX_DATAGRAM_LEN,
    MODE_CLIENT,
    MODE_SERVER,
    TRANSMIT_OFFSET,
    NtpCodecError,
    NtpPacket,
    SyncExtension,
    decode_packet,
    encode_packet,
    find_sync_extension,
    ntp_short_from_us,
    ntp_to_unix_us,
    unix_us_to_ntp,
    verify_mac,
)
from timesync.estimator import ClockEstimator, SyncSample
from timesync.ratelimit import RateLimiter
from timesync.store import SourceInfoStore

__all__ = ["PendingReply", "Responder", "ResponderConfig", "ResponderStats"]

#: Exchanges per source awaiting their T4 report.  A burst is 10 requests; a few more absorb
#: lost reports.  Older entries are forgotten (their report then counts as ``reports_unmatched``).
DEFAULT_PENDING_PER_SOURCE = 32
_TRANSMIT = struct.Struct("!Q")
#: Sources tracked at once; beyond it new source ids are served time but not registered.
DEFAULT_MAX_SOURCES = 10_000


@dataclass(frozen=True, slots=True)
class ResponderConfig:
    stratum: int = 1
    ref_id: bytes = b"XSKW"
    """Reference id; ASCII for stratum 1, "X..." marks an experimental source."""
    precision_log2: int = -20
    root_delay_us: int = 0
    root_dispersion_us: int = 100
    rate_limit_per_s: float = 64.0
    """Sustained requests per second per address; <= 0 disables the limit."""
    rate_limit_burst: int = 128
    keys: Mapping[str, bytes] = field(default_factory=dict)
    """HMAC keys by source id.  When set, only a correctly MAC'ed request registers samples."""
    max_sources: int = DEFAULT_MAX_SOURCES
    pending_per_source: int = DEFAULT_PENDING_PER_SOURCE
    min_version: int = 1
    max_version: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.stratum <= 15:
            raise ValueError("stratum must be in 1..15 (clients reject 0 and 16)")
        if len(self.ref_id) != 4:
            raise ValueError("ref_id must be 4 bytes")


@dataclass(slots=True)
class ResponderStats:
    received: int = 0
    replied: int = 0
    dropped_short: int = 0
    dropped_long: int = 0
    dropped_rate_limited: int = 0
    dropped_version: int = 0
    dropped_mode: int = 0
    dropped_zero_transmit: int = 0
    dropped_bad_extension: int = 0
    auth_failed: int = 0
    sources_over_limit: int = 0
    reports_only: int = 0
    reports_unmatched: int = 0
    samples_registered: int = 0
    samples_rejected: int = 0

    @property
    def dropped(self) -> int:
        return (
            self.dropped_short
            + self.dropped_long
            + self.dropped_rate_limited
            + self.dropped_version
            + self.dropped_mode
            + self.dropped_zero_transmit
            + self.dropped_bad_extension
        )

    def as_dict(self) -> dict[str, int]:
        d = asdict(self)
        d["dropped"] = self.dropped
        return d


@dataclass(frozen=True, slots=True)
class PendingReply:
    """A validated request waiting for its T3."""

    version: int
    poll: int
    origin_ts: int
    t2_us: int
    source_id: str | None
    """Set when the request registered a sync exchange for a source."""


@dataclass(slots=True)
class _SourceState:
    estimator: ClockEstimator
    pending: OrderedDict[int, tuple[int, int, int]]
    """transmit timestamp (raw) -> (t1_us, t2_us, t3_us)."""


EstimatorFactory = Callable[[], ClockEstimator]


class Responder:
    """The server's protocol core.  ``reference_ts_us`` is what the reply's reference timestamp says."""

    def __init__(
        self,
        config: ResponderConfig | None = None,
        store: SourceInfoStore | None = None,
        estimator_factory: EstimatorFactory = ClockEstimator,
    ) -> None:
        self.config = config or ResponderConfig()
        self.store = store if store is not None else SourceInfoStore()
        self.stats = ResponderStats()
        self.reference_ts_us: int | None = None
        self._estimator_factory = estimator_factory
        self._limiter = RateLimiter(self.config.rate_limit_per_s, self.config.rate_limit_burst)
        self._sources: dict[str, _SourceState] = {}
        self._root_delay = ntp_short_from_us(self.config.root_delay_us)
        self._root_dispersion = ntp_short_from_us(self.config.root_dispersion_us)

    def estimator(self, source_id: str) -> ClockEstimator | None:
        state = self._sources.get(source_id)
        return None if state is None else state.estimator

    def forget_source(self, source_id: str) -> None:
        self._sources.pop(source_id, None)
        self.store.remove(source_id)

    # -- request path ----------------------------------------------------------------------------

    def handle(self, data: bytes, addr_key: str, t2_us: int) -> PendingReply | None:
        """Validate a request; None means "send nothing"."""
        st = self.stats
        st.received += 1
        if len(data) < HEADER_LEN:
            st.dropped_short += 1
            return None
        if len(data) > MAX_DATAGRAM_LEN:
            st.dropped_long += 1
            return None
        if not self._limiter.allow(addr_key, t2_us):
            st.dropped_rate_limited += 1
            return None
        try:
            packet = decode_packet(data)
        except NtpCodecError:  # unreachable after the length checks, kept to fail closed
            st.dropped_short += 1
            return None
        if not self.config.min_version <= packet.version <= self.config.max_version:
            st.dropped_version += 1
            return None
        if packet.mode != MODE_CLIENT:
            st.dropped_mode += 1
            return None
        if packet.transmit_ts == 0:
            st.dropped_zero_transmit += 1
            return None
        try:
            ext = find_sync_extension(packet)
        except NtpCodecError:
            st.dropped_bad_extension += 1
            return None

        source_id: str | None = None
        if ext is not None and self._authorized(ext, data):
            source_id = self._register(ext, t2_us)
        if ext is not None and ext.report_only:
            st.reports_only += 1
            return None
        return PendingReply(
            version=packet.version,
            poll=packet.poll,
            origin_ts=packet.transmit_ts,
            t2_us=t2_us,
            source_id=source_id,
        )

    def complete(self, pending: PendingReply, t3_us: int) -> bytes:
        """Encode the reply with T3 and remember the exchange (:meth:`prepare` + :meth:`finalize`)."""
        return self.finalize(pending, self.prepare(pending), t3_us)

    def prepare(self, pending: PendingReply) -> bytearray:
        """The reply with every field but the transmit timestamp, so T3 can be read after encoding."""
        ref_us = self.reference_ts_us if self.reference_ts_us is not None else pending.t2_us
        reply = NtpPacket(
            leap=0,
            version=pending.version,
            mode=MODE_SERVER,
            stratum=self.config.stratum,
            poll=pending.poll,
            precision=self.config.precision_log2,
            root_delay=self._root_delay,
            root_dispersion=self._root_dispersion,
            ref_id=self.config.ref_id,
            ref_ts=unix_us_to_ntp(ref_us),
            origin_ts=pending.origin_ts,
            receive_ts=unix_us_to_ntp(pending.t2_us),
            transmit_ts=0,
        )
        return bytearray(encode_packet(reply))

    def finalize(self, pending: PendingReply, prepared: bytearray, t3_us: int) -> bytes:
        """Stamp T3 into a :meth:`prepare`-d reply and remember the exchange for the source's report."""
        t3_us = max(t3_us, pending.t2_us)  # a clock step between T2 and T3 must not give t3 < t2
        _TRANSMIT.pack_into(prepared, TRANSMIT_OFFSET, unix_us_to_ntp(t3_us))
        if pending.source_id is not None:
            state = self._sources.get(pending.source_id)
            if state is not None:
                state.pending[pending.origin_ts] = (ntp_to_unix_us(pending.origin_ts), pending.t2_us, t3_us)
                while len(state.pending) > self.config.pending_per_source:
                    state.pending.popitem(last=False)
        self.stats.replied += 1
        return bytes(prepared)

    def respond(self, data: bytes, addr_key: str, t2_us: int, t3_us: int) -> bytes | None:
        """:meth:`handle` and :meth:`complete` in one call (tests, fuzzing)."""
        pending = self.handle(data, addr_key, t2_us)
        return None if pending is None else self.complete(pending, t3_us)

    # -- sources ---------------------------------------------------------------------------------

    def _authorized(self, ext: SyncExtension, data: bytes) -> bool:
        keys = self.config.keys
        if not keys:
            return True
        key = keys.get(ext.source_id)
        if key is None or ext.mac is None or not verify_mac(data, key):
            self.stats.auth_failed += 1
            return False
        return True

    def _register(self, ext: SyncExtension, t2_us: int) -> str | None:
        state = self._sources.get(ext.source_id)
        if state is None:
            if len(self._sources) >= self.config.max_sources:
                self.stats.sources_over_limit += 1
                return None
            state = _SourceState(estimator=self._estimator_factory(), pending=OrderedDict())
            self._sources[ext.source_id] = state
        if ext.report_t1_ntp is not None and ext.report_t4_us is not None:
            exchange = state.pending.pop(ext.report_t1_ntp, None)
            if exchange is None:
                self.stats.reports_unmatched += 1
            else:
                t1_us, t2_prev_us, t3_prev_us = exchange
                sample = SyncSample(t1_us, t2_prev_us, t3_prev_us, ext.report_t4_us)
                if state.estimator.add_sample(sample):
                    self.stats.samples_registered += 1
                else:
                    self.stats.samples_rejected += 1
        if ext.end_of_burst:
            state.estimator.end_burst()
        estimate = state.estimator.estimate()
        if estimate is not None and (ext.has_report or ext.end_of_burst):
            self.store.update(ext.source_id, estimate, last_sync_us=t2_us)
        return ext.source_id
