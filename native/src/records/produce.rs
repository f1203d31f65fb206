//! The gateway's Produce actions built here, one call per batch: `RecordBuilder.produce_records` is
//! gateway/ingest.py's `_publish_one` for a plain event record (a `PublishRecord`), `RecordBuilder.build_merged` is
//! reorder/pipeline.py's `_records` followed by `_publish_one` for a plain release of the merge (a `Merged`): the
//! same `Produce(topic, key, value, DeliveryRef(source_id, stream, seq, kind, release_ts_us), timestamp_ms,
//! headers)` those give, without the EventRecord, PublishRecord and BuiltRecord objects in between.
//!
//! Anything else is handed back, in its place, for the Python path to handle (its side effects, counters and
//! refusals stay there): another output kind, a refused payload (`RejectedPayload`), a late record whose reason
//! `_publish` checks against the delivery tracker, an interval event, a raised reference time, a (stream, kind)
//! whose topic `_publish` has not cached yet, a value the native writer leaves to orjson, a record over the size
//! limit. Nothing here changes state but the builder's header cache, so handing an item back after looking at it
//! is safe; the clock calls (`to_reference`, `rtt_us`) are queries the Python path repeats.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use super::slots::{delivery_ref_fields, produce_fields, SlotsClass};
use super::{
    exact_int, kafka_timestamp_ms, opt_int, read_fields, write_event_record, write_py, Attrs,
    EventRecordFields, NotNative, RecordBuilder, ATTR_NAMES,
};
use crate::merger::held::HeldFields;

/// `produce=(PublishRecord, RejectedPayload, Produce, DeliveryRef, given_up_late_reasons, Merged, SourceEvent)`.
pub type ProduceArg<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
);
const PUBLISH_RECORD: usize = 0;
const REJECTED_PAYLOAD: usize = 1;
const PRODUCE: usize = 2;
const DELIVERY_REF: usize = 3;
const GIVEN_UP_LATE_REASONS: usize = 4;
const MERGED: usize = 5;
const SOURCE_EVENT: usize = 6;

/// What the builder produces with, once `produce=` and `publish_to` gave it.
pub struct Publishing {
    classes: [Py<PyAny>; 7],
    /// Produce and DeliveryRef built without their Python `__init__` (records/slots.rs), when they allow it.
    fast: Option<Arc<(SlotsClass, SlotsClass)>>,
    /// gateway.ingest's topic cache, (stream, kind) -> topic, shared with `_publish` (which fills it).
    topics: Option<Py<PyDict>>,
    max_record_bytes: usize,
}

impl Publishing {
    pub fn new(classes: ProduceArg<'_>) -> PyResult<Self> {
        let fast = match (
            SlotsClass::probe(&classes.2, produce_fields::COUNT)?,
            SlotsClass::probe(&classes.3, delivery_ref_fields::COUNT)?,
        ) {
            (Some(produce), Some(delivery)) => {
                Some(Arc::new((produce.untracked(), delivery.untracked())))
            }
            _ => None,
        };
        let (a, b, c, d, e, f, g) = classes;
        Ok(Publishing {
            classes: [a, b, c, d, e, f, g].map(Bound::unbind),
            fast,
            topics: None,
            max_record_bytes: 0,
        })
    }

    /// Whether Produce and DeliveryRef are built without their Python `__init__`.
    pub fn builds_directly(&self) -> bool {
        self.fast.is_some()
    }

    pub fn publish_to(&mut self, topics: &Bound<'_, PyDict>, max_record_bytes: usize) {
        self.topics = Some(topics.clone().unbind());
        self.max_record_bytes = max_record_bytes;
    }
}

