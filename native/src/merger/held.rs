//! What the native merge holds for an event (`HeldEvent`): the event object Python handed it, or, for an in-order
//! event the fused path took in Rust (pipeline.rs), its SourceEvent's fields without the SourceEvent. Such an event
//! usually leaves the merge as a Produce the record builder writes from those fields (records/produce.rs), so its
//! SourceEvent is never made; it is made, once, when the event leaves for Python instead (a Merged or Late record,
//! a release the builder hands back), and then it is the object the Python pipeline would have pushed:
//! `SourceEvent(source_id, stream, seq, source_ts_us, payload, None)`, built as `tuple_of` builds it.

use pyo3::prelude::*;

use super::MergeOutput;
use crate::payload::JsonPayload;

/// An in-order event's SourceEvent fields (source_id, stream, seq, source_ts_us, payload; its interval is None: the
/// fused path takes no interval event), the class to make it of, and the mapping it was pushed with.
pub struct HeldFields {
    pub fields: [Py<PyAny>; 5],
    /// The payload kept as JSON (payload.rs), `fields[4]` None then.
    pub payload_json: Option<JsonPayload>,
    pub class: Py<PyAny>,
    /// Which push of its merger took it (PyMerger's count): a release in that same call carries the run's error
    /// bound, a later one the clock's (as `_records` takes the run's errors).
    pub pushed_in: u64,
    pub error_us: i64,
}

pub enum HeldEvent {
    Object(Py<PyAny>),
    Fields(HeldFields),
}

impl HeldEvent {
    /// The event as Python sees it: the object, or the SourceEvent of the fields, made now and kept in place of them
    /// (so one event is one object however often it is asked for).
    pub fn object<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let HeldEvent::Fields(held) = self {
            let made = crate::sequence::run::source_event_of(
                held.class.bind(py),
                held.fields.each_ref().map(|f| f.bind(py).clone()),
                held.payload_json.as_ref(),
            )?;
            *self = HeldEvent::Object(made.unbind());
        }
        match self {
            HeldEvent::Object(object) => Ok(object.bind(py).clone()),
            HeldEvent::Fields(_) => unreachable!("the fields were just made into their object"),
        }
    }

    /// `object`, by value.
    pub fn into_object(mut self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        self.object(py)
    }
}

impl MergeOutput<HeldEvent> {
    /// The event of a Merged or Late output.
    pub fn event_mut(&mut self) -> Option<&mut HeldEvent> {
        match self {
            MergeOutput::Merged { event, .. } | MergeOutput::Late { event, .. } => Some(event),
            MergeOutput::Punctuation { .. } | MergeOutput::SourceTimedOut { .. } => None,
        }
    }
}
