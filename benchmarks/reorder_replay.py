"""Replay every approach on every disorder profile and write docs/reorder-benchmark.md + PNG plots.

    .venv/bin/python -m benchmarks.reorder_replay [--quick]

Deterministic (seeded traces, virtual time); only the throughput figures depend on the machine.
Replays run in two worker processes; the throughput measurement runs alone afterwards. The sequence and
thesis approaches run reorder.pipeline.IngestPipeline, the gateway's ordering pipeline (reorder/eval/replay.py).
"""

from __future__ import annotations

import argparse
import pickle
import platform
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.plotstyle import pyplot, save
from benchmarks.reorder_report import write_report
from benchmarks.reorder_thesis import (
    ALL,
    APPROACH_LABEL,
    DRIFTS,
    EXTRA_SEEDS,
    MULTI_SOURCE_RUNS,
    PROFILE_RUNS,
    PROFILE_SIZES,
    SKEW_PPM,
)
from contract.wire.messages import IncomingEvent
from reorder.eval.kslack import MPKSlack
from reorder.eval.progress import progress_bar, progress_enabled
from reorder.eval.replay import ReplayOptions, ReplayResult, replay
from reorder.eval.traces import MULTI_SOURCE_SPECS, PROFILES, TraceSpec, generate
from reorder.merger import MultiSourceMerger
from reorder.pipeline import GATEWAY_MIN_GAP_TIMEOUT_US, IngestPipeline
from reorder.records import SourceEvent
from reorder.sequence import SequenceConfig, SequenceReorderer
from timesync.clocks import IdentityMapping

DOCS = Path(__file__).resolve().parent.parent / "docs"

@dataclass(frozen=True)
class Job:
    key: str
    spec: TraceSpec
    runs: tuple[tuple[str, ReplayOptions], ...]


@dataclass
class JobResult:
    key: str
    events: int
    results: dict[str, dict[str, float | int | str]] = field(default_factory=dict)
    series: dict[str, list[tuple[int, float, float]]] = field(default_factory=dict)
    seconds: float = 0.0


def run_job(job: Job) -> JobResult:
    t0 = time.perf_counter()
    trace = generate(job.spec)
    out = JobResult(job.key, len(trace))
    for name, opts in job.runs:
        r: ReplayResult = replay(trace, opts)
        out.results[name] = r.metrics
        out.series[name] = r.series
    out.seconds = time.perf_counter() - t0
    return out


def build_jobs(scale: float) -> list[Job]:
    def n(x: int) -> int:
        return max(2000, int(x * scale))

    base: dict[str, ReplayOptions] = {a: ReplayOptions(approach=a) for a in ALL}
    # what the gateway configures on top of the same pipeline: late events only to the late topic, and no gap is
    # given up in less than 200 ms (a live gateway sees event-loop pauses and pool stalls a replay does not)
    base["sequence-gateway"] = replace(base["sequence"], drop_late=True, min_gap_timeout_us=GATEWAY_MIN_GAP_TIMEOUT_US)
    # the same two with the merge waiting only as long as the source's reorderer says (before issue 12 item 7)
    base["sequence-fixedwait"] = replace(base["sequence"], learn_merge_wait=False)
    base["sequence-gateway-fixedwait"] = replace(base["sequence-gateway"], learn_merge_wait=False)
    # the rule before issue 25 item 5's last change: the 2 s threshold never learns, room for 100k early events
    base["sequence-fixed"] = replace(base["sequence"], max_latency_threshold_us=0, max_buffered=100_000)
    all_runs = tuple((a, base[a]) for a in PROFILE_RUNS)
    jobs = []
    for prof, size in PROFILE_SIZES.items():
        spec = TraceSpec(PROFILES[prof], events_per_source=n(size), payload=False)
        runs = (*all_runs, ("sequence-fixed", base["sequence-fixed"])) if prof == "dataset3" else all_runs
        jobs.append(Job(prof, spec, runs))
        # issue 25 item 5: sequence against MP-K-slack on more seeds of every profile
        for seed in EXTRA_SEEDS:
            jobs.append(Job(f"{prof}-seed{seed}", replace(spec, seed=seed),
                            (("sequence", base["sequence"]), ("mpkslack", base["mpkslack"]))))
    multi = tuple((a, base[a]) for a in ("sequence", "thesis", "mpkslack", "aqkslack", "oracle"))
    for k in (1, 2, 5, 10, 20):
        spec = TraceSpec(PROFILES["dataset3"], events_per_source=n(40_000), sources=k, payload=False)
        jobs.append(Job(f"sources{k}", spec, multi))
    for label, drift in DRIFTS.items():
        spec = TraceSpec(PROFILES["dataset3"], events_per_source=n(100_000), sources=2, ahead_us=drift,
                         skew_ppm=SKEW_PPM if drift else 0.0, payload=False)  # fmt: skip
        runs = (("sync", base["sequence"]), ("nosync", replace(base["sequence"], sync=False)))
        jobs.append(Job(f"drift{label}", spec, runs))
    # sources whose uplink stalls (issue 12 item 7): learned merge wait or not
    stall_runs = tuple((a, base[a]) for a in MULTI_SOURCE_RUNS)
    for key, spec in MULTI_SOURCE_SPECS.items():
        jobs.append(Job(key, replace(spec, events_per_source=n(spec.events_per_source)), stall_runs))
    # latency versus accuracy: sweep each mode's knob
    for prof, size in (("dataset1", 200_000), ("heavytail", 200_000)):
        runs_list: list[tuple[str, ReplayOptions]] = [("oracle", base["oracle"])]
        for acc in (0.99, 0.999, 0.9999, 0.99999):
            runs_list.append((f"sequence@{acc}", replace(base["sequence"], target_accuracy=acc)))
        for cap_ms in (1, 10, 100, 500, 2000):
            runs_list.append((f"thesis@{cap_ms}ms", replace(base["thesis"], latency_threshold_us=cap_ms * 1000)))
        for k_ms in (1, 10, 100, 1000):
            runs_list.append((f"kslack@{k_ms}ms", replace(base["kslack"], k_us=k_ms * 1000)))
        runs_list += [("mpkslack", base["mpkslack"]), ("aqkslack", base["aqkslack"])]
        spec = TraceSpec(PROFILES[prof], events_per_source=n(size), payload=False)
        jobs.append(Job(f"tradeoff-{prof}", spec, tuple(runs_list)))
    return jobs


