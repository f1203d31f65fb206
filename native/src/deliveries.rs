//! The per-record part of gateway/ingest.py's `IngestCore.on_committed` (its executable specification), compiled:
//! the delivery latencies, `_observed_groups` (each transaction's deliveries by (source, stream), in their order,
//! and the progress observations it makes on the way) and `_seq_runs` (each group's runs of consecutive seqs on one
//! topic). What the Python code then does once per run (the tracker's `confirmed_run`, the progress, the acks)
//! stays Python. A transaction of 5,000 records was three Python loops over 5,000 DeliveryRefs, about half of the
//! commit stage of benchmarks/gateway_hotpath.py.
//!
//! tests/unit/native/test_native_delivery_runs.py holds `group` to the Python functions' outputs, and the ingest
//! differentials (test_native_ingest_records.py) to `on_committed`'s effects.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PyString, PyTuple};

use crate::records::slots::delivery_ref_fields::{
    self, RELEASED_US, SEQ, SOURCE_ID, STREAM, TOPIC,
};
use crate::records::slots::SlotsClass;

/// A multiply-rotate hash for the small integer keys here (addresses, ids): SipHash, the default, was most of the
/// cost per delivery, and nothing here is keyed by input an attacker chooses (addresses and the call's own ids).
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// One DeliveryRef's fields: its (source_id, stream) and its topic as ids, equal exactly when the strings are.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub key: usize,
    pub topic: usize,
    pub seq: i64,
    pub released_us: i64,
}

/// `_seq_runs`' tuple: the run's first position in its group's indices, its first delivery (whose topic is the
/// run's), its first and last seq, its latest release time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: usize,
    pub first: usize,
    pub first_seq: i64,
    pub last_seq: i64,
    pub seen_us: i64,
}

/// One (source, stream): its deliveries' indices in order (the first one's fields are the key) and their runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub indices: Vec<usize>,
    pub runs: Vec<Run>,
}

/// `_observed_groups` and `_seq_runs` of a transaction's deliveries: the deliveries whose seq `_observed_groups`
/// observes, in the order it does, and the groups in their first delivery's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grouped {
    pub observed: Vec<usize>,
    pub groups: Vec<Group>,
}

/// `events_topic`: the id of the topic "events", if any delivery has it.
pub fn group(deliveries: &[Delivery], events_topic: Option<usize>) -> Grouped {
    let mut group_of: IdMap<usize, usize> = IdMap::default();
    let mut groups: Vec<Group> = Vec::new();
    // A group whose first delivery was not an events record: its first events record is observed.
    let mut unobserved: Vec<bool> = Vec::new();
    let mut observed = Vec::new();
    for (index, delivery) in deliveries.iter().enumerate() {
        let on_events = Some(delivery.topic) == events_topic;
        match group_of.get(&delivery.key) {
            None => {
                group_of.insert(delivery.key, groups.len());
                groups.push(Group {
                    indices: vec![index],
                    runs: Vec::new(),
                });
                unobserved.push(!on_events);
                if on_events {
                    observed.push(index);
                }
            }
            Some(&at) => {
                groups[at].indices.push(index);
                if unobserved[at] && on_events {
                    unobserved[at] = false;
                    observed.push(index);
                }
            }
        }
    }
    for group in &mut groups {
        group.runs = seq_runs(deliveries, &group.indices);
    }
    Grouped { observed, groups }
}

/// `_seq_runs(deliveries, indices)`.
fn seq_runs(deliveries: &[Delivery], indices: &[usize]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut at = 0;
    while at < indices.len() {
        let start = at;
        let first = deliveries[indices[at]];
        let (mut last_seq, mut seen_us) = (first.seq, first.released_us);
        at += 1;
        while at < indices.len() {
            let delivery = deliveries[indices[at]];
            if i128::from(delivery.seq) != i128::from(last_seq) + 1 || delivery.topic != first.topic
            {
                break;
            }
            last_seq = delivery.seq;
            seen_us = seen_us.max(delivery.released_us);
            at += 1;
        }
        runs.push(Run {
            start,
            first: indices[start],
            first_seq: first.seq,
            last_seq,
            seen_us,
        });
    }
    runs
}

/// `on_committed`'s per-record loops for gateway.ingest.DeliveryRef (read from its slots).
#[pyclass(name = "DeliveryRuns", module = "skewless_native", frozen)]
pub struct PyDeliveryRuns {
    delivery_ref: Option<SlotsClass>,
}

