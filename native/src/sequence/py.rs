//! `skewless_native.SequenceReorderer`: the Python face of the Rust reorderer, with reorder/sequence.py's API shape
//! (same constructor, properties and per-event methods) plus batch entry points, so the differential tests drive both
//! cores with the same calls.
//!
//! Events are opaque objects: only their `seq` attribute is read. The core carries a handle per event; the handles of
//! events it holds map to the objects here, and every output carries back the very object that was pushed. Outputs
//! are built by the record classes given as `records=(Released, Late, GapSkipped)` (reorder/records.py: the
//! extension imports nothing of the Python packages), or else are tuples `(kind, *fields)` with the same fields in the
//! same order, kind 0 released, 1 late, 2 gap skipped.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyOverflowError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use pyo3::{intern, IntoPyObjectExt};

use crate::decode::panic_message;
use crate::pyrecords::{build_record, RecordClasses};

use super::{
    warmup_samples_for, Micros, Mode, Output, Seq, SequenceConfig, SequenceCounters,
    SequenceReorderer, INPUT_BOUND,
};

/// Python's int as the core's integer: i64 first (the fast path), else i128; refused beyond +-2**64.
fn extract_int(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i128> {
    let v: i128 = match obj.extract::<i64>() {
        Ok(v) => i128::from(v),
        Err(_) => obj.extract::<i128>()?,
    };
    if v.abs() > INPUT_BOUND {
        return Err(PyOverflowError::new_err(format!(
            "{what} = {v} lies outside -2**64..2**64"
        )));
    }
    Ok(v)
}

fn int_obj<'py>(py: Python<'py>, v: i128) -> PyResult<Bound<'py, PyAny>> {
    match i64::try_from(v) {
        Ok(small) => small.into_bound_py_any(py),
        Err(_) => v.into_bound_py_any(py),
    }
}

fn opt_int_obj(py: Python<'_>, v: Option<i128>) -> PyResult<Py<PyAny>> {
    match v {
        Some(v) => Ok(int_obj(py, v)?.unbind()),
        None => Ok(py.None()),
    }
}

fn config_from_py(config: Option<&Bound<'_, PyAny>>) -> PyResult<SequenceConfig> {
    let Some(c) = config.filter(|c| !c.is_none()) else {
        return Ok(SequenceConfig::default());
    };
    let py = c.py();
    let int = |name: &str| -> PyResult<i128> { extract_int(&c.getattr(name)?, name) };
    let opt_int = |name: &str| -> PyResult<Option<i128>> {
        let v = c.getattr(name)?;
        if v.is_none() {
            Ok(None)
        } else {
            extract_int(&v, name).map(Some)
        }
    };
    let float = |name: &str| -> PyResult<f64> { c.getattr(name)?.extract::<f64>() };
    let mode: String = c.getattr(intern!(py, "mode"))?.extract()?;
    let mode = match mode.as_str() {
        "adaptive" => Mode::Adaptive,
        "thesis" => Mode::Thesis,
        other => {
            return Err(PyValueError::new_err(format!(
                "mode must be 'adaptive' or 'thesis', not {other:?}"
            )))
        }
    };
    Ok(SequenceConfig {
        mode,
        latency_threshold_us: int("latency_threshold_us")?,
        alpha: float("alpha")?,
        beta: float("beta")?,
        drop_late: c.getattr(intern!(py, "drop_late"))?.is_truthy()?,
        target_accuracy: float("target_accuracy")?,
        timeout_factor: float("timeout_factor")?,
        quantile_half_life: float("quantile_half_life")?,
        max_latency_threshold_us: int("max_latency_threshold_us")?,
        min_gap_samples: int("min_gap_samples")?,
        warmup_samples: opt_int("warmup_samples")?,
        warmup_min_timeout_us: int("warmup_min_timeout_us")?,
        min_timeout_us: int("min_timeout_us")?,
        initial_seq: opt_int("initial_seq")?,
        max_buffered: int("max_buffered")?,
        max_skipped_tracked: int("max_skipped_tracked")?,
    })
}

