//! The Python face of the compiled merger: `skewless_native.MultiSourceMerger`, with `reorder.merger`'s API (the
//! same methods, arguments and results), so the differential tests drive both with the same calls.
//!
//! Events are opaque: the merger reads an event's `source_id`, `seq` (and `source_ts_us` to map it when no
//! `mapped` is given) and hands the object itself back. Results are built by the record classes given as
//! `records=(Merged, Punctuation, SourceTimedOut, Late)`, or else are tuples tagged by kind, each the fields of the
//! `reorder.records` record in order: `(MERGED, event, arrival_us, release_us, ref_ts_us, raised_us)`,
//! `(PUNCTUATION, stream, watermark_us, at_us)`, `(SOURCE_TIMED_OUT, stream, source_id, at_us)`,
//! `(LATE, event, arrival_us, reason, lateness_us, passed)`.
//!
//! A panic in the core never unwinds into the interpreter: it becomes a `RuntimeError` and the merger refuses every
//! later call (its state is no longer trusted). Bad input (a time outside +-2^61 us, a malformed event) raises
//! `ValueError`/`TypeError` before anything changes.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;

use super::held::HeldEvent;
use crate::decode::panic_message;
use crate::pyrecords::{build_record, RecordClasses};
use crate::records::RecordBuilder;

use super::{
    MergeError, MergeOutput, MergerConfig, MergerCounters, Mode, MultiSourceMerger, RunEvent,
    WaitPolicy, TIME_LIMIT_US, VIRTUAL_TIME_FLOOR_US,
};

const MERGED: u8 = 0;
const PUNCTUATION: u8 = 1;
const SOURCE_TIMED_OUT: u8 = 2;
const LATE: u8 = 3;

/// `records=(Merged, Punctuation, SourceTimedOut, Late)`: the record classes, in the kinds' order.
type RecordsArg<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
);

fn value_error(err: MergeError) -> PyErr {
    PyValueError::new_err(err.to_string())
}

/// `timeout_for(source_id, now_us)` called back into Python; its first error is kept and raised after the call
/// (the wait falls back to the default meanwhile).
struct PythonWait<'a, 'py> {
    callable: Option<&'a Bound<'py, PyAny>>,
    error: Option<PyErr>,
}

impl WaitPolicy for PythonWait<'_, '_> {
    fn wait_us(&mut self, source_id: &str, now_us: i64) -> Option<i64> {
        let callable = self.callable?;
        if self.error.is_some() {
            return None;
        }
        match callable
            .call1((source_id, now_us))
            .and_then(|wait| wait.extract::<i64>())
        {
            Ok(wait) => Some(wait),
            Err(err) => {
                self.error = Some(err);
                None
            }
        }
    }
}

fn config_from(config: Option<&Bound<'_, PyAny>>) -> PyResult<MergerConfig> {
    let Some(config) = config.filter(|c| !c.is_none()) else {
        return Ok(MergerConfig::default());
    };
    let mode: String = config.getattr("mode")?.extract()?;
    let mode = match mode.as_str() {
        "watermark" => Mode::Watermark,
        "thesis" => Mode::Thesis,
        other => {
            return Err(PyValueError::new_err(format!(
                "MergerConfig: mode '{other}' is not watermark or thesis"
            )))
        }
    };
    let parsed = MergerConfig {
        mode,
        default_timeout_us: config.getattr("default_timeout_us")?.extract()?,
        punctuation_interval_us: config.getattr("punctuation_interval_us")?.extract()?,
        max_queued_per_source: config.getattr("max_queued_per_source")?.extract()?,
        learn_wait: config.getattr("learn_wait")?.extract()?,
        learned_wait_cap_us: config.getattr("learned_wait_cap_us")?.extract()?,
        wait_quantile: config.getattr("wait_quantile")?.extract()?,
        wait_factor: config.getattr("wait_factor")?.extract()?,
        wait_half_life: config.getattr("wait_half_life")?.extract()?,
        min_wait_samples: config.getattr("min_wait_samples")?.extract()?,
        min_watermark_us: config.getattr("min_watermark_us")?.extract()?,
    };
    parsed.validate().map_err(value_error)?;
    Ok(parsed)
}