/// One call's view: the classes, the topic cache, scratch buffers.
pub struct Batch<'py> {
    classes: [Bound<'py, PyAny>; 7],
    fast: Option<Arc<(SlotsClass, SlotsClass)>>,
    topics: Bound<'py, PyDict>,
    max_record_bytes: usize,
    /// The last topic looked up: (stream object, late, topic). A batch's records share a stream.
    last_topic: Option<(Bound<'py, PyAny>, bool, Bound<'py, PyAny>)>,
    fields: Vec<Bound<'py, PyAny>>,
    buf: Vec<u8>,
    /// A plain release's payload JSON, before it goes into `buf`.
    payload_buf: Vec<u8>,
    /// The Kafka timestamp and the release time of the last record built.
    ints: [LastInt<'py>; 2],
    /// Each source's key and headers of the events records built in this call, by the address of its id (the
    /// object, held here: found without hashing the id's text, as `AddressHasher` hashes the run's events).
    sources: ByAddress<[Bound<'py, PyAny>; 3]>,
    attrs: Attrs,
}

impl<'py> Batch<'py> {
    pub fn new(py: Python<'py>, publishing: Option<&Publishing>) -> PyResult<Self> {
        let (Some(publishing), Some(topics)) =
            (publishing, publishing.and_then(|p| p.topics.as_ref()))
        else {
            return Err(PyTypeError::new_err(
                "the RecordBuilder produces only with produce=... and after publish_to(topics, max_record_bytes)",
            ));
        };
        Ok(Batch {
            classes: publishing.classes.each_ref().map(|c| c.bind(py).clone()),
            fast: publishing.fast.clone(),
            topics: topics.bind(py).clone(),
            max_record_bytes: publishing.max_record_bytes,
            last_topic: None,
            fields: Vec::with_capacity(ATTR_NAMES.len()),
            buf: Vec::with_capacity(512),
            payload_buf: Vec::with_capacity(256),
            ints: Default::default(),
            sources: ByAddress::default(),
            attrs: Attrs::get(py),
        })
    }

    /// The cached topic of (stream, kind), None when `_publish` has not cached it yet.
    fn topic(
        &mut self,
        stream: &Bound<'py, PyAny>,
        kind: &Bound<'py, PyAny>,
        late: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Some((last, last_late, topic)) = &self.last_topic {
            if last.is(stream) && *last_late == late {
                return Ok(Some(topic.clone()));
            }
        }
        let topic = self.topics.get_item((stream, kind))?;
        if let Some(topic) = &topic {
            self.last_topic = Some((stream.clone(), late, topic.clone()));
        }
        Ok(topic)
    }

    /// The events topic of `stream` (`topic(stream, "events", False)`).
    fn events_topic(
        &mut self,
        stream: &Bound<'py, PyString>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let kind = intern!(stream.py(), "events");
        self.topic(stream.as_any(), kind.as_any(), false)
    }

    /// An events record's key and headers of `source_id` (the builder's `event_key_and_headers`).
    fn key_and_headers(
        &mut self,
        builder: &mut RecordBuilder,
        source_id: &Bound<'py, PyString>,
    ) -> PyResult<[Bound<'py, PyAny>; 2]> {
        let address = source_id.as_ptr() as usize;
        if let Some([_id, key, headers]) = self.sources.get(&address) {
            return Ok([key.clone(), headers.clone()]);
        }
        let py = source_id.py();
        let (key, headers) = builder.event_key_and_headers(py, source_id.to_str()?, false)?;
        let (key, headers) = (
            key.into_bound(py).into_any(),
            headers.into_bound(py).into_any(),
        );
        let entry = [source_id.clone().into_any(), key.clone(), headers.clone()];
        self.sources.insert(address, entry);
        Ok([key, headers])
    }

    /// `Produce(topic, key, value, DeliveryRef(source_id, stream, seq, kind, release_ts_us), timestamp_ms,
    /// headers)` from `[topic, key, value, timestamp_ms, headers]` and `[source_id, stream, seq, kind,
    /// release_ts_us]`, each stored in its field's slot (slots.rs's `produce_fields`, `delivery_ref_fields`).
    fn produce(
        &self,
        [topic, key, value, ts, headers]: [&Bound<'py, PyAny>; 5],
        [source_id, stream, seq, kind, released_us]: [&Bound<'py, PyAny>; 5],
    ) -> PyResult<Bound<'py, PyAny>> {
        use delivery_ref_fields as d;
        use produce_fields as p;
        let py = self.topics.py();
        let mut delivery = [source_id; d::COUNT];
        delivery[d::STREAM] = stream;
        delivery[d::SEQ] = seq;
        delivery[d::TOPIC] = kind;
        delivery[d::RELEASED_US] = released_us;
        let delivery = match &self.fast {
            Some(fast) => fast.1.build(py, &delivery)?,
            None => self.classes[DELIVERY_REF].call1(PyTuple::new(py, delivery)?)?,
        };
        let mut fields = [topic; p::COUNT];
        fields[p::KEY] = key;
        fields[p::VALUE] = value;
        fields[p::DELIVERY] = &delivery;
        fields[p::TIMESTAMP_MS] = ts;
        fields[p::HEADERS] = headers;
        match &self.fast {
            Some(fast) => fast.0.build(py, &fields),
            None => self.classes[PRODUCE].call1(PyTuple::new(py, fields)?),
        }
    }
}

/// Each item's Produce, or the item itself where `each` gives None; with the positions of those.
pub fn each_item<'py>(
    items: &Bound<'py, PyList>,
    mut each: impl FnMut(&Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>>,
) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
    let out = PyList::empty(items.py());
    let mut handed_back = Vec::new();
    for (position, item) in items.iter().enumerate() {
        match each(&item)? {
            Some(produce) => out.append(produce)?,
            None => {
                handed_back.push(position);
                out.append(item)?;
            }
        }
    }
    Ok((out, handed_back))
}

/// `_publish_one` for a PublishRecord: its Produce, or None when the Python path must handle it. A Produce that
/// `build_merged` built goes through as it is.
pub fn produce_record<'py>(
    builder: &mut RecordBuilder,
    output: &Bound<'py, PyAny>,
    batch: &mut Batch<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = output.py();
    let kind_of_output = output.get_type();
    if kind_of_output.is(&batch.classes[PRODUCE]) {
        return Ok(Some(output.clone())); // built by `build_merged` already
    }
    if !kind_of_output.is(&batch.classes[PUBLISH_RECORD]) {
        return Ok(None);
    }
    let record = output.getattr(intern!(py, "record"))?;
    let kind = output.getattr(intern!(py, "topic"))?;
    let on_late = match kind.cast_exact::<PyString>().map(|k| k.to_str()) {
        Ok(Ok("events")) => false,
        Ok(Ok("late")) => true,
        _ => return Ok(None),
    };
    let mut fields = std::mem::take(&mut batch.fields);
    let produced = (|| {
        read_fields(&record, &batch.attrs, &mut fields)?;
        if fields[9].get_type().is(&batch.classes[REJECTED_PAYLOAD])
            || (on_late && batch.classes[GIVEN_UP_LATE_REASONS].contains(&fields[10])?)
        {
            return Ok(None);
        }
        let Some(topic) = batch.topic(&fields[0], &kind, on_late)? else {
            return Ok(None);
        };
        let [key, value, ts, headers] =
            builder.build_one(&record, &fields, on_late, &mut batch.buf)?;
        let fits = value
            .cast_exact::<PyBytes>()
            .is_ok_and(|v| v.as_bytes().len() <= batch.max_record_bytes);
        if !fits || ts.is_none() {
            return Ok(None);
        }
        let delivery = [&fields[1], &fields[0], &fields[2], &kind, &fields[7]];
        batch
            .produce([&topic, &key, &value, &ts, &headers], delivery)
            .map(Some)
    })();
    batch.fields = fields;
    produced
}

/// The run's error bounds by event address (`id(event)`; None: a bound that is not an exact int). Addresses are
/// not chosen by a peer, so a multiply-rotate hash serves them instead of SipHash, whose hashing was about a
/// twentieth of a record's instructions (one insert per event taken, one lookup per record built).
pub type RunErrors = ByAddress<Option<i128>>;

/// A map by object address (`id(object)`), hashed by `AddressHasher`.
pub type ByAddress<V> = HashMap<usize, V, std::hash::BuildHasherDefault<AddressHasher>>;

/// `RunErrors`' hasher: the address times an odd constant, rotated so that its well-mixed high bits pick the
/// bucket (an address's low bits are zeros of its alignment).
#[derive(Default)]
pub struct AddressHasher(u64);

impl std::hash::Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (self.0 ^ address as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// `build_merged`'s per-call state: the clock, the run's mappings' error bounds (by event), rtt_us per source id
/// (by the address of the id, the object held here: asked of the clock once per id object and call).
pub struct MergedContext<'py> {
    clock: Bound<'py, PyAny>,
    run_errors: RunErrors,
    /// The merger's push whose held events (HeldFields) carry the run's error bounds; None: no such push.
    current_push: Option<u64>,
    rtts: ByAddress<(Bound<'py, PyString>, Bound<'py, PyAny>)>,
}

impl<'py> MergedContext<'py> {
    /// `run`: the `(event, arrival_us, (ref_us, error_us))` items `push_run` took, whose error bounds the records
    /// of those events carry (the mapping they were pushed with, as `_records` takes it from `run_errors`).
    pub fn new(clock: &Bound<'py, PyAny>, run: &Bound<'py, PyAny>) -> PyResult<Self> {
        let mut run_errors = RunErrors::default();
        for item in run.try_iter()? {
            let item = item?;
            let item = item.cast::<PyTuple>()?;
            let mapped = item.get_item(2)?;
            run_errors.insert(
                item.get_item(0)?.as_ptr() as usize,
                exact_int(&mapped.get_item(1)?).ok(),
            );
        }
        Ok(Self::with_errors(clock, run_errors))
    }

    fn with_errors(clock: &Bound<'py, PyAny>, run_errors: RunErrors) -> Self {
        MergedContext {
            clock: clock.clone(),
            run_errors,
            current_push: None,
            rtts: ByAddress::default(),
        }
    }

    /// The context of the merger's push `push_id`, whose run was held events: each of them that push took carries
    /// its run's error bound (HeldFields).
    pub fn for_push(clock: &Bound<'py, PyAny>, push_id: u64) -> Self {
        MergedContext {
            current_push: Some(push_id),
            ..Self::with_errors(clock, RunErrors::default())
        }
    }

    /// The error bound of the event's mapping: the run's, or the clock's now (an event that waited in the merge
    /// since an earlier call); None when it is not an exact int.
    fn error_us(&self, event: &Bound<'py, PyTuple>) -> PyResult<Option<i128>> {
        if let Some(error) = self.run_errors.get(&(event.as_ptr() as usize)) {
            return Ok(*error);
        }
        self.clock_error_us(&event.get_item(0)?, &event.get_item(3)?)
    }

    /// `error_us` of a held event: its run's when the current push took it, else the clock's now.
    fn held_error_us(
        &self,
        held: &HeldFields,
        source_id: &Bound<'py, PyAny>,
        source_ts_us: &Bound<'py, PyAny>,
    ) -> PyResult<Option<i128>> {
        if self.current_push == Some(held.pushed_in) {
            return Ok(Some(i128::from(held.error_us)));
        }
        self.clock_error_us(source_id, source_ts_us)
    }

    /// The error bound the clock gives the event now; None when it is not an exact int.
    fn clock_error_us(
        &self,
        source_id: &Bound<'py, PyAny>,
        source_ts_us: &Bound<'py, PyAny>,
    ) -> PyResult<Option<i128>> {
        let mapped = crate::clocks::to_reference(&self.clock, source_id, source_ts_us)?;
        Ok(match mapped {
            crate::clocks::Mapped::Native(_, error_us) => Some(i128::from(error_us)),
            crate::clocks::Mapped::Python(mapped) => exact_int(&mapped.get_item(1)?).ok(),
        })
    }

    fn rtt_us(&mut self, source_id: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
        let address = source_id.as_ptr() as usize;
        if let Some((_id, rtt)) = self.rtts.get(&address) {
            return Ok(rtt.clone());
        }
        let rtt = crate::clocks::rtt_us(&self.clock, source_id)?;
        self.rtts.insert(address, (source_id.clone(), rtt.clone()));
        Ok(rtt)
    }
}

/// `_records` then `_publish_one` for a Merged release: its Produce, or None when the Python path must handle it.
pub fn produce_merged<'py>(
    builder: &mut RecordBuilder,
    item: &Bound<'py, PyAny>,
    batch: &mut Batch<'py>,
    context: &mut MergedContext<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if !item.get_type().is(&batch.classes[MERGED]) {
        return Ok(None);
    }
    // Merged(event, arrival_us, release_us, ref_ts_us, raised_us); SourceEvent(source_id, stream, seq,
    // source_ts_us, payload, interval).
    let merged = item.cast::<PyTuple>()?;
    if merged.get_item(4)?.extract::<i64>().ok() != Some(0) {
        return Ok(None);
    }
    // Times beyond 64 bits (never from the merge) are left to the Python path.
    let mut times = [0i64; 3];
    for (time, index) in times.iter_mut().zip(1..) {
        let Some(value) = exact_int(&merged.get_item(index)?)
            .ok()
            .and_then(|t| i64::try_from(t).ok())
        else {
            return Ok(None);
        };
        *time = value;
    }
    produce_release(builder, &merged.get_item(0)?, times, batch, context)
}

