"""What the DeliveryTracker differential tests share: the tracker's state as comparable data, and the operations
both trackers of a test (the tested call and its per-event or per-seq specification) take the same way."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from gateway.acks import DeliveryTracker

SOURCES = ("a", "b")
STREAMS = ("s", "t")
# The operations apply_to_both serves; a test adds its own (the call under test) to these.
COMMON_OPS = ["confirm", "give_up", "fail", "compact", "forget", "resume"]


def state(tracker: DeliveryTracker) -> Any:
    progress = {key: {name: copy.deepcopy(getattr(entry, name)) for name in type(entry).__slots__}
                for key, entry in tracker._progress.items()}
    for entry in progress.values():
        entry["confirmed"], entry["given_up"] = list(entry["confirmed"]), list(entry["given_up"])
    return progress, dict(tracker._floors)


def apply_to_both(op: str, tested: DeliveryTracker, spec: DeliveryTracker, source: str, stream: str, seq: int,
                  data: st.DataObject) -> None:
    """One of COMMON_OPS on both trackers; the answers that return one must agree."""
    if op == "confirm":
        assert tested.confirmed(source, stream, seq) == spec.confirmed(source, stream, seq)
    elif op == "give_up":
        last = seq + data.draw(st.integers(0, 5))
        assert tested.give_up(source, stream, seq, last) == spec.give_up(source, stream, seq, last)
    elif op == "fail":
        tested.failed(source, stream, seq)
        spec.failed(source, stream, seq)
    elif op == "compact":
        tested.compact(source, STREAMS)
        spec.compact(source, STREAMS)
    elif op == "forget":
        tested.forget(source, STREAMS)
        spec.forget(source, STREAMS)
    else:
        assert op == "resume", op
        tested.resume(source, stream, seq)
        spec.resume(source, stream, seq)
