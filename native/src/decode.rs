//! The gateway's per-connection decoder: frame split (contract/wire/frames.py FrameDecoder), msgpack decode
//! (msgpack-python's rules, decode/msgpack.rs) and per-event validation (contract/wire/messages.py), in the
//! loop GatewaySession.receive_data (gateway/session.py) runs: bytes in, whole messages out, stopping where the
//! session stops (an error, a bye, and a hello, which the Python shell checks before any event is parsed).
//! tests/unit/native/test_native_decode.py drives this and the Python path with the same bytes and requires the same
//! messages, errors and buffered bytes.

pub mod messages;
pub mod msgpack;
pub mod pyrepr;

use std::collections::HashMap;

use bumpalo::Bump;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::frame::{EventFrame, FrameEvent};
use crate::payload::JsonPayload;
use messages::{ErrorKind, Interval, ParsedEvent, PayloadRef, ProtocolError};
use msgpack::{Map, Value};

/// The decoder's per-event lookup (declared streams, their Python strs): a map of at most 64 entries (a hello's
/// streams), looked up once per event, where std's SipHash cost more than
/// the rest of the lookup. foldhash is keyed per map at random; their bounded size leaves a flood nothing to grow.
type SmallMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// contract.wire.frames.DEFAULT_MAX_FRAME_BYTES.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 1024 * 1024;
/// gateway.session.DEFAULT_MAX_EVENTS_PER_BATCH.
pub const DEFAULT_MAX_EVENTS_PER_BATCH: usize = 10_000;
const HEADER_BYTES: usize = 4;
/// A frame's decoded tree takes about 6 bytes per byte of body for small events (a map entry is 64 bytes, its
/// msgpack ~10): the arena's first allocation, up to a cap; a denser body grows it.
const ARENA_BYTES_PER_BODY_BYTE: usize = 8;
const ARENA_FIRST_MAX_BYTES: usize = 1 << 20;

/// GatewaySession's states as this decoder sees them; `HelloPending`: a hello was handed out and the shell has
/// not yet accepted it (`accept_hello`) or failed the connection (`fail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    AwaitHello,
    HelloPending,
    Streaming,
    Draining,
    Failed,
}

impl State {
    /// SessionState.value, as the "not allowed in state" message names it.
    fn session_value(self) -> &'static str {
        match self {
            State::AwaitHello | State::HelloPending => "await_hello",
            State::Streaming => "streaming",
            State::Draining => "draining",
            State::Failed => "error",
        }
    }
}

