//! gateway/shard.py's `ShardRuntime._produce_from` for a transactional shard's plain records, compiled: the loop
//! that hands each Produce action to confluent-kafka's `Producer.produce` (the client's own C method, called
//! positionally as the Python loop calls it) and keeps its DeliveryRef for the commit. The interpreted loop
//! around that call (the action's six attribute reads, the mark lookup, `list(headers)`, the append) was about a
//! third of the produce stage in benchmarks/gateway_hotpath.py.
//!
//! Only the records the Python loop treats alike are done here: a Produce whose index is not a mark (a mark's
//! delivery report is wanted, for the offset audit or the progress checkpoint's offset: the Python loop gives it
//! its callback) and whose headers are None or a tuple. The loop stops before any other action (a mark, a
//! WriteCheckpoint, another class), which the Python loop then takes, and on librdkafka's full queue
//! (BufferError), as the Python loop does; any other error of `produce` is raised as it came.
//! tests/unit/native/test_native_produce_loop.py holds the shard's loop with and without it to the same calls,
//! deliveries kept and counts.

use std::collections::HashSet;

use smallvec::SmallVec;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyList, PySet, PyString, PyTuple};

use crate::direct_produce::{
    bytes_or_none, CNames, DirectProducer, HeaderPair, Record, ERR_QUEUE_FULL, MAX_HEADERS,
};
use crate::records::slots::produce_fields::{DELIVERY, HEADERS, KEY, TIMESTAMP_MS, TOPIC, VALUE};
use crate::records::slots::{delivery_ref_fields, produce_fields, SlotsClass};

#[pyclass(name = "ProduceLoop", module = "skewless_native", frozen)]
pub struct ProduceLoop {
    produce: Option<SlotsClass>,
    delivery_ref: Option<SlotsClass>,
}

fn exact_str<'py>(value: Bound<'py, PyAny>) -> Option<Bound<'py, PyString>> {
    value.cast_into_exact::<PyString>().ok()
}

/// The list `produce` takes for a headers tuple: one per distinct tuple in a call (the records of a source share
/// theirs, and confluent-kafka only reads the list), where the Python loop made one per record.
struct HeaderLists<'py> {
    lists: Vec<(usize, Bound<'py, PyList>)>,
}

