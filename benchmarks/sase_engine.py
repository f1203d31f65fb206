"""Benchmark of the SASE out-of-order sequence engine, Li et al. 2007 Figures 6-9 style.

    .venv/bin/python -m benchmarks.sase_engine            # ~1-2 minutes on 2 cores
    .venv/bin/python -m benchmarks.sase_engine --quick    # smaller streams, smoke test

Every comparison runs the approaches side by side in one process on the same generated stream and reports
ratios (CPU time by ``time.process_time``, best of ``--repeat`` runs); nothing here asserts on timings.

* Figure 6: AIS-CLOCK on versus off (every event handled with sort semantics, RIP repair and construction at
  every position) for a falling share of out-of-order events.  Paper: gain 8 % -> 43 % from 90 % to 30 %
  out-of-order.
* Figures 7/8: AIS partition on versus off for a growing slack K: intermediate sequences built by construction
  (the SSC output the window filter would discard; Li's "intermediate buffer") and CPU time.  Paper: the
  ratio grows like ((K + W) / W) ** S.
* Figure 9: in-order input (0 % disorder): the out-of-order engine (AIS-CLOCK + partition, K = 10) against an
  append-only in-order SASE engine, plus a pyinstrument tree of both.  Paper: overhead 5.1 % - 24.6 %;
  target (issue 14): <= 25 %.
* Throughput: events/s of one engine on one core for the shoplifting query (partitioned, negation) in both
  modes, and for SEQ(A..F).

Data: SEQ(A, B, C, D, E, F) WITHIN 20 as in the paper's Sections 5.1/5.2; one event per time unit, type drawn
uniformly from A..F; a share p of the events is delayed by a uniform 1..K time units and the stream is
delivered in (timestamp + delay) order, so every delay is within K.  Every variant of a comparison must
produce the same result set (checked, and printed).

Results: docs/sase-benchmark.md and docs/sase-*.png (written by this script).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from cep.sase import (
    EngineConfig,
    InOrderSequenceEngine,
    SaseEvent,
    SaseOutput,
    SequenceEngine,
    parse_query,
)
from cep.sase.engine import Mode
from reorder.eval.progress import progress_bar, progress_enabled

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TYPES = "ABCDEF"
W = 20
QUERY = parse_query(f"EVENT SEQ(A a, B b, C c, D d, E e, F f) WITHIN {W}")
# Li's engine keeps no history for late events: the figures compare against it without allowed lateness.
LI = 0


def stream(n: int, p: float, k: int, seed: int = 1) -> list[SaseEvent]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        delay = rng.randint(1, k) if k and rng.random() < p else 0
        items.append((i + delay, i, SaseEvent(rng.choice(TYPES), i, {}, str(i))))
    items.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in items]


def digest(keys: Sequence[tuple[str, ...]]) -> str:
    h = hashlib.sha256()
    for k in sorted(keys):
        h.update("|".join(k).encode())
        h.update(b";")
    return h.hexdigest()[:12]


def run_engine(events: Sequence[SaseEvent], config: EngineConfig, query: Any = QUERY) -> dict[str, Any]:
    eng = SequenceEngine(query, config)
    outs: list[SaseOutput] = []
    on_event = eng.on_event
    t0 = time.process_time()
    for e in events:
        outs.extend(on_event(e))
    outs.extend(eng.end_of_stream())
    cpu = time.process_time() - t0
    keys = [tuple(x.event_id or "" for x in o.events) for o in outs if o.kind != "retract"]
    return {"cpu": cpu, "results": len(keys), "digest": digest(keys), "stats": eng.stats(), "outs": outs}


def measured(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one measurement with the pre-generated input moved out of the garbage collector's view
    (``gc.freeze``): a streaming job does not hold its whole input in memory, and letting every collection
    traverse hundreds of thousands of input events would time the benchmark's data, not the engine.  Objects
    the engines create are collected normally."""
    gc.collect()
    gc.freeze()
    try:
        return fn()
    finally:
        gc.unfreeze()


