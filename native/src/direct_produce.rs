//! A transactional shard's plain records handed to librdkafka by its C API (`rd_kafka_produceva`) on the very client
//! that confluent-kafka's `Producer` wraps, instead of one call of that `Producer.produce` per record.
//!
//! Why: through `Producer.produce` a record cost, on the loop's thread, the call itself (a Python argument tuple
//! parsed against a format string), the headers list converted, a per-record state allocated for the delivery
//! report, and at `poll` one callback per record that takes the GIL back and lets it go again, although these
//! records ask for no report. The produce loop was 28 % of the event loop's samples in the end-to-end profile
//! (docs/gateway-profile-e2e.txt). Here a record is one `rd_kafka_produceva` call with the same arguments
//! `Producer.produce` gives librdkafka (topic, partition, key, value, timestamp, each header, RD_KAFKA_MSG_F_COPY)
//! and no per-record state: librdkafka's report for it reaches confluent-kafka's delivery callback with no state
//! attached, which it returns from at once. The records whose report the shard wants (the marks) still go through
//! `Producer.produce` with their callback, in the same order on the same thread.
//!
//! Where the client handle comes from: confluent-kafka keeps it as the first field after the object header of its
//! `Handle` struct (confluent_kafka.h of the 2.x source this was written against; pyproject pins `<3`). The handle
//! is accepted only when the librdkafka it is opened from is the one already loaded for confluent-kafka (dlopen
//! with RTLD_NOLOAD), reports the version confluent-kafka reports, says it is a producer named `...#producer-N`, and
//! holds as many records as `len(producer)`. Anything else: `DirectProducer.open` raises, and the gateway keeps
//! calling `Producer.produce` (gateway/native.py). The handle is read again at every call: a closed producer
//! (handle NULL) raises as `Producer.produce` does.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyTuple};

const VTYPE_TOPIC: c_int = 1;
const VTYPE_PARTITION: c_int = 3;
const VTYPE_VALUE: c_int = 4;
const VTYPE_KEY: c_int = 5;
const VTYPE_MSGFLAGS: c_int = 7;
const VTYPE_TIMESTAMP: c_int = 8;
const VTYPE_HEADER: c_int = 9;
/// RD_KAFKA_MSG_F_COPY: librdkafka copies key and value before the call returns (as `Producer.produce` asks).
const MSG_F_COPY: c_int = 0x2;
const RD_KAFKA_PRODUCER: c_int = 0;
/// RD_KAFKA_RESP_ERR__QUEUE_FULL: `Producer.produce` raises BufferError for it.
pub const ERR_QUEUE_FULL: c_int = -184;
/// The most headers a record takes here (the contract's records have two or three); more go through Python.
pub const MAX_HEADERS: usize = 8;

#[repr(C)]
#[derive(Clone, Copy)]
struct Mem {
    ptr: *const c_void,
    size: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Header {
    name: *const c_char,
    value: *const c_void,
    size: isize,
}

/// rdkafka.h's `rd_kafka_vu_t` value union, 64 bytes of padding included.
#[repr(C)]
#[derive(Clone, Copy)]
union VuValue {
    cstr: *const c_char,
    i: c_int,
    i32: i32,
    i64: i64,
    mem: Mem,
    header: Header,
    pad: [u8; 64],
}

/// rdkafka.h's `rd_kafka_vu_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Vu {
    vtype: c_int,
    u: VuValue,
}

const EMPTY_VU: Vu = Vu {
    vtype: 0,
    u: VuValue { pad: [0; 64] },
};

type ProduceVa = unsafe extern "C" fn(*mut c_void, *const Vu, usize) -> *mut c_void;
type ErrorCode = unsafe extern "C" fn(*const c_void) -> c_int;
type ErrorString = unsafe extern "C" fn(*const c_void) -> *const c_char;
type ErrorDestroy = unsafe extern "C" fn(*mut c_void);
type HandleInt = unsafe extern "C" fn(*mut c_void) -> c_int;
type HandleName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type Version = unsafe extern "C" fn() -> c_int;