/// Each delivery's five fields, borrowed from it (the list holds the deliveries, and no Python code runs while
/// they are read); None when one is not a DeliveryRef with its fields set.
fn rows<'a, 'py>(
    class: &SlotsClass,
    deliveries: &'a Bound<'py, PyList>,
) -> PyResult<Option<Vec<[Borrowed<'a, 'py, PyAny>; delivery_ref_fields::COUNT]>>> {
    let py = deliveries.py();
    let mut rows = Vec::with_capacity(deliveries.len());
    for index in 0..deliveries.len() {
        // SAFETY: the GIL is held; PyList_GetItem gives a borrowed reference the list keeps alive (or NULL with an
        // exception set), and get_raw reads the slots of an instance of exactly the probed class.
        let row = unsafe {
            let item = ffi::PyList_GetItem(deliveries.as_ptr(), index as ffi::Py_ssize_t);
            if item.is_null() {
                return Err(PyErr::fetch(py));
            }
            let mut row = [item; delivery_ref_fields::COUNT];
            for (field, slot) in row.iter_mut().enumerate() {
                match class.get_raw(item, field) {
                    Some(value) => *slot = value,
                    None => return Ok(None),
                }
            }
            row.map(|value| Borrowed::from_ptr(py, value))
        };
        rows.push(row);
    }
    Ok(Some(rows))
}

fn as_str<'a>(value: Borrowed<'a, '_, PyAny>) -> Option<&'a str> {
    let string = value.cast_exact::<PyString>().ok()?;
    let mut size: ffi::Py_ssize_t = 0;
    // SAFETY: the GIL is held and `string` is an exact str, alive for 'a; its UTF-8 form is cached in the object
    // and lives as long as it does. A str that has none (a lone surrogate) gives NULL with an exception, cleared:
    // the Python functions then take the deliveries.
    unsafe {
        let data = ffi::PyUnicode_AsUTF8AndSize(string.as_ptr(), &mut size);
        if data.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), usize::try_from(size).ok()?);
        Some(std::str::from_utf8_unchecked(bytes))
    }
}

/// Ids of the (source_id, stream) pairs and topics of one call, by content: looked up by the str objects'
/// addresses first (the deliveries of a source share their strings), by their text when the objects are new.
#[derive(Default)]
struct Ids<'a> {
    keys_by_address: IdMap<(usize, usize), usize>,
    keys_by_str: HashMap<(&'a str, &'a str), usize>,
    topics_by_address: IdMap<usize, usize>,
    topics_by_str: HashMap<&'a str, usize>,
}

impl<'a> Ids<'a> {
    fn key(
        &mut self,
        source_id: Borrowed<'a, '_, PyAny>,
        stream: Borrowed<'a, '_, PyAny>,
    ) -> Option<usize> {
        let address = (source_id.as_ptr() as usize, stream.as_ptr() as usize);
        if let Some(&id) = self.keys_by_address.get(&address) {
            return Some(id);
        }
        let text = (as_str(source_id)?, as_str(stream)?);
        let next = self.keys_by_str.len();
        let id = *self.keys_by_str.entry(text).or_insert(next);
        self.keys_by_address.insert(address, id);
        Some(id)
    }

    fn topic(&mut self, topic: Borrowed<'a, '_, PyAny>) -> Option<usize> {
        let address = topic.as_ptr() as usize;
        if let Some(&id) = self.topics_by_address.get(&address) {
            return Some(id);
        }
        let next = self.topics_by_str.len();
        let id = *self.topics_by_str.entry(as_str(topic)?).or_insert(next);
        self.topics_by_address.insert(address, id);
        Some(id)
    }
}

fn as_i64(value: Borrowed<'_, '_, PyAny>) -> Option<i64> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    value.extract::<i64>().ok()
}

#[pymethods]
impl PyDeliveryRuns {
    /// `delivery_ref`: gateway.ingest.DeliveryRef (a plain slots dataclass; any other class: `group` answers None).
    #[new]
    fn new(delivery_ref: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(PyDeliveryRuns {
            delivery_ref: SlotsClass::probe(delivery_ref, delivery_ref_fields::COUNT)?,
        })
    }