def best(fns: Sequence[Callable[[], dict[str, Any]]], repeat: int) -> list[dict[str, Any]]:
    """Run the variants interleaved (a, b, a, b, ...) and keep each one's fastest run, with every run's CPU time
    in ``cpus`` (in run order) for :func:`paired`: on a shared machine the load changes over time, and
    interleaving exposes both variants to the same load."""
    runs: list[list[dict[str, Any]]] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            runs[i].append(measured(fn))
    out = []
    for r in runs:
        fastest = dict(min(r, key=lambda x: x["cpu"]))
        fastest["cpus"] = [x["cpu"] for x in r]
        out.append(fastest)
    return out


def paired(a: dict[str, Any], b: dict[str, Any]) -> float:
    """CPU ratio a / b as the median over the repeats of the two runs made back to back: robust to load that
    changes between repeats, which the ratio of two separate minima is not."""
    return float(statistics.median(x / y for x, y in zip(a["cpus"], b["cpus"], strict=True)))


def fig6(n: int, repeat: int, k: int = 10) -> list[dict[str, Any]]:
    rows = []
    for p in (0.9, 0.7, 0.5, 0.3, 0.1, 0.0):
        events = stream(n, p, k)
        on, off = best([partial(run_engine, events, EngineConfig(allowed_lateness_us=LI, k_slack_us=k, ais_clock=True)),
                        partial(run_engine, events, EngineConfig(allowed_lateness_us=LI, k_slack_us=k, ais_clock=False))], repeat)
        assert on["digest"] == off["digest"], "AIS-CLOCK changed the results"
        share = on["stats"]["late_events"] / n
        rows.append({"p": p, "share": share, "on": on["cpu"], "off": off["cpu"], "gain": 1 - paired(on, off),
                     "results": on["results"], "digest": on["digest"]})
        print(f"fig6  delayed {p:4.0%}  out-of-order {share:6.1%}  AIS-CLOCK on {on['cpu']:.3f}s off {off['cpu']:.3f}s"
              f"  gain {rows[-1]['gain']:6.1%}  results {on['results']}")
    return rows


def fig78(n: int, repeat: int, p: float = 0.5) -> list[dict[str, Any]]:
    rows = []
    for k in (0, 5, 10, 20, 30, 40):
        events = stream(n, p, k, seed=2)
        # purge_lag=0: Algorithm 3's exact purge, so that the kept history is exactly W + K as in the paper
        on, off = best([
            partial(run_engine, events, EngineConfig(allowed_lateness_us=LI, k_slack_us=k, ais_partition=True, purge_lag=0)),
            partial(run_engine, events, EngineConfig(allowed_lateness_us=LI, k_slack_us=k, ais_partition=False, purge_lag=0)),
        ], repeat)
        assert on["digest"] == off["digest"], "AIS partition changed the results"
        c_on, c_off = on["stats"]["candidates"], off["stats"]["candidates"]
        rows.append({"k": k, "cand_on": c_on, "cand_off": c_off, "mem_gain": 1 - c_on / c_off,
                     "ratio": c_off / c_on, "model": ((k + W) / W) ** 6, "on": on["cpu"], "off": off["cpu"],
                     "cpu_gain": 1 - paired(on, off), "results": on["results"]})
        r = rows[-1]
        print(f"fig7/8  K={k:3d}  sequences built: partition {c_on} / none {c_off} (x{r['ratio']:.1f}, "
              f"((K+W)/W)^6 = {r['model']:.1f})  CPU {on['cpu']:.3f}s / {off['cpu']:.3f}s gain {r['cpu_gain']:6.1%}")
    return rows


