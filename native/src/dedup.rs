//! The delivery tracker's per-event work on a frame's in-order events (gateway/acks.py, `DeliveryTracker`), compiled:
//! the digest a duplicate must repeat (`event_digest`) and `admit_frame`'s inline acceptance of a run of seqs
//! above everything its stream accepted, given up or acked, in one call per run (`EventDigests.admit_run`).
//!
//! The digest's definition: the Python core's `event_digest` is `hash((source_ts_us, body))`, `body` the payload's
//! orjson with sorted keys, or its `repr` when orjson refuses it. Python's `hash` of bytes is seeded per process and
//! cannot be computed here, so the native digest is a SipHash-1-3 (std's, keyed at random once per process, as
//! Python's: `process_digester`) of the bytes `hash(source_ts_us)` (8, little-endian), the kind of body (1), then
//! the body (`digest_head`): fixed-width fields first, so the bytes name one triple. The body is the same bytes: sorted-key JSON written here
//! exactly as orjson writes it (records.rs's writer, keys sorted by their UTF-8 bytes as orjson sorts them), else
//! what the tracker's own `_digest_body` gives (orjson, or the repr). Two events get the same native digest exactly
//! when they get the same Python digest (but for 64-bit collisions, in either), so the verdicts (duplicate,
//! conflict) are the same; a tracker uses one definition for all its digests (it takes this object or none).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use smallvec::SmallVec;

use crate::decode::guard;
use crate::records::{write_json_array, write_py, write_str, NotNative};

/// Deeper payloads go to the Python body (orjson's own limit is 254 levels; the wire's payloads stop at 32).
const MAX_SORTED_DEPTH: usize = 200;
/// A dict of at most this many keys is sorted without a heap allocation.
const SORTED_ON_STACK: usize = 8;
/// The tracker's `_NO_SEQ`: a stream that accepted nothing yet.
const NO_SEQ: i128 = -1;

/// What the digest hashes after the timestamp: sorted-key JSON (as orjson writes it) or the Python body's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    Json(&'a [u8]),
    Text(&'a [u8]),
}

/// The keyed hash of a digest: one key per process.
#[derive(Debug, Clone)]
pub struct Digester {
    keys: RandomState,
}

impl Default for Digester {
    fn default() -> Self {
        Digester {
            keys: RandomState::new(),
        }
    }
}

impl Digester {
    /// The digest of an event whose timestamp hashes (Python's `hash`) to `ts_hash`, with this body.
    pub fn digest(&self, ts_hash: i64, body: Body<'_>) -> i64 {
        let (kind, bytes) = match body {
            Body::Json(bytes) => (JSON_BODY, bytes),
            Body::Text(bytes) => (TEXT_BODY, bytes),
        };
        let mut framed = Vec::with_capacity(DIGEST_HEAD_BYTES + bytes.len());
        framed.extend_from_slice(&digest_head(ts_hash, kind));
        framed.extend_from_slice(bytes);
        self.digest_framed(&framed)
    }

    /// The digest of `digest_head(ts_hash, kind)` followed by the body, in one buffer: one SipHash write (each
    /// write costs about as much as hashing a short body again).
    pub fn digest_framed(&self, framed: &[u8]) -> i64 {
        let mut hasher = self.keys.build_hasher();
        hasher.write(framed);
        // Two's complement: the tracker keeps digests in an array('q').
        hasher.finish() as i64
    }
}

/// The bytes a digest hashes before its body: the timestamp's hash (8, little-endian), then the body's kind.
pub const DIGEST_HEAD_BYTES: usize = 9;
pub const JSON_BODY: u8 = 0;
pub const TEXT_BODY: u8 = 1;

pub fn digest_head(ts_hash: i64, kind: u8) -> [u8; DIGEST_HEAD_BYTES] {
    let mut head = [kind; DIGEST_HEAD_BYTES];
    head[..8].copy_from_slice(&ts_hash.to_le_bytes());
    head
}

