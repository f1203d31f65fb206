//! `SequenceReorderer.take_run`: reorder/pipeline.py's `IngestPipeline.push_many` in-order fast path for a run of
//! one frame's events, in one call: each event that is its reorderer's next seq with nothing buffered, mapped into
//! the contract's range and not future-dated, is taken in order (`take_in_order`) and becomes the
//! `(SourceEvent, arrival_us, mapped)` item `push_many` would have appended to its run. The run stops before the
//! first event that is not such an event (another stream, an interval event, a gap, a late or future-dated event):
//! `push_many` handles that one on its own path, as before, so outputs stay those of `push` (the differential tests
//! in tests/unit/native/test_native_take_run.py and test_native_ingest_records.py drive both).

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

use super::SequenceReorderer;
use crate::clocks::Mapped;
use crate::payload::JsonPayload;

/// `(max_future_us, ts_floor_us, MAX_TS_US, MIN_TS_US)`: push_many's range checks of the fast path.
pub type RunLimits = (i128, i128, i128, i128);

/// What one `take_run` call reads: the frame's events, the source, the arrival, the given mappings, the clock.
pub struct RunInput<'a, 'py> {
    pub events: &'a Bound<'py, PyAny>,
    pub source_id: &'a Bound<'py, PyString>,
    pub stream: &'a Bound<'py, PyAny>,
    pub arrival_us: &'a Bound<'py, PyAny>,
    pub mappings: Option<&'a Bound<'py, PyAny>>,
    pub clock: &'a Bound<'py, PyAny>,
    /// reorder.records.SourceEvent: built with `tuple.__new__`, as its own `__new__` does.
    pub source_event: &'a Bound<'py, PyAny>,
}

/// Takes the run from `start`: its items and the index of the first event not taken.
pub fn take_run<'py>(
    core: &mut SequenceReorderer<u64>,
    input: &RunInput<'_, 'py>,
    start: usize,
    limits: RunLimits,
) -> PyResult<(Bound<'py, PyList>, usize)> {
    let py = input.events.py();
    let run = PyList::empty(py);
    let next = take_run_with(core, input, start, limits, |taken| {
        run.append((
            taken.source_event(input.source_event)?,
            input.arrival_us,
            taken.mapped.into_tuple(py)?,
        ))
    })?;
    Ok((run, next))
}

/// One event `take_run_with` took: its SourceEvent's fields (source_id, stream, seq, source_ts_us, payload; its
/// interval is None), the mapping it was taken with (the caller's tuple, or the clock's: native/src/clocks.rs), and
/// those as integers.
pub struct Taken<'py> {
    pub fields: [Bound<'py, PyAny>; 5],
    /// The payload kept as JSON (payload.rs), `fields[4]` None then.
    pub payload_json: Option<JsonPayload>,
    pub mapped: Mapped<'py>,
    pub seq: i64,
    pub arrival_us: i64,
    pub ref_us: i64,
    pub error_us: i64,
}

impl<'py> Taken<'py> {
    /// `SourceEvent(*fields, None)` of `class` (reorder.records.SourceEvent), as `tuple.__new__` builds it.
    pub fn source_event(&self, class: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        source_event_of(class, self.fields.clone(), self.payload_json.as_ref())
    }
}

/// `SourceEvent(source_id, stream, seq, source_ts_us, payload, None)` of `class`, the payload made from its JSON
/// when it was kept so.
pub fn source_event_of<'py>(
    class: &Bound<'py, PyAny>,
    [source_id, stream, seq, source_ts_us, payload]: [Bound<'py, PyAny>; 5],
    payload_json: Option<&JsonPayload>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = class.py();
    let payload = match payload_json {
        Some(json) => json.to_py(py)?,
        None => payload,
    };
    let none = py.None().into_bound(py);
    crate::events::tuple_of(class, [source_id, stream, seq, source_ts_us, payload, none])
}

/// `take_run`, each event taken handed to `item` (pipeline.rs's fused path keeps them in Rust): returns the index
/// of the first event not taken.
pub fn take_run_with<'py>(
    core: &mut SequenceReorderer<u64>,
    input: &RunInput<'_, 'py>,
    start: usize,
    limits: RunLimits,
    mut item: impl FnMut(Taken<'py>) -> PyResult<()>,
) -> PyResult<usize> {
    let (max_future_us, ts_floor_us, max_ts_us, min_ts_us) = limits;
    let arrival_us = input.arrival_us.extract::<i64>()?;
    let arrival = i128::from(arrival_us);
    let events = crate::events::Events::of(input.events)?;
    let count = events.len()?;
    let mut index = start;
    while index < count {
        let event = events.at(index)?;
        let stream = event.field(crate::events::STREAM)?;
        let interval = event.field(crate::events::INTERVAL)?;
        // The decoder hands one str object per declared stream: the same object is the same str, without a compare.
        let same_str = stream.is(input.stream) && stream.is_exact_instance_of::<PyString>();
        if !interval.is_none() || !(same_str || stream.eq(input.stream)?) {
            break;
        }
        let seq_obj = event.field(crate::events::SEQ)?;
        let Ok(seq) = seq_obj.extract::<i64>() else {
            break; // push_many's own path takes it, or refuses it as the reorderer does
        };
        if !core.is_next_in_order(i128::from(seq)) {
            break;
        }
        let source_ts_us = event.field(crate::events::SOURCE_TS_US)?;
        let given = match input.mappings {
            Some(mappings) => Some(mappings.get_item(index)?).filter(|m| !m.is_none()),
            None => None,
        };
        let mapped = match given {
            Some(mapped) => Mapped::Python(mapped),
            None => crate::clocks::to_reference(input.clock, input.source_id, &source_ts_us)?,
        };
        let (ref_us, error_us) = match &mapped {
            Mapped::Native(ref_us, error_us) => (*ref_us, *error_us),
            // Beyond 64 bits the range checks fail anyway: push_many's own path refuses or quarantines it.
            Mapped::Python(tuple) => match tuple.extract::<(i64, i64)>() {
                Ok(mapped) => mapped,
                Err(_) => break,
            },
        };
        let (ref_wide, error_wide) = (i128::from(ref_us), i128::from(error_us));
        if ref_wide - arrival > max_future_us
            || ref_wide < ts_floor_us
            || ref_wide > max_ts_us
            || error_wide < min_ts_us
        {
            break;
        }
        core.take_in_order(i128::from(seq), arrival);
        let payload_json = event.payload_json().cloned();
        let payload = match payload_json {
            Some(_) => input.events.py().None().into_bound(input.events.py()),
            None => event.field(crate::events::PAYLOAD)?,
        };
        let fields = [
            input.source_id.as_any().clone(),
            stream,
            seq_obj,
            source_ts_us,
            payload,
        ];
        item(Taken {
            fields,
            payload_json,
            mapped,
            seq,
            arrival_us,
            ref_us,
            error_us,
        })?;
        index += 1;
    }
    Ok(index)
}