def fig9(sizes: Sequence[int], repeat: int, k: int = 10) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        events = stream(n, 0.0, 0, seed=3)

        def baseline(ev: list[SaseEvent] = events) -> dict[str, Any]:
            # Timed like run_engine: the engine's on_event over the stream, results collected, the digest after.
            eng = InOrderSequenceEngine(list(TYPES), W)
            found: list[tuple[SaseEvent, ...]] = []
            on_event = eng.on_event
            t0 = time.process_time()
            for e in ev:
                found.extend(on_event(e))
            cpu = time.process_time() - t0
            keys = [tuple(x.event_id or "" for x in m) for m in found]
            return {"cpu": cpu, "results": len(keys), "digest": digest(keys)}

        base, ooo = best([baseline, partial(run_engine, events, EngineConfig(allowed_lateness_us=LI, k_slack_us=k))], repeat)
        assert base["digest"] == ooo["digest"], "in-order baseline and engine disagree on in-order input"
        rows.append({"n": n, "base": base["cpu"], "ooo": ooo["cpu"], "overhead": paired(ooo, base) - 1,
                     "lo": min(a / b for a, b in zip(ooo["cpus"], base["cpus"], strict=True)) - 1,
                     "hi": max(a / b for a, b in zip(ooo["cpus"], base["cpus"], strict=True)) - 1,
                     "results": base["results"]})
        print(f"fig9  n={n:6d}  in-order SASE {base['cpu']:.3f}s  out-of-order engine {ooo['cpu']:.3f}s  "
              f"overhead {rows[-1]['overhead']:6.1%}  results {base['results']}")
    return rows


def profile_in_order(n: int, k: int = 10) -> dict[str, str]:
    """pyinstrument trees of both engines' ``on_event`` on the Figure 9 workload (0 % disorder): where the time of
    each goes, as a share of its own ``on_event`` total (frames >= 2 %, recursion folded into its first level)."""
    from pyinstrument import Profiler
    from pyinstrument.renderers import ConsoleRenderer

    events = stream(n, 0.0, 0, seed=3)
    trees: dict[str, str] = {}
    engines: dict[str, Callable[[], Callable[[SaseEvent], Any]]] = {
        "in-order SASE": lambda: InOrderSequenceEngine(list(TYPES), W).on_event,
        "out-of-order engine": lambda: SequenceEngine(
            QUERY, EngineConfig(allowed_lateness_us=LI, k_slack_us=k)).on_event,
    }
    for name, make in engines.items():
        profiler = Profiler(interval=0.0002)
        gc.collect()
        gc.freeze()
        try:
            profiler.start()
            for _ in range(3):
                on_event = make()
                for e in events:
                    on_event(e)
            profiler.stop()
        finally:
            gc.unfreeze()
        session = profiler.last_session
        raw = session.root_frame() if session is not None else None
        # The renderer's processors merge the per-call frames into one tree (as its text output shows it).
        root = ConsoleRenderer(show_all=True).preprocess(raw) if raw is not None else None

        top = _find_frame(root, "on_event")
        if top is None:
            continue
        lines: list[str] = []
        _profile_lines(top, 0, top.time, lines)
        trees[name] = "\n".join(lines)
    return trees


def _find_frame(frame: Any, function: str) -> Any:
    """The first pyinstrument frame (depth first) of ``function``, or None."""
    if frame is None or frame.function == function:
        return frame
    for child in frame.children:
        hit = _find_frame(child, function)
        if hit is not None:
            return hit
    return None


def _profile_lines(frame: Any, depth: int, total: float, lines: list[str]) -> None:
    """One line per frame >= 2 % of ``total``, depth <= 4; a recursive call is folded into its caller's self time
    (with whatever it calls)."""
    label = f"{frame.class_name + '.' if frame.class_name else ''}{frame.function}"
    recursive = [c for c in frame.children if c.function == frame.function]
    others = [c for c in frame.children if c.function != frame.function and not c.is_synthetic]
    self_time = frame.time - sum(c.time for c in others)
    note = f"  (self {100 * self_time / total:.1f} %{', recursion included' if recursive else ''})"
    lines.append(f"{'  ' * depth}{100 * frame.time / total:5.1f} %  {label}{note if frame.children else ''}")
    for child in sorted(others, key=lambda c: -c.time):
        if child.time >= 0.02 * total and depth < 4:
            _profile_lines(child, depth + 1, total, lines)