/// The librdkafka functions used here, resolved in the library confluent-kafka loaded.
struct Library {
    produceva: ProduceVa,
    error_code: ErrorCode,
    error_string: ErrorString,
    error_destroy: ErrorDestroy,
}

/// The symbol `name` of the already loaded library `handle`.
unsafe fn symbol(handle: *mut c_void, name: &CStr) -> PyResult<*mut c_void> {
    let found = libc::dlsym(handle, name.as_ptr());
    if found.is_null() {
        return Err(PyValueError::new_err(format!(
            "librdkafka has no {}",
            name.to_string_lossy()
        )));
    }
    Ok(found)
}

/// A header's name and value (None: a header without a value).
pub type HeaderPair<'a> = (&'a CStr, Option<&'a [u8]>);

/// One record's arguments: what `Producer.produce(topic, value, key, partition, None, None, timestamp_ms,
/// headers)` hands librdkafka.
pub struct Record<'a> {
    pub topic: &'a CStr,
    pub partition: i32,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp_ms: i64,
    /// In order; at most MAX_HEADERS.
    pub headers: &'a [HeaderPair<'a>],
}

#[pyclass(name = "DirectProducer", module = "skewless_native", frozen)]
pub struct DirectProducer {
    /// confluent_kafka.Producer: kept alive here, so its handle is freed only by its `close()` (read at each call).
    producer: Py<PyAny>,
    library: Library,
}

// SAFETY: the function pointers are plain code addresses; librdkafka's produce calls are thread-safe, and every
// call here is made with the GIL held, as confluent-kafka's own.
unsafe impl Send for DirectProducer {}
unsafe impl Sync for DirectProducer {}

impl Vu {
    fn topic(name: &CStr) -> Self {
        let cstr = name.as_ptr();
        Vu {
            vtype: VTYPE_TOPIC,
            u: VuValue { cstr },
        }
    }

    fn partition(i32: i32) -> Self {
        Vu {
            vtype: VTYPE_PARTITION,
            u: VuValue { i32 },
        }
    }

    /// A key or a value (`vtype`): None is librdkafka's NULL.
    fn bytes(vtype: c_int, bytes: Option<&[u8]>) -> Self {
        Vu {
            vtype,
            u: VuValue { mem: memory(bytes) },
        }
    }

    fn timestamp(i64: i64) -> Self {
        Vu {
            vtype: VTYPE_TIMESTAMP,
            u: VuValue { i64 },
        }
    }

    fn flags(i: c_int) -> Self {
        Vu {
            vtype: VTYPE_MSGFLAGS,
            u: VuValue { i },
        }
    }

    /// One header; a value of None is a header without a value (as confluent-kafka sends a None).
    fn header(name: &CStr, value: Option<&[u8]>) -> Self {
        let (value, size) = match value {
            Some(value) => (value.as_ptr().cast::<c_void>(), value.len() as isize),
            None => (std::ptr::null(), 0),
        };
        let header = Header {
            name: name.as_ptr(),
            value,
            size,
        };
        Vu {
            vtype: VTYPE_HEADER,
            u: VuValue { header },
        }
    }
}

fn memory(bytes: Option<&[u8]>) -> Mem {
    match bytes {
        Some(bytes) => Mem {
            ptr: bytes.as_ptr().cast(),
            size: bytes.len(),
        },
        None => Mem {
            ptr: std::ptr::null(),
            size: 0,
        },
    }
}

impl DirectProducer {
    /// The client handle in confluent-kafka's Handle struct (NULL once the producer is closed).
    fn handle(&self, py: Python<'_>) -> *mut c_void {
        let object = self.producer.bind(py).as_ptr();
        // SAFETY: `open` checked the object is confluent_kafka.cimpl.Producer, whose struct starts with the object
        // header followed by the `rd_kafka_t *`; the object is alive (held by self).
        unsafe {
            *(object as *const u8)
                .add(std::mem::size_of::<ffi::PyObject>())
                .cast::<*mut c_void>()
        }
    }

