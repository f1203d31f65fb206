"""Tables 5.11 / 5.12 of thesis 003: window-average error, one estimated window vs the LOW/MIDDLE/HIGH average.

Pure simulation (no Kafka, no Spark), ~30 s::

    .venv/bin/python -m benchmarks.three_window_error [--seeds 12] [--no-write]

Setup, as in Sec. 5.2.3.1: two sources send velocity readings; source 0's clock is right, source 1's is 5 ms
ahead.  Each source syncs with the NTP-style exchanges of ``timesync.estimator`` (a burst of 8 every second, the
minimum filter and skew regression of the gateway).  The "0.125 ms transport delay" is a one-way delay on the
sync path: source 1's requests travel 125 us longer than its replies, the asymmetry that Eq. 3.13 cannot see, so
its offset estimate is off by ~62 us while its RTT (the thesis' ``T_s``) grows by 125 us.  Events are mapped to the
reference clock with the estimate in force (``ref = source + offset + skew``), exactly as the gateway does.

For 10 s time batch windows we compare, per window, with the average over the *true* event times:

* single: the average of the one estimated window ``[t, t + w)`` on reference times (Query 5.6);
* three (thesis): the mean of the LOW, MIDDLE and HIGH averages, ``s = T_a / 2`` (Query 5.7);
* three (per-event): the same with each event shifted by its own source's ``rtt / 2`` bound.

Writes the "three-window" section of docs/cep-benchmark.md and docs/cep-three-window.png.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.plotstyle import axis_labels, pyplot, save
from cep.three_window import FinalResult, ShiftMode, ThreeWindowAggregator
from reorder.eval.progress import progress_bar, progress_enabled
from timesync.estimator import ClockEstimate, ClockEstimator, SyncSample

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
WINDOW_US = 10_000_000
WINDOWS = 7  # Table 5.11 has seven windows
RATE_HZ = 1_000  # per source (DEBS 2013 sensors report at 200 Hz and 2000 Hz)
AHEAD_US = (0, 5_000)  # source clock minus true time: source 1 is 5 ms ahead ("5 ms drift")
# Extra one-way uplink delay on each source's sync path: the thesis setup delays the drifted source only; the
# second scenario delays both, so every source's estimate sits near the edge of its bound.
SCENARIOS = {"drifted source delayed (thesis)": (0, 125), "both sources delayed": (125, 125)}
SKEW_PPM = (0.0, 3.0)
BASE_ONE_WAY_US = 40
JITTER_MEAN_US = 15
THESIS_SINGLE = (0, -0.12, 1.54, -1.53, 0.06, -0.25, 1.43)  # Table 5.11, expected - actual (um/s)
THESIS_THREE = (0, 0.22, 0.21, -0.36, 0.57, -0.60, 0.04)  # Table 5.12


@dataclass(frozen=True)
class Clock:
    ahead_us: int
    skew_ppm: float

    def read(self, true_us: float) -> int:
        return round(true_us + self.ahead_us + true_us * self.skew_ppm * 1e-6)


def sync_rounds(clock: Clock, transport_us: int, end_us: int, rng: random.Random) -> list[tuple[int, ClockEstimate]]:
    """(true time the estimate is in force from, estimate) for a burst of 8 exchanges every second."""
    est = ClockEstimator()
    out: list[tuple[int, ClockEstimate]] = []
    start = -1_500_000
    while start <= end_us + 1_000_000:
        t = float(start)
        for _ in range(8):
            up = BASE_ONE_WAY_US + transport_us + rng.expovariate(1 / JITTER_MEAN_US)
            down = BASE_ONE_WAY_US + rng.expovariate(1 / JITTER_MEAN_US)
            t2 = round(t + up)
            t3 = t2 + 10
            est.add_sample(SyncSample(clock.read(t), t2, t3, clock.read(t3 + down)))
            t += 2_000
        est.end_burst()
        estimate = est.estimate()
        assert estimate is not None
        out.append((round(t), estimate))
        start += 1_000_000
    return out


def velocity(true_us: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A player's |v| in um/s: slow changes, sprints, and sensor noise (the shape of DEBS 2013 v_abs)."""
    seconds = true_us / 1e6
    slow = 140_000 + 60_000 * np.sin(2 * np.pi * seconds / rng.uniform(15, 40) + rng.uniform(0, 6.3))
    sprint = 300_000 * np.maximum(0, np.sin(2 * np.pi * seconds / rng.uniform(5, 9) + rng.uniform(0, 6.3))) ** 8
    out: np.ndarray = np.abs(slow + sprint + rng.normal(0, 40_000, size=true_us.shape))
    return out


