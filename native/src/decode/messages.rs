//! contract/wire/messages.py's parse_events / parse_event / _interval / payload_problem / parse_heartbeat and
//! contract/wire/frames.py's _decode_body checks, on decoded msgpack values: the same checks in the same order,
//! so that the same input gets the same error code and message.

use super::msgpack::{Map, Value};
use super::pyrepr::{bytes_repr, float_repr, short};

pub const MAX_SEQ: i128 = (1i128 << 63) - 1;
pub const MAX_STREAMS_PER_SOURCE: usize = 64;
const MAX_PAYLOAD_DEPTH: usize = 32;
const MAX_INTERVAL_ID_CHARS: usize = 128;
const MAX_STREAM_NAME_CHARS: usize = 200;
const STREAM_NAME_PATTERN: &str = "^[A-Za-z0-9_-]{1,200}$";

/// contract.wire.errors' RemoteProtocolError subclasses the decoder raises (all fatal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    FrameTooLarge,
    MalformedFrame,
    InvalidMessage,
    UnexpectedMessage,
}

impl ErrorKind {
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::FrameTooLarge => "frame_too_large",
            ErrorKind::MalformedFrame => "malformed_frame",
            ErrorKind::InvalidMessage => "invalid_message",
            ErrorKind::UnexpectedMessage => "unexpected_message",
        }
    }
}

/// An error message. Three quote a str the client sent with Python's repr, whose non-ASCII rules need Python's
/// Unicode database: they keep the str, and `text` takes the repr to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorText {
    Plain(String),
    /// f"message {kind!r} not allowed in state {state}"
    NotAllowed {
        kind: String,
        state: &'static str,
    },
    /// contract.topics.validate_stream_name's message.
    BadStreamName(String),
    /// _interval's message for a str endpoint other than "start" and "end".
    BadEndpoint(String),
}

