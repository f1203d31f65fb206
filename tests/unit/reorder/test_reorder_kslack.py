"""K-slack family and oracle on the MP-K-slack worked example of thesis Figure 2.6."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reorder.eval.kslack import (
    AlphaController,
    AQKSlack,
    AQKSlackConfig,
    KSlack,
    MPKSlack,
    runtime_window_coverage,
    window_coverage_threshold,
)
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
    # ten events never fill a batch of 10,000, so alpha stays at its initial 1: AQ-K-slack = MP-K-slack
    aq = AQKSlack()
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


# -- AQ-K-slack as Siddhi's reorder:akslack (issue 25 item 4) --------------------------------------------------------


def test_alpha_controller_hand_computed_steps() -> None:
    # Eq. 2.3 as the extension runs it: err = thr - theta; alpha = |alpha + kp err + kd (err - err_prev)|,
    # from alpha = 0 and err_prev = 0 (defaults kp 0.5, kd 0.8).
    c = AlphaController(kp=0.5, kd=0.8)
    # first estimate, no L yet: theta = 1; err = -0.1 -> |0 - 0.05 - 0.08| = 0.13
    assert c.step(0.9, 1.0) == pytest.approx(0.13)
    # theta 0.8: err = 0.1 -> 0.13 + 0.05 + 0.8 * 0.2 = 0.34
    assert c.step(0.9, 0.8) == pytest.approx(0.34)
    # theta 1.0: err = -0.1 -> 0.34 - 0.05 - 0.16 = 0.13
    assert c.step(0.9, 1.0) == pytest.approx(0.13)
    # theta 1.0 again: err = -0.1, no change of err -> 0.13 - 0.05 = 0.08
    assert c.step(0.9, 1.0) == pytest.approx(0.08)
    # theta 1.0 with thr 0.7: err = -0.3 -> 0.08 - 0.15 - 0.16 = -0.23, kept positive: 0.23
    assert c.step(0.7, 1.0) == pytest.approx(0.23)


def test_window_coverage_threshold_hand_computed() -> None:
    # error threshold 0: both quadratics are (1 + t) x^2 - (2 + t) x + 1, roots 1 and 1 / (1 + t);
    # values all 2 (variance 0), n = 4, z = 2: t = 4 * (4 + 0) / (4 * 4) = 1 -> 1/2
    assert window_coverage_threshold([2.0] * 4, 2.0, 0.0) == pytest.approx(0.5)
    # values 1 and 3: mean 2, variance 1, n = 2, z = 1: t = (4 + 1) / (2 * 4) = 0.625 -> 1 / 1.625
    assert window_coverage_threshold([1.0, 3.0], 1.0, 0.0) == pytest.approx(1 / 1.625)
    # the extension's defaults on a constant field (the replay's traces without payload): n = 10,001,
    # t = 1.959964^2 / 10,001 = 3.8411e-4; only the first quadratic has real roots:
    # x = (1.940384 -+ sqrt(1.940384^2 - 4 * 1.000384 * 0.9409)) / (2 * 1.000384)
    #   = (1.940384 - sqrt(3.765090 - 3.765045)) / 2.000768 = (1.940384 - 0.00671) / 2.000768 -> 0.96647
    z = 1.959964
    assert window_coverage_threshold([5.0] * 10_001, z, 0.03) == pytest.approx(0.96647, abs=2e-5)
    assert math.isnan(window_coverage_threshold([0.0, 0.0], z, 0.03))


def test_runtime_window_coverage_hand_computed() -> None:
    # arrivals 1, 2, 5, 3, 4, 6; current 6, L = 2: the window ends at 4. Its events are 1, 2, 3, 4; the first
    # arrival reaching 4 is the 5, so 1 and 2 were covered and 3, 4 came after: 2 / 4.
    ts = [1, 2, 5, 3, 4, 6]
    assert runtime_window_coverage(6, ts, 2, 10) == 0.5
    assert ts == [1, 2, 5, 3, 4, 6]  # window start -6: nothing behind it
    # window 3: [1, 4]; the same coverage, and timestamps <= 1 leave the list
    assert runtime_window_coverage(6, ts, 2, 3) == 0.5
    assert ts == [2, 5, 3, 4, 6]
    assert runtime_window_coverage(100, [], 5, 10) == 1.0  # an empty window


def test_aq_k_slack_estimates_alpha_per_batch_and_k_only_moves_on_a_larger_delay() -> None:
    # batch_size 3: the 4th arrival triggers the first estimate (counter > batch size), with theta = 1.
    # Batch values all 2, n = 4, z = 1.959964, e = 0.03: t = 3.841459 / 4 = 0.960365, a = 1.960365;
    #   b1 = -2.900365, c1 = 0.9409: roots (2.900365 -+ 1.016909) / 3.92073 = 0.48038, 0.99876
    #   b2 = -3.020365, c2 = 1.0609: roots (3.020365 -+ 0.896455) / 3.92073 = 0.54172, 0.99900
    # theta_thr = 0.48038; alpha = |(0.5 + 0.8) (0.48038 - 1)| = 0.67550.
    aq = AQKSlack(AQKSlackConfig(batch_size=3, value=lambda e: 2.0))
    steps = [[o.event.source_ts_us for o in aq.push(SourceEvent("S", "R", i, ts), i) if isinstance(o, Released)]
             for i, ts in enumerate([10, 20, 15, 30])]
    assert aq.adjustments == 1
    assert aq.theta_thr == pytest.approx(0.48038, abs=1e-5)
    assert aq.alpha == pytest.approx(0.67550, abs=1e-5)
    # K was 0 until the 30: 10 and 20 left at once, the 15 (5 behind) waited. The estimate ran before the 30's
    # advance (K 0, so L = 0); the 30's delay 30 - 15 = 15 > K sets K = round(15 * 0.6755) = round(10.13) = 10;
    # 15 + 10 <= 30 releases the 15 (behind the 20); the 30 waits.
    assert aq.l_units == 0
    assert aq.k == 10
    assert steps == [[10], [20], [], [15]]
    # 31 - 21 = 10 is not above K: K stays. The 45 is the 4th arrival since the estimate: a second one first,
    # L still 0 (it was round(alpha * 0)), theta = 1, same error (no D term): alpha = 0.67550 - 0.5 * 0.51962
    # = 0.41569, L = min(round(0.41569 * 10), 10) = 4. Then its delay 45 - 22 = 23 > 10: K = round(9.561) = 10.
    for i, ts in enumerate([21, 31, 22, 45], start=4):
        aq.push(SourceEvent("S", "R", i, ts), i)
        if ts == 31:
            assert aq.k == 10
    assert aq.adjustments == 2
    assert aq.alpha == pytest.approx(0.41569, abs=1e-5)
    assert (aq.l_units, aq.k) == (4, 10)
    # 70 - 46 = 24 > 10: K = round(24 * 0.41569) = round(9.98) = 10. The 100 is the 4th arrival again: a third
    # estimate, now with L = 4: the window ends at 96, its 11 events all arrived before the first arrival >= 96
    # (the 100 itself): theta = 1, alpha = 0.41569 - 0.25981 = 0.15588, L = round(1.5588) = 2. Then the 100's
    # delay 100 - 60 = 40 > 10 sets K = round(40 * 0.15588) = round(6.235) = 6: below the old K.
    for i, ts in enumerate([46, 70, 60, 100], start=8):
        aq.push(SourceEvent("S", "R", i, ts), i)
        if ts == 70:
            assert aq.k == 10
    assert (aq.adjustments, aq.last_coverage) == (3, 1.0)
    assert aq.alpha == pytest.approx(0.15588, abs=1e-5)
    assert (aq.l_units, aq.k) == (2, 6)