/// One message of a frame, borrowing the frame's decoded values.
#[derive(Debug)]
pub enum Decoded<'v, 'a> {
    /// The raw hello map: the shell parses and authenticates it (messages.parse_hello, the authenticator).
    Hello(&'v Map<'a>),
    Events(Vec<ParsedEvent<'v, 'a>>),
    Heartbeat {
        source_ts_us: u64,
        next_seq: Vec<(&'a str, u64)>,
    },
    Bye,
}

/// Bytes in, messages out, for one client connection.
#[derive(Debug)]
pub struct ConnectionDecoder {
    buffer: Vec<u8>,
    start: usize,
    max_frame_bytes: usize,
    max_events: usize,
    declared: SmallMap<String, usize>,
    state: State,
}

impl ConnectionDecoder {
    pub fn new(max_frame_bytes: usize, max_events: usize) -> Self {
        ConnectionDecoder {
            buffer: Vec::new(),
            start: 0,
            max_frame_bytes,
            max_events,
            declared: SmallMap::default(),
            state: State::AwaitHello,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn buffered_bytes(&self) -> usize {
        self.buffer.len() - self.start
    }

    /// As GatewaySession.receive_data: a failed connection takes no more bytes.
    pub fn receive_data(&mut self, data: &[u8]) {
        if self.state == State::Failed {
            return;
        }
        if self.start > 0 && self.start >= self.buffer.len() / 2 {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(data);
    }

    /// The shell accepted the hello: events of these streams are valid from the next frame on.
    pub fn accept_hello<S: Into<String>>(&mut self, streams: impl IntoIterator<Item = S>) {
        self.declared = streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| (s.into(), i))
            .collect();
        if self.state == State::HelloPending {
            self.state = State::Streaming;
        }
    }

    /// The shell failed the connection (a refused hello): nothing more is decoded.
    pub fn fail(&mut self) {
        self.state = State::Failed;
    }

    /// The declared stream's index in `accept_hello`'s order.
    pub fn stream_index(&self, stream: &str) -> Option<usize> {
        self.declared.get(stream).copied()
    }

    /// Decodes the next complete frame and hands its message (or the error that fails the connection) to `f`;
    /// None when no complete frame is buffered or the state takes no more messages.
    pub fn next_message<R>(
        &mut self,
        f: impl FnOnce(Result<Decoded<'_, '_>, &ProtocolError>) -> R,
    ) -> Option<R> {
        if self.state != State::AwaitHello && self.state != State::Streaming {
            return None;
        }
        let available = self.buffered_bytes();
        if available < HEADER_BYTES {
            return None;
        }
        let header: [u8; 4] = self.buffer[self.start..self.start + HEADER_BYTES]
            .try_into()
            .ok()?;
        let length = u32::from_be_bytes(header) as usize;
        // Both errors leave the buffer as it is, as FrameDecoder.next_message does.
        if length == 0 {
            self.state = State::Failed;
            return Some(f(Err(&ProtocolError::plain(
                ErrorKind::MalformedFrame,
                "empty frame".into(),
            ))));
        }
        if length > self.max_frame_bytes {
            self.state = State::Failed;
            let text = format!(
                "frame of {length} bytes exceeds the limit of {} bytes",
                self.max_frame_bytes
            );
            return Some(f(Err(&ProtocolError::plain(
                ErrorKind::FrameTooLarge,
                text,
            ))));
        }
        if available - HEADER_BYTES < length {
            return None;
        }
        let body_start = self.start + HEADER_BYTES;
        let end = body_start + length;
        let body = &self.buffer[body_start..end];
        let declared = &self.declared;
        let is_declared = |s: &str| declared.contains_key(s);
        // The frame's tree in one allocation (grown if it must be), freed with the frame as the tree was before: no
        // memory is kept per connection between frames.
        let arena = Bump::with_capacity(
            length
                .saturating_mul(ARENA_BYTES_PER_BODY_BYTE)
                .min(ARENA_FIRST_MAX_BYTES),
        );
        let result = match msgpack::decode(body, &arena) {
            Err(e) => {
                let text = format!("frame body is not valid msgpack: {}", e.type_name());
                self.state = State::Failed;
                f(Err(&ProtocolError::plain(ErrorKind::MalformedFrame, text)))
            }
            Ok(value) => {
                let parsed = parse_frame(&value, self.state, self.max_events, &is_declared);
                self.state = match &parsed {
                    Err(_) => State::Failed,
                    Ok(Decoded::Hello(_)) => State::HelloPending,
                    Ok(Decoded::Bye) => State::Draining,
                    Ok(_) => self.state,
                };
                match parsed {
                    Ok(decoded) => f(Ok(decoded)),
                    Err(e) => f(Err(&e)),
                }
            }
        };
        self.start = end;
        if self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
        Some(result)
    }

    /// next_message with owned results: events with their payload as the record's JSON (the later native
    /// pipeline's input), or the error.
    pub fn next_owned(&mut self) -> Option<Result<OwnedMessage, ProtocolError>> {
        self.next_message(|m| match m {
            Err(e) => Err(e.clone()),
            Ok(Decoded::Hello(map)) => Ok(OwnedMessage::Hello(map.entries.len())),
            Ok(Decoded::Bye) => Ok(OwnedMessage::Bye),
            Ok(Decoded::Heartbeat {
                source_ts_us,
                next_seq,
            }) => Ok(OwnedMessage::Heartbeat {
                source_ts_us,
                next_seq: next_seq
                    .into_iter()
                    .map(|(s, q)| (s.to_owned(), q))
                    .collect(),
            }),
            Ok(Decoded::Events(events)) => Ok(OwnedMessage::Events(
                events.iter().map(OwnedEvent::from).collect(),
            )),
        })
    }
}

/// The session's transition table (gateway/session.py _TRANSITIONS) and the parse of each accepted type.
fn parse_frame<'v, 'a>(
    value: &'v Value<'a>,
    state: State,
    max_events: usize,
    declared: &dyn Fn(&str) -> bool,
) -> Result<Decoded<'v, 'a>, ProtocolError> {
    let (map, kind) = messages::frame_map(value)?;
    match (state, kind) {
        (State::AwaitHello, "hello") => Ok(Decoded::Hello(map)),
        (State::Streaming, "events") => {
            messages::parse_events(map, max_events, declared).map(Decoded::Events)
        }
        (State::Streaming, "heartbeat") => {
            messages::parse_heartbeat(map, declared).map(|(source_ts_us, next_seq)| {
                Decoded::Heartbeat {
                    source_ts_us,
                    next_seq,
                }
            })
        }
        (State::Streaming, "bye") => Ok(Decoded::Bye),
        _ => Err(ProtocolError {
            kind: ErrorKind::UnexpectedMessage,
            text: messages::ErrorText::NotAllowed {
                kind: kind.to_owned(),
                state: state.session_value(),
            },
        }),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedMessage {
    /// A hello of this many keys (the shell parses hellos).
    Hello(usize),
    Events(Vec<OwnedEvent>),
    Heartbeat {
        source_ts_us: u64,
        next_seq: Vec<(String, u64)>,
    },
    Bye,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedEvent {
    pub stream: String,
    pub seq: u64,
    pub source_ts_us: u64,
    /// The payload as its record's JSON, or why it was refused.
    pub payload: Result<Vec<u8>, String>,
    pub interval: Option<OwnedInterval>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnedInterval {
    Atomic { source_start_ts_us: u64 },
    Endpoint { interval_id: String, end: bool },
}

impl From<&ParsedEvent<'_, '_>> for OwnedEvent {
    fn from(e: &ParsedEvent<'_, '_>) -> Self {
        let payload = match &e.payload {
            PayloadRef::Rejected(reason) => Err(reason.clone()),
            PayloadRef::Valid(value) => {
                let mut json = Vec::new();
                payload_json(&mut json, value.unwrap_or(&Value::Nil));
                Ok(json)
            }
        };
        OwnedEvent {
            stream: e.stream.to_owned(),
            seq: e.seq,
            source_ts_us: e.source_ts_us,
            payload,
            interval: e.interval.as_ref().map(|i| match i {
                Interval::Atomic { source_start_ts_us } => OwnedInterval::Atomic {
                    source_start_ts_us: *source_start_ts_us,
                },
                Interval::Endpoint { interval_id, end } => OwnedInterval::Endpoint {
                    interval_id: (*interval_id).to_owned(),
                    end: *end,
                },
            }),
        }
    }
}

/// orjson's bytes for a payload that payload_problem accepted (str keys, ints within i64, finite floats).
pub fn payload_json(out: &mut Vec<u8>, value: &Value<'_>) {
    write_payload(out, value, false);
}

/// `payload_json` with every map's keys sorted by their UTF-8 bytes: orjson's `OPT_SORT_KEYS` output, the body of
/// the tracker's digest (dedup.rs), for a payload that payload_problem accepted (a map's keys are distinct strs).
pub fn payload_json_sorted(out: &mut Vec<u8>, value: &Value<'_>) {
    write_payload(out, value, true);
}

fn write_payload(out: &mut Vec<u8>, value: &Value<'_>, sorted: bool) {
    use crate::records::{write_f64, write_i64, write_str, write_u64};
    fn key<'a>((k, _): &(Value<'a>, Value<'a>)) -> &'a [u8] {
        match k {
            Value::Str(s) => s.as_bytes(),
            _ => &[], // refused by payload_problem before it gets here
        }
    }
    match value {
        Value::Nil => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Int(i) => write_i64(out, *i),
        Value::UInt(u) => write_u64(out, *u),
        Value::Float(f) => write_f64(out, *f),
        Value::Str(s) => write_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_payload(out, item, sorted);
            }
            out.push(b']');
        }
        Value::Map(map) => {
            out.push(b'{');
            // A source's payloads usually have few keys, often in order already: written as they are.
            if !sorted
                || map
                    .entries
                    .windows(2)
                    .all(|pair| key(&pair[0]) < key(&pair[1]))
            {
                write_entries(out, map.entries.iter(), sorted);
            } else {
                let mut entries: smallvec::SmallVec<[&(Value<'_>, Value<'_>); 8]> =
                    map.entries.iter().collect();
                entries.sort_unstable_by(|a, b| key(a).cmp(key(b)));
                write_entries(out, entries.into_iter(), sorted);
            }
            out.push(b'}');
        }
        // Refused by payload_problem: never written.
        Value::Bin(_) | Value::Ext(..) | Value::Timestamp { .. } => out.extend_from_slice(b"null"),
    }
}

/// A map's entries, in the order given, as `"key":value` separated by commas.
fn write_entries<'a, 'v: 'a>(
    out: &mut Vec<u8>,
    entries: impl Iterator<Item = &'a (Value<'v>, Value<'v>)>,
    sorted: bool,
) {
    for (i, (k, item)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match k {
            Value::Str(s) => crate::records::write_str(out, s),
            other => write_payload(out, other, sorted), // refused by payload_problem before it gets here
        }
        out.push(b':');
        write_payload(out, item, sorted);
    }
}

/// Whether every map in `value` has its keys in sorted order already (its JSON is then its sorted-key JSON).
fn keys_sorted(value: &Value<'_>) -> bool {
    match value {
        Value::Array(items) => items.iter().all(keys_sorted),
        Value::Map(map) => {
            map.entries
                .windows(2)
                .all(|pair| match (&pair[0].0, &pair[1].0) {
                    (Value::Str(a), Value::Str(b)) => a.as_bytes() < b.as_bytes(),
                    _ => false,
                })
                && map.entries.iter().all(|(_, item)| keys_sorted(item))
        }
        _ => true,
    }
}

/// The decoder's buffers for an event's payload JSON and its sorted-key JSON, reused across a frame's events.
#[derive(Default)]
struct PayloadScratch {
    json: Vec<u8>,
    sorted: Vec<u8>,
}

impl PayloadScratch {
    /// The tracker's digest of an event whose payload payload_problem accepted (None: the event has no payload).
    fn digest(&mut self, source_ts_us: u64, payload: Option<&Value<'_>>) -> i64 {
        let sorted = &mut self.sorted;
        crate::dedup::start_json_digest(sorted, source_ts_us);
        payload_json_sorted(sorted, payload.unwrap_or(&Value::Nil));
        crate::dedup::process_digester().digest_framed(sorted)
    }

    /// A valid map payload's record JSON (payload.rs) and the tracker's digest of the event: one JSON written when
    /// the map's keys are in order already (the sorted-key JSON is the same bytes), else the sorted one as well.
    fn map_json(&mut self, source_ts_us: u64, map: &Value<'_>) -> (JsonPayload, i64) {
        let json = &mut self.json;
        crate::dedup::start_json_digest(json, source_ts_us);
        let head = json.len();
        payload_json(json, map);
        let digest = if keys_sorted(map) {
            crate::dedup::process_digester().digest_framed(json)
        } else {
            self.digest(source_ts_us, Some(map))
        };
        (JsonPayload::new(&self.json[head..]), digest)
    }
}

// ------------------------------------------------------------------------------------------------ boundary

/// Runs `f`, turning a Rust panic into a RuntimeError that names `what` (PyO3's PanicException derives from
/// BaseException, which `except Exception` in the asyncio shell would not catch).
pub fn guard<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(PyRuntimeError::new_err(format!(
            "skewless_native: {what} failed with an internal error: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

/// The message a caught panic carries (`panic!` with a literal or a formatted one), for the error that replaces it.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

struct PyTypes {
    event_batch: Py<PyAny>,
    heartbeat: Py<PyAny>,
    bye: Py<PyAny>,
    rejected_payload: Py<PyAny>,
    atomic_interval: Py<PyAny>,
    interval_endpoint: Py<PyAny>,
    non_string_key_map: Py<PyAny>,
    ext_type: Py<PyAny>,
    timestamp: Py<PyAny>,
    errors: [Py<PyAny>; 4],
}

static PY_TYPES: PyOnceLock<PyTypes> = PyOnceLock::new();

fn py_types(py: Python<'_>) -> PyResult<&PyTypes> {
    PY_TYPES.get_or_try_init(py, || {
        let messages = py.import("contract.wire.messages")?;
        let errors = py.import("contract.wire.errors")?;
        let frames = py.import("contract.wire.frames")?;
        let msgpack = py.import("msgpack")?;
        let get = |m: &Bound<'_, PyModule>, name: &str| m.getattr(name).map(Bound::unbind);
        Ok::<_, PyErr>(PyTypes {
            event_batch: get(&messages, "EventBatch")?,
            heartbeat: get(&messages, "Heartbeat")?,
            bye: get(&messages, "Bye")?,
            rejected_payload: get(&messages, "RejectedPayload")?,
            atomic_interval: get(&messages, "AtomicInterval")?,
            interval_endpoint: get(&messages, "IntervalEndpoint")?,
            non_string_key_map: get(&frames, "NonStringKeyMap")?,
            ext_type: get(&msgpack, "ExtType")?,
            timestamp: get(&msgpack, "Timestamp")?,
            errors: [
                get(&errors, "FrameTooLarge")?,
                get(&errors, "MalformedFrame")?,
                get(&errors, "InvalidMessage")?,
                get(&errors, "UnexpectedMessage")?,
            ],
        })
    })
}

/// Containers nested deeper than this are converted by `to_py_deep` (a hello may nest 1,024 levels; a valid payload
/// at most 32).
const MAX_RECURSIVE_DEPTH: usize = 48;

/// The Python object msgpack-python (with frames._map_from_pairs) decodes `value` to.
fn to_py<'py>(
    py: Python<'py>,
    t: &PyTypes,
    value: &Value<'_>,
    depth: usize,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Array(_) | Value::Map(_) if depth >= MAX_RECURSIVE_DEPTH => {
            return to_py_deep(py, t, value)
        }
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items.iter() {
                list.append(to_py(py, t, item, depth + 1)?)?;
            }
            list.into_any()
        }
        Value::Map(map) => map_at_depth_to_py(py, t, map, depth + 1)?,
        scalar => scalar_to_py(py, t, scalar)?,
    })
}

/// to_py of a map, without copying it (a clone of a deep value would recurse).
fn map_value_to_py<'py>(
    py: Python<'py>,
    t: &PyTypes,
    map: &Map<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    map_at_depth_to_py(py, t, map, 1)
}

/// A map whose entries are at `depth`: with string keys, `dict_of_entries`; else `map_to_py` of the converted
/// parts.
fn map_at_depth_to_py<'py>(
    py: Python<'py>,
    t: &PyTypes,
    map: &Map<'_>,
    depth: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if map.string_keys {
        return dict_of_entries(py, t, map, depth, |k| to_py(py, t, k, depth));
    }
    let mut parts = Vec::with_capacity(map.entries.len() * 2);
    for (k, v) in map.entries.iter() {
        parts.push(to_py(py, t, k, depth)?);
        parts.push(to_py(py, t, v, depth)?);
    }
    map_to_py(py, t, false, parts)
}

/// to_py without recursion: the thread's stack stays flat however deep the value.
fn to_py_deep<'py>(py: Python<'py>, t: &PyTypes, root: &Value<'_>) -> PyResult<Bound<'py, PyAny>> {
    enum Work<'v, 'a> {
        Enter(&'v Value<'a>),
        Build(&'v Value<'a>),
    }
    let mut work = vec![Work::Enter(root)];
    let mut done: Vec<Bound<'py, PyAny>> = Vec::new();
    while let Some(step) = work.pop() {
        match step {
            Work::Enter(value) => match value {
                Value::Array(items) => {
                    work.push(Work::Build(value));
                    work.extend(items.iter().rev().map(Work::Enter));
                }
                Value::Map(map) => {
                    work.push(Work::Build(value));
                    for (k, v) in map.entries.iter().rev() {
                        work.push(Work::Enter(v));
                        work.push(Work::Enter(k));
                    }
                }
                scalar => done.push(scalar_to_py(py, t, scalar)?),
            },
            Work::Build(Value::Array(items)) => {
                let parts = done.split_off(done.len() - items.len());
                done.push(PyList::new(py, parts)?.into_any());
            }
            Work::Build(Value::Map(map)) => {
                let parts = done.split_off(done.len() - 2 * map.entries.len());
                done.push(map_to_py(py, t, map.string_keys, parts)?);
            }
            Work::Build(_) => unreachable!("only containers are built"),
        }
    }
    done.pop()
        .ok_or_else(|| PyRuntimeError::new_err("skewless_native: to_py_deep produced nothing"))
}

/// A dict, or a NonStringKeyMap of (key, value) tuples, from keys and values alternating.
fn map_to_py<'py>(
    py: Python<'py>,
    t: &PyTypes,
    string_keys: bool,
    parts: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let mut parts = parts.into_iter();
    if string_keys {
        let dict = PyDict::new(py);
        while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
            dict.set_item(k, v)?;
        }
        return Ok(dict.into_any());
    }
    let pairs = PyList::empty(py);
    while let (Some(k), Some(v)) = (parts.next(), parts.next()) {
        pairs.append(PyTuple::new(py, [k, v])?)?;
    }
    t.non_string_key_map.bind(py).call1((pairs,))
}

