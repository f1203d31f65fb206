"""CPU per event of the gateway's decode and record-building stages, Python core vs native (in-process, no sockets).

Decode: the same frames (batches of ``--batch`` in-order events of one source, after its hello) through
  python        GatewaySession.receive_data (FrameDecoder + msgpack + contract.wire.messages)
  native        skewless_native.ConnectionDecoder.receive_data: the same messages as Python objects
  native-rust   the native decoder's Rust-side events (payloads as record JSON), no Python objects: the input
                of the later all-native pipeline
Decode + records, native-rust: the same frames decoded in Rust and each event's record value written in Rust (its
  reference time taken as its source time): the floor of bytes in -> record bytes out, before reorder and merge.
Records: the same EventRecords (key, value JSON, Kafka timestamp, headers, as gateway.ingest._publish builds them)
  python        record.key, record.to_json() (orjson), kafka_timestamp_ms, event_headers cached per source
  native        skewless_native.RecordBuilder.build_events, one call per batch

Times are this process's CPU time (time.process_time), each variant run ``--rounds`` times alternating with the
others; the table gives the median us per event. Two payload shapes: the hot-path benchmark's {"v": int} and a
richer map (a float, a string, a list, a nested map). Writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import skewless_native

from contract.records import EventRecord, event_headers, kafka_timestamp_ms
from contract.wire.frames import encode_frame
from contract.wire.messages import build_event, build_events, build_hello
from gateway.session import GatewaySession

BASE_US = 1_800_000_000_000_000
STREAM = "bench"


def small_payload(q: int) -> Any:
    return {"v": q & 255}


def rich_payload(q: int) -> Any:
    return {"temp_c": 20.0 + (q % 100) / 8, "door": "north-entrance", "tags": ["rfid", "badge"],
            "reader": {"id": q % 17, "ok": True}, "n": q}


def frames_of(events: int, batch: int, payload: Callable[[int], Any]) -> list[bytes]:
    return [encode_frame(build_events([build_event(STREAM, q, BASE_US + q * 10, payload(q))
                                       for q in range(start, min(start + batch, events))]))
            for start in range(0, events, batch)]


def hello() -> bytes:
    return encode_frame(build_hello("source-1", [STREAM]))


def cpu_s_per_frames(frames: list[bytes], receive: Callable[[bytes], object]) -> float:
    """CPU seconds of ``receive`` over every frame, in order (the decoder's setup not counted)."""
    clock = time.process_time
    start = clock()
    for data in frames:
        receive(data)
    return clock() - start


def python_decode(frames: list[bytes]) -> float:
    session = GatewaySession(max_events_per_batch=len(frames[0]))
    session.receive_data(hello())
    return cpu_s_per_frames(frames, session.receive_data)


def native_decoder() -> Any:
    decoder = skewless_native.ConnectionDecoder(max_events_per_batch=1_000_000)
    decoder.receive_data(hello())
    decoder.accept_hello([STREAM])
    return decoder


def native_decode(frames: list[bytes]) -> float:
    return cpu_s_per_frames(frames, native_decoder().receive_data)


def native_rust_decode(frames: list[bytes]) -> float:
    return cpu_s_per_frames(frames, native_decoder()._decode_rust_only)


def native_rust_decode_and_build(frames: list[bytes]) -> float:
    decoder = native_decoder()
    return cpu_s_per_frames(frames, lambda data: decoder._decode_and_build_rust_only(data, "source-1"))


def records_of(events: int, payload: Callable[[int], Any]) -> list[EventRecord]:
    return [EventRecord(STREAM, "source-1", q, BASE_US + q * 10, BASE_US + q * 10 + 7, 250, BASE_US + q * 10 + 900,
                        BASE_US + q * 10 + 5_000, payload=payload(q), rtt_us=400) for q in range(events)]


def python_records(batches: list[list[EventRecord]]) -> float:
    headers_of: dict[tuple[str, str], Any] = {}
    clock = time.process_time
    start = clock()
    for batch in batches:
        for record in batch:
            headers = headers_of.get((record.source_id, "events"))
            if headers is None:
                headers = headers_of[(record.source_id, "events")] = event_headers(record.source_id, "events")
            (record.key, record.to_json(), kafka_timestamp_ms(record.ref_ts_us, record.release_ts_us), headers)
    return clock() - start


def native_records(batches: list[list[EventRecord]]) -> float:
    builder = skewless_native.RecordBuilder()
    late = [False] * len(batches[0])
    clock = time.process_time
    start = clock()
    for batch in batches:
        builder.build_events(batch, late[:len(batch)])
    return clock() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for shape, payload in (("small", small_payload), ("rich", rich_payload)):
        frames = frames_of(args.events, args.batch, payload)
        records = records_of(args.events, payload)
        batches = [records[i:i + args.batch] for i in range(0, len(records), args.batch)]
        variants: dict[str, Callable[[], float]] = {
            "decode python": partial(python_decode, frames),
            "decode native": partial(native_decode, frames),
            "decode native-rust": partial(native_rust_decode, frames),
            "decode+records native-rust": partial(native_rust_decode_and_build, frames),
            "records python": partial(python_records, batches),
            "records native": partial(native_records, batches),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, run in variants.items():
                times[name].append(run())
        for name, samples in times.items():
            rows.append((shape, name, statistics.median(samples) / args.events * 1e6))
    print(f"{args.events:,} events, batches of {args.batch}, median of {args.rounds} alternating runs, CPU time")
    print(f"{'payload':<8} {'stage':<27} {'us/event':>9} {'vs python':>10}")
    us_of = {(shape, name): us for shape, name, us in rows}
    for shape, name, us in rows:
        stage = name.split()[0]
        # decode+records is set against the two Python stages together
        base = (us_of[(shape, "decode python")] + us_of[(shape, "records python")] if stage == "decode+records"
                else us_of[(shape, f"{stage} python")])
        print(f"{shape:<8} {name:<27} {us:>9.3f} {base / us:>9.1f}x")


if __name__ == "__main__":
    main()
