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
