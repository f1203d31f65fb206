//! A frame's decoded events as one object (`EventFrame`): what the native decoder hands the session in place of a
//! tuple of IncomingEvents. Each event's fields (the same Python objects the decoder made for the IncomingEvent:
//! stream, seq, source_ts_us, payload, interval) are kept in a Rust vector, and the in-order path's native calls
//! (the tracker's `admit_run`, the builder's `any_payload_of_class`, the reorderer's `take_run` and the merger's
//! `push_in_order`) read them there (events.rs, `Events::Frame`): an in-order event is never an IncomingEvent
//! object. Python sees a read-only sequence of IncomingEvents, each made the first time Python asks for it (by
//! index, slice or iteration) and kept, so the same index gives the same object; once made, the native readers read
//! that object's fields, as they read a tuple's, so an assignment to it is seen as it would be in a tuple.
//! A frame equals a tuple (or another frame) of equal IncomingEvents, as the tuple the Python decoder builds does.

use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PySlice, PyTuple};

use crate::events::{INTERVAL, PAYLOAD, SEQ, SOURCE_TS_US, STREAM};
use crate::payload::JsonPayload;

/// One event's IncomingEvent fields, in their order (events.rs's STREAM..INTERVAL), its IncomingEvent once made, the
/// tracker's digest of it when the decoder made one, and its payload as JSON when the decoder kept it so
/// (payload.rs: the payload's field is None then, and its dict is made only with the IncomingEvent).
pub struct FrameEvent {
    fields: [Py<PyAny>; 5],
    made: PyOnceLock<Py<PyAny>>,
    digest: Option<i64>,
    payload_json: Option<JsonPayload>,
}

impl FrameEvent {
    pub fn new(fields: [Py<PyAny>; 5]) -> Self {
        Self::decoded(fields, None, None)
    }

    /// `digest`: `EventDigests.event_digest(source_ts_us, payload)` of these fields (dedup.rs's digest of the
    /// decoded payload, where writing its sorted JSON from the msgpack tree costs a fraction of reading it back from
    /// the Python objects). `payload_json`: the payload, kept as its JSON instead of `fields[PAYLOAD]`.
    pub fn decoded(
        fields: [Py<PyAny>; 5],
        digest: Option<i64>,
        payload_json: Option<JsonPayload>,
    ) -> Self {
        FrameEvent {
            fields,
            made: PyOnceLock::new(),
            digest,
            payload_json,
        }
    }

    /// The decoder's digest, until Python made the IncomingEvent (whose fields may then be other objects).
    pub fn decoded_digest(&self, py: Python<'_>) -> Option<i64> {
        match self.made.get(py) {
            Some(_) => None,
            None => self.digest,
        }
    }

    /// The payload's JSON, until Python made the IncomingEvent (its payload is then the object to read).
    pub fn payload_json(&self, py: Python<'_>) -> Option<&JsonPayload> {
        match self.made.get(py) {
            Some(_) => None,
            None => self.payload_json.as_ref(),
        }
    }

    /// Field `index`: the IncomingEvent's, once it was made, else the one the decoder made. A payload kept as JSON
    /// is read from the IncomingEvent, made for it: one event has one payload object.
    pub fn field<'py>(&self, py: Python<'py>, index: usize) -> PyResult<Bound<'py, PyAny>> {
        if let Some(event) = self.made.get(py) {
            return crate::events::field(event.bind(py), index);
        }
        if index == PAYLOAD && self.payload_json.is_some() {
            return crate::events::field(&self.event(py)?, index);
        }
        Ok(self.fields[index].bind(py).clone())
    }

    /// The IncomingEvent of these fields (made once). Not `PyOnceLock::get_or_try_init`: its first call per cell
    /// lets go of the GIL while it takes the cell's lock, and with another thread waiting for the GIL (librdkafka's
    /// delivery reports during a commit, the metrics server) the event loop then waited for that thread, at least
    /// once per frame. Here the GIL is held throughout: the event is made, then stored unless another thread stored
    /// one first, and the stored one is returned either way, so one index always gives one object.
    pub fn event<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(event) = self.made.get(py) {
            return Ok(event.bind(py).clone());
        }
        let [stream, seq, source_ts_us, payload, interval] =
            self.fields.each_ref().map(|f| f.bind(py));
        let from_json = match &self.payload_json {
            Some(json) => Some(json.to_py(py)?),
            None => None,
        };
        let payload = from_json.as_ref().unwrap_or(payload);
        let made =
            crate::events::make_incoming_event(py, [stream, seq, source_ts_us, payload, interval])?;
        // `set` does not let go of the GIL; it fails only when the cell was stored meanwhile.
        let _ = self.made.set(py, made.unbind());
        Ok(self
            .made
            .get(py)
            .expect("the cell was just stored")
            .bind(py)
            .clone())
    }
}