def shoplifting(n_books: int, seed: int = 4) -> tuple[list[SaseEvent], int]:
    """RFID reads in microseconds: SHELF, then CHECKOUT for 70 % of the books, then EXIT; 20 % of the
    reads delayed by up to K = 5 ms; books start 20 us apart."""
    rng = random.Random(seed)
    k = 5_000
    items = []
    i = 0
    for book in range(n_books):
        t0 = book * 20
        reads = [("SHELF", t0)]
        if rng.random() < 0.7:
            reads.append(("CHECKOUT", t0 + rng.randint(1_000, 50_000)))
        reads.append(("EXIT", t0 + rng.randint(60_000, 90_000)))
        for etype, ts in reads:
            delay = rng.randint(1, k) if rng.random() < 0.2 else 0
            items.append((ts + delay, i, SaseEvent(etype, ts, {"id": book, "reader": "r1"}, f"{etype}|{book}")))
            i += 1
    items.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in items], k


def throughput(n_books: int, n_seq: int) -> list[dict[str, Any]]:
    rows = []
    q = parse_query("EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 100 ms")
    events, k = shoplifting(n_books)
    modes: tuple[Mode, ...] = ("conservative", "aggressive")
    for mode in modes:
        r = measured(partial(run_engine, events, EngineConfig(allowed_lateness_us=LI, k_slack_us=k, mode=mode), q))
        kinds: dict[str, int] = {}
        for o in r["outs"]:
            kinds[o.kind] = kinds.get(o.kind, 0) + 1
        rows.append({"name": f"shoplifting, {mode}", "events": len(events), "cpu": r["cpu"],
                     "rate": len(events) / r["cpu"], "outputs": kinds, "late": r["stats"]["late_events"]})
    for p in (0.0, 0.5):
        ev = stream(n_seq, p, 10, seed=5)
        r = measured(partial(run_engine, ev, EngineConfig(allowed_lateness_us=LI, k_slack_us=10)))
        rows.append({"name": f"SEQ(A..F) W=20, {p:.0%} delayed", "events": n_seq, "cpu": r["cpu"],
                     "rate": n_seq / r["cpu"], "outputs": {"match": r["results"]}, "late": r["stats"]["late_events"]})
    for row in rows:
        print(f"throughput  {row['name']:40s} {row['rate']:10.0f} events/s  ({row['events']} events, "
              f"{row['late']} out of order, outputs {row['outputs']})")
    return rows