/// The process's digest key: every tracker's digests and the decoder's (`frame.rs`: a frame's in-order events come
/// with theirs) are one definition, so a digest made by either compares with the other's.
pub fn process_digester() -> &'static Digester {
    static DIGESTER: OnceLock<Digester> = OnceLock::new();
    DIGESTER.get_or_init(Digester::default)
}

/// Python's `hash` of a non-negative int: its value modulo the Mersenne prime 2^61 - 1 (`sys.hash_info.modulus`
/// on 64-bit builds), never -1 for these.
pub fn python_int_hash(value: u64) -> i64 {
    const MODULUS: u64 = (1 << 61) - 1;
    (value % MODULUS) as i64
}

/// Starts `framed` (cleared) with the head of a JSON body's digest at `source_ts_us`; the caller writes the payload's
/// sorted-key JSON after it and hands the whole to `digest_framed`.
pub fn start_json_digest(framed: &mut Vec<u8>, source_ts_us: u64) {
    framed.clear();
    framed.extend_from_slice(&digest_head(python_int_hash(source_ts_us), JSON_BODY));
}

/// `admit_frame`'s inline test: a seq above everything its stream accepted, given up or acked (`top`), within the
/// jump limit unless the stream accepted nothing yet (`highest` is NO_SEQ). Accepting it makes it the new top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InOrderAdmission {
    pub highest: i128,
    pub acked_through: i128,
    pub max_seq_jump: i128,
}

impl InOrderAdmission {
    fn top(&self) -> i128 {
        self.highest.max(self.acked_through)
    }

    /// Whether `seq` is accepted inline (the caller also checks that it is not pending).
    pub fn admits(&self, seq: i128) -> bool {
        let top = self.top();
        seq > top && (self.highest == NO_SEQ || seq - top <= self.max_seq_jump)
    }

    pub fn accept(&mut self, seq: i128) {
        self.highest = seq;
    }
}

/// orjson's `dumps(value, option=OPT_SORT_KEYS)` for a Python value of the exact JSON types, or NotNative.
pub fn write_sorted(
    out: &mut Vec<u8>,
    value: &Bound<'_, PyAny>,
    depth: usize,
) -> Result<(), NotNative> {
    if depth > MAX_SORTED_DEPTH {
        return Err(NotNative);
    }
    if let Ok(d) = value.cast_exact::<PyDict>() {
        // A payload's few keys sorted on the stack: two heap vectors per event were a tenth of the digest's cost.
        let mut entries: SmallVec<[_; SORTED_ON_STACK]> = SmallVec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let k = k.cast_into_exact::<PyString>().map_err(|_| NotNative)?;
            entries.push((k, v));
        }
        // The keys' text borrowed from the str objects `entries` holds (UTF-8 cached in them by to_str).
        let mut keys: SmallVec<[_; SORTED_ON_STACK]> = SmallVec::with_capacity(entries.len());
        for (index, (k, _)) in entries.iter().enumerate() {
            keys.push((k.to_str().map_err(|_| NotNative)?, index));
        }
        keys.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        out.push(b'{');
        for (i, &(k, index)) in keys.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let v = &entries[index].1;
            write_str(out, k);
            out.push(b':');
            write_sorted(out, v, depth + 1)?;
        }
        out.push(b'}');
    } else if let Ok(l) = value.cast_exact::<PyList>() {
        write_json_array(out, l.iter(), depth, write_sorted)?;
    } else if let Ok(t) = value.cast_exact::<PyTuple>() {
        write_json_array(out, t.iter(), depth, write_sorted)?;
    } else {
        write_py(out, value, depth)?; // a scalar: no keys to sort
    }
    Ok(())
}

/// `skewless_native.EventDigests(body)`: the tracker's digests. `body(payload)` is the tracker's `_digest_body`
/// (orjson with sorted keys, or the repr when orjson refuses the payload), asked only for a payload not written here.
#[pyclass(module = "skewless_native", frozen)]
pub struct EventDigests {
    body: Py<PyAny>,
}