/// The reorderer's counters at one instant (reorder/sequence.py's `SequenceCounters`, same field names).
#[pyclass(
    module = "skewless_native",
    name = "SequenceCounters",
    frozen,
    get_all,
    eq
)]
#[derive(Clone, PartialEq)]
pub struct PySequenceCounters {
    released: u64,
    in_order: u64,
    buffered: u64,
    peak_buffered: u64,
    gaps_closed: u64,
    timeouts: u64,
    buffer_full_skips: u64,
    skipped_seqs: i128,
    late: u64,
    late_passed: u64,
    duplicates: u64,
}

#[pymethods]
impl PySequenceCounters {
    fn __repr__(&self) -> String {
        format!(
            "SequenceCounters(released={}, in_order={}, buffered={}, peak_buffered={}, gaps_closed={}, timeouts={}, \
             buffer_full_skips={}, skipped_seqs={}, late={}, late_passed={}, duplicates={})",
            self.released,
            self.in_order,
            self.buffered,
            self.peak_buffered,
            self.gaps_closed,
            self.timeouts,
            self.buffer_full_skips,
            self.skipped_seqs,
            self.late,
            self.late_passed,
            self.duplicates
        )
    }
}

impl From<&SequenceCounters> for PySequenceCounters {
    fn from(c: &SequenceCounters) -> Self {
        Self {
            released: c.released,
            in_order: c.in_order,
            buffered: c.buffered,
            peak_buffered: c.peak_buffered,
            gaps_closed: c.gaps_closed,
            timeouts: c.timeouts,
            buffer_full_skips: c.buffer_full_skips,
            skipped_seqs: c.skipped_seqs,
            late: c.late,
            late_passed: c.late_passed,
            duplicates: c.duplicates,
        }
    }
}

/// Releases one source's events of one stream in sequence order: reorder/sequence.py's `SequenceReorderer`, in Rust.
#[pyclass(module = "skewless_native", name = "SequenceReorderer")]
pub struct PySequenceReorderer {
    core: SequenceReorderer<u64>,
    /// The objects of the events the core holds, by handle.
    held: HashMap<u64, Py<PyAny>>,
    next_handle: u64,
    source_id: Py<PyAny>,
    stream: Py<PyAny>,
    config: Py<PyAny>,
    records: Option<RecordClasses<3>>,
    scratch: Vec<Output<u64>>,
    /// Set when a call panicked: the state is unknown, so every later call refuses.
    broken: bool,
}

impl PySequenceReorderer {
    /// `take_run` with each event taken handed to `item` (native/src/pipeline.rs's fused in-order path), in the
    /// same guard; `input.stream` is ignored (this reorderer's stream is the run's).
    pub(crate) fn take_run_with<'py>(
        &mut self,
        input: &super::run::RunInput<'_, 'py>,
        start: usize,
        limits: super::run::RunLimits,
        item: impl FnMut(super::run::Taken<'py>) -> PyResult<()>,
    ) -> PyResult<usize> {
        let stream = self.stream.bind(input.events.py()).clone();
        let input = super::run::RunInput {
            stream: &stream,
            ..*input
        };
        self.guarded(|s| super::run::take_run_with(&mut s.core, &input, start, limits, item))
    }