impl<'py> HeaderLists<'py> {
    fn of(&mut self, headers: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyList>> {
        let address = headers.as_ptr() as usize;
        if let Some((_, list)) = self.lists.iter().find(|(at, _)| *at == address) {
            return Ok(list.clone());
        }
        let list = headers.to_list();
        // The tuple itself is kept alive by its action, and so is the address it is found by.
        self.lists.push((address, list.clone()));
        Ok(list)
    }
}

#[pymethods]
impl ProduceLoop {
    /// `produce_class`, `delivery_ref`: gateway.ingest.Produce and DeliveryRef (plain slots dataclasses; other
    /// classes: every `run` stops at once, every `wanted_reports` answers None).
    #[new]
    fn new(produce_class: &Bound<'_, PyAny>, delivery_ref: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(ProduceLoop {
            produce: SlotsClass::probe(produce_class, produce_fields::COUNT)?,
            delivery_ref: SlotsClass::probe(delivery_ref, delivery_ref_fields::COUNT)?,
        })
    }

    /// `ShardRuntime._wanted_reports(actions)`'s pass: `({index: (topic or None, stream or None)}, {topic: records})`
    /// in the order its backward pass fills them; None when a Produce's topic or delivery is not of the types read
    /// here (exact str fields, a DeliveryRef or None): the Python pass then runs.
    #[allow(clippy::type_complexity)]
    fn wanted_reports<'py>(
        &self,
        actions: &Bound<'py, PyList>,
    ) -> PyResult<Option<(Bound<'py, PyDict>, Bound<'py, PyDict>)>> {
        let py = actions.py();
        let (Some(produce), Some(delivery_ref)) =
            (self.produce.as_ref(), self.delivery_ref.as_ref())
        else {
            return Ok(None);
        };
        let none = py.None().into_bound(py);
        let wanted = PyDict::new(py);
        let mut topics: Vec<(Bound<'py, PyString>, usize)> = Vec::new();
        let mut streams: Vec<Bound<'py, PyString>> = Vec::new();
        for index in (0..actions.len()).rev() {
            let action = actions.get_item(index)?;
            let (Some(topic), Some(delivery)) =
                (produce.get(&action, TOPIC), produce.get(&action, DELIVERY))
            else {
                continue; // not a Produce: the Python pass skips it too
            };
            let Some(topic) = exact_str(topic) else {
                return Ok(None);
            };
            let mut first_of_topic = true;
            for (known, count) in topics.iter_mut() {
                if known.to_str()? == topic.to_str()? {
                    *count += 1;
                    first_of_topic = false;
                    break;
                }
            }
            if first_of_topic {
                topics.push((topic.clone(), 1));
            }
            let mut stream = None;
            if !delivery.is_none() {
                let (Some(delivery_topic), Some(delivery_stream)) = (
                    delivery_ref
                        .get(&delivery, delivery_ref_fields::TOPIC)
                        .and_then(exact_str),
                    delivery_ref
                        .get(&delivery, delivery_ref_fields::STREAM)
                        .and_then(exact_str),
                ) else {
                    return Ok(None);
                };
                if delivery_topic.to_str()? == "events" {
                    let mut seen = false;
                    for known in &streams {
                        if known.to_str()? == delivery_stream.to_str()? {
                            seen = true;
                            break;
                        }
                    }
                    if !seen {
                        streams.push(delivery_stream.clone());
                        stream = Some(delivery_stream);
                    }
                }
            }
            if first_of_topic || stream.is_some() {
                let topic = if first_of_topic {
                    topic.into_any()
                } else {
                    none.clone()
                };
                let stream = stream.map_or_else(|| none.clone(), Bound::into_any);
                wanted.set_item(index, (topic, stream))?;
            }
        }
        let records = PyDict::new(py);
        for (topic, count) in topics {
            records.set_item(topic, count)?;
        }
        Ok(Some((wanted, records)))
    }

    /// `ShardRuntime._first_write_end(actions, start)`: one past the first of `actions[start:]` whose `topic` is in
    /// `topics`, else `len(actions)`. A Produce's topic is read from its slot; any other action's by `getattr`.
    fn first_write_end<'py>(
        &self,
        actions: &Bound<'py, PyList>,
        start: usize,
        topics: &Bound<'py, PySet>,
    ) -> PyResult<usize> {
        let topic_name = pyo3::intern!(actions.py(), "topic");
        for index in start..actions.len() {
            let action = actions.get_item(index)?;
            let topic = match self
                .produce
                .as_ref()
                .and_then(|class| class.get(&action, TOPIC))
            {
                Some(topic) => topic,
                None => action.getattr(topic_name)?,
            };
            if topics.contains(topic)? {
                return Ok(index + 1);
            }
        }
        Ok(actions.len())
    }

    /// `ShardRuntime._carry_out_now`'s sorting of a core call's actions: `(the actions whose class is one of
    /// `writes`, the others)`, each in order, when every action's class is exactly one of `writes` or `others`;
    /// None when one is of another class (a subclass too: the Python loop's `isinstance` chain then sorts them).
    fn split_writes<'py>(
        &self,
        actions: &Bound<'py, PyList>,
        writes: &Bound<'py, PyTuple>,
        others: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<(Bound<'py, PyList>, Bound<'py, PyList>)>> {
        let py = actions.py();
        let classes = |tuple: &Bound<'py, PyTuple>| -> Vec<usize> {
            tuple.iter().map(|class| class.as_ptr() as usize).collect()
        };
        let (write_classes, other_classes) = (classes(writes), classes(others));
        let (kafka, rest) = (PyList::empty(py), PyList::empty(py));
        for action in actions.iter() {
            let class = action.get_type().as_ptr() as usize;
            if write_classes.contains(&class) {
                kafka.append(action)?;
            } else if other_classes.contains(&class) {
                rest.append(action)?;
            } else {
                return Ok(None);
            }
        }
        Ok(Some((kafka, rest)))
    }

    /// `actions[start:]` to `produce` as the transactional shard's loop does, each delivery appended to
    /// `uncommitted`: returns the index of the first action not produced and whether it stopped on a full queue
    /// (that action's BufferError), or `(len(actions), False)`. With `direct` (the same client's librdkafka handle,
    /// direct_produce.rs), a record whose fields librdkafka takes as they are goes to it without `produce`: the
    /// same arguments, the same errors (a full queue as BufferError would be, another as KafkaException).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (produce, actions, start, shard, marks, uncommitted, direct=None))]
    fn run<'py>(
        &self,
        produce: &Bound<'py, PyAny>,
        actions: &Bound<'py, PyList>,
        start: usize,
        shard: &Bound<'py, PyAny>,
        marks: &Bound<'py, PyDict>,
        uncommitted: &Bound<'py, PyList>,
        direct: Option<PyRef<'py, DirectProducer>>,
    ) -> PyResult<(usize, bool)> {
        let py = actions.py();
        let Some(class) = self.produce.as_ref() else {
            return Ok((start, false));
        };
        let partition: Option<i32> = shard.extract().ok();
        let mut names = CNames::default();
        let mut marked = HashSet::with_capacity(marks.len());
        for key in marks.keys() {
            if let Ok(index) = key.extract::<usize>() {
                marked.insert(index);
            }
        }
        let mut lists = HeaderLists { lists: Vec::new() };
        let none = py.None().into_bound(py);
        let mut index = start;
        while index < actions.len() {
            let action = actions.get_item(index)?;
            let field = |at: usize| class.get(&action, at);
            let (Some(topic), Some(key), Some(value), Some(delivery), Some(ts), Some(headers)) = (
                field(TOPIC),
                field(KEY),
                field(VALUE),
                field(DELIVERY),
                field(TIMESTAMP_MS),
                field(HEADERS),
            ) else {
                break;
            };
            if marked.contains(&index) {
                break; // its delivery report is wanted: the Python loop gives it its callback
            }
            if let (Some(direct), Some(partition)) = (direct.as_ref(), partition) {
                match produce_direct(
                    direct,
                    &mut names,
                    [&topic, &key, &value, &ts, &headers],
                    partition,
                )? {
                    Direct::Taken => {
                        if !delivery.is_none() {
                            uncommitted.append(delivery)?;
                        }
                        index += 1;
                        continue;
                    }
                    Direct::QueueFull => return Ok((index, true)),
                    Direct::NotTaken => {} // a field librdkafka does not take as it is: through `produce`
                }
            }
            let headers = if headers.is_none() {
                none.clone()
            } else if let Ok(tuple) = headers.cast_exact::<PyTuple>() {
                lists.of(tuple)?.into_any()
            } else {
                break;
            };
            let args = [
                topic,
                value,
                key,
                shard.clone(),
                none.clone(),
                none.clone(),
                ts,
                headers,
            ];
            match produce.call1(PyTuple::new(py, args)?) {
                Ok(_) => {}
                Err(error) if error.is_instance_of::<PyBufferError>(py) => {
                    return Ok((index, true))
                }
                Err(error) => return Err(error),
            }
            if !delivery.is_none() {
                uncommitted.append(delivery)?;
            }
            index += 1;
        }
        Ok((index, false))
    }
}