    /// Hand one record to librdkafka: Ok(None) when it took it, Ok(Some((code, reason))) when it refused it
    /// (ERR_QUEUE_FULL: its queue is full).
    pub fn produce(
        &self,
        py: Python<'_>,
        record: &Record<'_>,
    ) -> PyResult<Option<(c_int, String)>> {
        let handle = self.handle(py);
        if handle.is_null() {
            return Err(PyRuntimeError::new_err("Producer has been closed"));
        }
        if record.headers.len() > MAX_HEADERS {
            return Err(PyValueError::new_err(format!(
                "more than {MAX_HEADERS} headers"
            )));
        }
        let mut vus = [EMPTY_VU; 6 + MAX_HEADERS];
        vus[..6].copy_from_slice(&[
            Vu::topic(record.topic),
            Vu::partition(record.partition),
            Vu::bytes(VTYPE_KEY, record.key),
            Vu::bytes(VTYPE_VALUE, record.value),
            Vu::timestamp(record.timestamp_ms),
            Vu::flags(MSG_F_COPY),
        ]);
        let mut count = 6;
        for (name, value) in record.headers {
            vus[count] = Vu::header(name, *value);
            count += 1;
        }
        // SAFETY: the handle is the live producer's; every pointer in `vus` lives until the call returns, and
        // librdkafka copies what it keeps (RD_KAFKA_MSG_F_COPY, header values).
        unsafe {
            let error = (self.library.produceva)(handle, vus.as_ptr(), count);
            if error.is_null() {
                return Ok(None);
            }
            let code = (self.library.error_code)(error);
            let text = (self.library.error_string)(error);
            let reason = if text.is_null() {
                String::new()
            } else {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            };
            (self.library.error_destroy)(error);
            Ok(Some((code, reason)))
        }
    }
}

#[pymethods]
impl DirectProducer {
    /// `producer`'s client, through the librdkafka at `path` (already loaded for confluent-kafka, whose
    /// `libversion()` number is `version`). Raises ValueError when any check of the module doc fails.
    #[staticmethod]
    fn open(producer: &Bound<'_, PyAny>, path: &str, version: i64) -> PyResult<Self> {
        let py = producer.py();
        let producer_class = py
            .import(pyo3::intern!(py, "confluent_kafka.cimpl"))?
            .getattr(pyo3::intern!(py, "Producer"))?;
        if !producer.get_type().is(&producer_class) {
            return Err(PyValueError::new_err(format!(
                "not confluent-kafka's Producer: {}",
                producer.get_type().qualname()?
            )));
        }
        let c_path = CString::new(path).map_err(|_| PyValueError::new_err("a NUL in the path"))?;
        // SAFETY: dlopen with RTLD_NOLOAD only finds a library already loaded (it runs no initialiser); dlsym reads
        // its symbol table. The library stays loaded: confluent-kafka's module holds it for the process's life.
        let (library, handle_type, handle_name, outq_len, version_of) = unsafe {
            let handle = libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if handle.is_null() {
                return Err(PyValueError::new_err(format!("{path} is not loaded")));
            }
            let library = Library {
                produceva: std::mem::transmute::<*mut c_void, ProduceVa>(symbol(
                    handle,
                    c"rd_kafka_produceva",
                )?),
                error_code: std::mem::transmute::<*mut c_void, ErrorCode>(symbol(
                    handle,
                    c"rd_kafka_error_code",
                )?),
                error_string: std::mem::transmute::<*mut c_void, ErrorString>(symbol(
                    handle,
                    c"rd_kafka_error_string",
                )?),
                error_destroy: std::mem::transmute::<*mut c_void, ErrorDestroy>(symbol(
                    handle,
                    c"rd_kafka_error_destroy",
                )?),
            };
            (
                library,
                std::mem::transmute::<*mut c_void, HandleInt>(symbol(handle, c"rd_kafka_type")?),
                std::mem::transmute::<*mut c_void, HandleName>(symbol(handle, c"rd_kafka_name")?),
                std::mem::transmute::<*mut c_void, HandleInt>(symbol(
                    handle,
                    c"rd_kafka_outq_len",
                )?),
                std::mem::transmute::<*mut c_void, Version>(symbol(handle, c"rd_kafka_version")?),
            )
        };
        // SAFETY: a plain function of the loaded library.
        let loaded_version = i64::from(unsafe { version_of() });
        if loaded_version != version {
            return Err(PyValueError::new_err(format!(
                "{path}'s version {loaded_version:#x} is not confluent-kafka's {version:#x}"
            )));
        }
        let direct = DirectProducer {
            producer: producer.clone().unbind(),
            library,
        };
        let handle = direct.handle(py);
        if handle.is_null() {
            return Err(PyValueError::new_err("the producer is closed"));
        }
        // SAFETY: `handle` is the producer's `rd_kafka_t *` (the struct layout of the module doc); these read it.
        let (kind, name, queued) = unsafe {
            let name = handle_name(handle);
            let name = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            (handle_type(handle), name, outq_len(handle))
        };
        let expected_queued: usize = producer.len()?;
        if kind != RD_KAFKA_PRODUCER
            || !name.contains("#producer-")
            || usize::try_from(queued).ok() != Some(expected_queued)
        {
            return Err(PyValueError::new_err(format!(
                "the handle does not read as the producer's (type {kind}, name {name:?}, {queued} queued)"
            )));
        }
        Ok(direct)
    }