    /// Run `f` on the core; a panic becomes a RuntimeError and retires this reorderer (never an abort).
    fn guarded<T>(&mut self, f: impl FnOnce(&mut Self) -> PyResult<T>) -> PyResult<T> {
        if self.broken {
            return Err(PyRuntimeError::new_err(
                "skewless_native.SequenceReorderer: an earlier call failed inside the native core; this reorderer's \
                 state is unknown and it refuses further calls",
            ));
        }
        match catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(result) => result,
            Err(panic) => {
                self.broken = true;
                Err(PyRuntimeError::new_err(format!(
                    "skewless_native.SequenceReorderer: internal error in the native core ({}); this reorderer \
                     refuses further calls",
                    panic_message(panic.as_ref())
                )))
            }
        }
    }

    fn record<'py>(
        &self,
        py: Python<'py>,
        kind: usize,
        fields: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        build_record(py, self.records.as_ref(), kind, fields)
    }

    /// Turn the core's outputs (in `self.scratch`) into Python records appended to `into`. `current`: the handle and
    /// object of the event pushed in this call; true when that event left in these outputs (else the core holds it).
    fn emit<'py>(
        &mut self,
        py: Python<'py>,
        current: Option<(u64, &Bound<'py, PyAny>)>,
        into: &Bound<'py, PyList>,
    ) -> PyResult<bool> {
        let mut current_left = false;
        let outputs = std::mem::take(&mut self.scratch);
        let mut result = Ok(());
        for output in &outputs {
            if let Err(e) = self.emit_one(py, output, current, into, &mut current_left) {
                result = Err(e);
                break;
            }
        }
        self.scratch = outputs;
        self.scratch.clear();
        result.map(|()| current_left)
    }

    fn emit_one<'py>(
        &mut self,
        py: Python<'py>,
        output: &Output<u64>,
        current: Option<(u64, &Bound<'py, PyAny>)>,
        into: &Bound<'py, PyList>,
        current_left: &mut bool,
    ) -> PyResult<()> {
        let mut event = |handle: u64| -> PyResult<Bound<'py, PyAny>> {
            if let Some((h, obj)) = current {
                if h == handle {
                    *current_left = true;
                    return Ok(obj.clone());
                }
            }
            self.held
                .remove(&handle)
                .map(|o| o.into_bound(py))
                .ok_or_else(|| {
                    PyRuntimeError::new_err(
                        "skewless_native.SequenceReorderer: an output refers to no held event",
                    )
                })
        };
        let item = match output {
            Output::Released {
                payload,
                arrival_us,
                release_us,
                late,
                ..
            } => {
                let fields = vec![
                    event(*payload)?,
                    int_obj(py, *arrival_us)?,
                    int_obj(py, *release_us)?,
                    late.into_bound_py_any(py)?,
                ];
                self.record(py, 0, fields)?
            }
            Output::Late {
                payload,
                arrival_us,
                reason,
                lateness_us,
                passed,
                ..
            } => {
                let fields = vec![
                    event(*payload)?,
                    int_obj(py, *arrival_us)?,
                    reason_str(py, reason.as_str()),
                    int_obj(py, *lateness_us)?,
                    passed.into_bound_py_any(py)?,
                ];
                self.record(py, 1, fields)?
            }
            Output::GapSkipped {
                first_seq,
                last_seq,
                waited_us,
                at_us,
                reason,
            } => {
                let fields = vec![
                    self.source_id.bind(py).clone(),
                    self.stream.bind(py).clone(),
                    int_obj(py, *first_seq)?,
                    int_obj(py, *last_seq)?,
                    int_obj(py, *waited_us)?,
                    int_obj(py, *at_us)?,
                    reason_str(py, reason.as_str()),
                ];
                self.record(py, 2, fields)?
            }
        };
        into.append(item)
    }

    /// One `push`: the event's outputs appended to `into`.
    fn push_one<'py>(
        &mut self,
        py: Python<'py>,
        event: &Bound<'py, PyAny>,
        seq: Seq,
        now_us: Micros,
        into: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let mut scratch = std::mem::take(&mut self.scratch);
        self.core.push(seq, handle, now_us, &mut scratch);
        self.scratch = scratch;
        let left = self.emit(py, Some((handle, event)), into)?;
        if !left {
            self.held.insert(handle, event.clone().unbind());
        }
        Ok(())
    }

    fn advance_to<'py>(
        &mut self,
        py: Python<'py>,
        now_us: Micros,
        into: &Bound<'py, PyList>,
    ) -> PyResult<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        self.core.advance(now_us, &mut scratch);
        self.scratch = scratch;
        self.emit(py, None, into).map(|_| ())
    }
}

fn reason_str<'py>(py: Python<'py>, reason: &'static str) -> Bound<'py, PyAny> {
    match reason {
        "late_after_skip" => intern!(py, "late_after_skip").clone().into_any(),
        "before_start" => intern!(py, "before_start").clone().into_any(),
        "duplicate" => intern!(py, "duplicate").clone().into_any(),
        "timeout" => intern!(py, "timeout").clone().into_any(),
        _ => intern!(py, "buffer_full").clone().into_any(),
    }
}

fn seq_of(event: &Bound<'_, PyAny>) -> PyResult<Seq> {
    extract_int(&event.getattr(intern!(event.py(), "seq"))?, "seq")
}