/// A header's name (its key in `CNames`) and value.
type HeaderKey<'a> = (usize, Option<&'a [u8]>);

/// What `produce_direct` did with a record.
enum Direct {
    Taken,
    QueueFull,
    /// A field is not of a type taken here (str key or value, headers not a tuple of (str, bytes or None)
    /// pairs, more than MAX_HEADERS of them, a non-int timestamp): `produce` converts it as it always did.
    NotTaken,
}

/// One plain record straight to librdkafka when its fields are the types `Producer.produce` passes through as
/// they are (exact bytes or None key and value, an int timestamp, headers None or a tuple of (str, bytes or
/// None) pairs); a refusal other than a full queue raises `KafkaException(KafkaError(code, ...))` as `produce`
/// does.
fn produce_direct(
    direct: &DirectProducer,
    names: &mut CNames,
    fields: [&Bound<'_, PyAny>; 5],
    partition: i32,
) -> PyResult<Direct> {
    let [topic, key, value, timestamp_ms, headers] = fields;
    let py = topic.py();
    let (Some(topic), Some(key), Some(value)) = (
        names.ensure(topic),
        bytes_or_none(key),
        bytes_or_none(value),
    ) else {
        return Ok(Direct::NotTaken);
    };
    let Ok(timestamp_ms) = timestamp_ms
        .cast_exact::<PyInt>()
        .map_err(PyErr::from)
        .and_then(|ts| ts.extract::<i64>())
    else {
        return Ok(Direct::NotTaken);
    };
    // Each pair's (name, value), held here so the value's bytes can be lent to the record.
    let mut items: SmallVec<[(Bound<'_, PyAny>, Bound<'_, PyAny>); MAX_HEADERS]> = SmallVec::new();
    if !headers.is_none() {
        let Ok(tuple) = headers.cast_exact::<PyTuple>() else {
            return Ok(Direct::NotTaken);
        };
        if tuple.len() > MAX_HEADERS {
            return Ok(Direct::NotTaken);
        }
        for pair in tuple.iter() {
            let Ok(pair) = pair.cast_exact::<PyTuple>() else {
                return Ok(Direct::NotTaken);
            };
            if pair.len() != 2 {
                return Ok(Direct::NotTaken);
            }
            items.push((pair.get_item(0)?, pair.get_item(1)?));
        }
    }
    let mut header_keys: SmallVec<[HeaderKey<'_>; MAX_HEADERS]> = SmallVec::new();
    for (name, value) in &items {
        let (Some(name), Some(value)) = (names.ensure(name), bytes_or_none(value)) else {
            return Ok(Direct::NotTaken);
        };
        header_keys.push((name, value));
    }
    let header_pairs: SmallVec<[HeaderPair<'_>; MAX_HEADERS]> = header_keys
        .iter()
        .map(|(name, value)| (names.get(*name), *value))
        .collect();
    let record = Record {
        topic: names.get(topic),
        partition,
        key,
        value,
        timestamp_ms,
        headers: &header_pairs,
    };
    match direct.produce(py, &record)? {
        None => Ok(Direct::Taken),
        Some((code, _)) if code == ERR_QUEUE_FULL => Ok(Direct::QueueFull),
        Some((code, reason)) => {
            let kafka = py.import(pyo3::intern!(py, "confluent_kafka"))?;
            let error = kafka
                .getattr(pyo3::intern!(py, "KafkaError"))?
                .call1((code, format!("Unable to produce message: {reason}")))?;
            Err(PyErr::from_value(
                kafka
                    .getattr(pyo3::intern!(py, "KafkaException"))?
                    .call1((error,))?,
            ))
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ProduceLoop>()?;
    Ok(())
}