fn scalar_to_py<'py>(
    py: Python<'py>,
    t: &PyTypes,
    value: &Value<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Nil => py.None().into_bound(py),
        Value::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        Value::Float(f) => pyo3::types::PyFloat::new(py, *f).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bin(b) => PyBytes::new(py, b).into_any(),
        Value::Ext(code, data) => t.ext_type.bind(py).call1((*code, PyBytes::new(py, data)))?,
        Value::Timestamp {
            seconds,
            nanoseconds,
        } => t.timestamp.bind(py).call1((*seconds, *nanoseconds))?,
        Value::Array(_) | Value::Map(_) => to_py_deep(py, t, value)?,
    })
}

fn error_to_py<'py>(
    py: Python<'py>,
    t: &PyTypes,
    e: &ProtocolError,
) -> PyResult<Bound<'py, PyAny>> {
    let repr = |s: &str| -> String {
        PyString::new(py, s)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| pyrepr::str_repr(s))
    };
    let class = match e.kind {
        ErrorKind::FrameTooLarge => &t.errors[0],
        ErrorKind::MalformedFrame => &t.errors[1],
        ErrorKind::InvalidMessage => &t.errors[2],
        ErrorKind::UnexpectedMessage => &t.errors[3],
    };
    class.bind(py).call1((e.text.text(&repr),))
}