#[pymethods]
impl PySequenceReorderer {
    /// `config`: any object with reorder.sequence.SequenceConfig's attributes (None: its defaults).
    #[new]
    #[pyo3(signature = (source_id, stream, config = None, *, records = None))]
    fn new(
        py: Python<'_>,
        source_id: Bound<'_, PyAny>,
        stream: Bound<'_, PyAny>,
        config: Option<Bound<'_, PyAny>>,
        records: Option<(Bound<'_, PyAny>, Bound<'_, PyAny>, Bound<'_, PyAny>)>,
    ) -> PyResult<Self> {
        let cfg = config_from_py(config.as_ref())?;
        let core = SequenceReorderer::new(cfg).map_err(|e| PyValueError::new_err(e.0))?;
        let records = match records {
            None => None,
            Some((released, late, gap)) => Some(RecordClasses::new(py, [released, late, gap])?),
        };
        Ok(Self {
            core,
            held: HashMap::new(),
            next_handle: 0,
            source_id: source_id.unbind(),
            stream: stream.unbind(),
            config: config.map_or_else(|| py.None(), |c| c.unbind()),
            records,
            scratch: Vec::new(),
            broken: false,
        })
    }

    #[getter]
    fn source_id(&self, py: Python<'_>) -> Py<PyAny> {
        self.source_id.clone_ref(py)
    }

    #[getter]
    fn stream(&self, py: Python<'_>) -> Py<PyAny> {
        self.stream.clone_ref(py)
    }

    /// The config object given to the constructor (None if none was).
    #[getter]
    fn config(&self, py: Python<'_>) -> Py<PyAny> {
        self.config.clone_ref(py)
    }

    #[getter]
    fn counters(&self) -> PySequenceCounters {
        PySequenceCounters::from(&self.core.counters)
    }

    /// The next sequence number this reorderer will release (Figure 4.2's expSeqNum).
    #[getter]
    fn expected_seq(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(int_obj(py, self.core.expected_seq())?.unbind())
    }

    #[getter]
    fn buffered(&self) -> usize {
        self.core.buffered()
    }

    /// When the head gap times out, or None when nothing is held.
    fn next_deadline_us(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        opt_int_obj(py, self.core.next_deadline_us())
    }

    /// The longest gap-closing delay seen so far (0 before any): the learned cap's evidence.
    #[getter]
    fn longest_gap_delay_us(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(int_obj(py, self.core.longest_gap_delay_us())?.unbind())
    }

    /// The cap of the wait for a gap opening now (the learned latency threshold in adaptive mode).
    fn effective_latency_threshold_us(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(int_obj(py, self.core.effective_latency_threshold_us())?.unbind())
    }

    /// The timeout a gap opening now would get (Eq. 3.11, or the adaptive quantile).
    fn timeout_us(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.guarded(|s| Ok(int_obj(py, s.core.timeout_us())?.unbind()))
    }

    /// How long a merger should wait for this source's next release (thesis section 3.2.2).
    fn merge_wait_us(&mut self, py: Python<'_>, now_us: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let now_us = extract_int(now_us, "now_us")?;
        self.guarded(|s| Ok(int_obj(py, s.core.merge_wait_us(now_us))?.unbind()))
    }

    /// Accept one event that arrived at `now_us`; return what it releases or reports.
    fn push<'py>(
        &mut self,
        py: Python<'py>,
        event: &Bound<'py, PyAny>,
        now_us: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let seq = seq_of(event)?;
        let now_us = extract_int(now_us, "now_us")?;
        let out = PyList::empty(py);
        self.guarded(|s| s.push_one(py, event, seq, now_us, &out))?;
        Ok(out)
    }