/// The SourceEvent of a plain release and its (source_id, stream); None when the Python path must handle it (not
/// a SourceEvent, an interval event, a refused payload, an id or stream that is not a str).
#[allow(clippy::type_complexity)]
fn plain_event<'a, 'py>(
    event: &'a Bound<'py, PyAny>,
    batch: &Batch<'py>,
) -> PyResult<Option<(&'a Bound<'py, PyTuple>, [Bound<'py, PyString>; 2])>> {
    if !event.get_type().is(&batch.classes[SOURCE_EVENT]) {
        return Ok(None);
    }
    let event = event.cast::<PyTuple>()?;
    // Borrowed: the event holds them for the whole call (no reference count traffic for what is only read).
    let (payload, interval) = (event.get_borrowed_item(4)?, event.get_borrowed_item(5)?);
    if !interval.is_none() || payload.get_type().is(&batch.classes[REJECTED_PAYLOAD]) {
        return Ok(None);
    }
    let (Ok(source_id), Ok(stream)) = (
        event.get_item(0)?.cast_into::<PyString>(),
        event.get_item(1)?.cast_into::<PyString>(),
    ) else {
        return Ok(None);
    };
    Ok(Some((event, [source_id, stream])))
}

/// A plain release's Produce (`produce_merged` without the Merged tuple): its event and `[arrival_us, release_us,
/// ref_ts_us]`, its raised_us 0; None when the Python path must handle it.
pub fn produce_release<'py>(
    builder: &mut RecordBuilder,
    event: &Bound<'py, PyAny>,
    times: [i64; 3],
    batch: &mut Batch<'py>,
    context: &mut MergedContext<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some((event, ids)) = plain_event(event, batch)? else {
        return Ok(None);
    };
    let Some(topic) = batch.events_topic(&ids[1])? else {
        return Ok(None);
    };
    let Some(error_us) = context.error_us(event)? else {
        return Ok(None);
    };
    let fields = [event.get_item(2)?, event.get_item(3)?];
    let payload = event.get_item(4)?;
    release_produce(
        builder,
        ids,
        fields,
        (RecordPayload::Object(&payload), topic, error_us),
        times,
        batch,
        context,
    )
}

