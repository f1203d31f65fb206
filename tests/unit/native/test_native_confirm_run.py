"""``EventDigests.confirm_run`` (native/src/dedup.rs), ``DeliveryTracker.confirmed_run``'s in-order loop with the
native digests, against ``confirmed`` per seq: a tracker with the native digests confirms runs as the Python loop
does (tests/unit/gateway/test_acks_confirmed_run.py's operations, both trackers sharing one digest definition, so
the digests in the ring are compared too); and the call itself by hand where it hands a seq back."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.acks import RECENT_ACKED_DIGESTS, DeliveryTracker
from gateway.native import native_event_digests
from tests.unit.gateway.test_acks_confirmed_run import check_confirmed_run


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_confirmed_run_with_native_digests_is_confirmed_per_seq(data: st.DataObject) -> None:
    digests = native_event_digests()
    check_confirmed_run(data, lambda: DeliveryTracker(max_seq_jump=50, digests=digests))


def test_the_in_order_loop_goes_native() -> None:
    """A tracker with the native digests does not run the Python loop: a run of 300 seqs keeps the ring's newest
    digests as 300 single confirmations do."""
    digests = native_event_digests()
    runs, spec = DeliveryTracker(digests=digests), DeliveryTracker(digests=digests)
    for tracker in (runs, spec):
        for seq in range(300):
            tracker.admit("a", "s", seq, (10, seq))
    assert runs.confirmed_run("a", "s", 0, 299) == (0, 299)
    for seq in range(300):
        spec.confirmed("a", "s", seq)
    progress, expected = runs._progress[("a", "s")], spec._progress[("a", "s")]
    assert progress.pending == {} and progress.acked_through == 299
    assert progress.recent_seqs == expected.recent_seqs and progress.recent_digests == expected.recent_digests
    assert runs.admit("a", "s", 299, (10, -1)) == "conflict"
    assert runs.admit("a", "s", 100, (10, -1)) == "duplicate"


def test_confirm_run_hands_back_what_it_cannot_write() -> None:
    """Popped whatever its value; None digests skipped; without a ring the first digest comes back (popped), with
    one each digest is written at ``seq % len``; a digest beyond 64 bits comes back (``_remember`` then raises
    OverflowError, as the Python loop does)."""
    digests = native_event_digests()
    pending: dict[int, int | None] = {0: None, 1: 11, 2: None, 3: 2**70, 4: 14, 130: 9}
    assert digests.confirm_run(pending, None, None, 0, 4) == (1, 11)
    assert pending == {2: None, 3: 2**70, 4: 14, 130: 9}
    seqs, values = array("q", [-1]) * RECENT_ACKED_DIGESTS, array("q", [0]) * RECENT_ACKED_DIGESTS
    assert digests.confirm_run(pending, seqs, values, 2, 4) == (3, 2**70)
    assert pending == {4: 14, 130: 9}
    assert digests.confirm_run(pending, seqs, values, 4, 130) is None
    assert pending == {}
    assert (seqs[4], values[4], seqs[2], values[2]) == (4, 14, 130, 9)  # 130 % 128 == 2
    assert digests.confirm_run(pending, seqs, values, 5, 4) is None  # an empty run
    # Not writable arrays of 64-bit ints: handed back, as without a ring.
    pending = {5: 15}
    assert digests.confirm_run(pending, array("i", [0]) * 128, values, 5, 5) == (5, 15)
    assert pending == {}
