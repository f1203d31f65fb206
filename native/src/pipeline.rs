//! The fused in-order path of reorder/pipeline.py's `IngestPipeline.push_many`: for a run of a frame's in-order
//! events of one (source, stream), one call (`MultiSourceMerger.push_in_order`) does what `take_run` then
//! `_push_run`'s `push_run_built` did in two, without the run's `(SourceEvent, arrival_us, mapped)` items as Python
//! objects in between: the reorderer takes the events in order (sequence/run.rs), the merge takes the run, the
//! record builder turns each plain release into its Produce action (records/produce.rs). The merge holds each
//! event as its SourceEvent's fields (merger/held.rs): the SourceEvent is made only for an event that leaves for
//! Python (a record handed back, a Late), so an in-order event released as a Produce never was one.
//!
//! The run is pushed here only when `push_many` would push it right after `take_run` with nothing added: the frame
//! ends, or its next event is another stream's. Otherwise (the next event of the stream takes `push_many`'s own
//! path, which may add to the run or push it first) the taken items are handed back as `take_run` gives them, and
//! `push_many` goes on as before; so outputs are `push_many`'s in every case (tests/unit/native/
//! test_native_push_in_order.py and the ingest differential tests drive both). A builder that is not the native
//! one (a test's wrapper) gets the items back too, for its own `build_merged`.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::IntoPyObjectExt;

use crate::decode::guard;
use crate::merger::held::{HeldEvent, HeldFields};
use crate::merger::python::PyMerger;
use crate::merger::RunEvent;
use crate::records::RecordBuilder;
use crate::sequence::py::PySequenceReorderer;
use crate::sequence::run::{RunInput, RunLimits, Taken};

/// `(next_index, run, built, handed_back, run_errors)`: `run` the taken items when they were not pushed (else
/// None); when pushed, `built` and `handed_back` as `push_run_built` gives them and `run_errors` when something
/// was handed back: `{id(event): error_us}` of the run's events whose SourceEvent was made (those handed back
/// among them: `_push_run`'s map restricted to the events `_records` can look up).
pub fn push_in_order<'py>(
    merger: &mut PyMerger,
    reorderer: &Bound<'py, PyAny>,
    builder: &Bound<'py, PyAny>,
    input: &RunInput<'_, 'py>,
    start: usize,
    limits: RunLimits,
) -> PyResult<Bound<'py, PyTuple>> {
    let py = input.events.py();
    // At most the rest of the frame: sized once, not grown by doubling through a 500-event frame.
    let remaining = crate::events::Events::of(input.events)?
        .len()?
        .saturating_sub(start);
    let mut taken: Vec<Taken<'py>> = Vec::with_capacity(remaining);
    let next = reorderer
        .cast::<PySequenceReorderer>()?
        .borrow_mut()
        .take_run_with(input, start, limits, |item| {
            taken.push(item);
            Ok(())
        })?;
    let native = builder.cast::<RecordBuilder>().ok();
    let Some(native) = native.filter(|_| !taken.is_empty()) else {
        return handed_back_as_items(py, next, taken, input);
    };
    // Counted again: a list of events may have changed while a Python clock mapped them.
    if next < crate::events::Events::of(input.events)?.len()?
        && !next_is_another_stream(input, next, &taken[0])?
    {
        return handed_back_as_items(py, next, taken, input);
    }
    let arrival_us = taken[0].arrival_us;
    let push_id = merger.next_push_id();
    guard("MultiSourceMerger.push_in_order", || {
        let class = input.source_event.clone().unbind();
        let events = taken
            .into_iter()
            .map(|item| RunEvent {
                seq: item.seq,
                event: HeldEvent::Fields(HeldFields {
                    fields: item.fields.map(Bound::unbind),
                    payload_json: item.payload_json,
                    class: class.clone_ref(py),
                    pushed_in: push_id,
                    error_us: item.error_us,
                }),
                arrival_us: item.arrival_us,
                ref_us: item.ref_us,
                error_us: item.error_us,
            })
            .collect();
        let (built, handed_back, made) = merger.push_events_built(
            input.source_id,
            events,
            arrival_us,
            &mut native.borrow_mut(),
            push_id,
            input.clock,
        )?;
        let by_event = if handed_back.is_empty() {
            py.None().into_bound(py)
        } else {
            let by_event = PyDict::new(py);
            for (address, error) in made {
                by_event.set_item(address, error)?;
            }
            by_event.into_any()
        };
        PyTuple::new(
            py,
            [
                next.into_bound_py_any(py)?,
                py.None().into_bound(py),
                built.into_any(),
                handed_back.into_bound_py_any(py)?,
                by_event,
            ],
        )
    })
}

/// Whether `events[next]` is of another stream than the run's (its first SourceEvent's, field 1).
fn next_is_another_stream(
    input: &RunInput<'_, '_>,
    next: usize,
    first: &Taken<'_>,
) -> PyResult<bool> {
    let events = crate::events::Events::of(input.events)?;
    let stream = events.at(next)?.field(crate::events::STREAM)?;
    let run_stream = &first.fields[1];
    Ok(!stream.is(run_stream) && !stream.eq(run_stream)?)
}

/// The taken events as `take_run`'s items, not pushed.
fn handed_back_as_items<'py>(
    py: Python<'py>,
    next: usize,
    taken: Vec<Taken<'py>>,
    input: &RunInput<'_, 'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    let (class, arrival_us) = (input.source_event, input.arrival_us);
    let run = PyList::empty(py);
    for item in taken {
        run.append((
            item.source_event(class)?,
            arrival_us,
            item.mapped.into_tuple(py)?,
        ))?;
    }
    let none = py.None().into_bound(py);
    PyTuple::new(
        py,
        [
            next.into_bound_py_any(py)?,
            run.into_any(),
            none.clone(),
            none.clone(),
            none,
        ],
    )
}