/// `produce_release` of a held event's fields (merger/held.rs): the same Produce, without its SourceEvent.
pub fn produce_held_release<'py>(
    builder: &mut RecordBuilder,
    held: &HeldFields,
    times: [i64; 3],
    batch: &mut Batch<'py>,
    context: &mut MergedContext<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = batch.topics.py();
    let [source_id, stream, seq, source_ts_us, payload] =
        held.fields.each_ref().map(|f| f.bind(py));
    let payload = match &held.payload_json {
        Some(json) => RecordPayload::Json(json.json()),
        None if payload.get_type().is(&batch.classes[REJECTED_PAYLOAD]) => return Ok(None),
        None => RecordPayload::Object(payload),
    };
    let (Ok(id), Ok(name)) = (source_id.cast::<PyString>(), stream.cast::<PyString>()) else {
        return Ok(None);
    };
    let Some(topic) = batch.events_topic(name)? else {
        return Ok(None);
    };
    let Some(error_us) = context.held_error_us(held, source_id, source_ts_us)? else {
        return Ok(None);
    };
    let ids = [id.clone(), name.clone()];
    let fields = [seq.clone(), source_ts_us.clone()];
    release_produce(
        builder,
        ids,
        fields,
        (payload, topic, error_us),
        times,
        batch,
        context,
    )
}