/// `reorder.merger.MergerCounters`, read at one instant.
#[pyclass(
    name = "MergerCounters",
    module = "skewless_native",
    frozen,
    get_all,
    eq
)]
#[derive(PartialEq)]
pub struct PyMergerCounters {
    merged: u64,
    timeouts: u64,
    late: u64,
    punctuations: u64,
    heartbeats: u64,
    peak_queued: u64,
    raised: u64,
    stamp_regressions: u64,
    after_give_up: u64,
    departures: u64,
}

impl From<&MergerCounters> for PyMergerCounters {
    fn from(c: &MergerCounters) -> Self {
        PyMergerCounters {
            merged: c.merged,
            timeouts: c.timeouts,
            late: c.late,
            punctuations: c.punctuations,
            heartbeats: c.heartbeats,
            peak_queued: c.peak_queued,
            raised: c.raised,
            stamp_regressions: c.stamp_regressions,
            after_give_up: c.after_give_up,
            departures: c.departures,
        }
    }
}

#[pymethods]
impl PyMergerCounters {
    /// The counters by name, as `dataclasses.asdict` gives the Python core's.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, value) in [
            ("merged", self.merged),
            ("timeouts", self.timeouts),
            ("late", self.late),
            ("punctuations", self.punctuations),
            ("heartbeats", self.heartbeats),
            ("peak_queued", self.peak_queued),
            ("raised", self.raised),
            ("stamp_regressions", self.stamp_regressions),
            ("after_give_up", self.after_give_up),
            ("departures", self.departures),
        ] {
            dict.set_item(name, value)?;
        }
        Ok(dict)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("MergerCounters({})", self.as_dict(py)?.repr()?))
    }
}

/// `reorder.merger.MultiSourceMerger`, compiled.
#[pyclass(name = "MultiSourceMerger", module = "skewless_native")]
pub struct PyMerger {
    core: MultiSourceMerger<HeldEvent>,
    stream: Py<PyString>,
    clock: Py<PyAny>,
    config: Py<PyAny>,
    timeout_for: Option<Py<PyAny>>,
    /// The classes of `reorder.records` (Merged, Punctuation, SourceTimedOut, Late) when given: else tagged tuples.
    records: Option<RecordClasses<4>>,
    /// Set by a panic in the core: every later call raises.
    broken: bool,
    /// `push_events_built` calls so far: HeldFields' `pushed_in`.
    pushes_built: u64,
}

