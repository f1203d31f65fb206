"""Fuzzing the network-facing sans-IO cores: 10^6 frames against the frame protocol + session, 10^6 datagrams against
the time-sync codec + responder (long suite; the fast suite runs the same harness with fewer inputs).

Three drivers share tests/reliability/fuzz.py: a seeded mutation fuzzer (the 10^6 runs), hypothesis strategies, and
atheris (coverage-guided, in a child process: it installs its own instrumentation and exits when done).

The publish path is fuzzed twice: sans-IO (session + IngestCore + record encoding, 20,000 events fast, 10^6 long),
and end to end on a real gateway and Kafka, frame by frame (300 events fast, 20,000 long: the reliability_long
marker is the knob for the big campaign).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.reader import read_topic
from clients import SkewlessClient
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import build_event, build_events, build_hello, payload_problem
from gateway.server import Gateway, GatewayConfig
from tests.reliability.fuzz import (
    KNOWN_CODES,
    MAX_FRAME,
    SessionHarness,
    SessionReport,
    TimesyncHarness,
    fuzz_payloads,
    fuzz_sessions,
    fuzz_timesync,
    hostile_payload,
)
from tests.reliability.harness import REPO, child_env, record_outcome, rss_kib

LONG = pytest.mark.reliability_long
# Whole-process RSS growth allowed over a run: the harness keeps no per-input state, so 10^6 inputs must fit.
RSS_BUDGET_KIB = 64 * 1024


@pytest.mark.timeout(600)
@pytest.mark.parametrize("count", [pytest.param(20_000, id="fast"), pytest.param(1_000_000, id="long", marks=LONG)])
def test_fuzzed_frames_never_crash_and_every_rejection_is_explained(count: int):
    before = rss_kib(os.getpid())
    report = SessionReport()
    # Half against an open gateway, half against one that requires HMAC tokens.
    report.merge(fuzz_sessions(count // 2, seed=count, authenticated=False))
    report.merge(fuzz_sessions(count - count // 2, seed=count + 1, authenticated=True))
    growth = rss_kib(os.getpid()) - before
    assert report.frames == count
    assert report.unexplained == 0
    assert set(report.rejections) <= KNOWN_CODES
    # Every session but the last ended in exactly one explained rejection or a clean bye.
    assert sum(report.rejections.values()) <= report.sessions
    assert report.accepted_frames > 0 and report.events_accepted > 0  # the fuzzer also got past the handshake
    # The decoder never holds more than one frame besides the read it was just given (a read of a hostile frame is
    # refused from its header; the gateway's reads are at most a socket buffer).
    assert report.max_buffered_beyond_read <= 4 + MAX_FRAME
    assert growth < RSS_BUDGET_KIB, growth
    record_outcome(
        f"Fuzzed frames ({count:,})", group="hostile",
        injected=f"{count:,} frames: mutated/valid messages, random msgpack, random bytes, bit flips, hostile length "
                 "headers, truncation, split reads; half against an HMAC-authenticated gateway",
        checked="no exception but protocol rejections; each rejection = 1 error frame with a known code and a "
                "message; decoder buffer <= 1 frame + 1 read; RSS growth bounded",
        outcome={"frames": report.frames, "sessions": report.sessions, "frames_accepted": report.accepted_frames,
                 "events_accepted": report.events_accepted, "rejections": dict(report.rejections.most_common()),
                 "unexplained": report.unexplained, "max_buffered_beyond_one_read": report.max_buffered_beyond_read,
                 "rss_growth_kib": growth})


@pytest.mark.timeout(600)
@pytest.mark.parametrize("count", [pytest.param(20_000, id="fast"), pytest.param(1_000_000, id="long", marks=LONG)])
def test_fuzzed_datagrams_never_crash_never_amplify_and_are_all_counted(count: int):
    before = rss_kib(os.getpid())
    plain = fuzz_timesync(count // 2, seed=count)
    keyed = fuzz_timesync(count - count // 2, seed=count + 1, keyed=True)
    growth = rss_kib(os.getpid()) - before
    for report in (plain, keyed):
        assert report.max_reply_ratio <= 1.0
        assert report.replies > 0
    assert growth < RSS_BUDGET_KIB, growth
    stats = {k: plain.stats[k] + keyed.stats[k] for k in plain.stats}
    record_outcome(
        f"Fuzzed time-sync datagrams ({count:,})", group="hostile",
        injected=f"{count:,} datagrams: random bytes 0..1100 B, requests with bit flips, truncation, trailing "
                 "garbage, bad versions/modes, zero transmit, forged extensions and MACs, 2,048 source addresses",
        checked="no exception but NtpCodecError; reply always 48 B and <= request; received = replied + dropped "
                "(per reason) + report-only; tables under their limits; RSS growth bounded",
        outcome={"datagrams": count, "replies": stats["replied"], "max_reply_over_request": max(
            plain.max_reply_ratio, keyed.max_reply_ratio), "drop_reasons": {
            k: v for k, v in stats.items() if k.startswith("dropped_") and v}, "reports_only": stats["reports_only"],
            "auth_failed": stats["auth_failed"], "codec_errors": plain.codec_errors + keyed.codec_errors,
            "max_pending_per_source": max(plain.max_pending_per_source, keyed.max_pending_per_source),
            "rss_growth_kib": growth})


@pytest.mark.timeout(600)
@pytest.mark.parametrize("count", [pytest.param(20_000, id="fast"), pytest.param(1_000_000, id="long", marks=LONG)])
def test_hostile_payloads_are_published_unchanged_or_refused_and_counted(count: int):
    report = fuzz_payloads(count, seed=count)  # the harness asserts the per-event verdicts as it goes
    assert report.events == count == report.published + sum(report.rejections.values())
    assert report.last_ack == count - 1
    # Every class of hostile payload was generated and refused, and valid ones got through.
    assert set(report.rejections) == {"bytes", "integer", "NaN", "Infinity", "-Infinity", "nested", "map", "msgpack"}
    assert report.published > count // 4
    # Only integers beyond 64 bits (which msgpack cannot encode) skip the wire; non-string keys travel now.
    assert report.via_wire > count * 9 // 10
    # Hand-framed nesting past msgpack's decoder stack: refused whole (fatal malformed_frame), seq not consumed.
    assert report.frames_refused > 0
    record_outcome(
        f"Hostile payloads through the publish path ({count:,})", group="hostile",
        injected=f"{count:,} events from one source with payloads mixing bytes, integers beyond 64 bits, NaN and "
                 "infinities, nesting around the depth limit, non-string map keys and msgpack ext types into valid "
                 "JSON, plus hand-framed nesting of 33 to 10,000 levels; through msgpack frames + GatewaySession + "
                 "IngestCore + record encoding (integers msgpack cannot encode through the session's parser directly)",
        checked="no exception escapes; each event is either produced once as a JSON record with its payload "
                "unchanged or refused once with a non-fatal invalid_payload error frame naming its seq; refusals = "
                "invalid_payloads counter; the cumulative ack reaches the last seq; a frame nested past msgpack's "
                "decoder stack gets exactly one fatal malformed_frame",
        outcome={"events": report.events, "via_wire": report.via_wire, "published": report.published,
                 "frames_refused": report.frames_refused,
                 "rejections": dict(report.rejections.most_common()), "last_ack": report.last_ack})


# -- hypothesis ------------------------------------------------------------------------------------------------------

_messages = st.fixed_dictionaries(
    {"type": st.sampled_from(["hello", "events", "heartbeat", "bye", "ack"])},
    optional={"version": st.integers(-1, 3), "source_id": st.text(max_size=140), "streams": st.lists(st.text(
        max_size=10), max_size=70), "token": st.one_of(st.none(), st.text(max_size=80)),
        "events": st.lists(st.fixed_dictionaries({}, optional={
            "stream": st.sampled_from(["s", "t", "", 5]), "seq": st.integers(-2, 2**64),
            "source_ts_us": st.integers(-2, 2**64), "payload": st.binary(max_size=20)}), max_size=120),
        "source_ts_us": st.integers(-1, 2**64), "next_seq": st.dictionaries(st.text(max_size=5), st.integers(
            -1, 2**63), max_size=3)})
_frames = st.lists(st.one_of(
    _messages.map(lambda m: ("msg", m)),
    st.binary(max_size=200).map(lambda b: ("raw", b)),
    st.integers(0, 2**32 - 1).map(lambda n: ("len", n)),
), min_size=1, max_size=100)


def _run_frames(frames: list[tuple[str, object]], chunk: int, harness: SessionHarness) -> None:
    import msgpack

    from contract.wire.frames import HEADER, encode_frame

    for kind, value in frames:
        if kind == "msg":
            try:
                data = encode_frame(value)  # type: ignore[arg-type]
            except (TypeError, ValueError, OverflowError):
                data = HEADER.pack(1) + b"\xc1"
        elif kind == "raw":
            data = value if isinstance(value, bytes) else b""
        else:
            data = HEADER.pack(int(value))  # type: ignore[call-overload]
        harness.feed(data, chunk)
    assert harness.report.unexplained == 0
    assert set(harness.report.rejections) <= KNOWN_CODES
    _ = msgpack


def _hypothesis_frames(max_examples: int) -> SessionReport:
    harness = SessionHarness()

    @settings(max_examples=max_examples, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(frames=_frames, chunk=st.sampled_from([0, 1, 5, 4096]))
    def run(frames: list[tuple[str, object]], chunk: int) -> None:
        _run_frames(frames, chunk, harness)

    run()
    return harness.report


@pytest.mark.timeout(600)
@pytest.mark.parametrize("examples", [pytest.param(200, id="fast"), pytest.param(3_000, id="long", marks=LONG)])
def test_hypothesis_frame_sequences(examples: int):
    report = _hypothesis_frames(examples)
    assert report.unexplained == 0
    record_outcome(
        f"Hypothesis frame sequences ({examples:,} examples)", group="hostile",
        injected=f"{examples:,} hypothesis examples of up to 100 frames (typed messages with any field values, raw "
                 "bytes, bare length headers), fed whole or in 1/5/4096-byte reads",
        checked="same verdicts as the mutation fuzzer",
        outcome={"frames": report.frames, "sessions": report.sessions, "rejections": dict(
            report.rejections.most_common()), "unexplained": report.unexplained})


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.binary(max_size=1100), addr=st.integers(0, 3))
def test_hypothesis_datagrams_get_at_most_a_48_byte_reply(data: bytes, addr: int):
    harness = TimesyncHarness()
    harness.feed(data, f"a{addr}")
    harness.finish()


# -- atheris ---------------------------------------------------------------------------------------------------------


def _atheris_available() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import atheris"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("target", "runs"), [
    pytest.param("session", 3_000, id="session-fast"), pytest.param("timesync", 3_000, id="timesync-fast"),
    pytest.param("publish", 3_000, id="publish-fast"), pytest.param("publish", 100_000, id="publish-long", marks=LONG),
    # The session target runs ~4,000 inputs/s under atheris' instrumentation: 10^6 of them would take the whole
    # CI budget, so it gets 10^5 here and the seeded mutation fuzzer above does the 10^6.
    pytest.param("session", 100_000, id="session-long", marks=LONG),
    pytest.param("timesync", 1_000_000, id="timesync-long", marks=LONG)])
def test_atheris_coverage_guided(target: str, runs: int):
    if not _atheris_available():
        pytest.skip("atheris is not installed for this Python")
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.atheris_target", target, f"-runs={runs}", "-seed=1",
         "-max_len=1024", "-print_final_stats=1"],
        capture_output=True, text=True, env=child_env(), cwd=str(REPO), timeout=580, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    stats = {line.rpartition(":")[0]: line.rpartition(":")[2].strip() for line in result.stderr.splitlines()
             if line.startswith("stat::")}
    assert int(stats.get("stat::number_of_executed_units", "0")) >= runs
    record_outcome(
        f"Atheris {target} ({runs:,} runs)", group="hostile",
        injected=f"{runs:,} coverage-guided inputs (libFuzzer via atheris 3.0.0) against the "
                 + {"session": "frame decoder + session", "timesync": "time-sync codec + responder",
                    "publish": "one event's payload bytes through session + IngestCore + record encoding"}[target],
        checked="no uncaught exception (atheris stops at the first one); same invariants as the harness",
        outcome={"executed": int(stats.get("stat::number_of_executed_units", "0")),
                 "exec_per_s": int(stats.get("stat::average_exec_per_sec", "0")),
                 "peak_rss_mb": int(stats.get("stat::peak_rss_mb", "0"))})


# -- the SDK at the 64-bit edges ---------------------------------------------------------------------------------------


async def test_the_sdk_refuses_integers_msgpack_cannot_encode_at_send_and_keeps_its_seqs() -> None:
    client = SkewlessClient("127.0.0.1", 9, "edges", ["s"])  # never connected: send() only queues
    # msgpack carries -2**63 .. 2**64 - 1; the gateway refuses 2**63 and up per event (signed 64 bits in the record).
    for payload in (-(2**63), 2**63 - 1, 2**63, 2**64 - 1, {"x": 2**64 - 1}):
        await client.send("s", payload, 1)
    assert (client.next_seq("s"), client.unacked_count) == (5, 5)
    for payload in (2**64, -(2**63) - 1, 10**30, {"x": 2**64}, [-(10**30)]):
        # Queued, a top-level one failed the sender task when it was framed, and with it the whole client.
        with pytest.raises(OverflowError):
            await client.send("s", payload, 1)
    deep: object = 0
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(ValueError, match="recursion limit"):  # msgpack's packer stops at 512 levels
        await client.send("s", deep, 1)
    assert (client.next_seq("s"), client.unacked_count, client.error) == (5, 5, None)
    await client.close()


# -- the publish path on a real gateway and Kafka ----------------------------------------------------------------------

# A frame is answered (its last seq acked, refused seqs included, after their error frames) within this.
FRAME_ANSWER_BOUND_S = 10.0


@pytest.mark.integration
@pytest.mark.timeout(900)
@pytest.mark.parametrize("count", [pytest.param(300, id="fast"), pytest.param(20_000, id="long", marks=LONG)])
async def test_hostile_payloads_through_a_real_gateway_reach_kafka_once_as_json_or_are_refused(
        count: int, kafka: Any, topic_prefix: str) -> None:
    rng = random.Random(count)
    # Each frame waits for its answer before the next: acks come at commits, so commit often (this is about the
    # payloads, not about latency: at the default 100 ms the 20,000 events, ~4,400 frames, wait ~4,400 commits).
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    commit_interval_s=0.005))
    await gateway.start()
    sent: dict[int, Any] = {}
    refused: dict[int, str] = {}
    slowest_s = 0.0
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        decoder = FrameDecoder()
        writer.write(encode_frame(build_hello("fuzz", ["s"])))
        (welcome,) = decoder.feed(await reader.read(65536))
        assert welcome["type"] == "welcome"
        loop = asyncio.get_running_loop()
        seq = 0
        while seq < count:
            batch: list[dict[str, Any]] = []
            for _ in range(rng.randrange(1, 9)):
                payload = hostile_payload(rng)
                try:
                    msgpack.packb(payload)
                except (OverflowError, ValueError):
                    continue  # no client can send it (integers beyond 64 bits): not a wire input
                batch.append(build_event("s", seq, 1_000 + seq, payload))
                sent[seq] = payload
                seq += 1
            if not batch:
                continue
            last = batch[-1]["seq"]
            started_s = loop.time()
            writer.write(encode_frame(build_events(batch)))
            acked = -1
            async with asyncio.timeout(FRAME_ANSWER_BOUND_S):
                while acked < last:
                    data = await reader.read(65536)
                    assert data, "the gateway closed the connection"
                    for reply in decoder.feed(data):
                        if reply["type"] == "ack":
                            acked = max(acked, reply["seq"])
                            continue
                        assert (reply["type"], reply["code"], reply["fatal"], reply["stream"]) == (
                            "error", "invalid_payload", False, "s"), reply
                        assert reply["seq"] not in refused  # once per event
                        refused[reply["seq"]] = reply["message"]
            slowest_s = max(slowest_s, loop.time() - started_s)
        writer.close()
        health = gateway.health()
        assert (health["status"], health["failed_tasks"], health["last_connection_failure"]) == ("ok", {}, None)
        assert set(gateway.worker_errors.values()) == {0}
        assert gateway.counters.invalid_payloads == len(refused)
        assert gateway.counters.encode_failures == 0
    finally:
        await gateway.stop()

    # Refused exactly the events the contract cannot carry, with the reason payload_problem gives.
    assert refused == {s: p for s, p in ((s, payload_problem(v)) for s, v in sent.items()) if p is not None}
    published: dict[int, Any] = {}
    for _key, value in read_topic(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s")):
        record = orjson.loads(value)  # strict JSON: a NaN or Infinity token would not parse
        if record["kind"] != "event":
            continue
        assert record["seq"] not in published, record["seq"]  # exactly once
        published[record["seq"]] = record["payload"]
    assert sorted(published) == sorted(set(sent) - set(refused))
    assert all(published[s] == sent[s] for s in published)  # unchanged
    assert list(published) == sorted(published)  # in seq order
    record_outcome(
        f"Hostile payloads through a real gateway and Kafka ({count:,})", group="hostile",
        injected=f"{count:,} events in frames of 1-8 over one TCP connection, payloads as in the sans-IO campaign",
        checked=f"every frame answered within {FRAME_ANSWER_BOUND_S:.0f} s (its last seq acked, refused events "
                "first answered by one non-fatal invalid_payload naming their seq); every accepted event in the "
                "events topic exactly once, in order, as strict JSON with its payload unchanged; /healthz ok, no "
                "worker errors or task failures",
        outcome={"events": count, "published": len(published), "refused": len(refused),
                 "slowest_frame_s": round(slowest_s, 3)})