/// The Produce of a plain release whose event is `[source_id, stream]`, `[seq, source_ts_us]` and `payload`, to
/// `topic` (the stream's events topic), its mapping's error bound `error_us`, at `[arrival_us, release_us,
/// ref_ts_us]`; None when the Python path must write it (a value the native writer leaves to orjson, a record over
/// the size limit).
fn release_produce<'py>(
    builder: &mut RecordBuilder,
    [source_id, stream]: [Bound<'py, PyString>; 2],
    [seq, source_ts_us]: [Bound<'py, PyAny>; 2],
    (payload, topic, error_us): (RecordPayload<'_, 'py>, Bound<'py, PyAny>, i128),
    [arrival_us, release_us, ref_ts_us]: [i64; 3],
    batch: &mut Batch<'py>,
    context: &mut MergedContext<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = source_id.py();
    let kind = intern!(py, "events");
    let rtt_us = context.rtt_us(&source_id)?;
    let times = [ref_ts_us, arrival_us, release_us].map(i128::from);
    batch.buf.clear();
    if merged_json(
        [&mut batch.buf, &mut batch.payload_buf],
        [&source_id, &stream],
        [&seq, &source_ts_us],
        error_us,
        times,
        payload,
        &rtt_us,
    )
    .is_err()
        || batch.buf.len() > batch.max_record_bytes
    {
        return Ok(None);
    }
    let value = PyBytes::new(py, &batch.buf).into_any();
    let ts = batch.ints[0].get(py, kafka_timestamp_ms(times[0], times[2]))?;
    let release_us = batch.ints[1].get(py, times[2])?;
    let [key, headers] = batch.key_and_headers(builder, &source_id)?;
    let delivery = [
        source_id.as_any(),
        stream.as_any(),
        &seq,
        kind.as_any(),
        &release_us,
    ];
    batch
        .produce([&topic, &key, &value, &ts, &headers], delivery)
        .map(Some)
}

/// The last int a batch converted for one field (a record's Kafka timestamp, its release time): the releases of
/// one merge call share their release time, and the events of a millisecond their Kafka timestamp, so the one
/// Python int (immutable) serves each record that has the same value instead of an allocation per record.
#[derive(Default)]
pub struct LastInt<'py>(Option<(i128, Bound<'py, PyAny>)>);