@dataclass
class SeedResult:
    truth: list[float]
    single: list[float]
    thesis: list[float]
    per_event: list[float]
    ta_us: int
    offset_error_us: float


def window_avgs(ts: np.ndarray, values: np.ndarray) -> list[float]:
    idx = np.floor_divide(ts, WINDOW_US)  # windows before 0 and after the last are ignored
    return [float(values[idx == k].mean()) for k in range(WINDOWS)]


def run_seed(seed: int, transport_us: tuple[int, int]) -> SeedResult:
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    end = WINDOWS * WINDOW_US
    true_parts, ref_parts, unc_parts, val_parts = [], [], [], []
    ta = 0
    offset_errors = []
    for src in (0, 1):
        clock = Clock(AHEAD_US[src], SKEW_PPM[src])
        rounds = sync_rounds(clock, transport_us[src], end, rng)
        period = 1e6 / RATE_HZ
        # The stream runs one second past both ends, so the first and last windows have neighbours like the rest.
        grid = np.arange(-1e6 + nrng.uniform(0, period), end + 1e6, period)
        true = np.sort(grid + nrng.normal(0, period / 10, size=grid.shape))
        values = velocity(true, nrng)
        starts = np.array([r[0] for r in rounds])
        which = np.searchsorted(starts, true, side="right") - 1
        ref = np.empty(len(true), dtype=np.int64)
        unc = np.empty(len(true), dtype=np.int64)
        for i, (t, k) in enumerate(zip(true, which, strict=True)):
            estimate = rounds[max(k, 0)][1]
            ref[i] = estimate.to_reference_us(clock.read(float(t)))
            unc[i] = (estimate.rtt_us + 1) // 2
        for _, estimate in rounds:
            ta = max(ta, estimate.rtt_us)
        offset_errors.append(float(np.mean(np.abs(ref - true))))
        true_parts.append(true)
        ref_parts.append(ref)
        unc_parts.append(unc)
        val_parts.append(values)
    true_all = np.concatenate(true_parts)
    ref_all = np.concatenate(ref_parts)
    unc_all = np.concatenate(unc_parts)
    val_all = np.concatenate(val_parts)
    order = np.argsort(ref_all, kind="stable")  # the merged stream is in reference-time order
    ref_all, unc_all, val_all, true_all = ref_all[order], unc_all[order], val_all[order], true_all[order]
    truth = window_avgs(np.floor(true_all).astype(np.int64), val_all)
    single = window_avgs(ref_all, val_all)
    results = {}
    modes: tuple[ShiftMode, ShiftMode] = ("thesis", "per_event")
    for mode in modes:
        agg = ThreeWindowAggregator(WINDOW_US, shift_mode=mode, ta_us=ta, max_shift_us=int(unc_all.max()))
        agg.add_many(ref_all.tolist(), val_all.tolist(), unc_all.tolist())
        finals = {r.nominal_start_us: r for r in agg.flush() if isinstance(r, FinalResult)}
        results[mode] = [float(finals[k * WINDOW_US].avg or 0.0) for k in range(WINDOWS)]
    return SeedResult(truth, single, results["thesis"], results["per_event"], ta, max(offset_errors))


def mean_abs(xs: list[float]) -> float:
    return float(np.mean(np.abs(xs)))


