"""Fuzz harnesses for the two network-facing sans-IO cores: the frame protocol + session, and the time-sync responder;
and for the publish path behind them: hostile payloads through session + IngestCore + record encoding.

Both are driven three ways with the same `feed_*` functions: a seeded mutation fuzzer (fast enough for 10^6 inputs),
hypothesis strategies, and atheris (coverage-guided, in a child process). The verdicts they collect:
- no exception escapes except the protocol's own rejections, which become exactly one `error` frame each;
- every rejection is counted by its code and carries a message (the explanation the client sees);
- memory stays bounded: the decoder never buffers more than one frame plus one read, the responder's tables stay
  under their limits, and the process RSS grows by less than a fixed budget over the whole run;
- time sync: a reply is exactly 48 bytes and never larger than its request; received = replied + dropped + reports;
- publish path: every event is either produced as a JSON record carrying its payload unchanged, or refused with one
  counted `invalid_payload` error frame naming its seq, never both; the acks still reach the last seq sent. A frame
  msgpack itself cannot decode (nesting past its 1,024-level stack) is refused whole, with one fatal
  `malformed_frame`; its seq is not consumed.
"""

from __future__ import annotations

import math
import random
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import orjson

from contract.topics import TopicNames
from contract.wire.errors import MalformedFrame
from contract.wire.frames import HEADER, FrameDecoder, encode_frame
from contract.wire.messages import (
    MAX_PAYLOAD_DEPTH,
    build_event,
    build_events,
    build_hello,
    parse_events,
    payload_problem,
)
from gateway.auth import SourceAuthenticator, hmac_token
from gateway.ingest import ConnectionId, IngestAction, IngestCore, Produce, SendFrame, SendToSource
from gateway.session import (
    CloseConnection,
    EventsReceived,
    GatewaySession,
    SendBytes,
    SessionState,
    SessionTimeouts,
    SourceRegistered,
)
from timesync.clocks import IdentityMapping
from timesync.codec import HEADER_LEN, NtpCodecError, NtpPacket, SyncExtension, decode_packet, encode_request
from timesync.codec import find_sync_extension as codec_find_extension
from timesync.responder import Responder, ResponderConfig

MAX_FRAME = 16 * 1024
KNOWN_CODES = {"frame_too_large", "malformed_frame", "invalid_message", "unexpected_message", "unsupported_version",
               "unauthenticated", "unknown_source", "timeout"}
SECRET = b"fuzz-secret-0123456789abcdef0123"


# -- frames and sessions ---------------------------------------------------------------------------------------------


@dataclass
class SessionReport:
    frames: int = 0
    bytes_fed: int = 0
    sessions: int = 0
    accepted_frames: int = 0
    rejections: Counter[str] = field(default_factory=Counter)
    unexplained: int = 0
    max_buffered: int = 0
    max_buffered_beyond_read: int = 0
    """What the decoder holds besides the read just fed to it: at most one frame's header and body."""
    events_accepted: int = 0

    def merge(self, other: SessionReport) -> None:
        self.frames += other.frames
        self.bytes_fed += other.bytes_fed
        self.sessions += other.sessions
        self.accepted_frames += other.accepted_frames
        self.rejections.update(other.rejections)
        self.unexplained += other.unexplained
        self.max_buffered = max(self.max_buffered, other.max_buffered)
        self.max_buffered_beyond_read = max(self.max_buffered_beyond_read, other.max_buffered_beyond_read)
        self.events_accepted += other.events_accepted