impl PyMerger {
    /// Runs one core call: policy errors raised after it, a panic turned into a RuntimeError (and the merger
    /// refusing every later call), the outputs converted to tagged tuples.
    fn run<'py, F>(&mut self, py: Python<'py>, call: F) -> PyResult<Bound<'py, PyList>>
    where
        F: FnOnce(
            &mut MultiSourceMerger<HeldEvent>,
            &mut PythonWait<'_, 'py>,
            &mut Vec<MergeOutput<HeldEvent>>,
        ) -> Result<(), MergeError>,
    {
        let out = self.run_raw(py, call)?;
        self.outputs(py, out)
    }

    /// `run` without the conversion: the core's outputs themselves.
    fn run_raw<'py, F>(&mut self, py: Python<'py>, call: F) -> PyResult<Vec<MergeOutput<HeldEvent>>>
    where
        F: FnOnce(
            &mut MultiSourceMerger<HeldEvent>,
            &mut PythonWait<'_, 'py>,
            &mut Vec<MergeOutput<HeldEvent>>,
        ) -> Result<(), MergeError>,
    {
        if self.broken {
            return Err(PyRuntimeError::new_err(
                "skewless_native.MultiSourceMerger: an earlier call failed inside the native core; this merger's state \
                 is no longer trusted",
            ));
        }
        let timeout_for = self.timeout_for.as_ref().map(|f| f.bind(py).clone());
        let mut policy = PythonWait {
            callable: timeout_for.as_ref(),
            error: None,
        };
        let mut out = Vec::new();
        let core = &mut self.core;
        let result = catch_unwind(AssertUnwindSafe(|| call(core, &mut policy, &mut out)));
        match result {
            Err(panic) => {
                self.broken = true;
                return Err(PyRuntimeError::new_err(format!(
                    "skewless_native.MultiSourceMerger: internal error in the native core ({}); the merger refuses \
                     further calls",
                    panic_message(panic.as_ref())
                )));
            }
            Ok(Err(err)) => return Err(value_error(err)),
            Ok(Ok(())) => {}
        }
        if let Some(err) = policy.error {
            return Err(err);
        }
        Ok(out)
    }

    fn outputs<'py>(
        &self,
        py: Python<'py>,
        out: Vec<MergeOutput<HeldEvent>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for item in out {
            list.append(self.output(py, item)?)?;
        }
        Ok(list)
    }

    /// One output as its record (or tagged tuple).
    fn output<'py>(
        &self,
        py: Python<'py>,
        item: MergeOutput<HeldEvent>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let records = self.records.as_ref();
        {
            let (kind, fields) = match item {
                MergeOutput::Merged {
                    event,
                    arrival_us,
                    release_us,
                    ref_ts_us,
                    raised_us,
                } => (
                    MERGED,
                    vec![
                        event.into_object(py)?,
                        arrival_us.into_bound_py_any(py)?,
                        release_us.into_bound_py_any(py)?,
                        ref_ts_us.into_bound_py_any(py)?,
                        raised_us.into_bound_py_any(py)?,
                    ],
                ),
                MergeOutput::Punctuation {
                    watermark_us,
                    at_us,
                } => (
                    PUNCTUATION,
                    vec![
                        self.stream.bind(py).clone().into_any(),
                        watermark_us.into_bound_py_any(py)?,
                        at_us.into_bound_py_any(py)?,
                    ],
                ),
                MergeOutput::SourceTimedOut { source_id, at_us } => (
                    SOURCE_TIMED_OUT,
                    vec![
                        self.stream.bind(py).clone().into_any(),
                        (*source_id).into_bound_py_any(py)?,
                        at_us.into_bound_py_any(py)?,
                    ],
                ),
                MergeOutput::Late {
                    event,
                    arrival_us,
                    reason,
                    lateness_us,
                } => (
                    LATE,
                    vec![
                        event.into_object(py)?,
                        arrival_us.into_bound_py_any(py)?,
                        reason.as_str().into_bound_py_any(py)?,
                        lateness_us.into_bound_py_any(py)?,
                        false.into_bound_py_any(py)?,
                    ],
                ),
            };
            build_record(py, records, usize::from(kind), fields)
        }
    }

    /// `push_run`'s core call, its outputs unconverted.
    fn push_run_raw(
        &mut self,
        source_id: &Bound<'_, PyString>,
        run: &Bound<'_, PyAny>,
        now_us: i64,
    ) -> PyResult<Vec<MergeOutput<HeldEvent>>> {
        let events = run_events(run)?;
        let source = source_id.to_str()?;
        self.run_raw(source_id.py(), |core, policy, out| {
            core.push_run(source, events, now_us, policy, out)
        })
    }

    /// The id of the next `push_events_built` call, which the events it pushes carry (HeldFields' `pushed_in`).
    pub(crate) fn next_push_id(&mut self) -> u64 {
        self.pushes_built += 1;
        self.pushes_built
    }

    /// `push_run_built` for a run already taken in Rust (native/src/pipeline.rs's fused in-order path): its events
    /// (HeldFields pushed in `push_id`), the native builder. Also returns `(address, error_us)` of each event of this
    /// run whose SourceEvent was made for an output handed back (`_push_run`'s `run_errors` for those).
    #[allow(clippy::type_complexity)]
    pub(crate) fn push_events_built<'py>(
        &mut self,
        source_id: &Bound<'py, PyString>,
        events: Vec<RunEvent<HeldEvent>>,
        now_us: i64,
        builder: &mut RecordBuilder,
        push_id: u64,
        clock: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>, Vec<(usize, i64)>)> {
        let py = source_id.py();
        let source = source_id.to_str()?;
        let out = self.run_raw(py, |core, policy, out| {
            core.push_run(source, events, now_us, policy, out)
        })?;
        let mut made = Vec::new();
        let context = crate::records::MergedContext::for_push(clock, push_id);
        let (built, handed_back) =
            builder.build_releases_in(py, out.into_iter(), context, |mut item| {
                if let Some(event) = item.event_mut() {
                    let error_us = match event {
                        HeldEvent::Fields(held) if held.pushed_in == push_id => Some(held.error_us),
                        _ => None,
                    };
                    if let Some(error_us) = error_us {
                        made.push((event.object(py)?.as_ptr() as usize, error_us));
                    }
                }
                self.output(py, item)
            })?;
        Ok((built, handed_back, made))
    }

    fn map(
        &self,
        py: Python<'_>,
        source_id: &Bound<'_, PyAny>,
        source_ts_us: &Bound<'_, PyAny>,
    ) -> PyResult<(i64, i64)> {
        match crate::clocks::to_reference(self.clock.bind(py), source_id, source_ts_us)? {
            crate::clocks::Mapped::Native(ref_us, error_us) => Ok((ref_us, error_us)),
            crate::clocks::Mapped::Python(mapped) => mapped.extract(),
        }
    }
}

