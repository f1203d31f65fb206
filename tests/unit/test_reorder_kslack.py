"""K-slack family and oracle on the MP-K-slack worked example of thesis Figure 2.6."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from reorder.eval.kslack import AQKSlack, AQKSlackConfig, KSlack, MPKSlack
from reorder.eval.oracle import oracle_schedule
from reorder.records import Late, Released, SourceEvent
from reorder.sequence import SequenceConfig, SequenceReorderer

# Figure 2.6: buffer input e1..e10 with these timestamps, one arrival per time unit.
FIG_2_6_TS = [1, 4, 3, 5, 6, 9, 7, 8, 10, 13]
# Buffer output row of Figure 2.6 (e10 is still held at the end of the figure).
FIG_2_6_OUTPUT = [1, 2, 3, 4, 5, 7, 8, 6, 9]
FIG_2_6_K = [0, 0, 0, 2, 2, 2, 2, 2, 3, 3]


def flat(steps: list[list[int]]) -> list[int]:
    return [x for step in steps for x in step]


def fig_events() -> list[SourceEvent]:
    return [SourceEvent("S", "R", i + 1, ts) for i, ts in enumerate(FIG_2_6_TS)]


def run(reorderer: KSlack) -> tuple[list[list[int]], list[int]]:
    """Per arrival: the e-indices released; and K after each arrival."""
    steps: list[list[int]] = []
    ks: list[int] = []
    for t, e in enumerate(fig_events()):
        out = reorderer.push(e, t)
        steps.append([o.event.seq for o in out if isinstance(o, Released)])
        ks.append(reorderer.effective_k_us())
    return steps, ks


def test_mp_k_slack_reproduces_figure_2_6() -> None:
    steps, ks = run(MPKSlack())
    assert ks == FIG_2_6_K
    # e1, e2 at once; e3 at e4's arrival; e4, e5 at e6's; e7 at e9's; e8, e6, e9 at e10's
    assert steps == [[1], [2], [], [3], [], [4, 5], [], [], [7], [8, 6, 9]]
    assert flat(steps) == FIG_2_6_OUTPUT


def test_mp_k_slack_reports_e3_as_late() -> None:
    mp = MPKSlack()
    outs = [o for t, e in enumerate(fig_events()) for o in mp.push(e, t)]
    late = [o for o in outs if isinstance(o, Late)]
    assert [(o.event.seq, o.lateness_us, o.passed) for o in late] == [(3, 1, True)]
    assert mp.counters.late == 1


def test_aq_k_slack_with_alpha_one_reproduces_figure_2_6() -> None:
    # ten events never close a 1 s coverage window, so alpha stays at its initial 1: AQ-K-slack = MP-K-slack
    aq = AQKSlack(AQKSlackConfig(window_us=1_000_000))
    steps, ks = run(aq)
    assert aq.alpha == 1.0
    assert ks == FIG_2_6_K
    assert flat(steps) == FIG_2_6_OUTPUT


def test_fixed_k_slack_on_figure_2_6_hand_computed() -> None:
    # K = 3 fixed: release ts + 3 <= t_curr when t_curr advances.
    steps, ks = run(KSlack(3))
    assert ks == [3] * 10
    assert steps == [[], [1], [], [], [3], [2, 4, 5], [], [], [7], [8, 6, 9]]
    # in timestamp terms 1, 3, 4, 5, 6, 7, 8, 9, 10: a K known in advance orders this input fully
    assert [FIG_2_6_TS[s - 1] for s in flat(steps)] == [1, 3, 4, 5, 6, 7, 8, 9, 10]
    # K = 0 releases everything on arrival when t_curr advances; e3, e7, e8 wait for the next advance
    steps0, _ = run(KSlack(0))
    assert flat(steps0) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert steps0 == [[1], [2], [], [3, 4], [5], [6], [], [], [7, 8, 9], [10]]


def test_sequence_reorderer_and_oracle_on_figure_2_6_restore_full_order() -> None:
    events = fig_events()
    # the source numbers its events in timestamp order
    rank = {ts: i for i, ts in enumerate(sorted(FIG_2_6_TS))}
    r = SequenceReorderer("S", "R", SequenceConfig(latency_threshold_us=10**9))
    released: list[int] = []
    for t, e in enumerate(events):
        for o in r.push(e._replace(seq=rank[e.source_ts_us]), t):
            if isinstance(o, Released):
                released.append(o.event.source_ts_us)
    assert released == sorted(FIG_2_6_TS)
    schedule = oracle_schedule(FIG_2_6_TS, list(range(10)))
    assert [FIG_2_6_TS[i] for i, _ in schedule] == sorted(FIG_2_6_TS)
    # ts 3 (arrives at 2) waits for nothing earlier; ts 4 (arrived 1) must wait for ts 3 (2);
    # ts 7, 8 arrive at 6, 7 so ts 9 (arrived 5) leaves at 7.
    assert [r for _, r in schedule] == [0, 2, 2, 3, 4, 6, 7, 7, 8, 9]


def test_flush_releases_the_rest_in_timestamp_order() -> None:
    mp = MPKSlack()
    for t, e in enumerate(fig_events()):
        mp.push(e, t)
    out = mp.flush(100)
    assert [o.event.seq for o in out if isinstance(o, Released)] == [10]
    assert mp.buffered == 0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=50))
def test_mp_k_slack_loses_nothing_and_k_never_shrinks(ts_list: list[int]) -> None:
    mp = MPKSlack()
    out: list[object] = []
    last_k = 0
    for t, ts in enumerate(ts_list):
        out += mp.push(SourceEvent("S", "R", t, ts), t)
        assert mp.k_max_us >= last_k
        last_k = mp.k_max_us
    out += mp.flush(10**6)
    assert sorted(o.event.seq for o in out if isinstance(o, Released)) == list(range(len(ts_list)))
    not_late = [o.event.source_ts_us for o in out if isinstance(o, Released) and not o.late]
    assert not_late == sorted(not_late)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), min_size=1, max_size=60))
def test_oracle_output_is_sorted_and_never_before_arrival(pairs: list[tuple[int, int]]) -> None:
    ts = [p[0] for p in pairs]
    arr = [p[1] for p in pairs]
    schedule = oracle_schedule(ts, arr)
    assert sorted(i for i, _ in schedule) == list(range(len(pairs)))
    assert [ts[i] for i, _ in schedule] == sorted(ts)
    assert all(rel >= arr[i] for i, rel in schedule)
    assert [rel for _, rel in schedule] == sorted(rel for _, rel in schedule)