impl EventDigests {
    fn digest_of(
        &self,
        buf: &mut Vec<u8>,
        source_ts_us: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        let ts_hash = i64::try_from(source_ts_us.hash()?).unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(&digest_head(ts_hash, JSON_BODY));
        if write_sorted(buf, payload, 1).is_ok() {
            return Ok(process_digester().digest_framed(buf));
        }
        let body = self.body.bind(payload.py()).call1((payload,))?;
        if let Ok(bytes) = body.cast_exact::<PyBytes>() {
            return Ok(process_digester().digest(ts_hash, Body::Json(bytes.as_bytes())));
        }
        let Ok(text) = body.cast_exact::<PyString>() else {
            return Err(PyTypeError::new_err(
                "EventDigests: the body function must return bytes or str",
            ));
        };
        // A str with lone surrogates has no UTF-8: its repr (ASCII escapes) stands for it.
        let text = match text.to_str() {
            Ok(text) => text.to_owned(),
            Err(_) => text.repr()?.to_str()?.to_owned(),
        };
        Ok(process_digester().digest(ts_hash, Body::Text(text.as_bytes())))
    }
}

/// The tracker's ring of acked digests (`recent_seqs`, `recent_digests`: two `array('q')` of one length), written
/// in place; None when either is not such an array (not allocated yet: None).
struct Ring {
    seqs: PyBuffer<i64>,
    digests: PyBuffer<i64>,
}

impl Ring {
    fn of(seqs: &Bound<'_, PyAny>, digests: &Bound<'_, PyAny>) -> Option<Ring> {
        if seqs.is_none() || digests.is_none() {
            return None;
        }
        let (seqs, digests) = (PyBuffer::get(seqs).ok()?, PyBuffer::get(digests).ok()?);
        let writable =
            |b: &PyBuffer<i64>| !b.readonly() && b.is_c_contiguous() && b.item_count() > 0;
        (writable(&seqs) && writable(&digests) && seqs.item_count() == digests.item_count())
            .then_some(Ring { seqs, digests })
    }

    /// `seqs[seq % len] = seq; digests[seq % len] = digest`, Python's `%` (the slot of a negative seq too).
    fn remember(&self, py: Python<'_>, seq: i64, digest: i64) -> bool {
        let (Some(seqs), Some(digests)) =
            (self.seqs.as_mut_slice(py), self.digests.as_mut_slice(py))
        else {
            return false;
        };
        let len = i64::try_from(seqs.len()).unwrap_or(i64::MAX);
        let Ok(slot) = usize::try_from(seq.rem_euclid(len)) else {
            return false;
        };
        seqs[slot].set(seq);
        digests[slot].set(digest);
        true
    }
}

#[pymethods]
impl EventDigests {
    #[new]
    fn new(body: Py<PyAny>) -> Self {
        EventDigests { body }
    }

    /// The tracker's `event_digest(source_ts_us, payload)` under this definition.
    fn event_digest(
        &self,
        source_ts_us: &Bound<'_, PyAny>,
        payload: &Bound<'_, PyAny>,
    ) -> PyResult<i64> {
        guard("EventDigests.event_digest", || {
            self.digest_of(&mut Vec::with_capacity(64), source_ts_us, payload)
        })
    }

    /// `admit_frame`'s inline path from `events[start]` on, for one (source, stream) whose entry is `pending`,
    /// `highest` and `acked_through`: each event of `stream` whose seq the inline test admits and that is not
    /// pending gets `pending[seq] = digest`. Stops before the first other event. Returns (the index of that event,
    /// the stream's new highest seq).
    #[allow(clippy::too_many_arguments)]
    fn admit_run(
        &self,
        events: &Bound<'_, PyAny>,
        start: usize,
        stream: &Bound<'_, PyAny>,
        pending: &Bound<'_, PyDict>,
        highest: i64,
        acked_through: i64,
        max_seq_jump: i64,
    ) -> PyResult<(usize, i64)> {
        let events = crate::events::Events::of(events)?;
        let mut admission = InOrderAdmission {
            highest: i128::from(highest),
            acked_through: i128::from(acked_through),
            max_seq_jump: i128::from(max_seq_jump),
        };
        guard("EventDigests.admit_run", || {
            let mut buf = Vec::with_capacity(128);
            let mut index = start;
            while index < events.len()? {
                let event = events.at(index)?;
                let event_stream = event.field(crate::events::STREAM)?;
                if !event_stream.is(stream) && !event_stream.eq(stream)? {
                    break;
                }
                let seq_obj = event.field(crate::events::SEQ)?;
                let Ok(seq) = seq_obj.extract::<i64>() else {
                    break; // admit's own path takes it
                };
                if !admission.admits(i128::from(seq)) || pending.contains(&seq_obj)? {
                    break;
                }
                let digest = match event.decoded_digest() {
                    Some(digest) => digest,
                    None => self.digest_of(
                        &mut buf,
                        &event.field(crate::events::SOURCE_TS_US)?,
                        &event.field(crate::events::PAYLOAD)?,
                    )?,
                };
                pending.set_item(&seq_obj, digest)?;
                admission.accept(i128::from(seq));
                index += 1;
            }
            // The highest seq is one of the stream's i64 seqs or the one it was called with.
            Ok((index, i64::try_from(admission.highest).unwrap_or(highest)))
        })
    }