# -- throughput -----------------------------------------------------------------------------------


def _rate(fn: Callable[[], int], repeat: int = 3) -> float:
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = fn()
        dt = time.perf_counter() - t0
        best = max(best, count / dt)
    return best


def throughput(n: int) -> dict[str, float]:
    events = [SourceEvent("s0", "R", i, 66 * i) for i in range(n)]

    def seq_adaptive() -> int:
        r = SequenceReorderer("s0", "R")
        push = r.push
        for i, e in enumerate(events):
            push(e, 66 * i)
        return n

    def seq_thesis() -> int:
        r = SequenceReorderer("s0", "R", SequenceConfig.thesis())
        push = r.push
        for i, e in enumerate(events):
            push(e, 66 * i)
        return n

    def seq_and_merger() -> int:
        r = SequenceReorderer("s0", "R")
        m = MultiSourceMerger("R", IdentityMapping())
        push = r.push
        mpush = m.push
        for i, e in enumerate(events):
            for o in push(e, 66 * i):
                mpush(o.event, o.arrival_us, o.release_us)  # type: ignore[union-attr]
        return n

    incoming = [IncomingEvent("R", i, 66 * i, None) for i in range(n)]

    def pipeline() -> int:
        p = IngestPipeline(IdentityMapping())
        p.register("s0", ("R",), 0)
        push = p.push
        for i, e in enumerate(incoming):
            push("s0", e, 66 * i)
        return n

    def mp() -> int:
        k = MPKSlack()
        push = k.push
        for i, e in enumerate(events):
            push(e, 66 * i)
        return n

    return {
        "SequenceReorderer (adaptive), in order": _rate(seq_adaptive),
        "SequenceReorderer (thesis Eq. 3.11), in order": _rate(seq_thesis),
        "SequenceReorderer + MultiSourceMerger (1 source)": _rate(seq_and_merger),
        "IngestPipeline, gateway defaults (1 source, records built)": _rate(pipeline),
        "MP-K-slack (in order)": _rate(mp),
    }


# -- report ---------------------------------------------------------------------------------------