    /// `(latencies, observed, groups)` of `deliveries`: `[now_us - d.released_us ...]`; the `(stream, source_id,
    /// seq, released_us)` of each `observe_seq` call `_observed_groups` makes, in order; per group in its order
    /// `((source_id, stream), indices, [(start, topic, first_seq, last_seq, seen_us), ...])` as `_seq_runs` yields.
    /// None when a delivery is not a DeliveryRef of str and 64-bit int fields (the Python functions then run).
    fn group<'py>(
        &self,
        deliveries: &Bound<'py, PyList>,
        now_us: i64,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let py = deliveries.py();
        let Some(class) = self.delivery_ref.as_ref() else {
            return Ok(None);
        };
        crate::decode::guard("DeliveryRuns.group", || {
            let Some(rows) = rows(class, deliveries)? else {
                return Ok(None);
            };
            let mut ids = Ids::default();
            let mut parsed = Vec::with_capacity(rows.len());
            for row in &rows {
                let (Some(key), Some(topic), Some(seq), Some(released_us)) = (
                    ids.key(row[SOURCE_ID], row[STREAM]),
                    ids.topic(row[TOPIC]),
                    as_i64(row[SEQ]),
                    as_i64(row[RELEASED_US]),
                ) else {
                    return Ok(None);
                };
                parsed.push(Delivery {
                    key,
                    topic,
                    seq,
                    released_us,
                });
            }
            let latencies = PyList::empty(py);
            for delivery in &parsed {
                let latency = i128::from(now_us) - i128::from(delivery.released_us);
                latencies.append(crate::records::int_to_py(py, latency)?)?;
            }
            let grouped = group(&parsed, ids.topics_by_str.get("events").copied());
            let field = |index: usize, field: usize| rows[index][field];
            let observed = PyList::empty(py);
            for &index in &grouped.observed {
                observed.append((
                    field(index, STREAM),
                    field(index, SOURCE_ID),
                    field(index, SEQ),
                    field(index, RELEASED_US),
                ))?;
            }
            let groups = PyList::empty(py);
            for group in &grouped.groups {
                let first = group.indices[0];
                let runs = PyList::empty(py);
                for run in &group.runs {
                    runs.append((
                        run.start,
                        field(run.first, TOPIC),
                        run.first_seq,
                        run.last_seq,
                        run.seen_us,
                    ))?;
                }
                let key = (field(first, SOURCE_ID), field(first, STREAM));
                groups.append((key, PyList::new(py, &group.indices)?, runs))?;
            }
            Ok(Some(PyTuple::new(
                py,
                [latencies.into_any(), observed.into_any(), groups.into_any()],
            )?))
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDeliveryRuns>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: usize = 0;
    const LATE: usize = 1;

    fn d(key: usize, seq: i64, topic: usize, released_us: i64) -> Delivery {
        Delivery {
            key,
            topic,
            seq,
            released_us,
        }
    }

    #[test]
    fn groups_and_runs_as_the_python_functions_make_them() {
        // a: 1 2 (events) then 3 late, 5 events; b: 7 late first (observed at its first events record, 8).
        let (a, b) = (0, 1);
        let deliveries = [
            d(a, 1, EVENTS, 10),
            d(b, 7, LATE, 11),
            d(a, 2, EVENTS, 9),
            d(b, 8, EVENTS, 12),
            d(a, 3, LATE, 13),
            d(a, 5, EVENTS, 14),
        ];
        let grouped = group(&deliveries, Some(EVENTS));
        assert_eq!(grouped.observed, vec![0, 3]);
        let run = |start, first, first_seq, last_seq, seen_us| Run {
            start,
            first,
            first_seq,
            last_seq,
            seen_us,
        };
        assert_eq!(
            grouped.groups,
            vec![
                Group {
                    indices: vec![0, 2, 4, 5],
                    runs: vec![
                        run(0, 0, 1, 2, 10),
                        run(2, 4, 3, 3, 13),
                        run(3, 5, 5, 5, 14)
                    ],
                },
                Group {
                    indices: vec![1, 3],
                    runs: vec![run(0, 1, 7, 7, 11), run(1, 3, 8, 8, 12)],
                },
            ]
        );
    }

    #[test]
    fn a_seq_at_the_top_of_i64_ends_its_run() {
        let deliveries = [d(0, i64::MAX, EVENTS, 1), d(0, i64::MIN, EVENTS, 2)];
        assert_eq!(group(&deliveries, Some(EVENTS)).groups[0].runs.len(), 2);
        // Without an events record nothing is observed.
        assert!(group(&deliveries, None).observed.is_empty());
    }
}