    /// `DeliveryTracker.confirmed_run`'s in-order loop over `first_seq..=last_seq`: each seq's pending entry
    /// popped (the key removed whatever its value) and a digest that is not None written to the ring of acked
    /// digests. Returns None once every seq is done, else `(seq, digest)` of the first digest it could not write,
    /// popped already: the ring not allocated yet (None), or not two arrays of 64-bit ints, or the digest not a
    /// 64-bit int. The tracker's `_remember` then takes that one, and calls again from the next seq.
    fn confirm_run<'py>(
        &self,
        pending: &Bound<'py, PyDict>,
        ring_seqs: &Bound<'py, PyAny>,
        ring_digests: &Bound<'py, PyAny>,
        first_seq: i64,
        last_seq: i64,
    ) -> PyResult<Option<(i64, Bound<'py, PyAny>)>> {
        let py = pending.py();
        guard("EventDigests.confirm_run", || {
            let ring = Ring::of(ring_seqs, ring_digests);
            let mut seq = first_seq;
            while seq <= last_seq {
                let key = seq.into_pyobject(py)?;
                if let Some(digest) = pending.get_item(&key)? {
                    pending.del_item(&key)?;
                    if !digest.is_none() {
                        let written = match (&ring, digest.extract::<i64>()) {
                            (Some(ring), Ok(value)) => ring.remember(py, seq, value),
                            _ => false,
                        };
                        if !written {
                            return Ok(Some((seq, digest)));
                        }
                    }
                }
                let Some(next) = seq.checked_add(1) else {
                    break; // last_seq is i64::MAX
                };
                seq = next;
            }
            Ok(None)
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<EventDigests>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_body_same_digest_other_body_or_time_another() {
        let d = Digester::default();
        let a = d.digest(10, Body::Json(b"{\"a\":1}"));
        assert_eq!(a, d.digest(10, Body::Json(b"{\"a\":1}")));
        assert_ne!(a, d.digest(11, Body::Json(b"{\"a\":1}")));
        assert_ne!(a, d.digest(10, Body::Json(b"{\"a\":1.0}")));
        assert_ne!(a, d.digest(10, Body::Text(b"{\"a\":1}")));
    }

    #[test]
    fn in_order_admission_as_admit_frame_tests_it() {
        let mut a = InOrderAdmission {
            highest: NO_SEQ,
            acked_through: NO_SEQ,
            max_seq_jump: 5,
        };
        // Nothing accepted yet: any seq above the ack, however high.
        assert!(a.admits(1_000));
        assert!(!a.admits(-1));
        a.accept(3);
        assert!(!a.admits(3));
        assert!(a.admits(4));
        assert!(a.admits(8));
        assert!(!a.admits(9)); // beyond the jump limit
        let acked_ahead = InOrderAdmission {
            highest: 2,
            acked_through: 6,
            max_seq_jump: 5,
        };
        assert!(!acked_ahead.admits(6));
        assert!(acked_ahead.admits(7));
        assert!(acked_ahead.admits(11));
        assert!(!acked_ahead.admits(12));
    }
}