impl ErrorText {
    pub fn text(&self, repr: &dyn Fn(&str) -> String) -> String {
        match self {
            ErrorText::Plain(text) => text.clone(),
            ErrorText::NotAllowed { kind, state } => {
                format!("message {} not allowed in state {state}", repr(kind))
            }
            ErrorText::BadStreamName(name) => format!(
                "stream name {} must match {STREAM_NAME_PATTERN}",
                repr(name)
            ),
            ErrorText::BadEndpoint(endpoint) => {
                format!(
                    "field 'endpoint' must be 'start' or 'end', got {}",
                    short(&repr(endpoint), 40)
                )
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError {
    pub kind: ErrorKind,
    pub text: ErrorText,
}

impl ProtocolError {
    pub fn plain(kind: ErrorKind, text: String) -> Self {
        ProtocolError {
            kind,
            text: ErrorText::Plain(text),
        }
    }
}

fn invalid(text: String) -> ProtocolError {
    ProtocolError::plain(ErrorKind::InvalidMessage, text)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interval<'a> {
    Atomic { source_start_ts_us: u64 },
    Endpoint { interval_id: &'a str, end: bool },
}

/// An event's payload: the value (None: the key was absent, i.e. Python's None) or why it was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum PayloadRef<'v, 'a> {
    Valid(Option<&'v Value<'a>>),
    Rejected(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ParsedEvent<'v, 'a> {
    pub stream: &'a str,
    pub seq: u64,
    pub source_ts_us: u64,
    pub payload: PayloadRef<'v, 'a>,
    pub interval: Option<Interval<'a>>,
}

fn in_range(value: i128) -> Option<u64> {
    if (0..=MAX_SEQ).contains(&value) {
        u64::try_from(value).ok()
    } else {
        None
    }
}

/// _int_field(raw, name, 0, MAX_SEQ).
fn int_field(map: &Map<'_>, name: &str) -> Result<u64, ProtocolError> {
    let value = map.get(name).unwrap_or(&Value::Nil);
    let Some(int) = value.as_int() else {
        return Err(invalid(format!(
            "field '{name}' must be an integer, got {}",
            value.type_name()
        )));
    };
    in_range(int).ok_or_else(|| invalid(format!("field '{name}'={int} outside [0, {MAX_SEQ}]")))
}

/// validate_stream_name: [A-Za-z0-9_-]{1,200}.
pub fn valid_stream_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_STREAM_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// messages._stream: the value as a valid stream name, or its error.
fn stream_name<'a>(value: &Value<'a>) -> Result<&'a str, ProtocolError> {
    let Value::Str(name) = value else {
        return Err(invalid(format!(
            "stream must be a string, got {}",
            value.type_name()
        )));
    };
    if !valid_stream_name(name) {
        return Err(ProtocolError {
            kind: ErrorKind::InvalidMessage,
            text: ErrorText::BadStreamName((*name).to_owned()),
        });
    }
    Ok(name)
}

/// messages.payload_problem.
pub fn payload_problem(payload: &Value<'_>) -> Option<String> {
    if matches!(payload, Value::Str(_) | Value::Nil) {
        return None;
    }
    let (path, reason) = problem(payload, 0)?;
    let mut text = String::from("payload");
    for step in path.iter().rev() {
        text.push_str(step);
    }
    text.push_str(": ");
    text.push_str(&reason);
    Some(text)
}

fn problem(value: &Value<'_>, depth: usize) -> Option<(Vec<String>, String)> {
    match value {
        Value::Str(_) | Value::Nil | Value::Bool(_) | Value::Int(_) => None,
        Value::UInt(u) => Some((vec![], format!("integer {u} is outside signed 64 bits"))),
        Value::Float(f) if f.is_finite() => None,
        Value::Float(f) => {
            let name = if f.is_nan() { "NaN" } else if *f > 0.0 { "Infinity" } else { "-Infinity" };
            Some((vec![], format!("{name} is not JSON")))
        }
        Value::Array(_) | Value::Map(_) if depth >= MAX_PAYLOAD_DEPTH => {
            Some((vec![], format!("nested deeper than {MAX_PAYLOAD_DEPTH} levels")))
        }
        Value::Map(map) => {
            for (key, item) in map.entries.iter() {
                let Value::Str(name) = key else {
                    return Some((vec![], format!("map key {} is not a string", describe_key(key))));
                };
                if let Some(mut found) = problem(item, depth + 1) {
                    found.0.push(format!(".{}", short(name, 40)));
                    return Some(found);
                }
            }
            None
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                if let Some(mut found) = problem(item, depth + 1) {
                    found.0.push(format!("[{index}]"));
                    return Some(found);
                }
            }
            None
        }
        Value::Bin(_) => Some((
            vec![],
            "bytes (msgpack bin) are not JSON; encode them into a string (e.g. base64) before sending".into(),
        )),
        Value::Ext(code, _) => Some((vec![], format!("msgpack ext type {code} is not JSON"))),
        Value::Timestamp { .. } => {
            Some((vec![], "msgpack timestamp (ext -1) is not JSON; send integer microseconds".into()))
        }
    }
}

/// messages._describe_key for any value but a str.
fn describe_key(key: &Value<'_>) -> String {
    let quoted = match key {
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => float_repr(*f),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Nil => "None".into(),
        Value::Bin(b) => bytes_repr(b),
        _ => return format!("of type {}", key.type_name()),
    };
    short(&quoted, 40)
}

/// messages.parse_event.
pub fn parse_event<'v, 'a>(
    raw: &'v Value<'a>,
    declared: &dyn Fn(&str) -> bool,
) -> Result<ParsedEvent<'v, 'a>, ProtocolError> {
    let map = match raw {
        Value::Map(map) if map.string_keys => map,
        Value::Map(_) => return Err(invalid("an event map has a non-string key".into())),
        other => {
            return Err(invalid(format!(
                "an event must be a map, got {}",
                other.type_name()
            )))
        }
    };
    let stream = map.get("stream");
    let seq = map.get("seq");
    let source_ts_us = map.get("source_ts_us");
    // The hot path: a declared stream and two exact ints in range (messages.parse_event's first branch).
    if let (Some(Value::Str(name)), Some(seq), Some(ts)) = (stream, seq, source_ts_us) {
        if let (Some(seq), Some(ts)) = (
            seq.as_int().and_then(in_range),
            ts.as_int().and_then(in_range),
        ) {
            if declared(name) {
                let payload = map.get("payload");
                let payload_ref = match payload.map(payload_problem) {
                    Some(Some(reason)) => PayloadRef::Rejected(reason),
                    _ => PayloadRef::Valid(payload),
                };
                let n = map.entries.len();
                let interval = if (payload.is_some() && n == 4) || (payload.is_none() && n == 3) {
                    None
                } else {
                    interval(map, ts)?
                };
                return Ok(ParsedEvent {
                    stream: name,
                    seq,
                    source_ts_us: ts,
                    payload: payload_ref,
                    interval,
                });
            }
        }
    }
    // The full path, for its error (msgpack never makes the int subclasses it would accept).
    let name = match stream {
        Some(Value::Str(name)) if declared(name) => *name,
        other => {
            let name = stream_name(other.unwrap_or(&Value::Nil))?;
            return Err(ProtocolError::plain(
                ErrorKind::UnexpectedMessage,
                format!("stream '{name}' was not declared in hello"),
            ));
        }
    };
    let payload = map.get("payload");
    let payload_ref = match payload.and_then(payload_problem) {
        Some(reason) => PayloadRef::Rejected(reason),
        None => PayloadRef::Valid(payload),
    };
    let ts = int_field(map, "source_ts_us")?;
    let seq = int_field(map, "seq")?;
    let interval = interval(map, ts)?;
    Ok(ParsedEvent {
        stream: name,
        seq,
        source_ts_us: ts,
        payload: payload_ref,
        interval,
    })
}

/// messages._interval.
fn interval<'a>(map: &Map<'a>, source_ts_us: u64) -> Result<Option<Interval<'a>>, ProtocolError> {
    let start = match map.get("source_start_ts_us") {
        None | Some(Value::Nil) => None,
        Some(_) => Some(int_field(map, "source_start_ts_us")?),
    };
    let interval_id = map.get("interval_id").filter(|v| !matches!(v, Value::Nil));
    let endpoint = map.get("endpoint").filter(|v| !matches!(v, Value::Nil));
    let (Some(interval_id), Some(endpoint)) = (interval_id, endpoint) else {
        if interval_id.is_none() && endpoint.is_none() {
            return match start {
                None => Ok(None),
                Some(start) if start > source_ts_us => Err(invalid(format!(
                    "interval starts after it ends: source_start_ts_us={start} > source_ts_us={source_ts_us}"
                ))),
                Some(start) => Ok(Some(Interval::Atomic { source_start_ts_us: start })),
            };
        }
        if start.is_some() {
            return Err(both_kinds());
        }
        return Err(invalid(
            "an interval endpoint needs both 'interval_id' and 'endpoint'".into(),
        ));
    };
    if start.is_some() {
        return Err(both_kinds());
    }
    let interval_id = match interval_id {
        Value::Str(id) if !id.is_empty() && id.chars().count() <= MAX_INTERVAL_ID_CHARS => *id,
        _ => {
            return Err(invalid(format!(
                "field 'interval_id' must be a non-empty string of at most {MAX_INTERVAL_ID_CHARS} chars"
            )))
        }
    };
    match endpoint {
        Value::Str("start") => Ok(Some(Interval::Endpoint {
            interval_id,
            end: false,
        })),
        Value::Str("end") => Ok(Some(Interval::Endpoint {
            interval_id,
            end: true,
        })),
        Value::Str(other) => Err(ProtocolError {
            kind: ErrorKind::InvalidMessage,
            text: ErrorText::BadEndpoint((*other).to_owned()),
        }),
        other => Err(invalid(format!(
            "field 'endpoint' must be 'start' or 'end', got {}",
            describe_key(other)
        ))),
    }
}

fn both_kinds() -> ProtocolError {
    invalid(
        "an event is an atomic interval ('source_start_ts_us') or an endpoint ('interval_id' + 'endpoint'), not both"
            .into(),
    )
}

/// messages.parse_events.
pub fn parse_events<'v, 'a>(
    raw: &'v Map<'a>,
    max_events: usize,
    declared: &dyn Fn(&str) -> bool,
) -> Result<Vec<ParsedEvent<'v, 'a>>, ProtocolError> {
    let events = match raw.get("events") {
        Some(Value::Array(events)) if !events.is_empty() => events,
        _ => return Err(invalid("'events' must be a non-empty list".into())),
    };
    if events.len() > max_events {
        return Err(invalid(format!(
            "batch of {} events exceeds the limit of {max_events}",
            events.len()
        )));
    }
    // Sized once (collecting the Results grew the vector a dozen times per frame); the first error is returned.
    let mut parsed = Vec::with_capacity(events.len());
    for event in events.iter() {
        parsed.push(parse_event(event, declared)?);
    }
    Ok(parsed)
}

/// A heartbeat's next seq per stream, in its map's order.
pub type NextSeqs<'a> = Vec<(&'a str, u64)>;