#[pymethods]
impl PyMerger {
    #[classattr]
    const MERGED: u8 = MERGED;
    #[classattr]
    const PUNCTUATION: u8 = PUNCTUATION;
    #[classattr]
    const SOURCE_TIMED_OUT: u8 = SOURCE_TIMED_OUT;
    #[classattr]
    const LATE: u8 = LATE;
    #[classattr]
    const TIME_LIMIT_US: i64 = TIME_LIMIT_US;
    #[classattr]
    const VIRTUAL_TIME_FLOOR_US: i64 = VIRTUAL_TIME_FLOOR_US;

    /// `timeout_for(source_id, now_us)` gives how long to wait for that silent source; `clock.to_reference` maps an
    /// event or heartbeat given without `mapped`.
    #[new]
    #[pyo3(signature = (stream, clock, config=None, timeout_for=None, *, records=None))]
    fn new(
        stream: &Bound<'_, PyString>,
        clock: &Bound<'_, PyAny>,
        config: Option<&Bound<'_, PyAny>>,
        timeout_for: Option<&Bound<'_, PyAny>>,
        records: Option<RecordsArg<'_>>,
    ) -> PyResult<Self> {
        let parsed = config_from(config)?;
        let py = stream.py();
        Ok(PyMerger {
            core: MultiSourceMerger::new(parsed).map_err(value_error)?,
            stream: stream.clone().unbind(),
            clock: clock.clone().unbind(),
            config: config.map_or_else(|| py.None(), |c| c.clone().unbind()),
            timeout_for: timeout_for
                .filter(|f| !f.is_none())
                .map(|f| f.clone().unbind()),
            records: records
                .map(|(merged, punctuation, timed_out, late)| {
                    RecordClasses::new(py, [merged, punctuation, timed_out, late])
                })
                .transpose()?,
            broken: false,
            pushes_built: 0,
        })
    }

    #[getter]
    fn stream(&self, py: Python<'_>) -> Py<PyString> {
        self.stream.clone_ref(py)
    }

    #[getter]
    fn clock(&self, py: Python<'_>) -> Py<PyAny> {
        self.clock.clone_ref(py)
    }

    /// The config object given (None if none was: the defaults).
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PyAny> {
        self.config.clone_ref(py)
    }

    #[getter]
    fn counters(&self) -> PyMergerCounters {
        self.core.counters().into()
    }

    #[getter]
    fn watermark_us(&self) -> Option<i64> {
        self.core.watermark_us()
    }

    #[getter]
    fn queued(&self) -> u64 {
        self.core.queued()
    }