/// The Python view of ConnectionDecoder: the same messages as FrameDecoder + contract.wire.messages' parsers in
/// GatewaySession.receive_data's loop, as Python objects.
#[pyclass(name = "ConnectionDecoder", module = "skewless_native")]
pub struct PyConnectionDecoder {
    core: ConnectionDecoder,
    streams: SmallMap<String, Py<PyString>>,
    poisoned: bool,
}

/// A map with string keys as a dict filled as its entries are converted (no vector of the parts in between: an
/// allocation per payload), its entries at `depth`, each key made by `key`.
fn dict_of_entries<'py>(
    py: Python<'py>,
    t: &PyTypes,
    map: &Map<'_>,
    depth: usize,
    mut key: impl FnMut(&Value<'_>) -> PyResult<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let dict = PyDict::new(py);
    for (k, v) in map.entries.iter() {
        dict.set_item(key(k)?, to_py(py, t, v, depth)?)?;
    }
    Ok(dict.into_any())
}

impl PyConnectionDecoder {
    fn decode_buffered<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let t = py_types(py)?;
        let out = PyList::empty(py);
        let streams = &self.streams;
        loop {
            let step = self
                .core
                .next_message(|m| -> PyResult<(Bound<'py, PyAny>, bool)> {
                    match m {
                        Err(e) => Ok((error_to_py(py, t, e)?, true)),
                        Ok(Decoded::Hello(map)) => Ok((map_value_to_py(py, t, map)?, true)),
                        Ok(Decoded::Bye) => Ok((t.bye.bind(py).call0()?, true)),
                        Ok(Decoded::Heartbeat {
                            source_ts_us,
                            next_seq,
                        }) => {
                            let dict = PyDict::new(py);
                            for (stream, seq) in next_seq {
                                dict.set_item(stream, seq)?;
                            }
                            Ok((t.heartbeat.bind(py).call1((source_ts_us, dict))?, false))
                        }
                        Ok(Decoded::Events(events)) => {
                            let mut items = Vec::with_capacity(events.len());
                            let mut scratch = PayloadScratch::default();
                            for e in &events {
                                items.push(event_fields(py, t, streams, e, &mut scratch)?);
                            }
                            let frame = Bound::new(py, EventFrame::from_events(items))?;
                            Ok((t.event_batch.bind(py).call1((frame,))?, false))
                        }
                    }
                });
            match step {
                None => break,
                Some(result) => {
                    let (item, stop) = result?;
                    out.append(item)?;
                    if stop {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    fn guarded<T>(&mut self, what: &str, f: impl FnOnce(&mut Self) -> PyResult<T>) -> PyResult<T> {
        if self.poisoned {
            return Err(PyRuntimeError::new_err(format!(
                "skewless_native: {what}: this decoder failed with an internal error earlier; close the connection"
            )));
        }
        self.poisoned = true;
        let result = guard(what, || f(self));
        // A panic left `poisoned` set (its state may be half-updated); anything else clears it.
        if !matches!(&result, Err(e) if e.to_string().contains("failed with an internal error")) {
            self.poisoned = false;
        }
        result
    }
}

/// An event's IncomingEvent fields, kept in the frame (frame.rs): no IncomingEvent is made unless Python asks.
fn event_fields(
    py: Python<'_>,
    t: &PyTypes,
    streams: &SmallMap<String, Py<PyString>>,
    e: &ParsedEvent<'_, '_>,
    scratch: &mut PayloadScratch,
) -> PyResult<FrameEvent> {
    let stream = match streams.get(e.stream) {
        Some(s) => s.clone_ref(py).into_any(),
        None => PyString::new(py, e.stream).into_any().unbind(),
    };
    let (payload, digest, payload_json) = match &e.payload {
        PayloadRef::Valid(Some(map @ Value::Map(_))) => {
            let (json, digest) = scratch.map_json(e.source_ts_us, map);
            (py.None(), Some(digest), Some(json))
        }
        PayloadRef::Valid(value) => {
            let payload = match value {
                Some(v) => to_py(py, t, v, 0)?.unbind(),
                None => py.None(),
            };
            (payload, Some(scratch.digest(e.source_ts_us, *value)), None)
        }
        PayloadRef::Rejected(reason) => {
            let rejected = t.rejected_payload.bind(py).call1((reason.as_str(),))?;
            (rejected.unbind(), None, None)
        }
    };
    let interval = match &e.interval {
        None => py.None(),
        Some(Interval::Atomic { source_start_ts_us }) => t
            .atomic_interval
            .bind(py)
            .call1((*source_start_ts_us,))?
            .unbind(),
        Some(Interval::Endpoint { interval_id, end }) => t
            .interval_endpoint
            .bind(py)
            .call1((*interval_id, if *end { "end" } else { "start" }))?
            .unbind(),
    };
    let seq = e.seq.into_pyobject(py)?.into_any().unbind();
    let source_ts_us = e.source_ts_us.into_pyobject(py)?.into_any().unbind();
    Ok(FrameEvent::decoded(
        [stream, seq, source_ts_us, payload, interval],
        digest,
        payload_json,
    ))
}

#[pymethods]
impl PyConnectionDecoder {
    #[new]
    #[pyo3(signature = (max_frame_bytes = DEFAULT_MAX_FRAME_BYTES as i64, max_events_per_batch = DEFAULT_MAX_EVENTS_PER_BATCH))]
    fn new(max_frame_bytes: i64, max_events_per_batch: usize) -> PyResult<Self> {
        if max_frame_bytes <= 0 {
            return Err(PyValueError::new_err("max_frame_bytes must be positive"));
        }
        let max_frame_bytes = usize::try_from(max_frame_bytes).unwrap_or(usize::MAX);
        Ok(PyConnectionDecoder {
            core: ConnectionDecoder::new(max_frame_bytes, max_events_per_batch),
            streams: SmallMap::default(),
            poisoned: false,
        })
    }

    #[getter]
    fn buffered_bytes(&self) -> usize {
        self.core.buffered_bytes()
    }

    /// "await_hello", "hello_pending", "streaming", "draining" or "error".
    #[getter]
    fn state(&self) -> &'static str {
        match self.core.state() {
            State::AwaitHello => "await_hello",
            State::HelloPending => "hello_pending",
            State::Streaming => "streaming",
            State::Draining => "draining",
            State::Failed => "error",
        }
    }

    /// Buffers `data` and decodes every complete frame up to the first that stops the loop. Items: an
    /// EventBatch, a Heartbeat, a Bye (last), a hello's raw dict (last: call `accept_hello` or `fail`, then
    /// `decode`), or a RemoteProtocolError instance (last: the connection failed).
    fn receive_data<'py>(&mut self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        self.guarded("ConnectionDecoder.receive_data", |s| {
            s.core.receive_data(data);
            s.decode_buffered(py)
        })
    }

