"""`skewless traces ...` and `skewless replay ...`: generate disorder traces and replay them offline."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import orjson
import typer

from contract import units
from reorder.eval.kslack import AQKSlackConfig
from reorder.eval.progress import progress_bar, progress_enabled, track
from reorder.eval.replay import APPROACHES, Approach, ReplayOptions, replay
from reorder.eval.traces import (
    MULTI_SOURCE_SPECS,
    PROFILES,
    TraceEvent,
    TraceSpec,
    generate,
    read_trace,
    with_profile,
    write_trace,
)
from reorder.pipeline import PipelineCores
from reorder.sequence import DEFAULT_MAX_BUFFERED

__all__ = ["CORES", "parse_duration_us", "register"]

#: The pipeline cores ``skewless replay --core`` can run (``sequence``, ``thesis``): ``python`` is
#: reorder/sequence.py's and reorder/merger.py's (None: the pipeline's default); ``native`` is given to
#: :func:`register` (skewless/native_cores.py) when the compiled module is built. Set by the last :func:`register`.
CORES: dict[str, PipelineCores | None] = {"python": None}

def parse_duration_us(text: str) -> int:
    """``"1h"``, ``"1min"``, ``"5ms"``, ``"250us"``, ``"-3s"`` or a bare integer of microseconds."""
    try:
        return units.parse_duration_us(text, allow_negative=True)
    except units.DurationError as exc:
        raise typer.BadParameter(str(exc)) from exc


Progress = Annotated[bool, typer.Option(
    "--progress/--no-progress", help="Show progress on stderr (only when stderr is a terminal).")]


def _generate_and_write(out: Path, make: Callable[[], list[TraceEvent]], progress: bool) -> int:
    enabled = progress_enabled(progress)
    # The generator is pure and has no progress hook: a pulsing bar while it runs, then a real one while writing.
    with progress_bar("generating", None, enabled=enabled):
        events = make()
    return write_trace(out, track(events, f"writing {out.name}", enabled=enabled))


traces_app = typer.Typer(no_args_is_help=True, help="Generate and inspect replay traces (docs/traces.md).")


@traces_app.command("profiles")
def profiles() -> None:
    """List the disorder profiles."""
    for name, p in PROFILES.items():
        typer.echo(f"{name:10s} {p.description}")


@traces_app.command("generate")
def generate_cmd(
    out: Annotated[Path, typer.Option("--out", help="JSON Lines file to write.")],
    profile: Annotated[str, typer.Option(help=f"Disorder profile: {', '.join(PROFILES)}.")] = "dataset1",
    events: Annotated[int, typer.Option(help="Events per source.")] = 100_000,
    sources: Annotated[int, typer.Option(help="Sources; source k publishes the same data k*3 ms later.")] = 1,
    independent: Annotated[
        bool, typer.Option("--independent", help="Draw each source's delays independently (default: shared).")
    ] = False,
    ahead: Annotated[str, typer.Option(
        "--ahead", "--drift", help="How far the clock of every source but s0 reads ahead (the thesis' drift; "
                                   "negative: behind), e.g. 5ms, 1min, 1h. --drift is a deprecated spelling of "
                                   "it.")] = "0",
    skew_ppm: Annotated[float, typer.Option(help="Source k runs k*skew_ppm fast.")] = 0.0,
    connections: Annotated[
        int | None, typer.Option(help="TCP connections per source (pool interleaving); default per profile.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Random seed: same options and seed, same trace.")] = 1,
    payload: Annotated[bool, typer.Option("--payload/--no-payload", help="Full DEBS-like payload.")] = True,
    multi: Annotated[
        str | None,
        typer.Option(help=f"A multi-source trace of the benchmark, as it runs it: {', '.join(MULTI_SOURCE_SPECS)}; "
                          "only --seed applies."),
    ] = None,
    progress: Progress = True,
) -> None:
    """Write a seeded DEBS-2013-like sensor trace with the chosen disorder."""
    if multi is not None:
        if multi not in MULTI_SOURCE_SPECS:
            choices = ", ".join(MULTI_SOURCE_SPECS)
            raise typer.BadParameter(f"unknown multi-source trace {multi!r}; choose from {choices}")
        spec = replace(MULTI_SOURCE_SPECS[multi], seed=seed)
        n = _generate_and_write(out, lambda: generate(spec), progress)
        typer.echo(f"wrote {n} events to {out}")
        return
    if profile not in PROFILES:
        raise typer.BadParameter(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
    prof = PROFILES[profile] if connections is None else with_profile(profile, connections=connections)
    spec = TraceSpec(
        prof,
        events_per_source=events,
        sources=sources,
        seed=seed,
        same_disorder=not independent,
        ahead_us=parse_duration_us(ahead),
        skew_ppm=skew_ppm,
        payload=payload,
    )
    n = _generate_and_write(out, lambda: generate(spec), progress)
    typer.echo(f"wrote {n} events to {out}")


# The options of `skewless replay`, one alias each, so the command's signature reads as its option list.
_Trace = Annotated[Path, typer.Option("--trace", help="JSON Lines trace (docs/traces.md).")]
_Approach = Annotated[str, typer.Option(help=f"One of {', '.join(APPROACHES)}.")]
_LatencyThreshold = Annotated[
    str | None, typer.Option(help="User latency threshold (Eq. 3.11) [sequence 2s, thesis 500ms].")]
_Alpha = Annotated[float, typer.Option(help="Smoothing factor of Eq. 3.2-3.3.")]
_Beta = Annotated[float, typer.Option(help="Smoothing factor of Eq. 3.7-3.8.")]
_DropLate = Annotated[
    bool, typer.Option("--drop-late", help="Late events only to the side output (as the gateway runs).")]
_TargetAccuracy = Annotated[float, typer.Option(help="sequence: fraction of gaps to wait out.")]
_MinGapTimeout = Annotated[str, typer.Option(help="sequence: never give up on a gap sooner (the gateway runs 200ms).")]
_MaxLatencyThreshold = Annotated[
    str, typer.Option(help="sequence: how far the latency threshold may learn (0: fixed at --latency-threshold).")]
_MaxBuffered = Annotated[
    int, typer.Option(help="sequence, thesis: early events one reorderer may hold before giving its gap up.")]
_K = Annotated[str, typer.Option(help="kslack: fixed K.")]
_ErrorThreshold = Annotated[float, typer.Option(help="aqkslack: relative error threshold (Siddhi akslack's default).")]
_Confidence = Annotated[float, typer.Option(help="aqkslack: confidence level (Siddhi akslack's default).")]
_BatchSize = Annotated[int, typer.Option(help="aqkslack: events per alpha estimate (Siddhi's default).")]
_Sync = Annotated[bool, typer.Option("--sync/--no-sync", help="Simulated time sync of source clocks.")]
_Heartbeats = Annotated[bool, typer.Option("--heartbeats/--no-heartbeats", help="Sync rounds prove liveness.")]
_Seed = Annotated[int, typer.Option(help="Seed of the simulated sync network.")]
_LearnMergeWait = Annotated[bool, typer.Option(
    "--learn-merge-wait/--fixed-merge-wait",
    help="sequence: wait for a silent source as long as its silences say, or only as its gaps say.")]
_Core = Annotated[str | None, typer.Option(
    help="sequence, thesis: the reorderer core, native (Rust, skewless_native) or python (its specification) "
         "[native when built].")]
_AsJson = Annotated[bool, typer.Option("--json", help="Print the metrics as one JSON object.")]
_Emit = Annotated[Path | None, typer.Option(help="Also write released events, in release order.")]


def replay_cmd(
    trace: _Trace,
    approach: _Approach = "sequence",
    latency_threshold: _LatencyThreshold = None,
    alpha: _Alpha = 0.6,
    beta: _Beta = 0.6,
    drop_late: _DropLate = False,
    target_accuracy: _TargetAccuracy = 0.9999,
    min_gap_timeout: _MinGapTimeout = "0",
    max_latency_threshold: _MaxLatencyThreshold = "60s",
    max_buffered: _MaxBuffered = DEFAULT_MAX_BUFFERED,
    k: _K = "100ms",
    error_threshold: _ErrorThreshold = 0.03,
    confidence: _Confidence = 0.95,
    batch_size: _BatchSize = 10_000,
    sync: _Sync = True,
    heartbeats: _Heartbeats = True,
    seed: _Seed = 1,
    learn_merge_wait: _LearnMergeWait = True,
    core: _Core = None,
    as_json: _AsJson = False,
    emit: _Emit = None,
    progress: Progress = True,
) -> None:
    """Replay a trace in virtual time through one approach and print the thesis' metrics."""
    if approach not in APPROACHES:
        raise typer.BadParameter(f"unknown approach {approach!r}; choose from {', '.join(APPROACHES)}")
    cores = _pipeline_cores(core)
    opts = ReplayOptions(
        approach=_approach(approach),
        latency_threshold_us=None if latency_threshold is None else parse_duration_us(latency_threshold),
        alpha=alpha, beta=beta, drop_late=drop_late, target_accuracy=target_accuracy,
        min_gap_timeout_us=parse_duration_us(min_gap_timeout),
        max_latency_threshold_us=parse_duration_us(max_latency_threshold),
        max_buffered=max_buffered, k_us=parse_duration_us(k), sync=sync, heartbeats=heartbeats,
        learn_merge_wait=learn_merge_wait, seed=seed,
        aq=AQKSlackConfig(batch_size=batch_size, error_threshold=error_threshold, confidence=confidence),
        emit=emit is not None, cores=cores,
    )
    _replay_and_print(trace, opts, emit, as_json=as_json, progress=progress_enabled(progress))


