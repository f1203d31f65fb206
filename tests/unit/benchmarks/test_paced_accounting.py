"""The paced benchmark's check (benchmarks/gateway_throughput.py, ``paced_run``): every event a source sent and had
acked is on the events or late topic exactly once, by (source, seq)."""

from benchmarks.gateway_throughput import unaccounted


def record(source: str, seq: int) -> dict[str, object]:
    return {"source_id": source, "seq": seq}


def test_every_event_once_leaves_nothing_unaccounted() -> None:
    # src-0 sent seqs 0-2, src-1 seqs 0-1; one of src-1's is on the late topic (the list holds both topics).
    records = [record("src-0", 0), record("src-1", 0), record("src-0", 1), record("src-0", 2), record("src-1", 1)]
    assert unaccounted([3, 2], records) == ([], [])


def test_a_missing_event_and_a_repeated_one_are_named() -> None:
    records = [record("src-0", 0), record("src-0", 2), record("src-0", 2), record("src-1", 0)]
    assert unaccounted([3, 2], records) == ([("src-0", 1), ("src-1", 1)], [("src-0", 2)])