/// messages.parse_heartbeat, then the session's check that it names declared streams only.
pub fn parse_heartbeat<'a>(
    raw: &Map<'a>,
    declared: &dyn Fn(&str) -> bool,
) -> Result<(u64, NextSeqs<'a>), ProtocolError> {
    let source_ts_us = int_field(raw, "source_ts_us")?;
    let next_seq = match raw.get("next_seq") {
        Some(Value::Map(m)) if m.string_keys && m.entries.len() <= MAX_STREAMS_PER_SOURCE => m,
        _ => {
            return Err(invalid(format!(
                "'next_seq' must be a map of at most {MAX_STREAMS_PER_SOURCE} streams to seqs"
            )))
        }
    };
    let mut seqs = Vec::with_capacity(next_seq.entries.len());
    for (key, _) in next_seq.entries.iter() {
        let name = stream_name(key)?;
        seqs.push((name, int_field(next_seq, name)?));
    }
    let mut undeclared: Vec<&str> = seqs
        .iter()
        .map(|(s, _)| *s)
        .filter(|s| !declared(s))
        .collect();
    if !undeclared.is_empty() {
        undeclared.sort_unstable();
        undeclared.dedup();
        let names: Vec<String> = undeclared.iter().map(|s| format!("'{s}'")).collect();
        return Err(ProtocolError::plain(
            ErrorKind::UnexpectedMessage,
            format!("heartbeat names undeclared streams [{}]", names.join(", ")),
        ));
    }
    Ok((source_ts_us, seqs))
}