    /// `push` of each event at `now_us`, in order: one list of outputs per event, as `push` returns them. Every
    /// event's seq is read before any is pushed: a bad one refuses the whole batch and changes nothing.
    fn push_many<'py>(
        &mut self,
        py: Python<'py>,
        events: Vec<Bound<'py, PyAny>>,
        now_us: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let seqs = events.iter().map(seq_of).collect::<PyResult<Vec<Seq>>>()?;
        let now_us = extract_int(now_us, "now_us")?;
        let result = PyList::empty(py);
        self.guarded(|s| {
            for (event, seq) in events.iter().zip(seqs) {
                let out = PyList::empty(py);
                s.push_one(py, event, seq, now_us, &out)?;
                result.append(out)?;
            }
            Ok(())
        })?;
        Ok(result)
    }

    /// A trace in one call: for each event, first every timeout due strictly before its arrival fires (`advance`
    /// at each deadline, as the replay drives a reorderer: an event arriving at a deadline is in time), then it is
    /// pushed at its arrival. All outputs in one list, in order.
    fn push_arrivals<'py>(
        &mut self,
        py: Python<'py>,
        events: Vec<Bound<'py, PyAny>>,
        arrivals_us: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        if events.len() != arrivals_us.len() {
            return Err(PyValueError::new_err(format!(
                "push_arrivals: {} events but {} arrival times",
                events.len(),
                arrivals_us.len()
            )));
        }
        let seqs = events.iter().map(seq_of).collect::<PyResult<Vec<Seq>>>()?;
        let arrivals = arrivals_us
            .iter()
            .map(|a| extract_int(a, "arrival_us"))
            .collect::<PyResult<Vec<Micros>>>()?;
        let out = PyList::empty(py);
        self.guarded(|s| {
            for ((event, seq), arrival_us) in events.iter().zip(seqs).zip(arrivals) {
                while let Some(due) = s.core.next_deadline_us() {
                    if due >= arrival_us {
                        break;
                    }
                    s.advance_to(py, due, &out)?;
                }
                s.push_one(py, event, seq, arrival_us, &out)?;
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// `push`'s in-order fast path without its output: True when `seq` is the expected seq and nothing is buffered
    /// (released exactly as `push` would release it); False, and nothing changed, otherwise.
    fn take_in_order(
        &mut self,
        seq: &Bound<'_, PyAny>,
        now_us: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let seq = extract_int(seq, "seq")?;
        let now_us = extract_int(now_us, "now_us")?;
        self.guarded(|s| Ok(s.core.take_in_order(seq, now_us)))
    }

    /// `IngestPipeline.push_many`'s in-order fast path from `events[start]` (sequence/run.rs): the
    /// `(SourceEvent, arrival_us, mapped)` items of the events it took in order, and the index of the first event it
    /// left to `push_many`'s own path. `mappings[i]`: event i's mapping when the caller made it (None: `clock` maps
    /// it); `limits`: `(max_future_us, ts_floor_us, MAX_TS_US, MIN_TS_US)`.
    #[pyo3(signature = (events, start, source_id, arrival_us, mappings, clock, source_event, limits))]
    #[allow(clippy::too_many_arguments)]
    fn take_run<'py>(
        &mut self,
        events: &Bound<'py, PyAny>,
        start: usize,
        source_id: &Bound<'py, PyString>,
        arrival_us: &Bound<'py, PyAny>,
        mappings: Option<&Bound<'py, PyAny>>,
        clock: &Bound<'py, PyAny>,
        source_event: &Bound<'py, PyAny>,
        limits: super::run::RunLimits,
    ) -> PyResult<(Bound<'py, PyList>, usize)> {
        let py = events.py();
        let stream = self.stream.bind(py).clone();
        let input = super::run::RunInput {
            events,
            source_id,
            stream: &stream,
            arrival_us,
            mappings: mappings.filter(|m| !m.is_none()),
            clock,
            source_event,
        };
        self.guarded(|s| super::run::take_run(&mut s.core, &input, start, limits))
    }

    /// Fire every timeout due at or before `now_us`; outputs carry the deadline as their time.
    fn advance<'py>(
        &mut self,
        py: Python<'py>,
        now_us: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let now_us = extract_int(now_us, "now_us")?;
        let out = PyList::empty(py);
        self.guarded(|s| s.advance_to(py, now_us, &out))?;
        Ok(out)
    }

    /// Give up on every gap at once (end of stream): release everything held, in seq order.
    fn flush<'py>(
        &mut self,
        py: Python<'py>,
        now_us: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let now_us = extract_int(now_us, "now_us")?;
        let out = PyList::empty(py);
        self.guarded(|s| {
            let mut scratch = std::mem::take(&mut s.scratch);
            s.core.flush(now_us, &mut scratch);
            s.scratch = scratch;
            s.emit(py, None, &out).map(|_| ())
        })?;
        Ok(out)
    }

    /// The memory a reorderer keeps besides its buffer: (skipped seqs remembered, their ranges, hole seqs tracked,
    /// their ranges). The Python core's `_skipped.count`, `len(_skipped)`, `_holes.count`, `len(_holes)`.
    fn tracked(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (skipped, skipped_ranges) = self.core.skipped_tracked();
        let (holes, hole_ranges) = self.core.holes_tracked();
        (
            int_obj(py, skipped)?,
            skipped_ranges,
            int_obj(py, holes)?,
            hole_ranges,
        )
            .into_py_any(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "skewless_native.SequenceReorderer({}, {}, expected_seq={}, buffered={})",
            self.source_id
                .bind(py)
                .repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string()),
            self.stream
                .bind(py)
                .repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string()),
            self.core.expected_seq(),
            self.core.buffered()
        )
    }
}