class SessionHarness:
    """Feeds frames into one GatewaySession at a time; a new session replaces one that failed."""

    def __init__(self, authenticated: bool = False) -> None:
        self.report = SessionReport()
        self.authenticator = SourceAuthenticator(hmac_secret=SECRET) if authenticated else SourceAuthenticator()
        self.now_us = 1_700_000_000_000_000
        self._new_session()

    def _new_session(self) -> None:
        self.report.sessions += 1
        self.session = GatewaySession(MAX_FRAME, max_events_per_batch=100, authenticator=self.authenticator,
                                      timeouts=SessionTimeouts(), now_us=self.now_us)

    def hello(self, rng: random.Random) -> bytes:
        """A valid hello (with a fresh HMAC token, which the unauthenticated gateway ignores)."""
        token = hmac_token(SECRET, "s1", self.now_us - rng.randrange(0, 1_000_000))
        return encode_frame(build_hello("s1", ["s"], token))

    def feed(self, frame: bytes, chunk: int = 0) -> None:
        """One frame's bytes (possibly split in `chunk`-byte reads); checks every action the session returns."""
        self.report.frames += 1
        self.report.bytes_fed += len(frame)
        self.now_us += 1_000
        pieces = [frame] if chunk <= 0 else [frame[i:i + chunk] for i in range(0, len(frame), chunk)] or [b""]
        for piece in pieces:
            actions = self.session.receive_data(piece, self.now_us)
            # Bounded: one frame (at most the limit, or refused from its header) plus the last read.
            buffered = self.session.buffered_bytes
            self.report.max_buffered = max(self.report.max_buffered, buffered)
            beyond = buffered - len(piece)
            self.report.max_buffered_beyond_read = max(self.report.max_buffered_beyond_read, beyond)
            assert beyond <= HEADER.size + MAX_FRAME, buffered
            self._check(actions)
            if self.session.state is SessionState.ERROR:
                self._new_session()
                return
        if self.session.state is SessionState.DRAINING:
            self._new_session()

    def _check(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, CloseConnection):
                code = action.error_code
                if code is None or code not in KNOWN_CODES or not action.reason:
                    self.report.unexplained += 1
                else:
                    self.report.rejections[code] += 1
            elif isinstance(action, SendBytes):
                (reply,) = FrameDecoder().feed(action.data)
                assert reply["type"] in ("welcome", "error"), reply
                if reply["type"] == "error":
                    assert reply["fatal"] is True and reply["message"], reply
            elif type(action).__name__ == "EventsReceived":
                self.report.accepted_frames += 1
                self.report.events_accepted += len(action.events)
            else:
                self.report.accepted_frames += 1


