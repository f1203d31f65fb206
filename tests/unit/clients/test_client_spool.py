"""The file spool: recovery after a restart, torn tails, compaction, bounds, ownership."""

from __future__ import annotations

import pytest

from clients.spool import FileSpool, SpoolError


def test_a_fresh_spool_is_empty(tmp_path):
    spool = FileSpool(tmp_path / "s.spool", "src")
    assert spool.state.events == []
    assert spool.state.next_seq == {}
    spool.close()


def test_unacked_events_and_next_seq_survive_a_reopen(tmp_path):
    path = tmp_path / "s.spool"
    spool = FileSpool(path, "src")
    for i in range(10):
        spool.append_event("a", i, 100 + i, {"i": i})
    spool.append_event("b", 0, 5, None)
    spool.append_ack("a", 6)
    spool.close()

    state = FileSpool(path, "src").state
    assert state.next_seq == {"a": 10, "b": 1}
    assert state.acked_through == {"a": 6}
    assert state.events == [("a", 7, 107, {"i": 7}), ("a", 8, 108, {"i": 8}), ("a", 9, 109, {"i": 9}),
                            ("b", 0, 5, None)]
    assert state.truncated_bytes == 0


def test_a_torn_or_corrupt_tail_is_truncated(tmp_path):
    path = tmp_path / "s.spool"
    spool = FileSpool(path, "src")
    spool.append_event("a", 0, 1, "x")
    spool.append_event("a", 1, 2, "y")
    spool.close()
    good_size = path.stat().st_size
    with path.open("ab") as fh:
        fh.write(b"\x00\x00\x00\x20\x00\x00")  # half a record header: the process died mid-write
    reopened = FileSpool(path, "src")
    assert [e[1] for e in reopened.state.events] == [0, 1]
    assert reopened.state.truncated_bytes == 6
    reopened.close()
    assert path.stat().st_size == good_size

    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the last record: its checksum fails, the record is dropped
    path.write_bytes(bytes(data))
    state = FileSpool(path, "src").state
    assert [e[1] for e in state.events] == [0]


def test_compaction_keeps_only_live_events_and_the_counters(tmp_path, monkeypatch):
    monkeypatch.setattr("clients.spool._COMPACT_MIN_DEAD_BYTES", 1_000)
    path = tmp_path / "s.spool"
    spool = FileSpool(path, "src")
    for i in range(200):
        spool.append_event("a", i, i, "p" * 20)
    spool.append_ack("a", 189)
    assert spool.compactions == 1
    assert spool.file_bytes < 1_000
    assert spool.file_bytes == path.stat().st_size
    spool.append_event("a", 200, 200, "q")
    spool.close()
    state = FileSpool(path, "src").state
    assert [e[1] for e in state.events] == [*range(190, 200), 200]
    assert state.next_seq == {"a": 201}
    assert state.acked_through == {"a": 189}


def test_a_fully_acked_spool_compacts_to_its_counters(tmp_path, monkeypatch):
    monkeypatch.setattr("clients.spool._COMPACT_MIN_DEAD_BYTES", 100)
    path = tmp_path / "s.spool"
    spool = FileSpool(path, "src")
    for i in range(20):
        spool.append_event("a", i, i, "p" * 20)
    spool.append_ack("a", 19)
    assert spool.live_bytes == 0
    spool.close()
    state = FileSpool(path, "src").state
    assert state.events == []
    assert state.next_seq == {"a": 20}


def test_the_bound_is_on_live_bytes(tmp_path):
    spool = FileSpool(tmp_path / "s.spool", "src", max_bytes=200)
    i = 0
    while spool.has_room:
        spool.append_event("a", i, i, "p" * 30)
        i += 1
    assert 4 <= i <= 6
    spool.append_ack("a", i - 1)
    assert spool.has_room
    assert spool.live_bytes == 0
    spool.close()


def test_a_spool_of_another_source_or_not_a_spool_is_refused(tmp_path):
    path = tmp_path / "s.spool"
    FileSpool(path, "src").close()
    with pytest.raises(SpoolError, match="belongs to source 'src'"):
        FileSpool(path, "other")
    junk = tmp_path / "junk"
    junk.write_bytes(b"hello world, not a spool at all")
    with pytest.raises(SpoolError):
        FileSpool(junk, "src")


def test_closed_spool_refuses_writes_and_fsync_mode_works(tmp_path):
    spool = FileSpool(tmp_path / "s.spool", "src", fsync=True)
    spool.append_event("a", 0, 0, None)
    spool.flush()
    spool.close()
    with pytest.raises(ValueError, match="closed"):
        spool.append_event("a", 1, 0, None)


def test_interval_events_survive_a_reopen_and_a_compaction_as_intervals(tmp_path, monkeypatch):
    from contract.wire.messages import AtomicInterval, IntervalEndpoint

    monkeypatch.setattr("clients.spool._COMPACT_MIN_DEAD_BYTES", 1_000)
    path = tmp_path / "s.spool"
    spool = FileSpool(path, "src")
    for i in range(100):
        spool.append_event("a", i, 1_000 + i, "p" * 20)
    spool.append_event("a", 100, 2_000, {"k": 1}, AtomicInterval(1_500))
    spool.append_event("a", 101, 2_100, None, IntervalEndpoint("door-7", "start"))
    spool.append_event("a", 102, 2_200, None, IntervalEndpoint("door-7", "end"))
    spool.append_event("a", 103, 2_300, "point")
    spool.close()

    state = FileSpool(path, "src").state
    assert [e[1] for e in state.events] == list(range(104))
    assert state.intervals == {("a", 100): AtomicInterval(1_500), ("a", 101): IntervalEndpoint("door-7", "start"),
                               ("a", 102): IntervalEndpoint("door-7", "end")}

    spool = FileSpool(path, "src")
    spool.append_ack("a", 100)  # the atomic interval is acked; dead bytes outweigh live ones: compaction
    assert spool.compactions == 1
    spool.close()
    state = FileSpool(path, "src").state
    assert state.events == [("a", 101, 2_100, None), ("a", 102, 2_200, None), ("a", 103, 2_300, "point")]
    assert state.intervals == {("a", 101): IntervalEndpoint("door-7", "start"),
                               ("a", 102): IntervalEndpoint("door-7", "end")}


def test_an_explicit_compaction_keeps_the_given_interval_keys(tmp_path):
    from contract.wire.messages import AtomicInterval

    path = tmp_path / "s.spool"
    spool = FileSpool(path, "src")
    spool.compact([("a", 0, 10, "x"), ("a", 1, 20, "y")], {("a", 1): AtomicInterval(15)})
    spool.close()
    state = FileSpool(path, "src").state
    assert state.events == [("a", 0, 10, "x"), ("a", 1, 20, "y")]
    assert state.intervals == {("a", 1): AtomicInterval(15)}


def test_malformed_interval_keys_in_a_spool_fail_loudly(tmp_path):
    import zlib

    import msgpack

    path = tmp_path / "s.spool"
    FileSpool(path, "src").close()
    body = msgpack.packb(["E", "a", 0, 10, "x", {"source_start_ts_us": "soon"}])
    with path.open("ab") as fh:
        fh.write(len(body).to_bytes(4, "big") + zlib.crc32(body).to_bytes(4, "big") + body)
    with pytest.raises(SpoolError, match="malformed interval keys"):
        FileSpool(path, "src")