def _pipeline_cores(core: str | None) -> PipelineCores | None:
    """The pipeline cores of ``--core`` (None: native when built), or one line saying why there are none."""
    if core is None:
        core = "native" if "native" in CORES else "python"
    if core not in ("native", "python"):
        raise typer.BadParameter(f"unknown core {core!r}; choose from native, python")
    if core not in CORES:
        raise typer.BadParameter("the native core is not built (`make native`); --core python runs the Python one")
    return CORES[core]


def _replay_and_print(trace: Path, opts: ReplayOptions, emit: Path | None, *, as_json: bool, progress: bool) -> None:
    # read_trace and the virtual-time replay are single calls without a hook: pulsing bars, one per stage.
    with progress_bar(f"reading {trace.name}", None, enabled=progress):
        events = read_trace(trace)
    with progress_bar(f"replaying {len(events):,} events ({opts.approach})", None, enabled=progress):
        result = replay(events, opts)
    if emit is not None:
        keys = ("source_id", "stream", "seq", "release_ts_us", "ref_ts_us")
        with emit.open("wb") as fh:
            for row in track(result.emitted, f"writing {emit.name}", enabled=progress):
                fh.write(orjson.dumps(dict(zip(keys, row, strict=True))) + b"\n")
    if as_json:
        typer.echo(orjson.dumps(result.metrics, option=orjson.OPT_SORT_KEYS).decode())
    else:
        for key, value in result.metrics.items():
            typer.echo(f"{key:32s} {value}")


def _approach(name: str) -> Approach:
    for a in APPROACHES:
        if a == name:
            return a
    raise typer.BadParameter(name)


def register(app: typer.Typer, cores: Mapping[str, PipelineCores] | None = None) -> None:
    """``cores``: pipeline cores beyond the Python ones, by ``--core`` name (the CLI passes ``native``)."""
    CORES.clear()
    CORES.update({"python": None, **(cores or {})})
    app.add_typer(traces_app, name="traces")
    app.command("replay")(replay_cmd)
