//! The fields of contract.wire.messages.IncomingEvent (a slots dataclass the decoders build, one per event) read from
//! their slots (records/slots.rs's `SlotsClass`, probed once) instead of by `getattr`, whose descriptor call was
//! about a tenth of the native ingest stage (the tracker's `admit_run` and the reorderer's `take_run` read four or
//! five fields of every event). Any other object, or a class that fails the probe, is read by `getattr`.

use pyo3::exceptions::PyIndexError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};

use crate::frame::{EventFrame, FrameEvent};
use crate::payload::JsonPayload;
use crate::records::slots::SlotsClass;

pub const STREAM: usize = 0;
pub const SEQ: usize = 1;
pub const SOURCE_TS_US: usize = 2;
pub const PAYLOAD: usize = 3;
pub const INTERVAL: usize = 4;

static INCOMING_EVENT: PyOnceLock<Option<SlotsClass>> = PyOnceLock::new();

fn incoming_event(py: Python<'_>) -> Option<&SlotsClass> {
    INCOMING_EVENT
        .get_or_init(py, || {
            let class = py
                .import("contract.wire.messages")
                .and_then(|m| m.getattr("IncomingEvent"))
                .ok()?;
            SlotsClass::probe(&class, 5)
                .ok()
                .flatten()
                .map(SlotsClass::untracked)
        })
        .as_ref()
}

/// `IncomingEvent(stream, seq, source_ts_us, payload, interval)` allocated without its Python `__init__` (the
/// decoder builds one per event: `type.__call__` and the dataclass's `__init__` frame were about a tenth of the
/// native decode stage); None when the class failed the probe (the caller then calls it).
pub fn new_incoming_event<'py>(
    py: Python<'py>,
    [stream, seq, source_ts_us, payload, interval]: [&Bound<'py, PyAny>; 5],
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(class) = incoming_event(py) else {
        return Ok(None);
    };
    let mut fields = [stream; 5];
    fields[SEQ] = seq;
    fields[SOURCE_TS_US] = source_ts_us;
    fields[PAYLOAD] = payload;
    fields[INTERVAL] = interval;
    class.build(py, &fields).map(Some)
}

/// `IncomingEvent(stream, seq, source_ts_us, payload, interval)`: `new_incoming_event`, or the class called when
/// it failed the probe.
pub fn make_incoming_event<'py>(
    py: Python<'py>,
    fields: [&Bound<'py, PyAny>; 5],
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(event) = new_incoming_event(py, fields)? {
        return Ok(event);
    }
    let class = py
        .import("contract.wire.messages")?
        .getattr("IncomingEvent")?;
    class.call1(PyTuple::new(py, fields)?)
}

/// `getattr(event, name)` of the field `index` (STREAM, SEQ, SOURCE_TS_US, PAYLOAD, INTERVAL).
pub fn field<'py>(event: &Bound<'py, PyAny>, index: usize) -> PyResult<Bound<'py, PyAny>> {
    let py = event.py();
    if let Some(value) = incoming_event(py).and_then(|class| class.get(event, index)) {
        return Ok(value);
    }
    let name = match index {
        STREAM => intern!(py, "stream"),
        SEQ => intern!(py, "seq"),
        SOURCE_TS_US => intern!(py, "source_ts_us"),
        PAYLOAD => intern!(py, "payload"),
        _ => intern!(py, "interval"),
    };
    event.getattr(name)
}