def _random_scalar(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 7)
    if kind == 0:
        return rng.randrange(-(2**63), 2**64)
    if kind == 1:
        return rng.choice([0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
    if kind == 2:
        return rng.random() * 10 ** rng.randrange(-5, 20)
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "".join(chr(rng.randrange(32, 0x3000)) for _ in range(rng.randrange(0, 40)))
    if kind == 5:
        return rng.randbytes(rng.randrange(0, 40))
    if kind == 6:
        return rng.choice(["s", "hello", "events", "heartbeat", "bye", "", "x" * 300, "s/../t", "s\x00"])
    if kind == 7:
        return [_random_scalar(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {(rng.randrange(-5, 5) if rng.random() < 0.2 else str(_random_scalar(rng, depth + 1))):
            _random_scalar(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def _valid_message(rng: random.Random, seq: int) -> dict[str, Any]:
    kind = rng.randrange(4)
    if kind == 0:
        ts = 1_700_000_000_000_000
        source_id = rng.choice(["s1", "s2", "é" * 10])  # drawn before the token: keeps seeded runs reproducible
        return build_hello(source_id, ["s"], hmac_token(SECRET, "s1", ts) if rng.random() < 0.5 else None)
    if kind == 1:
        return {"type": "events", "events": [
            {"stream": "s", "seq": seq + i, "source_ts_us": 1_000 + i, "payload": _random_scalar(rng)}
            for i in range(rng.randrange(1, 5))]}
    if kind == 2:
        return {"type": "heartbeat", "source_ts_us": rng.randrange(0, 2**40), "next_seq": {"s": seq}}
    return {"type": "bye"}


def _mutate_message(rng: random.Random, message: dict[str, Any]) -> dict[str, Any]:
    message = dict(message)
    for _ in range(rng.randrange(1, 3)):
        action = rng.randrange(5)
        keys = list(message)
        if action == 0 and keys:
            del message[rng.choice(keys)]
        elif action == 1 and keys:
            message[rng.choice(keys)] = _random_scalar(rng)
        elif action == 2:
            message[str(_random_scalar(rng))] = _random_scalar(rng)
        elif action == 3 and isinstance(message.get("events"), list):
            events = list(message["events"])
            if events:
                event = dict(events[0]) if isinstance(events[0], dict) else {}
                event[rng.choice(["stream", "seq", "source_ts_us", "payload", "x"])] = _random_scalar(rng)
                events[0] = event
            if rng.random() < 0.1:
                events = events * 60  # over the batch limit
            message["events"] = events
        else:
            message["type"] = _random_scalar(rng) if rng.random() < 0.5 else rng.choice(
                ["hello", "events", "heartbeat", "bye", "ack", "welcome"])
    return message


def random_frame(rng: random.Random, seq: int) -> bytes:
    """One fuzzed frame: valid, a mutated message, random msgpack, random bytes, or a hostile header."""
    kind = rng.randrange(10)
    if kind <= 2:
        return encode_frame(_valid_message(rng, seq))
    if kind <= 4:
        try:
            return encode_frame(_mutate_message(rng, _valid_message(rng, seq)))
        except (TypeError, ValueError, OverflowError):
            return encode_frame({"type": "bye"})
    if kind == 5:
        try:
            body = msgpack.packb(_random_scalar(rng), use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            body = b"\xc1"
        return HEADER.pack(len(body)) + body
    if kind == 6:
        body = rng.randbytes(rng.randrange(1, 64))
        return HEADER.pack(len(body)) + body
    if kind == 7:
        frame = bytearray(encode_frame(_valid_message(rng, seq)))
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(frame))
            frame[i] ^= 1 << rng.randrange(8)
        return bytes(frame)
    if kind == 8:
        return HEADER.pack(rng.choice([0, MAX_FRAME + 1, 2**32 - 1, rng.randrange(2**32)]))
    return encode_frame(_valid_message(rng, seq))[: rng.randrange(1, 8)]  # truncated: the next frame follows


def fuzz_sessions(count: int, seed: int, authenticated: bool = False) -> SessionReport:
    rng = random.Random(seed)
    harness = SessionHarness(authenticated)
    for i in range(count):
        if harness.session.state is SessionState.AWAIT_HELLO and rng.random() < 0.8:
            frame = harness.hello(rng)  # most sessions get past the handshake, so STREAMING gets fuzzed too
        else:
            frame = random_frame(rng, i)
        harness.feed(frame, chunk=rng.choice([0, 0, 0, 1, 3, 7, 64]))
    return harness.report


# -- the publish path: hostile payloads ------------------------------------------------------------------------------


def hostile_payload(rng: random.Random, depth: int = 0) -> Any:
    """A payload the record contract may or may not carry: bytes, integers beyond 64 bits, NaN and infinities,
    nesting around the depth limit, non-string map keys, msgpack ext types, mixed into valid JSON values."""
    kind = rng.randrange(14 if depth < 4 else 9)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 16))
    if kind == 1:
        return rng.choice([2**63 - 1, 2**63, 2**64 - 1, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30)])
    if kind == 2:
        return rng.choice([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324])
    if kind == 3:
        return rng.choice([msgpack.ExtType(rng.randrange(0, 128), rng.randbytes(rng.randrange(0, 8))),
                           msgpack.Timestamp(rng.randrange(0, 2**32), rng.randrange(0, 10**9))])
    if kind == 4:
        value: Any = rng.choice([1, "x", None, math.nan])
        for _ in range(rng.randrange(MAX_PAYLOAD_DEPTH - 3, MAX_PAYLOAD_DEPTH + 4)):
            value = [value] if rng.random() < 0.5 else {"k": value}
        return value
    if kind in (5, 6, 7, 8):
        return rng.choice([0, -1, 2**40, 1.5, "é\x00", "", True, False, None, "x" * rng.randrange(0, 100)])
    if kind == 9:
        # Keys msgpack can carry but JSON cannot; a tuple key goes out as a msgpack array.
        key = rng.choice([b"k", 1, -7, 2**64 - 1, 1.5, None, True, (1, (2,)), msgpack.ExtType(1, b"k")])
        return {key: hostile_payload(rng, depth + 1)}
    if kind in (10, 11):
        return [hostile_payload(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {f"f{i}": hostile_payload(rng, depth + 1) for i in range(rng.randrange(0, 4))}


@dataclass
class PayloadReport:
    events: int = 0
    via_wire: int = 0
    """Events sent as msgpack frames through a GatewaySession; the others (payloads msgpack cannot encode: integers
    beyond 64 bits) go through parse_events, the function the session calls, directly."""
    published: int = 0
    frames_refused: int = 0
    """Frames nested past msgpack's decoder stack: refused whole with a fatal malformed_frame, seq not consumed."""
    rejections: Counter[str] = field(default_factory=Counter)
    last_ack: int = -1


class PublishHarness:
    """One source streaming hostile payloads into GatewaySession + IngestCore; Kafka confirms every record."""

    def __init__(self) -> None:
        self.report = PayloadReport()
        self.now_us = 1_700_000_000_000_000
        self.core = IngestCore(TopicNames("f"), IdentityMapping())
        self.core.stream_created("s")
        self.session = GatewaySession(now_us=self.now_us)
        self.connection = ConnectionId(1)
        self.sent: dict[int, Any] = {}
        self.offset = 0
        self._carry_out(self._session_actions(encode_frame(build_hello("src", ["s"]))))

    def send(self, seq: int, payload: Any) -> None:
        self.now_us += 1_000
        self.report.events += 1
        self.sent[seq] = payload
        event = build_event("s", seq, self.now_us, payload)
        try:
            frame = encode_frame(build_events([event]))
        except (OverflowError, ValueError):
            # msgpack cannot encode it (integers beyond 64 bits): no client can send it, but the parser must still
            # refuse it if it ever got one. Anything msgpack can encode goes over the wire below.
            batch = parse_events(build_events([event]), 10, frozenset({"s"}))
            self._carry_out(self.core.events_received(self.connection, "src", batch.events, self.now_us))
            return
        self.report.via_wire += 1
        self._carry_out(self._session_actions(frame))

    def send_nested(self, seq: int, levels: int) -> bool:
        """A payload of ``levels`` nested one-element arrays, framed by hand (msgpack's packer stops at 512 levels).
        True if the seq was consumed (refused as too deep), False if the frame was refused whole."""
        return self.send_raw_payload(seq, b"\x91" * levels + b"\x00")

    def send_raw_payload(self, seq: int, raw: bytes) -> bool:
        """An events frame whose payload is the bytes ``raw``, spliced in as they are (any msgpack, or none). True if
        the seq was consumed (published or refused), False if msgpack could not decode the frame: then a fresh
        session (this one would close) must answer exactly one fatal malformed_frame."""
        event = build_event("s", seq, self.now_us, 0)
        body = bytearray(msgpack.packb(build_events([event])))
        assert body.endswith(b"\xa7payload\x00")
        body[-1:] = raw
        frame = HEADER.pack(len(body)) + bytes(body)
        try:
            (message,) = FrameDecoder().feed(frame)
        except MalformedFrame:
            throwaway = GatewaySession(now_us=self.now_us)
            throwaway.receive_data(encode_frame(build_hello("src", ["s"])), self.now_us)
            actions = throwaway.receive_data(frame, self.now_us)
            assert len(actions) == 2 and isinstance(actions[0], SendBytes), actions
            (reply,) = FrameDecoder().feed(actions[0].data)
            assert (reply["code"], reply["fatal"]) == ("malformed_frame", True), reply
            assert actions[1] == CloseConnection(reply["message"], "malformed_frame")
            self.report.frames_refused += 1
            return False
        self.now_us += 1_000
        self.report.events += 1
        self.report.via_wire += 1
        self.sent[seq] = message["events"][0]["payload"]
        self._carry_out(self._session_actions(frame))
        return True

    def _session_actions(self, frame: bytes) -> list[IngestAction]:
        actions: list[IngestAction] = []
        for action in self.session.receive_data(frame, self.now_us):
            if isinstance(action, EventsReceived):
                actions += self.core.events_received(self.connection, action.source_id, action.events, self.now_us)
            elif isinstance(action, SourceRegistered):
                actions += self.core.source_registered("src", ("s",), self.now_us)
            else:
                # Frames the decoder refuses went the direct way (send): nothing that reaches the session may fail.
                assert not isinstance(action, CloseConnection), f"session failed: {action}"
        return actions

    def _carry_out(self, actions: list[IngestAction]) -> None:
        for action in actions:
            if isinstance(action, Produce):
                record = orjson.loads(action.value)  # every produced value is JSON
                if action.delivery is None:
                    assert record["kind"] == "punctuation", record
                    continue
                seq = record["seq"]
                assert record["kind"] == "event" and not record["late"], record
                assert payload_problem(record["payload"]) is None
                assert record["payload"] == self.sent.pop(seq), seq  # unchanged, and published at most once
                self.report.published += 1
                self.core.on_delivered(action.delivery, None, self.offset, self.now_us)
                self.offset += 1
            elif isinstance(action, SendFrame | SendToSource):
                (reply,) = FrameDecoder().feed(action.data)
                if reply["type"] == "ack":
                    self.report.last_ack = max(self.report.last_ack, reply["seq"])
                    continue
                assert reply["type"] == "error" and reply["code"] == "invalid_payload", reply
                assert reply["fatal"] is False and reply["stream"] == "s", reply
                reason = reply["message"].split(": ", 1)[1]
                assert payload_problem(self.sent.pop(reply["seq"])) is not None  # refused at most once, rightly
                self.report.rejections[reason.split(" ", 1)[0]] += 1
        self._carry_out_poll()

    def _carry_out_poll(self) -> None:
        for action in self.core.poll(self.now_us):
            if isinstance(action, SendToSource):
                (reply,) = FrameDecoder().feed(action.data)
                assert reply["type"] == "ack", reply
                self.report.last_ack = max(self.report.last_ack, reply["seq"])

    def finish(self) -> PayloadReport:
        self.now_us += 10_000_000
        self._carry_out(self.core.advance(self.now_us))
        self.now_us += self.core.config.checkpoint_interval_us
        self._carry_out_poll()
        assert not self.sent, f"neither published nor refused: {sorted(self.sent)[:10]}"
        assert sum(self.report.rejections.values()) == self.core.counters.invalid_payloads
        assert self.report.published + self.core.counters.invalid_payloads == self.report.events
        assert self.core.counters.encode_failures == 0 and self.core.counters.task_failures == 0
        assert self.report.last_ack == self.report.events - 1  # refused events never hold the acks back
        return self.report


# Nesting depths sent framed by hand: just past the limit, deep, at and past msgpack's decoder stack (1,024 levels
# including the frame's own 3), and far past it.
HAND_NESTED_LEVELS = (MAX_PAYLOAD_DEPTH + 1, 500, 1_019, 1_020, 1_021, 10_000)


def fuzz_payloads(count: int, seed: int) -> PayloadReport:
    rng = random.Random(seed)
    harness = PublishHarness()
    seq = 0
    while seq < count:
        if rng.random() < 0.01:
            seq += harness.send_nested(seq, rng.choice(HAND_NESTED_LEVELS))
            continue
        harness.send(seq, hostile_payload(rng))
        seq += 1
    return harness.finish()


# -- time sync -------------------------------------------------------------------------------------------------------


@dataclass
class TimesyncReport:
    datagrams: int = 0
    replies: int = 0
    max_reply_ratio: float = 0.0
    codec_errors: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    sources_tracked: int = 0
    limiter_entries: int = 0
    max_pending_per_source: int = 0


class TimesyncHarness:
    def __init__(self, keyed: bool = False) -> None:
        keys = {"s1": b"k" * 32} if keyed else {}
        self.responder = Responder(ResponderConfig(keys=keys, max_sources=500, rate_limit_per_s=64,
                                                   rate_limit_burst=128))
        self.t_us = 1_700_000_000_000_000
        self.report = TimesyncReport()

    def feed(self, datagram: bytes, addr_key: str) -> None:
        self.report.datagrams += 1
        self.t_us += 37
        reply = self.responder.respond(datagram, addr_key, self.t_us, self.t_us + 5)
        if reply is not None:
            self.report.replies += 1
            assert len(reply) == HEADER_LEN <= len(datagram), (len(reply), len(datagram))
            self.report.max_reply_ratio = max(self.report.max_reply_ratio, len(reply) / len(datagram))
        # The codec alone: only its own error type may escape.
        try:
            packet = decode_packet(datagram)
            codec_find_extension(packet)
        except NtpCodecError:
            self.report.codec_errors += 1

    def finish(self) -> TimesyncReport:
        stats = self.responder.stats
        self.report.stats = stats.as_dict()
        # Every datagram is accounted for: answered, dropped for one named reason, or a report-only datagram.
        assert stats.received == self.report.datagrams
        assert stats.received == stats.replied + stats.dropped + stats.reports_only, stats.as_dict()
        self.report.sources_tracked = len(self.responder._sources)
        self.report.limiter_entries = len(self.responder._limiter)
        self.report.max_pending_per_source = max((len(s.pending) for s in self.responder._sources.values()),
                                                 default=0)
        assert self.report.sources_tracked <= self.responder.config.max_sources
        assert self.report.max_pending_per_source <= self.responder.config.pending_per_source
        return self.report


def random_datagram(rng: random.Random, i: int) -> bytes:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 1100))
    source_id = rng.choice(["s1", "s2", f"src-{rng.randrange(2000)}", "ü" * 16])
    ext = SyncExtension(source_id=source_id,
                        report_t1_ntp=rng.randrange(1, 2**64) if rng.random() < 0.5 else None,
                        report_t4_us=rng.randrange(0, 2**62) if rng.random() < 0.5 else None,
                        end_of_burst=rng.random() < 0.2, report_only=rng.random() < 0.2)
    if ext.report_t1_ntp is None or ext.report_t4_us is None:
        ext = SyncExtension(source_id=source_id, end_of_burst=ext.end_of_burst, report_only=ext.report_only)
    header = NtpPacket(version=rng.choice([4, 4, 3, 0, 5, 7]), mode=rng.choice([3, 3, 3, 4, 1, 0]),
                       transmit_ts=rng.choice([0, rng.randrange(1, 2**64)]), poll=rng.randrange(-128, 128))
    try:
        data = bytearray(encode_request(header, ext if kind != 1 else None,
                                        key=b"k" * 32 if rng.random() < 0.3 else None))
    except (ValueError, NtpCodecError):
        data = bytearray(rng.randbytes(48))
    if kind in (2, 3):
        for _ in range(rng.randrange(1, 6)):
            j = rng.randrange(len(data))
            data[j] ^= 1 << rng.randrange(8)
    elif kind == 4:
        data = data[: rng.randrange(0, len(data) + 1)]
    elif kind == 5:
        data += rng.randbytes(rng.randrange(0, 1000))
    return bytes(data)


def fuzz_timesync(count: int, seed: int, keyed: bool = False) -> TimesyncReport:
    rng = random.Random(seed)
    harness = TimesyncHarness(keyed)
    for i in range(count):
        harness.feed(random_datagram(rng, i), f"10.0.{rng.randrange(8)}.{rng.randrange(256)}")
    return harness.finish()


def traced_peak_kib(fn: Any, *args: Any) -> tuple[Any, int]:
    """Run fn under tracemalloc; the result and the peak of traced Python allocations in KiB."""
    tracemalloc.start()
    try:
        result = fn(*args)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak // 1024