impl<'py> LastInt<'py> {
    fn get(&mut self, py: Python<'py>, value: i128) -> PyResult<Bound<'py, PyAny>> {
        if let Some((last, object)) = &self.0 {
            if *last == value {
                return Ok(object.clone());
            }
        }
        let object = super::int_to_py(py, value)?;
        self.0 = Some((value, object.clone()));
        Ok(object)
    }
}

/// A release's payload: its object, or its JSON as the decoder kept it (payload.rs).
#[derive(Clone, Copy)]
enum RecordPayload<'a, 'py> {
    Object(&'a Bound<'py, PyAny>),
    Json(&'a [u8]),
}

/// EventRecord(stream, source_id, seq, source_ts_us, ref_ts_us, error_us, arrival_us, release_us, False, payload,
/// None, rtt_us).to_json(), or NotNative (the Python path then builds it, or orjson refuses it); the payload's JSON
/// is written into `payload_json` first (a buffer the batch reuses, not an allocation per record).
fn merged_json(
    [out, payload_buf]: [&mut Vec<u8>; 2],
    [source_id, stream]: [&Bound<'_, PyString>; 2],
    [seq, source_ts_us]: [&Bound<'_, PyAny>; 2],
    uncertainty_us: i128,
    [ref_ts_us, arrival_us, release_us]: [i128; 3],
    payload: RecordPayload<'_, '_>,
    rtt_us: &Bound<'_, PyAny>,
) -> Result<(), NotNative> {
    let payload_json = match payload {
        RecordPayload::Json(json) => json,
        RecordPayload::Object(payload) => {
            payload_buf.clear();
            write_py(payload_buf, payload, 1)?;
            payload_buf
        }
    };
    let fields = EventRecordFields {
        stream: stream.to_str().map_err(|_| NotNative)?,
        source_id: source_id.to_str().map_err(|_| NotNative)?,
        seq: exact_int(seq)?,
        source_ts_us: exact_int(source_ts_us)?,
        ref_ts_us,
        uncertainty_us,
        arrival_ts_us: arrival_us,
        release_ts_us: release_us,
        late: false,
        payload_json,
        late_reason: None,
        rtt_us: opt_int(rtt_us)?,
        lateness_us: None,
        start_ts_us: None,
        start_uncertainty_us: None,
        source_start_ts_us: None,
        interval_id: None,
        endpoint: None,
        extra_json: Vec::new(),
    };
    write_event_record(out, &fields)
}
