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

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::records::slots::SlotsClass;

// Produce(topic, key, value, delivery, timestamp_ms, headers).
const TOPIC: usize = 0;
const KEY: usize = 1;
const VALUE: usize = 2;
const DELIVERY: usize = 3;
const TIMESTAMP_MS: usize = 4;
const HEADERS: usize = 5;

#[pyclass(name = "ProduceLoop", module = "skewless_native", frozen)]
pub struct ProduceLoop {
    produce: Option<SlotsClass>,
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
    /// `produce_class`: gateway.ingest.Produce (a plain slots dataclass; any other class: every call stops at once).
    #[new]
    fn new(produce_class: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(ProduceLoop {
            produce: SlotsClass::probe(produce_class, 6)?,
        })
    }

    /// `actions[start:]` to `produce` as the transactional shard's loop does, each delivery appended to
    /// `uncommitted`: returns the index of the first action not produced and whether it stopped on a full queue
    /// (that action's BufferError), or `(len(actions), False)`.
    #[allow(clippy::too_many_arguments)]
    fn run<'py>(
        &self,
        produce: &Bound<'py, PyAny>,
        actions: &Bound<'py, PyList>,
        start: usize,
        shard: &Bound<'py, PyAny>,
        marks: &Bound<'py, PyDict>,
        uncommitted: &Bound<'py, PyList>,
    ) -> PyResult<(usize, bool)> {
        let py = actions.py();
        let Some(class) = self.produce.as_ref() else {
            return Ok((start, false));
        };
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ProduceLoop>()?;
    Ok(())
}