/// frames._decode_body's checks on the decoded value: the frame's map and its "type".
pub fn frame_map<'v, 'a>(value: &'v Value<'a>) -> Result<(&'v Map<'a>, &'a str), ProtocolError> {
    let map = match value {
        Value::Map(map) if map.string_keys => map,
        Value::Map(_) => {
            return Err(ProtocolError::plain(
                ErrorKind::MalformedFrame,
                "frame map has a non-string key".into(),
            ))
        }
        other => {
            return Err(ProtocolError::plain(
                ErrorKind::MalformedFrame,
                format!("frame body must be a map, got {}", other.type_name()),
            ))
        }
    };
    match map.get("type") {
        Some(Value::Str(kind)) => Ok((map, kind)),
        _ => Err(ProtocolError::plain(
            ErrorKind::MalformedFrame,
            "frame map has no string 'type'".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::msgpack::DecodeError;
    use super::*;

    /// `msgpack::decode` with an arena of its own, kept for the test's life.
    fn decode(body: &[u8]) -> Result<Value<'_>, DecodeError> {
        super::super::msgpack::decode(body, Box::leak(Box::new(bumpalo::Bump::new())))
    }

    fn declared(s: &str) -> bool {
        s == "s"
    }

    /// How `parse_event` refuses the event encoded in `body`.
    fn event_error(body: &[u8], declared: &dyn Fn(&str) -> bool) -> ProtocolError {
        parse_event(&decode(body).unwrap(), declared).unwrap_err()
    }

    #[test]
    fn payload_problems_name_the_path() {
        // {"a": [1, {"b": 2**64 - 1}]}
        let body = b"\x81\xa1a\x92\x01\x81\xa1b\xcf\xff\xff\xff\xff\xff\xff\xff\xff";
        let value = decode(body).unwrap();
        assert_eq!(
            payload_problem(&value).as_deref(),
            Some("payload.a[1].b: integer 18446744073709551615 is outside signed 64 bits")
        );
        let value = decode(b"\x81\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\x01").unwrap();
        assert_eq!(
            payload_problem(&value).as_deref(),
            Some("payload: map key nan is not a string")
        );
    }

    #[test]
    fn a_point_event_and_its_errors() {
        // {"stream": "s", "seq": 1, "source_ts_us": 2, "payload": "x"}
        let body = b"\x84\xa6stream\xa1s\xa3seq\x01\xacsource_ts_us\x02\xa7payload\xa1x";
        let value = decode(body).unwrap();
        let event = parse_event(&value, &declared).unwrap();
        assert_eq!(
            (event.stream, event.seq, event.source_ts_us, event.interval),
            ("s", 1, 2, None)
        );
        assert_eq!(event.payload, PayloadRef::Valid(Some(&Value::Str("x"))));
        let err = event_error(body, &|_| false);
        assert_eq!(err.kind, ErrorKind::UnexpectedMessage);
        assert_eq!(
            err.text.text(&|s| format!("'{s}'")),
            "stream 's' was not declared in hello"
        );
    }

    #[test]
    fn an_atomic_interval_must_start_before_it_ends() {
        let body = b"\x84\xa6stream\xa1s\xa3seq\x01\xacsource_ts_us\x02\xb2source_start_ts_us\x03";
        let err = event_error(body, &declared);
        assert_eq!(
            err.text,
            ErrorText::Plain(
                "interval starts after it ends: source_start_ts_us=3 > source_ts_us=2".into()
            )
        );
    }
}
