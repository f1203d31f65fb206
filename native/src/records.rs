//! The Kafka record bytes of contract/records.py (EventRecord.to_json, PunctuationRecord.to_json, EventRecord.key),
//! gateway/ingest.py (event_headers, PUNCTUATION_HEADERS, kafka_timestamp_ms): the same bytes as orjson 3.x writes
//! for the same dict. JSON here is orjson's default output: no spaces, keys in insertion order, non-ASCII as
//! UTF-8, only `"`, `\` and the C0 controls escaped (\b \t \n \f \r short, the rest \u00xx), integers in
//! [-2^63, 2^64 - 1], floats as their shortest round-trip digits (plain notation for exponents -5..15, else
//! "1.5e+16" / "1e-7"), NaN and infinities as null.
//!
//! The Python wrapper writes dict/list/tuple/str/int/float/bool/None values of their exact types; anything else
//! (a subclass, a dataclass, a non-str key, an int beyond 64 bits, a str with a lone surrogate, nesting past
//! MAX_NATIVE_DEPTH) is handed to the record's own `to_json`, i.e. orjson, so that its bytes or its exception are
//! orjson's by construction; `fallbacks` counts those records.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::decode::guard;
use crate::decode::pyrepr::write_shortest;

mod produce;
use crate::merger::held::HeldEvent;
use crate::merger::MergeOutput;
pub use produce::MergedContext;
pub(crate) mod slots;

/// contract.records.CONTRACT_VERSION (a unit test compares them).
pub const CONTRACT_VERSION: u32 = 2;
/// gateway.ingest.KAFKA_TIMESTAMP_BEHIND_US and KAFKA_TIMESTAMP_AHEAD_US (a unit test compares them).
pub const KAFKA_TIMESTAMP_BEHIND_US: i128 = 3_600_000_000;
pub const KAFKA_TIMESTAMP_AHEAD_US: i128 = 60_000_000;
/// Deeper values go to orjson (its own limit is 254 levels; the wire's payloads stop at 32).
const MAX_NATIVE_DEPTH: usize = 200;