def plots(res: dict[str, JobResult]) -> list[str]:
    plt = pyplot()

    names = []
    # Figure 5.7-like: average latency per second on Dataset 1
    fig, ax = plt.subplots(figsize=(8, 4))
    for a in ("sequence", "thesis", "mpkslack", "aqkslack", "oracle"):
        s = res["dataset1"].series[a]
        ax.plot([t / 1e6 for t, _, _ in s], [max(v, 1e-4) for _, v, _ in s], label=APPROACH_LABEL[a])
    names.append(save_log_plot(fig, ax, "arrival time (s)", "average latency per second (ms, log scale)",
                               "Dataset 1 profile: average latency over time (cf. thesis Figure 5.7)",
                               "reorder-dataset1-latency.png"))
    # Figures 5.8 / 5.9: latency and out-of-order per dataset
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    datasets = ("dataset1", "dataset2", "dataset3", "heavytail", "pool")
    approaches = ("sequence", "thesis", "mpkslack", "aqkslack", "oracle")
    width = 0.16
    for j, a in enumerate(approaches):
        xs = [i + (j - 2) * width for i in range(len(datasets))]
        ax1.bar(xs, [max(float(res[d].results[a]["avg_latency_ms"]), 1e-3) for d in datasets], width,
                label=APPROACH_LABEL[a])  # fmt: skip
        ax2.bar(xs, [max(int(res[d].results[a]["out_of_order_events"]), 0.5) for d in datasets], width)
    for ax, title, ylabel in ((ax1, "average latency", "average latency (ms, log scale)"),
                              (ax2, "out-of-order events", "out-of-order events (count, log scale)")):
        ax.set_yscale("log")
        ax.set_xticks(range(len(datasets)), datasets, fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("trace profile")
        ax.set_ylabel(ylabel)
    ax1.legend(fontsize=7)
    fig.suptitle("Per profile (cf. thesis Figures 5.8 and 5.9)")
    names.append(save_as(fig, "reorder-datasets.png"))
    # Figures 5.10 / 5.11: sources
    fig, ax = plt.subplots(figsize=(7, 4))
    ks = (1, 2, 5, 10, 20)
    for a in ("sequence", "thesis", "mpkslack", "aqkslack", "oracle"):
        ax.plot(ks, [max(float(res[f"sources{k}"].results[a]["avg_latency_ms"]), 1e-3) for k in ks], "o-",
                label=APPROACH_LABEL[a])  # fmt: skip
    names.append(save_log_plot(fig, ax, "number of sources", "average latency (ms, log scale)",
                               "Multiple sources, Dataset 3 profile (cf. thesis Figures 5.10, 5.11)",
                               "reorder-sources.png"))
    # Figure 5.13: drift
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(DRIFTS)
    for mode, style in (("sync", "o-"), ("nosync", "s--")):
        ax.plot(labels, [max(int(res[f"drift{d}"].results[mode]["out_of_order_events_ms"]), 0.5) for d in labels],
                style, label=f"sequence, {'with' if mode == 'sync' else 'without'} time sync")  # fmt: skip
    names.append(save_log_plot(fig, ax, "clock offset of source s1, plus 20 ppm skew",
                               "out-of-order events (count at ms resolution, log scale)",
                               "Two sources with drift (cf. thesis Figure 5.13)", "reorder-drift.png"))
    # latency versus accuracy
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, prof in zip(axes, ("dataset1", "heavytail"), strict=True):
        r = res[f"tradeoff-{prof}"].results
        for prefix, marker, label in (("sequence@", "o-", "sequence (ours), target accuracy"),
                                      ("thesis@", "s-", "thesis Eq. 3.11, latency threshold"),
                                      ("kslack@", "^-", "K-slack, K")):  # fmt: skip
            pts = [(k, v) for k, v in r.items() if k.startswith(prefix)]
            xs = [max(float(v["avg_latency_ms"]), 1e-3) for _, v in pts]
            ys = [float(v["accuracy_pct"]) for _, v in pts]
            ax.plot(xs, ys, marker, label=label)
            for (k, _), x, y in zip(pts, xs, ys, strict=True):
                ax.annotate(k.split("@")[1], (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
        for k, marker in (("mpkslack", "D"), ("aqkslack", "v"), ("oracle", "*")):
            ax.plot([max(float(r[k]["avg_latency_ms"]), 1e-3)], [float(r[k]["accuracy_pct"])], marker, ms=9,
                    label=APPROACH_LABEL[k])  # fmt: skip
        ax.set_xscale("log")
        ax.set_ylim(max(-5.0, min(float(v["accuracy_pct"]) for v in r.values()) - 2), 101)
        ax.set_xlabel("average latency (ms, log scale)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{prof} profile")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Latency versus accuracy: adaptive sequence mode vs the thesis' timeout")
    names.append(save_as(fig, "reorder-latency-accuracy.png"))
    # issue 12 item 7: sources whose uplink stalls, merge wait learned or not
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    keys = ("multitail", "multistall")
    runs = ("sequence-fixedwait", "sequence", "sequence-gateway-fixedwait", "sequence-gateway", "oracle")
    width = 0.16
    for j, a in enumerate(runs):
        xs = [i + (j - 2) * width for i in range(len(keys))]
        ax1.bar(xs, [float(res[k].results[a]["accuracy_ms_pct"]) for k in keys], width, label=APPROACH_LABEL[a])
        ax2.bar(xs, [float(res[k].results[a]["avg_latency_ms"]) / max(float(res[k].results["oracle"]["avg_latency_ms"]),
                                                                        1e-9) for k in keys], width)  # fmt: skip
    ax1.set_ylim(70, 100.5)
    ax1.axhline(99.9, color="grey", lw=0.8, ls="--")
    ax2.axhline(1.25, color="grey", lw=0.8, ls="--")
    for ax, title, ylabel in ((ax1, "accuracy at ms resolution, late counted", "accuracy (%)"),
                              (ax2, "mean latency over the oracle's", "latency ratio (x oracle)")):
        ax.set_xticks(range(len(keys)), keys, fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("trace")
        ax.set_ylabel(ylabel)
    fig.legend(loc="outside lower center", ncol=3, fontsize=7)
    fig.suptitle("Sources whose uplink stalls: learned merge wait (issue 12 item 7)")
    names.append(save_as(fig, "reorder-multisource.png"))
    return names


def save_as(fig: Any, name: str) -> str:
    """Write ``fig`` to DOCS/``name`` and return the name (for the report's list of plots)."""
    save(fig, DOCS / name)
    return name


def save_log_plot(fig: Any, ax: Any, xlabel: str, ylabel: str, title: str, name: str) -> str:
    """Finish a one-axes plot whose y axis is logarithmic, and save it as :func:`save_as` does."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return save_as(fig, name)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="1/10 of the trace sizes (smoke test)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out-dir", type=Path, default=None, help="default: docs/ (full run), /tmp (--quick)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    ap.add_argument("--save-results", type=Path, default=None,
                    help="also pickle the replay results and throughput here (to re-render with --from-results)")
    ap.add_argument("--from-results", type=Path, default=None,
                    help="re-render plots and report from a --save-results file instead of replaying")
    args = ap.parse_args()
    global DOCS  # noqa: PLW0603 - one switch for plots and report, set before anything is written
    DOCS = args.out_dir or (Path("/tmp/reorder-bench-quick") if args.quick else DOCS)
    DOCS.mkdir(parents=True, exist_ok=True)
    scale = 0.1 if args.quick else 1.0
    t0 = time.perf_counter()
    if args.from_results is not None:
        saved = pickle.loads(args.from_results.read_bytes())
        write_report(saved["res"], saved["tput"], plots(saved["res"]), saved["replay_s"], saved["total_s"],
                     saved["scale"], saved["cpu"], DOCS)
        print(f"re-rendered {DOCS / 'reorder-benchmark.md'} from {args.from_results}")
        return
    jobs = build_jobs(scale)
    # biggest first so the two workers finish together
    jobs.sort(key=lambda j: -j.spec.events_per_source * j.spec.sources * len(j.runs))
    # one step per replay job (in submission order, as pool.map yields them), then throughput, then the plots
    with progress_bar("replay jobs", len(jobs) + 2, enabled=progress_enabled(not args.no_progress)) as advance:
        res = {}
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for r in pool.map(run_job, jobs):
                res[r.key] = r
                advance(description=f"replay {r.key}")
        replay_s = time.perf_counter() - t0
        advance(0, description="throughput")
        tput = throughput(300_000 if not args.quick else 50_000)
        advance(description="plots")
        images = plots(res)
        advance()
    total_s = time.perf_counter() - t0
    if args.save_results is not None:
        args.save_results.write_bytes(pickle.dumps({"res": res, "tput": tput, "replay_s": replay_s,
                                                    "total_s": total_s, "scale": scale, "cpu": cpu_name()}))
    write_report(res, tput, images, replay_s, total_s, scale, cpu_name(), DOCS)
    print(f"done in {time.perf_counter() - t0:.0f} s; wrote {DOCS / 'reorder-benchmark.md'}")


if __name__ == "__main__":
    main()