/// A frame's events, read-only: `len`, index, slice (a tuple), iteration, `==` with a tuple or a frame.
#[pyclass(frozen, sequence, name = "EventFrame", module = "skewless_native")]
pub struct EventFrame {
    events: Vec<FrameEvent>,
}

impl EventFrame {
    pub fn from_events(events: Vec<FrameEvent>) -> Self {
        EventFrame { events }
    }

    pub fn events(&self) -> &[FrameEvent] {
        &self.events
    }

    fn as_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let made = self
            .events
            .iter()
            .map(|e| e.event(py))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, made)
    }
}

#[pymethods]
impl EventFrame {
    /// A frame of the fields of `events` (IncomingEvents, or objects with their fields), as the decoder keeps
    /// them: none of its IncomingEvents is made yet. The decoder builds frames itself; this is for the differential
    /// tests, which hand the native core a frame where the Python one gets the tuple.
    #[new]
    fn new(events: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut out = Vec::new();
        for event in events.try_iter()? {
            let event = event?;
            let [a, b, c, d, e] = [STREAM, SEQ, SOURCE_TS_US, PAYLOAD, INTERVAL]
                .map(|index| crate::events::field(&event, index).map(Bound::unbind));
            out.push(FrameEvent::new([a?, b?, c?, d?, e?]));
        }
        Ok(EventFrame { events: out })
    }

    /// How many of its IncomingEvents were made (asked for by Python): the tests check the in-order path makes
    /// few.
    #[getter]
    fn made(&self, py: Python<'_>) -> usize {
        self.events
            .iter()
            .filter(|e| e.made.get(py).is_some())
            .count()
    }

    /// The decoder's digest of each event (None: none made, or its IncomingEvent was made), for the tests that
    /// compare them with the tracker's.
    #[getter]
    fn decoded_digests(&self, py: Python<'_>) -> Vec<Option<i64>> {
        self.events.iter().map(|e| e.decoded_digest(py)).collect()
    }

    fn __len__(&self) -> usize {
        self.events.len()
    }

    fn __getitem__<'py>(&self, index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = index.py();
        if let Ok(slice) = index.cast::<PySlice>() {
            return self.as_tuple(py)?.as_any().get_item(slice);
        }
        let Ok(at) = index.extract::<isize>() else {
            return Err(PyTypeError::new_err(
                "EventFrame indices must be integers or slices",
            ));
        };
        let len = self.events.len() as isize;
        let at = if at < 0 { at + len } else { at };
        if !(0..len).contains(&at) {
            return Err(PyIndexError::new_err("EventFrame index out of range"));
        }
        self.events[at as usize].event(py)
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.as_tuple(py)?.as_any().try_iter().map(Bound::into_any)
    }

    fn __richcmp__<'py>(
        &self,
        other: &Bound<'py, PyAny>,
        op: CompareOp,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = other.py();
        let other = if let Ok(frame) = other.cast::<EventFrame>() {
            frame.get().as_tuple(py)?.into_any()
        } else if other.is_instance_of::<PyTuple>() {
            other.clone()
        } else {
            return Ok(py.NotImplemented().into_bound(py));
        };
        match op {
            CompareOp::Eq | CompareOp::Ne => self.as_tuple(py)?.as_any().rich_compare(other, op),
            _ => Ok(py.NotImplemented().into_bound(py)),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("EventFrame({})", self.as_tuple(py)?.repr()?))
    }
}
