//! A valid map payload as the decoder keeps it for the in-order path (`JsonPayload`): its record JSON, the bytes
//! orjson writes for the dict msgpack decodes it to (decode.rs's `payload_json`), shared by the frame's event and the
//! merge's held event (merger/held.rs) until the record writer copies them into the record. Its Python dict is made
//! from those bytes (`orjson.loads`) only when Python asks for the event: the same dict, because the JSON of a
//! payload `payload_problem` accepted (str keys, each once; ints within 64 bits; finite floats, written as their
//! shortest round-trip digits; UTF-8 strs; at most 32 levels) reads back to equal values of the same types in the
//! same key order. tests/unit/native/test_native_decode.py holds the two to equality on random payloads. An event
//! whose IncomingEvent and SourceEvent are both made after its payload went on as JSON gets two equal dicts, where
//! the Python pipeline shares one: nothing compares payloads by identity.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict};

#[derive(Clone)]
pub struct JsonPayload {
    json: Arc<[u8]>,
}

static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl JsonPayload {
    /// A payload whose record JSON is `json` (the caller wrote it from a map `payload_problem` accepted).
    pub fn new(json: &[u8]) -> Self {
        JsonPayload { json: json.into() }
    }

    pub fn json(&self) -> &[u8] {
        &self.json
    }

    /// Whether the payload's object is of `class`: it is a dict.
    pub fn is_of_class(&self, class: &Bound<'_, PyAny>) -> bool {
        class.is(class.py().get_type::<PyDict>())
    }

    /// The payload's dict, made now.
    pub fn to_py<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let loads = LOADS.get_or_try_init(py, || {
            py.import("orjson")
                .and_then(|m| m.getattr("loads"))
                .map(Bound::unbind)
        })?;
        loads.bind(py).call1((PyBytes::new(py, &self.json),))
    }
}