    fn queued_by_source<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (source_id, queued) in self.core.queued_by_source() {
            dict.set_item(&*source_id, queued)?;
        }
        Ok(dict)
    }

    fn sources(&self) -> Vec<&str> {
        self.core.sources().collect()
    }

    fn is_timed_out(&self, source_id: &str) -> PyResult<bool> {
        self.core
            .is_timed_out(source_id)
            .ok_or_else(|| PyKeyError::new_err(source_id.to_string()))
    }

    fn next_deadline_us(&self) -> Option<i64> {
        self.core.next_deadline_us()
    }

    fn queued_of(&self, source_id: &str) -> Option<usize> {
        self.core.queued_of(source_id)
    }

    fn waits_for(&self, source_id: &str) -> bool {
        self.core.waits_for(source_id)
    }

    fn forget(&mut self, source_id: &str) -> bool {
        self.core.forget(source_id)
    }

    fn note_heard(&mut self, source_id: &str, now_us: i64) {
        self.core.note_heard(source_id, now_us);
    }

    fn restore_watermark(&mut self, watermark_us: i64) -> PyResult<()> {
        self.core
            .restore_watermark(watermark_us)
            .map_err(value_error)
    }

    #[pyo3(signature = (event, arrival_us, now_us, *, late=false, mapped=None))]
    fn push<'py>(
        &mut self,
        event: &Bound<'py, PyAny>,
        arrival_us: i64,
        now_us: i64,
        late: bool,
        mapped: Option<(i64, i64)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = event.py();
        let source = event.getattr(intern!(py, "source_id"))?;
        let source = source.cast::<PyString>()?;
        let seq: i64 = event.getattr(intern!(py, "seq"))?.extract()?;
        let mapped = match mapped {
            Some(mapped) => mapped,
            None => self.map(
                py,
                source.as_any(),
                &event.getattr(intern!(py, "source_ts_us"))?,
            )?,
        };
        let source_id = source.to_str()?;
        let handle = HeldEvent::Object(event.clone().unbind());
        self.run(py, |core, policy, out| {
            core.push(
                source_id, seq, handle, arrival_us, now_us, late, mapped, policy, out,
            )
        })
    }

    /// `run`: `(event, arrival_us, (ref_us, error_us))` per event, in seq order. Checked whole before any is taken.
    fn push_run<'py>(
        &mut self,
        source_id: &Bound<'py, PyString>,
        run: &Bound<'py, PyAny>,
        now_us: i64,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = self.push_run_raw(source_id, run, now_us)?;
        self.outputs(source_id.py(), out)
    }

    /// `builder.build_merged(self.push_run(source_id, run, now_us), run, clock)` in one call, without building the
    /// Merged record of a release the builder produces: the same list (each plain release's Produce, every other
    /// output as its record, in place) and the positions of the records.
    fn push_run_built<'py>(
        &mut self,
        source_id: &Bound<'py, PyString>,
        run: &Bound<'py, PyAny>,
        now_us: i64,
        builder: &Bound<'py, PyAny>,
        clock: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let py = source_id.py();
        let out = self.push_run_raw(source_id, run, now_us)?;
        let Ok(native) = builder.cast::<RecordBuilder>() else {
            // Another builder (a test's wrapper, say): its own build_merged of the records.
            let records = self.outputs(py, out)?;
            return builder
                .call_method1(intern!(py, "build_merged"), (records, run, clock))?
                .extract();
        };
        let mut native = native.borrow_mut();
        native.build_releases(py, out.into_iter(), run, clock, |item| {
            self.output(py, item)
        })
    }

    /// reorder.pipeline's `push_many` fast path for one run in one call: the reorderer's `take_run` from
    /// `events[start]`, then, when `push_many` would hand that run to the merge right after (the frame ends or its
    /// next event is another stream's), `push_run_built` of it. See native/src/pipeline.rs.
    #[allow(clippy::too_many_arguments)]
    fn push_in_order<'py>(
        &mut self,
        reorderer: &Bound<'py, PyAny>,
        builder: &Bound<'py, PyAny>,
        events: &Bound<'py, PyAny>,
        start: usize,
        source_id: &Bound<'py, PyString>,
        arrival_us: &Bound<'py, PyAny>,
        mappings: Option<&Bound<'py, PyAny>>,
        clock: &Bound<'py, PyAny>,
        source_event: &Bound<'py, PyAny>,
        limits: crate::sequence::run::RunLimits,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let input = crate::sequence::run::RunInput {
            events,
            source_id,
            stream: events,
            arrival_us,
            mappings: mappings.filter(|m| !m.is_none()),
            clock,
            source_event,
        };
        crate::pipeline::push_in_order(self, reorderer, builder, &input, start, limits)
    }

    fn register<'py>(
        &mut self,
        py: Python<'py>,
        source_id: &str,
        now_us: i64,
    ) -> PyResult<Bound<'py, PyList>> {
        self.run(py, |core, policy, out| {
            core.heard(source_id, now_us, true, policy, out)
        })
    }

    /// `register` whose silence goes on (MultiSourceMerger.hear).
    fn hear<'py>(
        &mut self,
        py: Python<'py>,
        source_id: &str,
        now_us: i64,
    ) -> PyResult<Bound<'py, PyList>> {
        self.run(py, |core, policy, out| {
            core.heard(source_id, now_us, false, policy, out)
        })
    }

    #[pyo3(signature = (source_id, seq, source_ts_us, now_us, *, caught_up=false, mapped=None))]
    #[allow(clippy::too_many_arguments)]
    fn heartbeat<'py>(
        &mut self,
        source_id: &Bound<'py, PyString>,
        seq: i64,
        source_ts_us: &Bound<'py, PyAny>,
        now_us: i64,
        caught_up: bool,
        mapped: Option<(i64, i64)>,
    ) -> PyResult<Bound<'py, PyList>> {
        let py = source_id.py();
        let mapped = match mapped {
            Some(mapped) => mapped,
            None => self.map(py, source_id.as_any(), source_ts_us)?,
        };
        let source_id = source_id.to_str()?;
        self.run(py, |core, policy, out| {
            core.heartbeat(source_id, seq, now_us, caught_up, mapped, policy, out)
        })
    }

    fn leave<'py>(
        &mut self,
        py: Python<'py>,
        source_id: &str,
        now_us: i64,
    ) -> PyResult<Bound<'py, PyList>> {
        self.run(py, |core, policy, out| {
            core.leave(source_id, now_us, policy, out)
        })
    }

    fn advance<'py>(&mut self, py: Python<'py>, now_us: i64) -> PyResult<Bound<'py, PyList>> {
        self.run(py, |core, policy, out| core.advance(now_us, policy, out))
    }

    fn flush<'py>(&mut self, py: Python<'py>, now_us: i64) -> PyResult<Bound<'py, PyList>> {
        self.run(py, |core, _policy, out| core.flush(now_us, out))
    }
}

/// `push_run`'s `(event, arrival_us, (ref_us, error_us))` items, checked whole before any is taken.
fn run_events(run: &Bound<'_, PyAny>) -> PyResult<Vec<RunEvent<HeldEvent>>> {
    let py = run.py();
    let seq_name = intern!(py, "seq");
    let mut events = Vec::with_capacity(run.len().unwrap_or(0));
    for item in run.try_iter()? {
        let item = item?;
        let item = item.cast::<PyTuple>()?;
        let (event, arrival_us, (ref_us, error_us)): (Bound<'_, PyAny>, i64, (i64, i64)) =
            item.extract()?;
        let seq: i64 = event.getattr(seq_name)?.extract()?;
        events.push(RunEvent {
            seq,
            event: HeldEvent::Object(event.unbind()),
            arrival_us,
            ref_us,
            error_us,
        });
    }
    Ok(events)
}

/// Adds this module's classes to `skewless_native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMerger>()?;
    m.add_class::<PyMergerCounters>()?;
    Ok(())
}