    /// One record as `Producer.produce(topic, value, key, partition, None, None, timestamp_ms, headers)` would
    /// queue it, for tests: None when librdkafka took it, else `(error code, reason)`.
    #[pyo3(signature = (topic, value, key, partition, timestamp_ms, headers))]
    #[allow(clippy::too_many_arguments)]
    fn produce_one(
        &self,
        py: Python<'_>,
        topic: &str,
        value: Option<&[u8]>,
        key: Option<&[u8]>,
        partition: i32,
        timestamp_ms: i64,
        headers: Option<&Bound<'_, PyTuple>>,
    ) -> PyResult<Option<(c_int, String)>> {
        let topic = CString::new(topic).map_err(|_| PyValueError::new_err("a NUL in the topic"))?;
        let mut names = Vec::new();
        let mut values: Vec<Option<Vec<u8>>> = Vec::new();
        for pair in headers.into_iter().flat_map(|tuple| tuple.iter()) {
            let (name, value): (String, Option<Vec<u8>>) = pair.extract()?;
            names.push(
                CString::new(name).map_err(|_| PyValueError::new_err("a NUL in a header name"))?,
            );
            values.push(value);
        }
        let pairs: Vec<HeaderPair<'_>> = names
            .iter()
            .zip(&values)
            .map(|(name, value)| (name.as_c_str(), value.as_deref()))
            .collect();
        self.produce(
            py,
            &Record {
                topic: &topic,
                partition,
                key,
                value,
                timestamp_ms,
                headers: &pairs,
            },
        )
    }
}

/// C strings of a call's topics and header names, made once per distinct str object (the records share theirs).
#[derive(Default)]
pub struct CNames {
    names: HashMap<usize, CString>,
}

impl CNames {
    /// Make `name`'s C string if it is not made yet; returns its key for `get`, or None when `name` is not an
    /// exact str or holds a NUL (its record then goes through Python).
    pub fn ensure(&mut self, name: &Bound<'_, PyAny>) -> Option<usize> {
        let address = name.as_ptr() as usize;
        if let Entry::Vacant(slot) = self.names.entry(address) {
            let text = name.cast_exact::<PyString>().ok()?.to_str().ok()?;
            // The str is kept alive by its action for the whole call, and so is the address it is found by.
            slot.insert(CString::new(text).ok()?);
        }
        Some(address)
    }

    pub fn get(&self, key: usize) -> &CStr {
        &self.names[&key]
    }
}

/// A key or value as `Producer.produce` takes it (`z#`: None, or bytes), else None (the record goes through Python).
pub fn bytes_or_none<'a>(value: &'a Bound<'_, PyAny>) -> Option<Option<&'a [u8]>> {
    if value.is_none() {
        return Some(None);
    }
    value
        .cast_exact::<PyBytes>()
        .ok()
        .map(|bytes| Some(bytes.as_bytes()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DirectProducer>()?;
    Ok(())
}
