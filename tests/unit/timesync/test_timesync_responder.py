"""Responder + client exchange, in process with virtual clocks (no sockets)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timesync.codec import (
    HEADER_LEN,
    MODE_SERVER,
    NtpPacket,
    SyncExtension,
    decode_packet,
    encode_packet,
    encode_request,
    ntp_to_unix_us,
    unix_us_to_ntp,
)
from timesync.exchange import ClientExchange
from timesync.ratelimit import RateLimiter
from timesync.responder import Responder, ResponderConfig
from timesync.store import SourceInfoStore


class Clock:
    def __init__(self, t_us: int) -> None:
        self.t_us = t_us

    def __call__(self) -> int:
        return self.t_us


def _request(version: int = 4, mode: int = 3, transmit: int = 0xE9000000_00001234) -> bytes:
    return encode_packet(NtpPacket(version=version, mode=mode, poll=6, transmit_ts=transmit))


def test_plain_ntp_reply_fields() -> None:
    r = Responder(ResponderConfig(stratum=2, ref_id=b"ABCD"))
    req = _request(version=3)
    t2 = 1_700_000_000_000_000
    reply = r.respond(req, "127.0.0.1", t2, t2 + 37)
    assert reply is not None and len(reply) == HEADER_LEN
    p = decode_packet(reply)
    assert p.mode == MODE_SERVER and p.version == 3 and p.poll == 6
    assert p.stratum == 2 and p.ref_id == b"ABCD" and p.leap == 0
    assert p.origin_ts == 0xE9000000_00001234  # copied bit for bit
    assert ntp_to_unix_us(p.receive_ts) == t2
    assert ntp_to_unix_us(p.transmit_ts) == t2 + 37
    assert r.stats.replied == 1


def test_bad_input_is_dropped_with_counters() -> None:
    r = Responder()
    t = 1_700_000_000_000_000
    assert r.respond(b"", "a", t, t) is None
    assert r.respond(b"\x23" * 47, "a", t, t) is None
    assert r.respond(b"\x23" + bytes(2000), "a", t, t) is None
    assert r.respond(_request(mode=4), "a", t, t) is None
    assert r.respond(_request(mode=1), "a", t, t) is None
    assert r.respond(_request(version=0), "a", t, t) is None
    assert r.respond(_request(version=5), "a", t, t) is None
    assert r.respond(_request(transmit=0), "a", t, t) is None
    bad_ext = _request() + bytes.fromhex("5ec50014") + b"\x09" + bytes(15)
    assert r.respond(bad_ext, "a", t, t) is None
    s = r.stats
    assert (s.dropped_short, s.dropped_long, s.dropped_mode, s.dropped_version) == (2, 1, 2, 2)
    assert (s.dropped_zero_transmit, s.dropped_bad_extension) == (1, 1)
    assert s.dropped == 9 and s.replied == 0 and s.received == 9
    # Still serving afterwards.
    assert r.respond(_request(), "a", t, t) is not None


def test_unknown_trailer_still_gets_time() -> None:
    r = Responder()
    legacy_mac = _request() + b"\x00\x00\x00\x01" + bytes(16)
    reply = r.respond(legacy_mac, "a", 10**15, 10**15)
    assert reply is not None and len(reply) <= len(legacy_mac)


def test_rate_limit_per_address() -> None:
    r = Responder(ResponderConfig(rate_limit_per_s=1.0, rate_limit_burst=3))
    t = 1_700_000_000_000_000
    replies = [r.respond(_request(), "10.0.0.1", t, t) for _ in range(5)]
    assert sum(x is not None for x in replies) == 3
    assert r.stats.dropped_rate_limited == 2
    assert r.respond(_request(), "10.0.0.2", t, t) is not None  # another address is unaffected
    assert r.respond(_request(), "10.0.0.1", t + 1_000_000, t + 1_000_000) is not None  # refilled


def test_rate_limiter_table_is_bounded() -> None:
    rl = RateLimiter(1.0, 1, max_tracked=10)
    for i in range(100):
        rl.allow(f"h{i}", 0)
    assert len(rl) == 10


def _pair(offset_us: int, skew_ppm: float, key: bytes | None = None, keys: dict[str, bytes] | None = None):
    """A responder on reference time ``ref`` and a client whose clock is ref - offset(ref)."""
    store = SourceInfoStore()
    r = Responder(ResponderConfig(keys=keys or {}, rate_limit_per_s=0), store=store)
    ref = Clock(1_700_000_000_000_000)

    def source_clock() -> int:
        return ref.t_us - round(offset_us + skew_ppm * 1e-6 * (ref.t_us - 1_700_000_000_000_000))

    client = ClientExchange("dev-1", source_clock, key=key, rng=random.Random(3))
    return r, ref, client, store


def _burst(r: Responder, ref: Clock, client: ClientExchange, n: int, up_us: int, down_us: int) -> None:
    for _ in range(n):
        req = client.build_request()
        ref.t_us += up_us
        reply = r.respond(req, "198.51.100.7", ref.t_us, ref.t_us + 15)
        assert reply is not None and len(reply) <= len(req)
        ref.t_us += 15 + down_us
        assert client.handle_reply(reply) is not None
        ref.t_us += 10_000
    report = client.build_report()
    assert report is not None
    assert r.respond(report, "198.51.100.7", ref.t_us, ref.t_us) is None  # report-only: no reply
    client.end_burst()


def test_server_registers_source_and_matches_client() -> None:
    r, ref, client, store = _pair(offset_us=3_600_000_000, skew_ppm=0.0)
    _burst(r, ref, client, 10, up_us=100, down_us=100)
    info = store.get("dev-1")
    assert info is not None
    assert info.sample_count == 10
    assert info.rtt_us == 200 + 0  # symmetric 100 + 100 us path
    assert abs(info.offset_us - 3_600_000_000) <= 1
    assert info.last_sync_us > 0
    client_est = client.estimate()
    assert client_est is not None and client_est.offset_us == info.offset_us
    assert r.stats.samples_registered == 10 and r.stats.reports_only == 1
    assert store.max_rtt_us(["dev-1"]) == 200


def test_server_tracks_skew_over_bursts() -> None:
    r, ref, client, store = _pair(offset_us=-5_000, skew_ppm=120.0)
    for _ in range(13):
        _burst(r, ref, client, 8, up_us=80, down_us=120)
        ref.t_us += 5_000_000
    info = store["dev-1"]
    assert abs(info.skew_ppm - 120.0) < 1.0
    now = ref.t_us
    true = -5_000 + 120e-6 * (now - 1_700_000_000_000_000)
    assert abs(info.estimate.offset_at_us(now) - true) <= info.error_bound_us(now)


def test_auth_required_when_keys_configured() -> None:
    keys = {"dev-1": b"secret-key-0123456789"}
    r, ref, client, store = _pair(0, 0.0, key=b"wrong", keys=keys)
    _burst(r, ref, client, 3, 50, 50)
    assert store.get("dev-1") is None
    assert r.stats.auth_failed > 0
    r2, ref2, client2, store2 = _pair(0, 0.0, key=keys["dev-1"], keys=keys)
    _burst(r2, ref2, client2, 3, 50, 50)
    assert store2.get("dev-1") is not None and r2.stats.auth_failed == 0


def test_unmatched_report_is_counted() -> None:
    r = Responder()
    ext = SyncExtension(source_id="s", report_t1_ntp=unix_us_to_ntp(5), report_t4_us=9)
    data = encode_request(NtpPacket(mode=3, version=4, transmit_ts=unix_us_to_ntp(10)), ext)
    assert r.respond(data, "a", 10**15, 10**15) is not None
    assert r.stats.reports_unmatched == 1


def test_client_rejects_bad_replies() -> None:
    client = ClientExchange("x", Clock(1_700_000_000_000_000))
    assert client.handle_reply(b"junk") is None  # nothing outstanding
    req = decode_packet(client.build_request())
    wrong_origin = NtpPacket(mode=4, stratum=1, origin_ts=req.transmit_ts ^ 1, receive_ts=5, transmit_ts=5)
    assert client.handle_reply(encode_packet(wrong_origin)) is None
    unsynced = NtpPacket(mode=4, stratum=0, origin_ts=req.transmit_ts, receive_ts=5, transmit_ts=5)
    assert client.handle_reply(encode_packet(unsynced)) is None
    assert client.stats.replies_rejected == 3
    assert client.outstanding


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=1100))
def test_fuzz_responder_never_crashes_or_amplifies(data: bytes) -> None:
    r = Responder()
    reply = r.respond(data, "fuzz", 1_700_000_000_000_000, 1_700_000_000_000_100)
    assert r.stats.received == 1
    if reply is None:
        assert r.stats.dropped + r.stats.reports_only == 1
    else:
        assert len(reply) == HEADER_LEN <= len(data)


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=16).filter(lambda s: s.isprintable()),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.booleans(),
    st.integers(min_value=1, max_value=7),
    st.integers(min_value=0, max_value=7),
)
def test_fuzz_responder_with_sync_extensions(
    sid: str, t1: int, t4: int, end: bool, only: bool, version: int, mode: int
) -> None:
    r = Responder()
    ext = SyncExtension(source_id=sid, report_t1_ntp=t1, report_t4_us=t4, end_of_burst=end, report_only=only)
    data = encode_request(NtpPacket(version=version, mode=mode, transmit_ts=t1 | 1), ext)
    reply = r.respond(data, "f", 1_700_000_000_000_000, 1_700_000_000_000_001)
    if reply is not None:
        assert len(reply) <= len(data)


def test_sans_io_cores_do_not_import_asyncio() -> None:
    import subprocess
    import sys

    code = (
        "import sys, timesync.codec, timesync.responder, timesync.estimator, timesync.exchange, "
        "timesync.store, timesync.ratelimit, timesync.clocks; print('asyncio' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_client_reply_parsing_never_raises(data: bytes) -> None:
    client = ClientExchange("fz", Clock(1_700_000_000_000_000))
    client.build_request()
    assert client.handle_reply(data) is None or len(data) >= HEADER_LEN
    assert client.stats.replies_accepted + client.stats.replies_rejected == 1


def test_store_max_error_bound() -> None:
    from timesync.estimator import ClockEstimate

    store = SourceInfoStore()
    store.update("a", ClockEstimate(0, 0.0, 100, 0, 1, root_error_us=50.0, skew_error_ppm=10.0), 0)
    store.update("b", ClockEstimate(0, 0.0, 300, 0, 1, root_error_us=150.0, skew_error_ppm=0.0), 0)
    # a: 50 + (1 + 10) ppm * 20 s = 270; b: 150 + 1 ppm * 20 s = 170
    assert store.max_error_bound_us(20_000_000) == 270
    assert store.max_error_bound_us(20_000_000, ["b"]) == 170
    assert store.max_error_bound_us(0, ["zz"], default_us=7) == 7


# -- the minimum filter sees the whole burst, on both sides ------------------------------------------------------------


def _burst_with_delays(r: Responder, ref: Clock, client: ClientExchange, delays: list[tuple[int, int]]) -> None:
    for up_us, down_us in delays:
        req = client.build_request()
        ref.t_us += up_us
        reply = r.respond(req, "198.51.100.7", ref.t_us, ref.t_us + 15)
        assert reply is not None
        ref.t_us += 15 + down_us
        assert client.handle_reply(reply) is not None
        ref.t_us += 10_000
    report = client.build_report()
    assert report is not None
    assert r.respond(report, "198.51.100.7", ref.t_us, ref.t_us) is None
    client.end_burst()


@pytest.mark.parametrize("index", [0, 1])
@pytest.mark.parametrize("periodic", [False, True])
def test_best_sample_early_in_a_10_request_burst_is_used_by_server_and_client(index: int, periodic: bool) -> None:
    # The probe: a 50 us exchange early in the burst, 900 us for the rest.
    r, ref, client, store = _pair(offset_us=3_600_000_000, skew_ppm=0.0)
    if periodic:  # the client-side estimator exactly as PeriodicSync configures it
        from timesync.client import PeriodicSync

        client = PeriodicSync("127.0.0.1", 9, "dev-1", client.clock_us).exchange
    delays = [(600, 300)] * 10
    delays[index] = (30, 20)
    _burst_with_delays(r, ref, client, delays)
    # rtt = up + down; offset = true offset + (up - down) / 2: 3_600_000_005 for the best, 3_600_000_150 otherwise.
    info = store["dev-1"]
    assert info.sample_count == 10
    assert info.rtt_us == 50
    assert info.offset_us == 3_600_000_005
    client_est = client.estimate()
    assert client_est is not None
    assert (client_est.rtt_us, client_est.offset_us) == (50, 3_600_000_005)
    assert client_est.sync_ref_us == info.estimate.sync_ref_us


def test_server_state_of_a_never_ending_burst_is_bounded() -> None:
    # A client that never sends end-of-burst: the server cuts its burst every burst_size samples.
    r, ref, client, store = _pair(offset_us=1_000, skew_ppm=0.0)
    n = 200
    for _ in range(n):
        req = client.build_request()
        ref.t_us += 50
        reply = r.respond(req, "198.51.100.7", ref.t_us, ref.t_us + 15)
        assert reply is not None
        ref.t_us += 65
        assert client.handle_reply(reply) is not None
    est = r.estimator("dev-1")
    assert est is not None
    assert est.sample_count == n - 1  # the last exchange is never reported
    assert est.burst_count == -(-(n - 1) // est.burst_size)
    assert est.open_burst_samples <= est.burst_size
    assert store["dev-1"].rtt_us == 100
