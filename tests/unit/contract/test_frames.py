import msgpack
import pytest

from contract.wire.errors import FrameTooLarge, MalformedFrame
from contract.wire.frames import HEADER, FrameDecoder, encode_frame

MESSAGES = [
    {"type": "hello", "version": 1, "source_id": "s", "streams": ["a"]},
    {"type": "events", "events": [{"stream": "a", "seq": 0, "source_ts_us": 5, "payload": {"x": 1.5}}]},
    {"type": "bye"},
]


def test_encode_is_length_prefixed_msgpack():
    frame = encode_frame({"type": "bye"})
    body = msgpack.packb({"type": "bye"}, use_bin_type=True)
    assert frame == len(body).to_bytes(4, "big") + body


def test_decode_whole_stream_at_once():
    data = b"".join(encode_frame(m) for m in MESSAGES)
    assert FrameDecoder().feed(data) == MESSAGES


def test_decode_byte_by_byte():
    data = b"".join(encode_frame(m) for m in MESSAGES)
    decoder = FrameDecoder()
    got = []
    for i in range(len(data)):
        got.extend(decoder.feed(data[i:i + 1]))
    assert got == MESSAGES
    assert decoder.buffered_bytes == 0


def test_trailing_partial_frame_stays_buffered():
    data = encode_frame(MESSAGES[0]) + encode_frame(MESSAGES[1])[:7]
    decoder = FrameDecoder()
    assert decoder.feed(data) == [MESSAGES[0]]
    assert decoder.buffered_bytes == 7
    assert decoder.feed(encode_frame(MESSAGES[1])[7:]) == [MESSAGES[1]]


def test_oversized_length_rejected_before_body_arrives():
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge, match="101 bytes exceeds the limit of 100"):
        decoder.feed(HEADER.pack(101))


def test_frame_at_exact_limit_accepted():
    body = msgpack.packb({"type": "x", "pad": "a" * 50})
    decoder = FrameDecoder(max_frame_bytes=len(body))
    assert decoder.feed(HEADER.pack(len(body)) + body) == [{"type": "x", "pad": "a" * 50}]


@pytest.mark.parametrize(("body", "message"), [
    (b"\xc1", "not valid msgpack"),
    (msgpack.packb([1, 2]), "must be a map"),
    (msgpack.packb({"kind": "hello"}), "no string 'type'"),
    (msgpack.packb({"type": 7}), "no string 'type'"),
    (msgpack.packb({1: "int key"}), "frame map has a non-string key"),
    (msgpack.packb({"type": "events", 1: "int key"}), "frame map has a non-string key"),
])
def test_malformed_bodies(body, message):
    with pytest.raises(MalformedFrame, match=message):
        FrameDecoder().feed(HEADER.pack(len(body)) + body)


def test_zero_length_frame_is_malformed():
    with pytest.raises(MalformedFrame, match="empty frame"):
        FrameDecoder().feed(HEADER.pack(0))
