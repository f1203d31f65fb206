"""Sans-IO client side of a sync exchange: request bytes out, reply bytes in, samples out.

Usage (any transport)::

    ex = ClientExchange("sensor-1", clock_us=my_source_clock)
    for _ in range(10):
        sock.send(ex.build_request())
        sample = ex.handle_reply(sock.recv(2048))   # None if the reply was not acceptable
    sock.send(ex.build_report())                    # hands the last T4 to the server, ends the burst
    estimate = ex.estimate()

The source clock is injected (``clock_us() -> int``, Unix microseconds as the source sees them), so
tests and demos can run a clock with any offset or skew.  Every request carries the previous
exchange's T4 in the sync extension, so the server can compute the same samples on its side.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from timesync.clocks import ClockUs
from timesync.codec import (
    MODE_SERVER,
    NtpCodecError,
    NtpPacket,
    SyncExtension,
    decode_packet,
    encode_request,
    encode_unsigned_request,
    ntp_to_unix_us,
    stamp_transmit,
    unix_us_to_ntp,
)
from timesync.estimator import ClockEstimate, ClockEstimator, SyncSample

__all__ = ["ClientExchange", "ClientStats", "ReplyRejected"]



class ReplyRejected(Exception):
    """Why a reply was not used (kept on ``ClientExchange.last_rejection``)."""


@dataclass(slots=True)
class ClientStats:
    requests: int = 0
    replies_accepted: int = 0
    replies_rejected: int = 0
    timeouts: int = 0
    reports: int = 0


@dataclass(frozen=True, slots=True)
class _Outstanding:
    transmit_ts: int
    t1_us: int


class ClientExchange:
    """One source's sync state machine: at most one request outstanding at a time."""

    def __init__(
        self,
        source_id: str,
        clock_us: ClockUs,
        *,
        key: bytes | None = None,
        estimator: ClockEstimator | None = None,
        version: int = 4,
        rng: random.Random | None = None,
        on_sample: Callable[[SyncSample], None] | None = None,
    ) -> None:
        self.source_id = source_id
        self.clock_us = clock_us
        self.key = key
        self.version = version
        self.on_sample = on_sample
        self.estimator = estimator if estimator is not None else ClockEstimator()
        self.stats = ClientStats()
        self.last_rejection: ReplyRejected | None = None
        self._rng = rng or random.Random()
        self._outstanding: _Outstanding | None = None
        self._unreported: tuple[int, int] | None = None  # (transmit_ts, t4_us) of the last exchange
        # Validate the source id once, early.
        encode_request(NtpPacket(transmit_ts=1), SyncExtension(source_id=source_id))

    @property
    def outstanding(self) -> bool:
        return self._outstanding is not None

    def build_request(self) -> bytes:
        """A new request; T1 is read from the source clock here, as late as possible."""
        ext = self._extension(end_of_burst=False, report_only=False)
        header = NtpPacket(version=self.version, mode=3, transmit_ts=0)
        unsigned = encode_unsigned_request(header, ext, with_mac=self.key is not None)
        low_bits = self._rng.randrange(2048)
        t1_us = self.clock_us()  # after encoding: only the stamp (and MAC) lie between T1 and send
        transmit_ts = unix_us_to_ntp(t1_us, low_bits=low_bits)
        data = stamp_transmit(unsigned, transmit_ts, self.key)
        self._outstanding = _Outstanding(transmit_ts=transmit_ts, t1_us=t1_us)
        self._unreported = None
        self.stats.requests += 1
        return data

    def build_report(self, end_of_burst: bool = True) -> bytes | None:
        """A report-only datagram (no reply comes back) for the last exchange; None if nothing to say."""
        if self._unreported is None and not end_of_burst:
            return None
        ext = self._extension(end_of_burst=end_of_burst, report_only=True)
        # The header of a report is a valid request; its transmit timestamp only has to be non-zero.
        transmit_ts = unix_us_to_ntp(self.clock_us(), low_bits=self._rng.randrange(2048))
        header = NtpPacket(version=self.version, mode=3, transmit_ts=transmit_ts)
        self._unreported = None
        self.stats.reports += 1
        return encode_request(header, ext, self.key)

    def timeout(self) -> None:
        """The outstanding request got no reply in time; forget it."""
        if self._outstanding is not None:
            self.stats.timeouts += 1
        self._outstanding = None

    def handle_reply(self, data: bytes, t4_us: int | None = None) -> SyncSample | None:
        """Check a reply; on success return the sample and add it to the local estimator.

        ``t4_us`` defaults to reading the source clock now.  Anything unacceptable (garbage, a
        stale or spoofed reply, an unsynchronised server) returns None and is counted.
        """
        if t4_us is None:
            t4_us = self.clock_us()
        try:
            sample = self._check_reply(data, t4_us)
        except ReplyRejected as exc:
            self.last_rejection = exc
            self.stats.replies_rejected += 1
            return None
        self.stats.replies_accepted += 1
        self.estimator.add_sample(sample)
        if self.on_sample is not None:
            self.on_sample(sample)
        return sample

    def end_burst(self) -> None:
        self.estimator.end_burst()

    def estimate(self) -> ClockEstimate | None:
        return self.estimator.estimate()

    # -- internals -------------------------------------------------------------------------------

    def _extension(self, *, end_of_burst: bool, report_only: bool) -> SyncExtension:
        t1_ntp, t4_us = self._unreported if self._unreported is not None else (None, None)
        return SyncExtension(
            source_id=self.source_id,
            report_t1_ntp=t1_ntp,
            report_t4_us=t4_us,
            end_of_burst=end_of_burst,
            report_only=report_only,
        )

    def _check_reply(self, data: bytes, t4_us: int) -> SyncSample:
        out = self._outstanding
        if out is None:
            raise ReplyRejected("no request outstanding")
        try:
            reply = decode_packet(data)
        except NtpCodecError as exc:
            raise ReplyRejected(str(exc)) from None
        # Numbered checks in the spirit of chrony's test1..test7.
        if reply.origin_ts != out.transmit_ts:
            raise ReplyRejected("origin does not echo our transmit timestamp (stale or spoofed)")
        if reply.mode != MODE_SERVER:
            raise ReplyRejected(f"mode {reply.mode} is not server")
        if reply.leap == 3 or not 1 <= reply.stratum <= 15:
            raise ReplyRejected("server is not synchronised (leap 3 or stratum outside 1..15)")
        if reply.receive_ts == 0 or reply.transmit_ts == 0:
            raise ReplyRejected("zero receive or transmit timestamp")
        t2_us = ntp_to_unix_us(reply.receive_ts)
        t3_us = ntp_to_unix_us(reply.transmit_ts)
        if t3_us < t2_us:
            raise ReplyRejected("transmit before receive")
        self._outstanding = None
        self._unreported = (out.transmit_ts, t4_us)
        return SyncSample(out.t1_us, t2_us, t3_us, t4_us)