/// A Python int of an i128, through i64 when it fits: PyO3's i128 conversion goes through Python calls under abi3
/// (a Kafka timestamp per record paid it).
pub fn int_to_py(py: Python<'_>, value: i128) -> PyResult<Bound<'_, PyAny>> {
    match i64::try_from(value) {
        Ok(small) => Ok(small.into_pyobject(py)?.into_any()),
        Err(_) => Ok(value.into_pyobject(py)?.into_any()),
    }
}

/// gateway.ingest.kafka_timestamp_ms: rule 7's Kafka timestamp (ms, floor division as Python's `//`).
pub fn kafka_timestamp_ms(ref_us: i128, release_us: i128) -> i128 {
    (release_us - KAFKA_TIMESTAMP_BEHIND_US)
        .max(ref_us.min(release_us + KAFKA_TIMESTAMP_AHEAD_US))
        .div_euclid(1000)
}

/// A value orjson would write differently or refuse: the caller lets orjson do it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotNative;

pub fn write_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    // Most strs (stream names, source ids, payload keys) escape nothing: one scan, one reserve, three copies.
    if !bytes.iter().any(|&c| c < 0x20 || c == b'"' || c == b'\\') {
        out.reserve(bytes.len() + 2);
        out.push(b'"');
        out.extend_from_slice(bytes);
        out.push(b'"');
        return;
    }
    out.push(b'"');
    let mut start = 0;
    for (i, &c) in bytes.iter().enumerate() {
        let escape: &[u8] = match c {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(c >> 4)]);
            out.push(HEX[usize::from(c & 0xf)]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

pub fn write_int(out: &mut Vec<u8>, value: i128) -> Result<(), NotNative> {
    if value < i128::from(i64::MIN) || value > i128::from(u64::MAX) {
        return Err(NotNative); // orjson: "Integer exceeds 64-bit range"
    }
    if value < 0 {
        out.push(b'-');
    }
    write_u64(
        out,
        u64::try_from(value.unsigned_abs()).map_err(|_| NotNative)?,
    );
    Ok(())
}

pub fn write_i64(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    write_u64(out, value.unsigned_abs());
}

pub fn write_u64(out: &mut Vec<u8>, value: u64) {
    // itoa: four digits per division, no bounds checks (a record's microsecond times have 16 digits each, several
    // per record; the two-digit loop this replaces was the record writer's largest cost).
    let mut text = itoa::Buffer::new();
    out.extend_from_slice(text.format(value).as_bytes());
}

/// A fixed buffer for one formatted number (no allocation on the per-event path).
struct NumberText {
    bytes: [u8; 48],
    len: usize,
}

impl std::fmt::Write for NumberText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        if end > self.bytes.len() {
            return Err(std::fmt::Error);
        }
        self.bytes[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

pub fn write_f64(out: &mut Vec<u8>, x: f64) {
    use std::fmt::Write as _;
    if !x.is_finite() {
        out.extend_from_slice(b"null");
        return;
    }
    // The common case: orjson's plain range (1e-5 <= |x| < 1e16), where Rust's Display writes the same shortest
    // digits without an exponent; under 15 significant digits no half-even tie can arise (see shortest_digits).
    let a = x.abs();
    if (1e-5..1e16).contains(&a) {
        let mut text = NumberText {
            bytes: [0; 48],
            len: 0,
        };
        if write!(text, "{a}").is_ok() {
            let t = &text.bytes[..text.len];
            let significant = t.iter().filter(|c| c.is_ascii_digit()).count()
                - t.iter()
                    .take_while(|&&c| c == b'0' || c == b'.')
                    .filter(|&&c| c == b'0')
                    .count()
                - t.iter().rev().take_while(|&&c| c == b'0').count();
            if significant < 15 {
                if x.is_sign_negative() {
                    out.push(b'-');
                }
                out.extend_from_slice(t);
                if !t.contains(&b'.') {
                    out.extend_from_slice(b".0");
                }
                return;
            }
        }
    }
    let mut text = String::new();
    write_shortest(&mut text, x, -5..16, 1);
    out.extend_from_slice(text.as_bytes());
}

/// The fields of contract.records.EventRecord, its payload already JSON.
#[derive(Debug, Clone, Default)]
pub struct EventRecordFields<'a> {
    pub stream: &'a str,
    pub source_id: &'a str,
    pub seq: i128,
    pub source_ts_us: i128,
    pub ref_ts_us: i128,
    pub uncertainty_us: i128,
    pub arrival_ts_us: i128,
    pub release_ts_us: i128,
    pub late: bool,
    pub payload_json: &'a [u8],
    pub late_reason: Option<&'a str>,
    pub rtt_us: Option<i128>,
    /// How far behind the watermark a late record arrived (written after rtt_us when set).
    pub lateness_us: Option<i128>,
    pub start_ts_us: Option<i128>,
    pub start_uncertainty_us: Option<i128>,
    pub source_start_ts_us: Option<i128>,
    pub interval_id: Option<&'a str>,
    /// Written only with interval_id (None: null, as EventRecord.to_json writes it).
    pub endpoint: Option<&'a str>,
    /// `extra`'s (key, JSON value) pairs, none of them a key the record writes itself.
    pub extra_json: Vec<(&'a str, Vec<u8>)>,
}

fn key(out: &mut Vec<u8>, name: &str) {
    out.push(b',');
    write_str(out, name);
    out.push(b':');
}

/// `key` for one of the record's own names (ASCII letters and underscores: nothing to escape).
#[inline(always)]
fn own_key(out: &mut Vec<u8>, name: &str) {
    debug_assert!(name.bytes().all(|c| c.is_ascii_alphabetic() || c == b'_'));
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

/// `own_key` then the integer; called once per field with its name written out (not looped over), so that each
/// key's bytes have a constant length and are copied inline.
#[inline(always)]
fn own_int(out: &mut Vec<u8>, name: &str, value: i128) -> Result<(), NotNative> {
    own_key(out, name);
    write_int(out, value)
}

/// EventRecord.to_json.
pub fn write_event_record(out: &mut Vec<u8>, r: &EventRecordFields<'_>) -> Result<(), NotNative> {
    out.extend_from_slice(b"{\"v\":");
    write_u64(out, u64::from(CONTRACT_VERSION));
    out.extend_from_slice(b",\"kind\":\"event\"");
    own_key(out, "stream");
    write_str(out, r.stream);
    own_key(out, "source_id");
    write_str(out, r.source_id);
    own_int(out, "seq", r.seq)?;
    own_int(out, "source_ts_us", r.source_ts_us)?;
    own_int(out, "ref_ts_us", r.ref_ts_us)?;
    own_int(out, "uncertainty_us", r.uncertainty_us)?;
    own_int(out, "arrival_ts_us", r.arrival_ts_us)?;
    own_int(out, "release_ts_us", r.release_ts_us)?;
    out.extend_from_slice(if r.late {
        b",\"late\":true"
    } else {
        b",\"late\":false"
    });
    own_key(out, "payload");
    out.extend_from_slice(r.payload_json);
    let start_ts_us = r.start_ts_us.or(r.interval_id.map(|_| r.ref_ts_us));
    if let Some(start) = start_ts_us {
        own_key(out, "start_ts_us");
        write_int(out, start)?;
        own_key(out, "end_ts_us");
        write_int(out, r.ref_ts_us)?;
        own_key(out, "start_uncertainty_us");
        write_int(out, r.start_uncertainty_us.unwrap_or(r.uncertainty_us))?;
        own_key(out, "source_start_ts_us");
        write_int(out, r.source_start_ts_us.unwrap_or(r.source_ts_us))?;
        if let Some(interval_id) = r.interval_id {
            own_key(out, "interval_id");
            write_str(out, interval_id);
            own_key(out, "endpoint");
            match r.endpoint {
                Some(endpoint) => write_str(out, endpoint),
                None => out.extend_from_slice(b"null"),
            }
        }
    }
    if let Some(reason) = r.late_reason {
        own_key(out, "late_reason");
        write_str(out, reason);
    }
    if let Some(rtt_us) = r.rtt_us {
        own_key(out, "rtt_us");
        write_int(out, rtt_us)?;
    }
    if let Some(lateness_us) = r.lateness_us {
        own_key(out, "lateness_us");
        write_int(out, lateness_us)?;
    }
    for (name, value) in &r.extra_json {
        key(out, name);
        out.extend_from_slice(value);
    }
    out.push(b'}');
    Ok(())
}

/// PunctuationRecord.to_json.
pub fn write_punctuation_record(
    out: &mut Vec<u8>,
    stream: &str,
    watermark_us: i128,
    release_ts_us: i128,
) -> Result<(), NotNative> {
    out.extend_from_slice(b"{\"v\":");
    write_u64(out, u64::from(CONTRACT_VERSION));
    out.extend_from_slice(b",\"kind\":\"punctuation\"");
    own_key(out, "stream");
    write_str(out, stream);
    own_key(out, "watermark_us");
    write_int(out, watermark_us)?;
    own_key(out, "release_ts_us");
    write_int(out, release_ts_us)?;
    out.push(b'}');
    Ok(())
}

/// The JSON keys EventRecord.to_json may write itself: an `extra` key among them replaces that value in place
/// (dict.update), which the wrapper leaves to orjson.
const RECORD_KEYS: [&str; 21] = [
    "v",
    "kind",
    "stream",
    "source_id",
    "seq",
    "source_ts_us",
    "ref_ts_us",
    "uncertainty_us",
    "arrival_ts_us",
    "release_ts_us",
    "late",
    "payload",
    "start_ts_us",
    "end_ts_us",
    "start_uncertainty_us",
    "source_start_ts_us",
    "interval_id",
    "endpoint",
    "late_reason",
    "rtt_us",
    "lateness_us",
];

// ------------------------------------------------------------------------------------------------ Python view

/// How one JSON value is written: `write_py`, or the dedup's sorted-key `write_sorted`.
pub(crate) type WriteJson<'py> =
    fn(&mut Vec<u8>, &Bound<'py, PyAny>, usize) -> Result<(), NotNative>;

/// A list's or tuple's items as one JSON array (orjson writes both alike), each by `write_item` (the plain or the
/// sorted-key writer).
pub(crate) fn write_json_array<'py>(
    out: &mut Vec<u8>,
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    depth: usize,
    write_item: WriteJson<'py>,
) -> Result<(), NotNative> {
    out.push(b'[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_item(out, &item, depth + 1)?;
    }
    out.push(b']');
    Ok(())
}

/// orjson's bytes for a Python value of the exact JSON types.
pub fn write_py(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    depth: usize,
) -> Result<(), NotNative> {
    if depth > MAX_NATIVE_DEPTH {
        return Err(NotNative);
    }
    if value.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(s) = value.cast_exact::<PyString>() {
        write_str(out, s.to_str().map_err(|_| NotNative)?);
    } else if let Ok(b) = value.cast_exact::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if value.is_exact_instance_of::<PyInt>() {
        write_int(out, py_int(value).ok_or(NotNative)?)?;
    } else if let Ok(f) = value.cast_exact::<PyFloat>() {
        write_f64(out, f.value());
    } else if let Ok(d) = value.cast_exact::<PyDict>() {
        out.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let k = k.cast_exact::<PyString>().map_err(|_| NotNative)?;
            write_str(out, k.to_str().map_err(|_| NotNative)?);
            out.push(b':');
            write_py(out, &v, depth + 1)?;
        }
        out.push(b'}');
    } else if let Ok(l) = value.cast_exact::<PyList>() {
        write_json_array(out, l.iter(), depth, write_py)?;
    } else if let Ok(t) = value.cast_exact::<PyTuple>() {
        write_json_array(out, t.iter(), depth, write_py)?;
    } else {
        return Err(NotNative);
    }
    Ok(())
}

/// An int within [-2^63, 2^64 - 1] (PyO3's i128 extraction goes through Python calls under abi3: slow).
fn py_int(value: &Bound<'_, PyAny>) -> Option<i128> {
    match value.extract::<i64>() {
        Ok(v) => Some(i128::from(v)),
        Err(_) => value.extract::<u64>().ok().map(i128::from),
    }
}

/// An exact int of 64 bits, or NotNative.
fn exact_int(value: &Bound<'_, PyAny>) -> Result<i128, NotNative> {
    if !value.is_exact_instance_of::<PyInt>() {
        return Err(NotNative);
    }
    py_int(value).ok_or(NotNative)
}

fn opt_int(value: &Bound<'_, PyAny>) -> Result<Option<i128>, NotNative> {
    if value.is_none() {
        return Ok(None);
    }
    exact_int(value).map(Some)
}

static HEADER_NAMES: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();

/// (HEADER_KIND, HEADER_SOURCE_ID, HEADER_CONTRACT_VERSION, PUNCTUATION_KEY) from contract.records.
/// Indexes into `header_names()`.
const HEADER_KIND: usize = 0;
const HEADER_SOURCE_ID: usize = 1;
const HEADER_CONTRACT_VERSION: usize = 2;
const PUNCTUATION_KEY: usize = 3;

/// A record's Kafka headers: a `(name, value)` tuple per `(header_names() index, value)` given, in that order.
fn header_tuple<'py>(py: Python<'py>, pairs: &[(usize, &[u8])]) -> PyResult<Bound<'py, PyTuple>> {
    let names = header_names(py)?;
    let headers = pairs
        .iter()
        .map(|&(name, value)| {
            PyTuple::new(
                py,
                [names.get_item(name)?, PyBytes::new(py, value).into_any()],
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, headers)
}

fn header_names(py: Python<'_>) -> PyResult<&Bound<'_, PyTuple>> {
    HEADER_NAMES
        .get_or_try_init(py, || {
            let records = py.import("contract.records")?;
            let names = PyTuple::new(
                py,
                [
                    records.getattr("HEADER_KIND")?,
                    records.getattr("HEADER_SOURCE_ID")?,
                    records.getattr("HEADER_CONTRACT_VERSION")?,
                    records.getattr("PUNCTUATION_KEY")?,
                ],
            )?;
            Ok::<_, PyErr>(names.unbind())
        })
        .map(|t| t.bind(py))
}

/// What the builder keeps per source: the headers of its events-topic and late-topic records, and the key of
/// its records (`source_id.encode()`: bytes are immutable, so one object serves every record of the source instead
/// of an allocation per record).
#[derive(Default)]
struct SourceCache {
    headers: [Option<Py<PyTuple>>; 2],
    key: Option<Py<PyBytes>>,
}

/// Builds the Kafka record bytes of a batch of EventRecords (gateway.ingest._publish's per-record work) and of
/// punctuations, caching each source's headers as _publish does.
#[pyclass(module = "skewless_native")]
pub struct RecordBuilder {
    /// Per source: its events-topic and late-topic headers, and its records' key.
    headers: std::collections::HashMap<String, SourceCache>,
    punctuation_headers: Option<Py<PyTuple>>,
    /// Records whose JSON orjson wrote (see the module doc).
    #[pyo3(get)]
    fallbacks: u64,
    /// What `produce_records` and `build_merged` build with (`produce=` of the constructor, then `publish_to`).
    produce: Option<produce::Publishing>,
}

struct Attrs {
    names: Vec<Py<PyString>>,
}

static ATTRS: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();
const ATTR_NAMES: [&str; 19] = [
    "stream",
    "source_id",
    "seq",
    "source_ts_us",
    "ref_ts_us",
    "uncertainty_us",
    "arrival_ts_us",
    "release_ts_us",
    "late",
    "payload",
    "late_reason",
    "rtt_us",
    "start_ts_us",
    "start_uncertainty_us",
    "source_start_ts_us",
    "interval_id",
    "endpoint",
    "extra",
    "lateness_us",
];

impl Attrs {
    fn get(py: Python<'_>) -> Attrs {
        let names = ATTRS.get_or_init(py, || {
            ATTR_NAMES
                .iter()
                .map(|n| PyString::intern(py, n).unbind())
                .collect()
        });
        Attrs {
            names: names.iter().map(|n| n.clone_ref(py)).collect(),
        }
    }
    fn name<'py>(&self, py: Python<'py>, i: usize) -> &Bound<'py, PyString> {
        self.names[i].bind(py)
    }
}

/// The record's fields in ATTR_NAMES' order, into `fields`.
fn read_fields<'py>(
    record: &Bound<'py, PyAny>,
    attrs: &Attrs,
    fields: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<()> {
    let py = record.py();
    fields.clear();
    for i in 0..ATTR_NAMES.len() {
        fields.push(record.getattr(attrs.name(py, i))?);
    }
    Ok(())
}

fn opt_str(value: &Bound<'_, PyAny>) -> Result<Option<String>, NotNative> {
    if value.is_none() {
        return Ok(None);
    }
    let s = value.cast_exact::<PyString>().map_err(|_| NotNative)?;
    Ok(Some(s.to_str().map_err(|_| NotNative)?.to_owned()))
}

impl RecordBuilder {
    /// The source's record key (`source_id.encode()`) and its records' headers (gateway.ingest's
    /// `event_headers`), from one lookup of the source's cache.
    fn event_key_and_headers(
        &mut self,
        py: Python<'_>,
        source_id: &str,
        late: bool,
    ) -> PyResult<(Py<PyBytes>, Py<PyTuple>)> {
        if let Some(SourceCache {
            headers,
            key: Some(key),
        }) = self.headers.get(source_id)
        {
            if let Some(h) = &headers[usize::from(late)] {
                return Ok((key.clone_ref(py), h.clone_ref(py)));
            }
        }
        let kind: &[u8] = if late { b"late" } else { b"event" };
        let version = CONTRACT_VERSION.to_string();
        let headers = header_tuple(
            py,
            &[
                (HEADER_KIND, kind),
                (HEADER_SOURCE_ID, source_id.as_bytes()),
                (HEADER_CONTRACT_VERSION, version.as_bytes()),
            ],
        )?
        .unbind();
        let cache = self.headers.entry(source_id.to_owned()).or_default();
        cache.headers[usize::from(late)] = Some(headers.clone_ref(py));
        let key = cache
            .key
            .get_or_insert_with(|| PyBytes::new(py, source_id.as_bytes()).unbind());
        Ok((key.clone_ref(py), headers))
    }

    /// (key, value, timestamp_ms, headers) of one EventRecord whose fields `read_fields` gave: value is the
    /// exception orjson raised (TypeError or ValueError) when it refuses the record, timestamp_ms None past 64 bits.
    fn build_one<'py>(
        &mut self,
        record: &Bound<'py, PyAny>,
        fields: &[Bound<'py, PyAny>],
        on_late: bool,
        buf: &mut Vec<u8>,
    ) -> PyResult<[Bound<'py, PyAny>; 4]> {
        let py = record.py();
        buf.clear();
        let value: Bound<'py, PyAny> = match Self::native_json(fields, buf) {
            Ok(()) => PyBytes::new(py, buf).into_any(),
            Err(NotNative) => {
                self.fallbacks += 1;
                match record.call_method0("to_json") {
                    Ok(v) => v,
                    Err(e)
                        if e.is_instance_of::<PyTypeError>(py)
                            || e.is_instance_of::<PyValueError>(py) =>
                    {
                        e.into_value(py).into_bound(py).into_any()
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let Ok(source_id) = fields[1].cast_exact::<PyString>() else {
            return Err(PyTypeError::new_err(
                "an EventRecord's source_id must be a str",
            ));
        };
        // EventRecord.key is source_id.encode(): the same bytes (the source's cached object), without the
        // property call.
        let (key, headers) = self.event_key_and_headers(py, source_id.to_str()?, on_late)?;
        let (key, headers) = (
            key.into_bound(py).into_any(),
            headers.into_bound(py).into_any(),
        );
        // Times beyond 64 bits make to_json fail (orjson): such a record is refused, it has no timestamp.
        let ts = match (py_int(&fields[4]), py_int(&fields[7])) {
            (Some(ref_us), Some(release_us)) => {
                int_to_py(py, kafka_timestamp_ms(ref_us, release_us))?
            }
            _ => py.None().into_bound(py),
        };
        Ok([key, value, ts, headers])
    }

    /// `build_merged` for a merge's outputs before they became records (the native merger's `push_run_built`):
    /// each plain release's Produce, or `record(output)` in its place; with the positions of those records.
    pub fn build_releases<'py>(
        &mut self,
        py: Python<'py>,
        outputs: impl Iterator<Item = MergeOutput<HeldEvent>>,
        run: &Bound<'py, PyAny>,
        clock: &Bound<'py, PyAny>,
        record: impl FnMut(MergeOutput<HeldEvent>) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let context = produce::MergedContext::new(clock, run)?;
        self.build_releases_in(py, outputs, context, record)
    }

    /// `build_releases` with the error bounds of the run's events given by `context`: the fused in-order path's
    /// (native/src/merger/python.rs's `push_events_built`) are in its held events.
    pub(crate) fn build_releases_in<'py>(
        &mut self,
        py: Python<'py>,
        outputs: impl Iterator<Item = MergeOutput<HeldEvent>>,
        mut context: produce::MergedContext<'py>,
        mut record: impl FnMut(MergeOutput<HeldEvent>) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        guard("RecordBuilder.build_merged", || {
            let mut batch = produce::Batch::new(py, self.produce.as_ref())?;
            let out = PyList::empty(py);
            let mut handed_back = Vec::new();
            for (position, output) in outputs.enumerate() {
                let produced = match &output {
                    MergeOutput::Merged {
                        event,
                        arrival_us,
                        release_us,
                        ref_ts_us,
                        raised_us: 0,
                    } => {
                        let times = [*arrival_us, *release_us, *ref_ts_us];
                        match event {
                            HeldEvent::Object(event) => produce::produce_release(
                                self,
                                event.bind(py),
                                times,
                                &mut batch,
                                &mut context,
                            )?,
                            HeldEvent::Fields(held) => produce::produce_held_release(
                                self,
                                held,
                                times,
                                &mut batch,
                                &mut context,
                            )?,
                        }
                    }
                    _ => None,
                };
                match produced {
                    Some(produce) => out.append(produce)?,
                    None => {
                        handed_back.push(position);
                        out.append(record(output)?)?;
                    }
                }
            }
            Ok((out, handed_back))
        })
    }

    /// The record's JSON written natively from its fields (`f`, in ATTR_NAMES' order), or NotNative.
    fn native_json(f: &[Bound<'_, PyAny>], out: &mut Vec<u8>) -> Result<(), NotNative> {
        let stream = f[0].cast_exact::<PyString>().map_err(|_| NotNative)?;
        let source_id = f[1].cast_exact::<PyString>().map_err(|_| NotNative)?;
        let stream = stream.to_str().map_err(|_| NotNative)?;
        let source_id = source_id.to_str().map_err(|_| NotNative)?;
        let late = f[8]
            .cast_exact::<PyBool>()
            .map_err(|_| NotNative)?
            .is_true();
        let mut payload_json = Vec::with_capacity(64);
        write_py(&mut payload_json, &f[9], 1)?;
        let (late_reason, interval_id, endpoint) =
            (opt_str(&f[10])?, opt_str(&f[15])?, opt_str(&f[16])?);
        let extra = f[17].cast_exact::<PyDict>().map_err(|_| NotNative)?;
        let mut extra_json = Vec::with_capacity(extra.len());
        for (k, v) in extra.iter() {
            let k = opt_str(&k)?.ok_or(NotNative)?;
            if RECORD_KEYS.contains(&k.as_str()) {
                return Err(NotNative);
            }
            let mut json = Vec::new();
            write_py(&mut json, &v, 1)?;
            extra_json.push((k, json));
        }
        let fields = EventRecordFields {
            stream,
            source_id,
            seq: exact_int(&f[2])?,
            source_ts_us: exact_int(&f[3])?,
            ref_ts_us: exact_int(&f[4])?,
            uncertainty_us: exact_int(&f[5])?,
            arrival_ts_us: exact_int(&f[6])?,
            release_ts_us: exact_int(&f[7])?,
            late,
            payload_json: &payload_json,
            late_reason: late_reason.as_deref(),
            rtt_us: opt_int(&f[11])?,
            lateness_us: opt_int(&f[18])?,
            start_ts_us: opt_int(&f[12])?,
            start_uncertainty_us: opt_int(&f[13])?,
            source_start_ts_us: opt_int(&f[14])?,
            interval_id: interval_id.as_deref(),
            endpoint: endpoint.as_deref(),
            extra_json: extra_json
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .collect(),
        };
        write_event_record(out, &fields)
    }
}

#[pymethods]
impl RecordBuilder {
    #[new]
    #[pyo3(signature = (*, produce=None))]
    fn new(produce: Option<produce::ProduceArg<'_>>) -> PyResult<Self> {
        Ok(RecordBuilder {
            headers: std::collections::HashMap::new(),
            punctuation_headers: None,
            fallbacks: 0,
            produce: produce.map(produce::Publishing::new).transpose()?,
        })
    }

    /// Whether `produce=`'s Produce and DeliveryRef are built without running their Python `__init__` (plain
    /// slots dataclasses, see records/slots.rs); else they are called.
    #[getter]
    fn builds_actions_directly(&self) -> bool {
        self.produce
            .as_ref()
            .is_some_and(produce::Publishing::builds_directly)
    }

    /// Drops `source_id`'s cached headers, as IngestCore drops its own when it frees an idle source (rule 11): the
    /// cache holds the sources seen since, not every source id ever seen.
    fn forget_source(&mut self, source_id: &str) {
        self.headers.remove(source_id);
    }

    /// How many sources' headers are cached (for tests).
    #[getter]
    fn cached_sources(&self) -> usize {
        self.headers.len()
    }

    /// `any(type(event.payload) is refused for event in events)`: IngestCore.events_received's check of a frame
    /// for a refused payload, the payloads read from IncomingEvent's slots (events.rs) in one pass.
    fn any_payload_of_class(
        &self,
        events: &Bound<'_, PyAny>,
        refused: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let events = crate::events::Events::of(events)?;
        for index in 0..events.len()? {
            let event = events.at(index)?;
            let of_class = match event.payload_json() {
                Some(json) => json.is_of_class(refused),
                None => event.field(crate::events::PAYLOAD)?.get_type().is(refused),
            };
            if of_class {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Where `produce_records` and `build_merged` publish: gateway.ingest's topic cache ((stream, kind) -> topic,
    /// filled by `_publish`; a record whose topic is not in it yet is handed back) and its `max_record_bytes`.
    fn publish_to(&mut self, topics: &Bound<'_, PyDict>, max_record_bytes: usize) -> PyResult<()> {
        let Some(publishing) = self.produce.as_mut() else {
            return Err(PyTypeError::new_err(
                "publish_to needs RecordBuilder(produce=...)",
            ));
        };
        publishing.publish_to(topics, max_record_bytes);
        Ok(())
    }

    /// gateway.ingest's `_publish_one` for the plain event records among a pipeline's `outputs`, in one call (see
    /// records/produce.rs). Returns the list, each output's Produce or the output itself in its place, and the
    /// positions of those handed back.
    fn produce_records<'py>(
        &mut self,
        outputs: &Bound<'py, PyList>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let py = outputs.py();
        guard("RecordBuilder.produce_records", || {
            let mut batch = produce::Batch::new(py, self.produce.as_ref())?;
            produce::each_item(outputs, |output| {
                produce::produce_record(self, output, &mut batch)
            })
        })
    }

    /// reorder.pipeline's `_records`, then gateway.ingest's `_publish_one`, for the plain releases among the
    /// merge's `merged` outputs of a `push_run(run)` (see records/produce.rs); `clock`: the pipeline's mapping.
    /// Returns the list, each item's Produce or the item itself in its place, and the positions of those handed
    /// back.
    fn build_merged<'py>(
        &mut self,
        merged: &Bound<'py, PyList>,
        run: &Bound<'py, PyAny>,
        clock: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let py = merged.py();
        guard("RecordBuilder.build_merged", || {
            let mut batch = produce::Batch::new(py, self.produce.as_ref())?;
            let mut context = produce::MergedContext::new(clock, run)?;
            produce::each_item(merged, |item| {
                produce::produce_merged(self, item, &mut batch, &mut context)
            })
        })
    }

    /// One (key, value, timestamp_ms, headers) per EventRecord, `late[i]` saying whether it goes to the late
    /// topic. A value orjson refuses is that exception (TypeError or ValueError, as `to_json` raises it), not
    /// bytes: the batch goes on; timestamp_ms is None when ref_ts_us or release_ts_us exceeds 64 bits.
    fn build_events<'py>(
        &mut self,
        py: Python<'py>,
        records: Vec<Bound<'py, PyAny>>,
        late: Vec<bool>,
    ) -> PyResult<Bound<'py, PyList>> {
        guard("RecordBuilder.build_events", || {
            if records.len() != late.len() {
                return Err(PyValueError::new_err("records and late differ in length"));
            }
            let attrs = Attrs::get(py);
            let out = PyList::empty(py);
            let mut buf = Vec::with_capacity(512);
            let mut fields = Vec::with_capacity(ATTR_NAMES.len());
            for (record, &on_late) in records.iter().zip(&late) {
                read_fields(record, &attrs, &mut fields)?;
                let built = self.build_one(record, &fields, on_late, &mut buf)?;
                out.append(PyTuple::new(py, built)?)?;
            }
            Ok(out)
        })
    }

    /// (key, value, timestamp_ms, headers) of PunctuationRecord(stream, watermark_us, release_ts_us).
    fn build_punctuation<'py>(
        &mut self,
        py: Python<'py>,
        stream: &str,
        watermark_us: i128,
        release_ts_us: i128,
    ) -> PyResult<Bound<'py, PyTuple>> {
        guard("RecordBuilder.build_punctuation", || {
            let names = header_names(py)?;
            let mut buf = Vec::with_capacity(128);
            if write_punctuation_record(&mut buf, stream, watermark_us, release_ts_us).is_err() {
                return Err(PyValueError::new_err(
                    "a punctuation's times must fit 64 bits",
                ));
            }
            if self.punctuation_headers.is_none() {
                let version = CONTRACT_VERSION.to_string();
                let h = header_tuple(
                    py,
                    &[
                        (HEADER_KIND, b"punctuation"),
                        (HEADER_CONTRACT_VERSION, version.as_bytes()),
                    ],
                )?;
                self.punctuation_headers = Some(h.unbind());
            }
            let headers = self
                .punctuation_headers
                .as_ref()
                .map(|h| h.clone_ref(py).into_bound(py));
            PyTuple::new(
                py,
                [
                    names.get_item(PUNCTUATION_KEY)?,
                    PyBytes::new(py, &buf).into_any(),
                    int_to_py(py, kafka_timestamp_ms(watermark_us, release_ts_us))?,
                    headers.map_or_else(|| py.None().into_bound(py), |h| h.into_any()),
                ],
            )
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RecordBuilder>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_f64(x: f64) -> String {
        let mut out = Vec::new();
        write_f64(&mut out, x);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn integers_in_decimal_as_rust_formats_them() {
        let mut values = vec![
            0,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1000,
            u64::MAX,
            u64::MAX - 1,
        ];
        let mut power = 1u64;
        while let Some(next) = power.checked_mul(10) {
            values.extend([next - 1, next, next + 1, next / 2 + 7]);
            power = next;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..10_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            values.push(seed >> (seed % 64));
        }
        for value in values {
            let mut out = Vec::new();
            write_u64(&mut out, value);
            assert_eq!(String::from_utf8(out).unwrap(), value.to_string());
        }
        for value in [i64::MIN, -1, -10, -99, -100, i64::MAX] {
            let mut out = Vec::new();
            write_i64(&mut out, value);
            assert_eq!(String::from_utf8(out).unwrap(), value.to_string());
        }
    }

    #[test]
    fn floats_as_orjson_writes_them() {
        for (x, want) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1e-5, "0.00001"),
            (1e-6, "1e-6"),
            (2.5e-5, "0.000025"),
            (1.234e-7, "1.234e-7"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (1234567890123456.8, "1234567890123456.8"),
            (f64::NAN, "null"),
        ] {
            assert_eq!(json_f64(x), want, "{x}");
        }
    }

    #[test]
    fn strings_escaped_as_orjson_does() {
        let mut out = Vec::new();
        write_str(
            &mut out,
            "a\u{0}\u{1}\u{8}\t\n\u{b}\u{c}\r\u{1f}\u{7f}\"\\/é\u{2028}",
        );
        assert_eq!(
            out,
            "\"a\\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f\u{7f}\\\"\\\\/é\u{2028}\"".as_bytes()
        );
        // Nothing to escape: the fast path, the same bytes.
        let mut out = Vec::new();
        write_str(&mut out, "s-1 é/\u{7f}\u{2028}");
        assert_eq!(out, "\"s-1 é/\u{7f}\u{2028}\"".as_bytes());
    }

    #[test]
    fn kafka_timestamp_floors_like_python() {
        assert_eq!(kafka_timestamp_ms(-1_500, 1_000), -2); // -1500 // 1000
        assert_eq!(
            kafka_timestamp_ms(10_000_000_000, 10_000_000_000),
            10_000_000
        );
        assert_eq!(kafka_timestamp_ms(i128::from(i64::MAX), 0), 60_000);
    }

    #[test]
    fn an_interval_record_writes_its_start_fields() {
        let fields = EventRecordFields {
            stream: "s",
            source_id: "src",
            seq: 1,
            ref_ts_us: 10,
            payload_json: b"null",
            interval_id: Some("i"),
            ..Default::default()
        };
        let mut out = Vec::new();
        write_event_record(&mut out, &fields).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"v\":2,\"kind\":\"event\",\"stream\":\"s\",\"source_id\":\"src\",\"seq\":1,\"source_ts_us\":0,\
             \"ref_ts_us\":10,\"uncertainty_us\":0,\"arrival_ts_us\":0,\"release_ts_us\":0,\"late\":false,\
             \"payload\":null,\"start_ts_us\":10,\"end_ts_us\":10,\"start_uncertainty_us\":0,\
             \"source_start_ts_us\":0,\"interval_id\":\"i\",\"endpoint\":null}"
        );
    }
}