def summarize(runs: list[SeedResult]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("single", "thesis", "per_event"):
        errs = [e - t for r in runs for e, t in zip(getattr(r, name), r.truth, strict=True)]
        out[name] = mean_abs(errs)
        out[name + "_rms"] = float(np.sqrt(np.mean(np.square(errs))))
    out["ta_us"] = float(np.mean([r.ta_us for r in runs]))
    out["offset_error_us"] = float(np.mean([r.offset_error_us for r in runs]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=12, help="seeds per scenario")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = parser.parse_args()
    started = time.perf_counter()
    all_runs: dict[str, list[SeedResult]] = {}
    with progress_bar("seeds", args.seeds * len(SCENARIOS),
                      enabled=progress_enabled(not args.no_progress)) as advance:
        for name, transport in SCENARIOS.items():
            all_runs[name] = []
            for s in range(args.seeds):
                all_runs[name].append(run_seed(s, transport))
                advance(description=f"{name} seeds")
    summaries = {name: summarize(runs) for name, runs in all_runs.items()}
    runs = next(iter(all_runs.values()))
    first = runs[0]
    print(f"{args.seeds} seeds per scenario, {WINDOWS} windows of {WINDOW_US / 1e6:.0f} s, {RATE_HZ} Hz per source")
    print("thesis scenario, seed 0, per window: truth, single - truth, three(thesis) - truth, three(per-event) - truth")
    rows = []
    for k in range(WINDOWS):
        row = (
            k + 1,
            first.truth[k],
            first.single[k] - first.truth[k],
            first.thesis[k] - first.truth[k],
            first.per_event[k] - first.truth[k],
        )
        rows.append(row)
        print(f"  {row[0]}  {row[1]:12.2f}  {row[2]:+8.2f}  {row[3]:+8.2f}  {row[4]:+8.2f}")
    for name, sm in summaries.items():
        print(
            f"{name}: T_a {sm['ta_us']:.0f} us, worst source mean |ref - true| {sm['offset_error_us']:.1f} us; "
            f"mean |error| single {sm['single']:.2f}, three (thesis) {sm['thesis']:.2f} "
            f"({100 * (sm['thesis'] / sm['single'] - 1):+.0f} %), three (per-event) {sm['per_event']:.2f} "
            f"({100 * (sm['per_event'] / sm['single'] - 1):+.0f} %) um/s"
        )
    thesis_single, thesis_three = mean_abs(list(THESIS_SINGLE)), mean_abs(list(THESIS_THREE))
    print(
        f"thesis Tables 5.11/5.12: mean |error| single {thesis_single:.2f}, three {thesis_three:.2f} "
        f"({100 * (thesis_three / thesis_single - 1):+.0f} %)"
    )
    print(f"runtime {time.perf_counter() - started:.1f} s")
    if args.no_write:
        return
    plot(all_runs)
    write_doc(args.seeds, rows, summaries, thesis_single, thesis_three)


def plot(all_runs: dict[str, list[SeedResult]]) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    x = np.arange(1, WINDOWS + 1)
    first = next(iter(all_runs.values()))[0]
    ax1.axhline(0, color="grey", lw=0.8)
    ax1.plot(x, np.array(first.single) - first.truth, "o-", label="single window (Query 5.6)")
    ax1.plot(x, np.array(first.thesis) - first.truth, "s-", label="LOW/MIDDLE/HIGH mean, s = T_a/2 (Query 5.7)")
    ax1.plot(x, np.array(first.per_event) - first.truth, "^-", label="LOW/MIDDLE/HIGH mean, per-event s")
    axis_labels(ax1, ("time batch window, thesis scenario, seed 0", "window number"),
                ("window average - true average", "µm/s"))
    ax1.set_title("Fig. 5.14 analogue")
    ax1.legend()
    names = list(all_runs)
    width = 0.25
    for j, (key, label) in enumerate(
        (("single", "single"), ("thesis", "three, s = T_a/2"), ("per_event", "three, per-event s"))
    ):
        vals = [summarize(all_runs[n])[key] for n in names]
        ax2.bar(np.arange(len(names)) + (j - 1) * width, vals, width, label=label)
    ax2.set_xticks(np.arange(len(names)), [n.replace(" (", "\n(") for n in names])
    axis_labels(ax2, ("scenario", None), ("mean |error| over all windows", "µm/s"))
    ax2.set_title("all seeds")
    ax2.legend()
    save(fig, DOCS / "cep-three-window.png")


def write_doc(
    seeds: int,
    rows: list[tuple[int, float, float, float, float]],
    summaries: dict[str, dict[str, float]],
    thesis_single: float,
    thesis_three: float,
) -> None:
    table = "\n".join(f"| {k} | {truth:.2f} | {s:+.2f} | {t:+.2f} | {e:+.2f} |" for k, truth, s, t, e in rows)

    def pct(sm: dict[str, float], key: str) -> str:
        return f"{100 * (sm[key] / sm['single'] - 1):+.0f} %"

    summary_rows = "\n".join(
        f"| {name} | {sm['ta_us']:.0f} | {sm['offset_error_us']:.1f} | {sm['single']:.2f} | {sm['thesis']:.2f} "
        f"({pct(sm, 'thesis')}) | {sm['per_event']:.2f} ({pct(sm, 'per_event')}) |"
        for name, sm in summaries.items()
    )
    section = f"""## Three-window average (Tables 5.11 / 5.12)

`benchmarks/three_window_error.py`: {seeds} seeds per scenario, {WINDOWS} time batch windows of 10 s each, two
sources at {RATE_HZ} Hz sending a velocity-like signal (um/s, slow swings, sprints, sensor noise). Source 1's clock
is 5 ms ahead (+3 ppm); both sync with `timesync.estimator` (8 exchanges per second, minimum filter). The 0.125 ms
transport delay is a one-way uplink delay on the sync path: Eq. 3.13 cannot see that asymmetry, so the delayed
source's offset estimate is off by about half of it. Error = window average on reference times minus the average
over the true event times.

Thesis scenario, seed 0, per window (um/s):

| window | true average | single window | three windows, s = T_a/2 | three windows, per-event s |
|---|---|---|---|---|
{{table}}

All {seeds * WINDOWS} windows per scenario, mean absolute error (um/s) and change against the single window:

| scenario | T_a (us) | mean \\|ref - true\\| of the delayed source (us) | single window (Query 5.6) | three, s = T_a/2 (Query 5.7) | three, per-event s |
|---|---|---|---|---|---|
{{summary_rows}}

**What the thesis reported.** Table 5.11 (single window): 0, -0.12, 1.54, -1.53, 0.06, -0.25, 1.43 um/s (mean
abs {thesis_single:.2f}); Table 5.12 (three-window mean): 0, 0.22, 0.21, -0.36, 0.57, -0.60, 0.04 (mean abs
{thesis_three:.2f}, {100 * (thesis_three / thesis_single - 1):+.0f} %), summarised as "~50 % lower".

**What we see, and why.** The error sizes match the thesis (tenths to a few um/s on averages of ~10^5): only
events within a few hundred microseconds of a boundary can change windows. The ~50 % reduction does not
reproduce: with one exact and one delayed source (the thesis' setup) the three-window mean is no better than the
single window, and with every source off by about its bound it is 10-20 % better (table above; the figures move by
about 10 points between seed sets: 15 seeds gave +26 % and -8 %).

The reason is structural. The three-window mean replaces each hard boundary by a three-step ramp of width 2s
around the estimated boundary. (1) It does not remove a systematic offset error e: the
mass moved across a boundary is (s - e)/3 - 2e/3 - s/3 = -e, the same as for the single window. (2) It spreads the
misplaced mass over more events with weights 1/3 and 2/3, which lowers its variance per source from e to
(2s + 3e)/9 (a gain when e is close to s). (3) It also blurs the boundary for a source whose clock is right, which
costs 2s/9 that the single window does not pay. With one exact and one delayed source, (3) eats the gain of (2);
with every source near its bound, (2) wins. Seven windows are too few to tell a 50 % difference from noise (the
per-window errors above change sign from window to window), which is what we think the thesis measured.

![three-window error](cep-three-window.png)
"""
    section = section.replace("{table}", table).replace("{summary_rows}", summary_rows)
    replace_section(DOCS / "cep-benchmark.md", "## Three-window average", section)


HEADER = """# CEP benchmarks (thesis 003, Sec. 5.2.3)

Pure simulations of the query-operator experiments of the thesis: no Kafka, no Spark; the time-sync error comes
from the gateway's own estimator (`timesync.estimator`) fed with simulated NTP-style exchanges. Each section is
written by its script (`make bench` runs both); numbers below are from the last run.

"""


def replace_section(path: Path, heading: str, section: str) -> None:
    """Rewrite one ``## `` section of the shared benchmark document, keeping the other one."""
    text = path.read_text() if path.exists() else HEADER
    if not text.startswith("# "):
        text = HEADER + text
    parts = text.split("\n## ")
    head, sections = parts[0], ["## " + p for p in parts[1:]]
    sections = [s for s in sections if not s.startswith(heading)]
    sections.append(section.rstrip() + "\n")
    sections.sort(key=lambda s: (not s.startswith("## Three-window"), s))
    path.write_text(head.rstrip() + "\n\n" + "\n".join(s.rstrip() + "\n" for s in sections))


if __name__ == "__main__":
    main()