def plots(f6: list[dict[str, Any]], f78: list[dict[str, Any]], f9: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["share"] * 100 for r in f6], [r["gain"] * 100 for r in f6], "o-")
    label_axes(ax, "out-of-order events (% of stream)", "CPU gain of AIS-CLOCK (%)", "AIS-CLOCK (Li et al. Fig. 6 style)")
    save_png(plt, fig, "sase-ais-clock.png")

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    ks = [r["k"] for r in f78]
    a1.semilogy(ks, [r["cand_off"] for r in f78], "o-", label="without partition")
    a1.semilogy(ks, [r["cand_on"] for r in f78], "s-", label="with AIS partition")
    label_axes(a1, "K (time units), W = 20", "intermediate sequences built", "AIS partition: memory (Fig. 7 style)",
               legend=True)
    a2.plot(ks, [r["cpu_gain"] * 100 for r in f78], "o-")
    label_axes(a2, "K (time units), W = 20", "CPU gain of AIS partition (%)", "AIS partition: CPU (Fig. 8 style)")
    save_png(plt, fig, "sase-ais-partition.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    ns = [r["n"] / 1000 for r in f9]
    ax.plot(ns, [r["base"] for r in f9], "o-", label="in-order SASE (append only)")
    ax.plot(ns, [r["ooo"] for r in f9], "s-", label="out-of-order engine (K = 10)")
    label_axes(ax, "events (thousands), 0 % out of order", "CPU seconds",
               "Overhead of out-of-order handling (Fig. 9 style)", legend=True)
    save_png(plt, fig, "sase-overhead.png")


def label_axes(ax: Any, xlabel: str, ylabel: str, title: str, *, legend: bool = False) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend()
    ax.grid(alpha=0.3)


def save_png(plt: Any, fig: Any, name: str) -> None:
    """Write ``fig`` to DOCS/``name`` at 150 dpi and close it."""
    fig.tight_layout()
    fig.savefig(DOCS / name, dpi=150)
    plt.close(fig)


def report(args: argparse.Namespace, f6: list[dict[str, Any]], f78: list[dict[str, Any]], f9: list[dict[str, Any]],
           tp: list[dict[str, Any]], prof: dict[str, str], wall: float) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# SASE engine benchmark",
        "",
        f"Generated by `benchmarks/sase_engine.py{' --quick' if args.quick else ''}` on {now} "
        f"({os.cpu_count()} CPUs, shared machine, Python {platform.python_version()}, wall time {wall:.0f} s). "
        "CPU times are `time.process_time()`, best of "
        f"{args.repeat} runs; all comparisons run side by side in one process on the same stream and are "
        "reported as ratios: gains and overheads are the median over the repeats of the ratio of two runs made "
        "back to back (robust to the load changing between repeats; the times shown are each variant's best). The pre-generated input is hidden from the garbage collector during a measurement "
        "(`gc.freeze()`, as a streaming job does not hold its input in memory); the engines' own objects are "
        "collected normally. Re-run with `.venv/bin/python -m benchmarks.sase_engine`.",
        "",
        "## Method",
        "",
        f"- Query `SEQ(A, B, C, D, E, F) WITHIN {W}` (length 6 and W = 20 as in Li et al. Sections 5.1-5.2); one "
        "event per time unit, type uniform over A..F.",
        "- Disorder: a share p of the events is delayed by 1..K time units (uniform) and the stream is delivered in "
        "(timestamp + delay) order, so every delay is within K. \"out-of-order\" below is the measured share of "
        "events that arrive with a timestamp below CLOCK (Li's definition), which is lower than p.",
        "- Every variant of a comparison produced the same result set (checked by a digest in the run).",
        "",
        "## AIS-CLOCK (Figure 6 style)",
        "",
        f"{args.n} events, K = 10. Off = every event is treated as potentially out of order (sort semantics, RIP "
        "repair, construction at every position). Paper: gain 8 % at 90 % out-of-order -> 43 % at 30 %.",
        "",
        "| delayed share p | measured out-of-order | CPU with AIS-CLOCK (s) | without (s) | gain | results |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['p']:.0%} | {r['share']:.1%} | {r['on']:.3f} | {r['off']:.3f} | {r['gain']:.1%} | {r['results']} |"
              for r in f6]
    lines += [
        "",
        "![AIS-CLOCK](sase-ais-clock.png)",
        "",
        "## AIS partition (Figures 7 and 8 style)",
        "",
        f"{args.n_partition} events, p = 50 %. \"Sequences built\" counts the sequences construction completes "
        "before the window filter (Li's intermediate SSC buffer, what the WD operator would discard). The "
        "stacks themselves hold the same instances either way (the partition changes what construction visits, "
        "not what is kept). Paper: the ratio grows like ((K + W) / W)^S.",
        "",
        "| K | sequences built, partition | without | ratio | ((K+W)/W)^6 | memory gain | CPU partition (s) | "
        "without (s) | CPU gain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['k']} | {r['cand_on']} | {r['cand_off']} | {r['ratio']:.1f} | {r['model']:.1f} | "
              f"{r['mem_gain']:.1%} | {r['on']:.3f} | {r['off']:.3f} | {r['cpu_gain']:.1%} |" for r in f78]
    lines += [
        "",
        "![AIS partition](sase-ais-partition.png)",
        "",
        "## Overhead on in-order input (Figure 9 style)",
        "",
        "0 % disorder. Baseline: `cep.sase.InOrderSequenceEngine`, Li's in-order SASE: append-only stacks, RIP "
        "as an index, construction only on the last type, basic purge e.ts + W < CLOCK on every CLOCK update, no "
        "validation, negation or predicate machinery. Engine: `SequenceEngine` with AIS-CLOCK and partition, "
        "K = 10 (it keeps 10 more time units of state), its own validation, counters, partition and purge "
        "bookkeeping, and `SaseOutput` records instead of bare tuples. Both are timed the same way: `on_event` "
        f"over the stream with the results collected (the engine also runs `end_of_stream`), "
        f"{args.repeat_overhead} interleaved pairs; overhead = median of the paired ratios, with their range "
        "(the spread the machine's load causes). Target (issue 14): <= 25 %. Paper: 5.1 % - 24.6 %.",
        "",
        "| events | in-order SASE (s) | out-of-order engine (s) | overhead | paired range | results |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['n']} | {r['base']:.3f} | {r['ooo']:.3f} | {r['overhead']:.1%} | {r['lo']:.0%} .. {r['hi']:.0%} | "
              f"{r['results']} |" for r in f9]
    lines += [
        "",
        "![overhead](sase-overhead.png)",
        "",
        f"Where the time goes ({args.n} events, pyinstrument, share of each engine's own `on_event` time; frames "
        ">= 2 %):",
        "",
        "```",
    ]
    for name, tree in prof.items():
        lines += [f"{name}:", tree, ""]
    lines[-1] = "```"
    lines += [
        "",
        "Before issue 14 (commit 9772ba5), the same side-by-side measurement at 40000 events gave 159 % "
        "(baseline 0.091 s, engine 0.234 s, ratio of the best of 9 each; the earlier report's 113 % - 123 % also timed the "
        "baseline's result-key extraction, which made the baseline look slower). What changed: an in-order fast "
        "path in `on_event` for events at or above CLOCK of a type without constant predicates or negation role "
        "(append semantics inline, no sort-semantics branch, no per-event route filtering); construction for an "
        "in-order last-type event searches only leftwards, top down from each RIP to Li's divider, straight "
        "into event tuples (`ActiveInstanceStacks.construct_last`, no closures per call, no window test per "
        "sequence), and finds a RIP's position from the instance's ordinal in its stack (the baseline's RIP "
        "index) instead of a binary search; one precomputed watermark threshold decides whether release/purge "
        "is due instead of three heap checks per CLOCK update; the partition of an unpartitioned query is "
        "cached; the purge finds each stack's expired prefix by one binary search; `match` records are built "
        "without the frozen dataclass's per-field `object.__setattr__`. The top-down search to the divider is the "
        "AIS partition itself: without the partition, in-order construction keeps the general search (every "
        "RIP-compatible sequence built, then the window applied to it), which is what Figures 7/8 compare. "
        "Figures 6-8 are no worse for it: in one side-by-side run of the old and the new code (p = 50 %, "
        "12000 events, best of 9, paired median), the partition's CPU gain was 15.0 % (K = 10) and 55.0 % "
        "(K = 40) before, 24.9 % and 58.7 % after; AIS-CLOCK's gain (40000 events, K = 10, best of 5) was "
        "25.5 / 14.8 / 28.1 / 34.0 % before and 29.5 / 38.4 / 38.1 / 52.4 % after at p = 90 / 70 / 50 / 30 %; "
        "the shoplifting query (partitioned, negation; not on the fast path for CHECKOUT) ran 0.86x the old "
        "CPU time. Run-to-run spread of this comparison with the new code: three full runs on 2026-11-23 gave "
        "median overheads of 14.5 - 22.4 %, 6.4 - 23.1 % and 16.0 - 46.0 % over the five sizes (the 46 % is "
        "one size in one run, whose best times differ by 25 %); the target is met typically, not with margin.",
        "",
        "## Throughput (one core)",
        "",
        "Shoplifting: `EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 100 ms`"
        ", timestamps in microseconds, a book every 20 us, 70 % checked out, 20 % of the reads delayed by up to "
        "K = 5 ms (partitioned by id; negation buffer and holding set in use).",
        "",
        "| workload | events | CPU (s) | events/s | outputs | out of order |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['name']} | {r['events']} | {r['cpu']:.3f} | {r['rate']:.0f} | "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(r['outputs'].items()))} | {r['late']} |" for r in tp]
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- The ratios, not the absolute times, are the result: this is CPython on a shared 2-core machine, and "
        "repeated runs move single points by several percentage points.",
        f"- AIS-CLOCK: gain {f6[0]['gain']:.0%} at the most disordered stream ({f6[0]['share']:.0%} out of order) "
        f"and {next(r['gain'] for r in f6 if r['p'] == 0.3):.0%} at p = 30 % "
        f"({next(r['share'] for r in f6 if r['p'] == 0.3):.0%} out of order); the paper reports 8 % -> 43 %. "
        "It saves the binary searches, the RIP repair and the construction attempts at non-final positions of "
        "every in-order event. Where our gain at high disorder is above the paper's 8 %, the reason is that we "
        "time the whole engine, and construction at every position (which AIS-CLOCK skips for in-order events) "
        "is part of it; Li's figure counts only insertion and RIP resetting. The in-order fast path (issue 14) "
        "also counts here: it exists only because AIS-CLOCK tells an in-order event apart, so with AIS-CLOCK "
        "off every event takes the general path.",
        f"- AIS partition: sequences built without the partition grow x{f78[-1]['ratio']:.0f} at K = "
        f"{f78[-1]['k']} (the ((K + W) / W)^6 model says x{f78[-1]['model']:.0f}: the model assumes every "
        "RIP-compatible combination in the K-extended history exists, the random stream has fewer); with the "
        "partition the count stays flat, and the CPU gain follows once those sequences dominate the cost.",
        f"- Overhead on in-order input: {min(r['overhead'] for r in f9):.1%} - {max(r['overhead'] for r in f9):.1%} "
        f"({'within' if max(r['overhead'] for r in f9) <= 0.25 else 'NOT within'} the 25 % target at every size) "
        "against the paper's 5.1 % - 24.6 %: "
        f"at {f9[-1]['n']} events about {1e6 * f9[-1]['overhead'] * f9[-1]['base'] / f9[-1]['n']:.2f} us per event "
        f"(median overhead times the baseline's best) on top of the baseline's "
        f"{1e6 * f9[-1]['base'] / f9[-1]['n']:.2f} us. The profile above says where: construction costs both "
        "about the same; the engine purges less often (lazily, every W / 4) but each purge also keeps the "
        "purge heap, the RIP hygiene and the counters; the rest is the fixed per-event work the baseline does "
        "not do (validation, counters, partition lookup and registration, `Instance` and `SaseOutput` objects). "
        "It is a constant per event (the overhead does not grow with the stream), unlike the paper's, which "
        "grew with the dataset size. Next lever, if more margin is needed: the fixed per-event work is now a "
        "handful of attribute updates per event (validation, counters, registration), so the next step is a "
        "compiled core for the fast path (e.g. mypyc on `ais.py` / the engine), not more Python.",
        "- Shoplifting is slower per event than SEQ(A..F) because every book is its own partition: each key's "
        "AIS, negation buffer and holding set are created, checked and purged during its short life, and "
        "these short-lived objects keep CPython's cyclic garbage collector busy (measured separately: about "
        "twice the throughput with the collector disabled).",
        "- Inside Spark local[2] (the `sequence` job reading Kafka, one engine per partition key in "
        "applyInPandasWithState): see docs/spark-benchmark.md, where it runs next to Spark's own window count on "
        "the same topics.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller streams (smoke test)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--repeat-overhead", type=int, default=9,
                    help="runs of the overhead comparison (its ratios are the smallest, so noise matters most)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = ap.parse_args()
    if args.quick:
        args.repeat = args.repeat_overhead = 1
    args.n = 8_000 if args.quick else 40_000
    args.n_partition = 4_000 if args.quick else 12_000
    sizes = [5_000, 10_000] if args.quick else [20_000, 40_000, 60_000, 80_000, 100_000]
    t0 = time.monotonic()
    # one step per section
    with progress_bar("fig6", 5, enabled=progress_enabled(not args.no_progress)) as advance:
        f6 = fig6(args.n, args.repeat)
        advance(description="fig7/8")
        f78 = fig78(args.n_partition, args.repeat)
        advance(description="fig9")
        f9 = fig9(sizes, args.repeat_overhead)
        advance(description="profile")
        prof = profile_in_order(args.n)
        advance(description="throughput")
        tp = throughput(5_000 if args.quick else 60_000, 10_000 if args.quick else 100_000)
        advance()
    wall = time.monotonic() - t0
    plots(f6, f78, f9)
    (DOCS / "sase-benchmark.md").write_text(report(args, f6, f78, f9, tp, prof, wall))
    print(f"wrote {DOCS / 'sase-benchmark.md'} and docs/sase-*.png in {wall:.0f} s")


if __name__ == "__main__":
    main()