/// reorder/sequence.py's `warmup_samples_for`, computed by the Rust core.
#[pyfunction(name = "warmup_samples_for")]
fn py_warmup_samples_for(target_accuracy: f64) -> i128 {
    warmup_samples_for(target_accuracy)
}

/// The pure Rust core over a whole trace, without Python objects on the way (handles only), for the benchmark
/// (benchmarks/native_sequence.py): the replay's loop of `push_arrivals`. Returns (released, late, gaps skipped).
#[pyfunction(name = "run_sequence_core")]
#[pyo3(signature = (config, seqs, arrivals_us))]
fn py_run_sequence_core(
    config: Option<Bound<'_, PyAny>>,
    seqs: Vec<i64>,
    arrivals_us: Vec<i64>,
) -> PyResult<(u64, u64, u64)> {
    if seqs.len() != arrivals_us.len() {
        return Err(PyValueError::new_err(
            "run_sequence_core: seqs and arrivals_us differ in length",
        ));
    }
    let cfg = config_from_py(config.as_ref())?;
    let mut core: SequenceReorderer<u64> =
        SequenceReorderer::new(cfg).map_err(|e| PyValueError::new_err(e.0))?;
    let mut out = Vec::new();
    let (mut released, mut late, mut gaps) = (0, 0, 0);
    catch_unwind(AssertUnwindSafe(|| {
        for (i, (&seq, &arrival_us)) in seqs.iter().zip(&arrivals_us).enumerate() {
            let arrival_us = i128::from(arrival_us);
            while let Some(due) = core.next_deadline_us() {
                if due >= arrival_us {
                    break;
                }
                core.advance(due, &mut out);
            }
            core.push(i128::from(seq), i as u64, arrival_us, &mut out);
            for o in out.drain(..) {
                match o {
                    Output::Released { .. } => released += 1,
                    Output::Late { .. } => late += 1,
                    Output::GapSkipped { .. } => gaps += 1,
                }
            }
        }
    }))
    .map_err(|_| PyRuntimeError::new_err("run_sequence_core: internal error in the native core"))?;
    Ok((released, late, gaps))
}

/// Add this module's classes and functions to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySequenceReorderer>()?;
    m.add_class::<PySequenceCounters>()?;
    m.add_function(wrap_pyfunction!(py_warmup_samples_for, m)?)?;
    m.add_function(wrap_pyfunction!(py_run_sequence_core, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_the_core_becomes_a_runtime_error_and_retires_the_reorderer() {
        Python::initialize();
        Python::attach(|py| {
            let mut r = PySequenceReorderer::new(
                py,
                "s".into_bound_py_any(py).unwrap(),
                "x".into_bound_py_any(py).unwrap(),
                None,
                None,
            )
            .unwrap();
            let err = r
                .guarded(|_| -> PyResult<()> { panic!("boom") })
                .unwrap_err();
            assert!(err.is_instance_of::<PyRuntimeError>(py));
            assert!(err.to_string().contains("boom"), "{err}");
            let err = r.guarded(|_| Ok(())).unwrap_err();
            assert!(err.to_string().contains("refuses further calls"), "{err}");
        });
    }
}