    /// Decodes what is buffered (after `accept_hello`), as `receive_data(b"")`.
    fn decode<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.guarded("ConnectionDecoder.decode", |s| s.decode_buffered(py))
    }

    fn accept_hello(&mut self, py: Python<'_>, streams: Vec<String>) -> PyResult<()> {
        self.guarded("ConnectionDecoder.accept_hello", |s| {
            s.streams = streams
                .iter()
                .map(|n| (n.clone(), PyString::intern(py, n).unbind()))
                .collect();
            s.core.accept_hello(streams);
            Ok(())
        })
    }

    fn fail(&mut self) {
        self.core.fail();
    }

    /// For tests: buffers `data`, decodes it into Rust-side events and gives each event's payload as the Rust
    /// path has it: its record JSON (bytes) or why it was refused (str).
    fn _payload_json_rust_only<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
    ) -> PyResult<Bound<'py, PyList>> {
        self.guarded("ConnectionDecoder._payload_json_rust_only", |s| {
            s.core.receive_data(data);
            let out = PyList::empty(py);
            while let Some(message) = s.core.next_owned() {
                let Ok(OwnedMessage::Events(batch)) = message else {
                    continue;
                };
                for event in batch {
                    match event.payload {
                        Ok(json) => out.append(PyBytes::new(py, &json))?,
                        Err(reason) => out.append(reason)?,
                    }
                }
            }
            Ok(out)
        })
    }

    /// For benchmarks: as `_decode_rust_only`, then each event's record value (EventRecord.to_json's bytes, its
    /// reference time taken as its source time, the other times fixed) written into one reused buffer: the floor
    /// of the all-native path from bytes to record bytes, before reordering and merging. The bytes written.
    fn _decode_and_build_rust_only(&mut self, data: &[u8], source_id: &str) -> PyResult<i64> {
        self.guarded("ConnectionDecoder._decode_and_build_rust_only", |s| {
            s.core.receive_data(data);
            let mut written = 0i64;
            let mut value = Vec::with_capacity(512);
            while let Some(message) = s.core.next_owned() {
                let Ok(OwnedMessage::Events(batch)) = message else {
                    continue;
                };
                for event in &batch {
                    let Ok(payload_json) = &event.payload else {
                        continue;
                    };
                    let ts = i128::from(event.source_ts_us);
                    let fields = crate::records::EventRecordFields {
                        stream: &event.stream,
                        source_id,
                        seq: i128::from(event.seq),
                        source_ts_us: ts,
                        ref_ts_us: ts,
                        uncertainty_us: 250,
                        arrival_ts_us: ts + 900,
                        release_ts_us: ts + 5_000,
                        payload_json,
                        rtt_us: Some(400),
                        ..Default::default()
                    };
                    value.clear();
                    if crate::records::write_event_record(&mut value, &fields).is_ok() {
                        written += i64::try_from(value.len()).unwrap_or(0);
                    }
                }
            }
            Ok(written)
        })
    }

    /// For benchmarks: buffers `data` and decodes it into Rust-side events (payloads as record JSON, what the
    /// native pipeline will take) without making Python objects; the number of events, or -1 at an error.
    fn _decode_rust_only(&mut self, data: &[u8]) -> PyResult<i64> {
        self.guarded("ConnectionDecoder._decode_rust_only", |s| {
            s.core.receive_data(data);
            let mut events = 0i64;
            while let Some(message) = s.core.next_owned() {
                match message {
                    Ok(OwnedMessage::Events(batch)) => {
                        events += i64::try_from(batch.len()).unwrap_or(i64::MAX)
                    }
                    Ok(_) => {}
                    Err(_) => return Ok(-1),
                }
            }
            Ok(events)
        })
    }

    /// Panics inside the guard: tests check that it surfaces as a RuntimeError and poisons the decoder.
    fn _panic_for_test(&mut self) -> PyResult<()> {
        self.guarded("ConnectionDecoder._panic_for_test", |_| {
            panic!("a panic raised on purpose")
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyConnectionDecoder>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `msgpack::decode` with an arena of its own, kept for the test's life.
    fn decode(body: &[u8]) -> Result<Value<'_>, msgpack::DecodeError> {
        msgpack::decode(body, Box::leak(Box::new(bumpalo::Bump::new())))
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut out = u32::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    /// A map payload held as JSON (payload.rs) costs at most 6 bytes per byte of its msgpack: the worst a hostile
    /// source can pick is a str of control characters (1 byte each, `\u00XX` in JSON) or an array of `false`
    /// (1 byte each, `false,`). docs/native.md states the bound.
    #[test]
    fn a_payloads_json_is_at_most_six_bytes_per_msgpack_byte() {
        let controls = [&b"\x81\xa1k\xda\x10\x00"[..], &[0x01u8; 4096]].concat(); // {"k": 4096 x "\x01"}
        let falses = [&b"\x81\xa1k\xdc\x10\x00"[..], &[0xc2u8; 4096]].concat(); // {"k": [False] * 4096}
        let nested = [&[0x91u8; 30][..], b"\x80"].concat(); // [[[...[{}]...]]] under the top map: 32 levels
        let mut nested_map = b"\x81\xa1k".to_vec();
        nested_map.extend_from_slice(&nested);
        for body in [controls, falses, nested_map] {
            let value = decode(&body).unwrap();
            assert_eq!(messages::payload_problem(&value), None);
            let mut json = Vec::new();
            payload_json(&mut json, &value);
            assert!(
                json.len() <= 6 * body.len(),
                "{} bytes of JSON for {}",
                json.len(),
                body.len()
            );
            let mut sorted = Vec::new();
            payload_json_sorted(&mut sorted, &value);
            assert_eq!(sorted, json); // one key: the sorted JSON is the same bytes
        }
    }

    #[test]
    fn hello_then_events_split_anywhere() {
        let hello = frame(b"\x81\xa4type\xa5hello");
        // {"type": "events", "events": [{"stream": "s", "seq": 1, "source_ts_us": 2, "payload": {"k": 1.5}}]}
        let events = frame(
            b"\x82\xa4type\xa6events\xa6events\x91\x84\xa6stream\xa1s\xa3seq\x01\xacsource_ts_us\x02\
              \xa7payload\x81\xa1k\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00",
        );
        let bye = frame(b"\x81\xa4type\xa3bye");
        let all = [hello, events, bye].concat();
        for split in 0..all.len() {
            let mut d = ConnectionDecoder::new(DEFAULT_MAX_FRAME_BYTES, 10);
            let mut got = Vec::new();
            for chunk in [&all[..split], &all[split..]] {
                d.receive_data(chunk);
                while let Some(m) = d.next_owned() {
                    if matches!(m, Ok(OwnedMessage::Hello(_))) {
                        d.accept_hello(["s"]);
                    }
                    got.push(m);
                }
            }
            let event = OwnedEvent {
                stream: "s".into(),
                seq: 1,
                source_ts_us: 2,
                payload: Ok(b"{\"k\":1.5}".to_vec()),
                interval: None,
            };
            assert_eq!(
                got,
                vec![
                    Ok(OwnedMessage::Hello(1)),
                    Ok(OwnedMessage::Events(vec![event])),
                    Ok(OwnedMessage::Bye)
                ]
            );
            assert_eq!(d.state(), State::Draining);
        }
    }

    #[test]
    fn an_oversized_frame_fails_the_connection_and_keeps_the_buffer() {
        let mut d = ConnectionDecoder::new(8, 10);
        d.receive_data(b"\x00\x00\x00\x09abc");
        let err = d.next_owned().unwrap().unwrap_err();
        assert_eq!(err.kind, ErrorKind::FrameTooLarge);
        assert_eq!(
            err.text.text(&|s| s.to_owned()),
            "frame of 9 bytes exceeds the limit of 8 bytes"
        );
        assert_eq!(d.buffered_bytes(), 7);
        d.receive_data(b"more");
        assert_eq!(d.buffered_bytes(), 7);
        assert!(d.next_owned().is_none());
    }

    #[test]
    fn payload_json_is_orjsons_for_the_dict_python_decodes() {
        // {"b": [1, -2, 2.5e-7, "q\"\n\u{e9}"], "a": true, "b": {"z": null}}: the repeated "b" keeps its first
        // place and its last value, as the dict msgpack-python builds.
        let body = b"\x83\xa1b\x94\x01\xfe\xcb\x3e\x90\xc6\xf7\xa0\xb5\xed\x8d\xa5q\"\n\xc3\xa9\xa1a\xc3\xa1b\x81\xa1z\xc0";
        let value = decode(body).unwrap();
        let mut json = Vec::new();
        payload_json(&mut json, &value);
        assert_eq!(
            String::from_utf8(json).unwrap(),
            "{\"b\":{\"z\":null},\"a\":true}"
        );
        let array = decode(&body[3..21]).unwrap(); // the first "b"'s array
        let mut json = Vec::new();
        payload_json(&mut json, &array);
        assert_eq!(
            String::from_utf8(json).unwrap(),
            "[1,-2,2.5e-7,\"q\\\"\\n\u{e9}\"]"
        );
    }

    #[test]
    fn events_before_hello_are_unexpected() {
        let mut d = ConnectionDecoder::new(64, 10);
        d.receive_data(&frame(b"\x81\xa4type\xa6events"));
        let err = d.next_owned().unwrap().unwrap_err();
        assert_eq!(err.kind, ErrorKind::UnexpectedMessage);
        assert_eq!(
            err.text.text(&pyrepr::str_repr),
            "message 'events' not allowed in state await_hello"
        );
        assert_eq!(d.buffered_bytes(), 0);
    }
}