/// A frame's events: a tuple or a list (IngestCore hands a tuple, push_many a list) read without the int object
/// and the call `get_item` on any sequence makes; the native decoder's EventFrame (frame.rs) read from its vector,
/// without an IncomingEvent; any other sequence through `get_item`.
pub enum Events<'a, 'py> {
    Tuple(Bound<'py, PyTuple>),
    List(Bound<'py, PyList>),
    Frame(Bound<'py, EventFrame>),
    Other(&'a Bound<'py, PyAny>),
}

/// One event of `Events`: an object whose fields are read as `field` reads them, or a frame's event.
pub enum EventAt<'a, 'py> {
    Object(Bound<'py, PyAny>),
    Frame(Python<'py>, &'a FrameEvent),
}

impl<'py> EventAt<'_, 'py> {
    /// The payload of a frame's event kept as JSON (payload.rs), while Python has not made its IncomingEvent; None
    /// otherwise (the payload is `field(PAYLOAD)`).
    pub fn payload_json(&self) -> Option<&JsonPayload> {
        match self {
            EventAt::Object(_) => None,
            EventAt::Frame(py, event) => event.payload_json(*py),
        }
    }

    /// The digest the decoder made of a frame's event (frame.rs), while Python has not made its IncomingEvent; None
    /// otherwise (the caller digests the fields).
    pub fn decoded_digest(&self) -> Option<i64> {
        match self {
            EventAt::Object(_) => None,
            EventAt::Frame(py, event) => event.decoded_digest(*py),
        }
    }

    /// Field `index` (STREAM, SEQ, SOURCE_TS_US, PAYLOAD, INTERVAL) of the event.
    pub fn field(&self, index: usize) -> PyResult<Bound<'py, PyAny>> {
        match self {
            EventAt::Object(event) => field(event, index),
            EventAt::Frame(py, event) => event.field(*py, index),
        }
    }
}

impl<'a, 'py> Events<'a, 'py> {
    pub fn of(events: &'a Bound<'py, PyAny>) -> PyResult<Self> {
        if let Ok(t) = events.cast::<PyTuple>() {
            return Ok(Events::Tuple(t.clone()));
        }
        if let Ok(l) = events.cast::<PyList>() {
            return Ok(Events::List(l.clone()));
        }
        if let Ok(f) = events.cast::<EventFrame>() {
            return Ok(Events::Frame(f.clone()));
        }
        Ok(Events::Other(events))
    }

    pub fn len(&self) -> PyResult<usize> {
        match self {
            Events::Tuple(t) => Ok(t.len()),
            Events::List(l) => Ok(l.len()),
            Events::Frame(f) => Ok(f.get().events().len()),
            Events::Other(o) => o.len(),
        }
    }

    pub fn is_empty(&self) -> PyResult<bool> {
        Ok(self.len()? == 0)
    }

    /// The event at `index`, whose fields are read without making a frame's IncomingEvent.
    pub fn at(&self, index: usize) -> PyResult<EventAt<'_, 'py>> {
        Ok(match self {
            Events::Tuple(t) => EventAt::Object(t.get_item(index)?),
            Events::List(l) => EventAt::Object(l.get_item(index)?),
            Events::Frame(f) => match f.get().events().get(index) {
                Some(event) => EventAt::Frame(f.py(), event),
                None => return Err(PyIndexError::new_err("EventFrame index out of range")),
            },
            Events::Other(o) => EventAt::Object(o.get_item(index)?),
        })
    }
}

/// `tuple.__new__(class, items)` for a tuple subclass (reorder.records.SourceEvent, a NamedTuple): the instance
/// allocated by the class's own `tp_alloc` and filled in place, without the call and the argument tuple. Any other
/// class goes through `tuple.__new__` itself.
pub fn tuple_of<'py, const N: usize>(
    class: &Bound<'py, PyAny>,
    items: [Bound<'py, PyAny>; N],
) -> PyResult<Bound<'py, PyAny>> {
    let py = class.py();
    let is_tuple_type = class
        .cast::<pyo3::types::PyType>()
        .is_ok_and(|t| t.is_subclass_of::<PyTuple>().unwrap_or(false));
    // SAFETY: a type object's tp_alloc slot; PyType_GetSlot returns NULL (no error) where there is none.
    let alloc = if is_tuple_type {
        unsafe { pyo3::ffi::PyType_GetSlot(class.as_ptr().cast(), pyo3::ffi::Py_tp_alloc) }
    } else {
        std::ptr::null_mut()
    };
    if alloc.is_null() {
        let tuple_new = py.get_type::<PyTuple>().getattr(intern!(py, "__new__"))?;
        return tuple_new.call1((class, PyTuple::new(py, items)?));
    }
    // SAFETY: the Py_tp_alloc slot holds an allocfunc; for a tuple subclass it gives a tuple of N NULL items (or
    // NULL with an exception set), owned only here, whose items PyTuple_SetItem fills (each call steals a new
    // reference; it refuses only a shared tuple or an index out of range, neither possible here). No Python code
    // runs between the allocation and the last store.
    unsafe {
        let alloc = std::mem::transmute::<*mut std::os::raw::c_void, pyo3::ffi::allocfunc>(alloc);
        let object = alloc(class.as_ptr().cast(), N as pyo3::ffi::Py_ssize_t);
        if object.is_null() {
            return Err(PyErr::fetch(py));
        }
        let object = Bound::from_owned_ptr(py, object);
        for (index, item) in items.into_iter().enumerate() {
            if pyo3::ffi::PyTuple_SetItem(
                object.as_ptr(),
                index as pyo3::ffi::Py_ssize_t,
                item.into_ptr(),
            ) != 0
            {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(object)
    }
}
