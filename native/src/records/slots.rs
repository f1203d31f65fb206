//! Instances of a Python slots class built here without running its Python `__init__`: gateway.ingest's `Produce`
//! and `DeliveryRef` (dataclasses with `slots=True`), one of each per record. Calling the class from Rust runs
//! `type.__call__`, `object.__new__` and the generated `__init__` (a Python frame storing each field): about half a
//! microsecond per record for the two. Here the instance is allocated by the class's own `tp_alloc` and each
//! field's reference is stored in its slot, which is all that `__init__` does.
//!
//! Only a class shown to be such a class takes this path (`SlotsClass::probe`): its `__new__` is `object.__new__`,
//! it has no `__post_init__`, no `__dict__` or `__weakref__` slot, exactly one pointer-sized slot per field of its
//! `__match_args__` (the dataclass's `__init__` parameters, in order), and where each field's slot lies is found by
//! storing a marker through the class's own descriptor and finding it in the instance's memory (no assumption
//! about how CPython orders slots). The probe then builds one instance both ways and requires them equal. Any
//! other class (a test's stand-in, say) is called as before.

use std::os::raw::c_void;

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};

/// gateway.ingest.Produce's fields, in `__match_args__` order (its `__init__` parameters): the index of each
/// one's slot for `SlotsClass::get`/`get_raw`/`build`, declared here once for every module that reads or builds one.
pub mod produce_fields {
    pub const TOPIC: usize = 0;
    pub const KEY: usize = 1;
    pub const VALUE: usize = 2;
    pub const DELIVERY: usize = 3;
    pub const TIMESTAMP_MS: usize = 4;
    pub const HEADERS: usize = 5;
    /// How many: what `SlotsClass::probe` is given for Produce.
    pub const COUNT: usize = 6;
}

/// gateway.ingest.DeliveryRef's fields, in `__match_args__` order, as `produce_fields` for Produce.
pub mod delivery_ref_fields {
    pub const SOURCE_ID: usize = 0;
    pub const STREAM: usize = 1;
    pub const SEQ: usize = 2;
    pub const TOPIC: usize = 3;
    pub const RELEASED_US: usize = 4;
    /// How many: what `SlotsClass::probe` is given for DeliveryRef.
    pub const COUNT: usize = 5;
}

/// A slots class and the byte offset of each `__init__` parameter's slot in its instances.
pub struct SlotsClass {
    class: Py<PyType>,
    alloc: ffi::allocfunc,
    offsets: Vec<usize>,
    /// Whether `build` takes its instances off the cyclic collector's lists (`untracked`).
    untracked: bool,
}

impl SlotsClass {
    /// The class's fast constructor for `fields` fields, or None when `class` is not a plain slots dataclass.
    pub fn probe(class: &Bound<'_, PyAny>, fields: usize) -> PyResult<Option<Self>> {
        let py = class.py();
        let Ok(class) = class.cast::<PyType>() else {
            return Ok(None);
        };
        let object = py.get_type::<pyo3::types::PyAny>();
        let plain = class
            .getattr(intern!(py, "__new__"))?
            .is(object.getattr(intern!(py, "__new__"))?)
            && !class.hasattr(intern!(py, "__post_init__"))?
            && class
                .getattr(intern!(py, "__dictoffset__"))?
                .extract::<isize>()?
                == 0
            && class
                .getattr(intern!(py, "__weakrefoffset__"))?
                .extract::<isize>()?
                == 0;
        if !plain {
            return Ok(None);
        }
        let Ok(names) = class
            .getattr(intern!(py, "__match_args__"))?
            .cast_into::<PyTuple>()
        else {
            return Ok(None);
        };
        let header = object
            .getattr(intern!(py, "__basicsize__"))?
            .extract::<usize>()?;
        let size = class
            .getattr(intern!(py, "__basicsize__"))?
            .extract::<usize>()?;
        let word = std::mem::size_of::<*mut ffi::PyObject>();
        if names.len() != fields || size != header + fields * word {
            return Ok(None);
        }
        // SAFETY: a type object's tp_alloc slot; PyType_GetSlot returns NULL (no error) where there is none.
        let alloc = unsafe { ffi::PyType_GetSlot(class.as_ptr().cast(), ffi::Py_tp_alloc) };
        if alloc.is_null() {
            return Ok(None);
        }
        // SAFETY: the Py_tp_alloc slot holds an allocfunc.
        let alloc = unsafe { std::mem::transmute::<*mut c_void, ffi::allocfunc>(alloc) };
        let instance = object.call_method1(intern!(py, "__new__"), (class,))?;
        let markers: Vec<Bound<'_, PyAny>> = (0..fields)
            .map(|_| object.call0())
            .collect::<PyResult<_>>()?;
        for (name, marker) in names.iter().zip(&markers) {
            let Ok(name) = name.cast_into::<PyString>() else {
                return Ok(None);
            };
            // A frozen dataclass refuses the store: its own __init__ (object.__setattr__) is then the way.
            if instance.setattr(name, marker).is_err() {
                return Ok(None);
            }
        }
        let mut offsets = Vec::with_capacity(fields);
        for marker in &markers {
            let found: Vec<usize> = (0..fields)
                .map(|slot| header + slot * word)
                // SAFETY: within the instance's basicsize, each word after the header is a slot's pointer.
                .filter(
                    |&offset| unsafe { read_slot(instance.as_ptr(), offset) } == marker.as_ptr(),
                )
                .collect();
            if found.len() != 1 {
                return Ok(None);
            }
            offsets.push(found[0]);
        }
        let slots = SlotsClass {
            class: class.clone().unbind(),
            alloc,
            offsets,
            untracked: false,
        };
        let refs: Vec<&Bound<'_, PyAny>> = markers.iter().collect();
        let built = slots.build(py, &refs)?;
        if !built.eq(class.call1(PyTuple::new(py, &markers)?)?)? {
            return Ok(None);
        }
        Ok(Some(slots))
    }

    /// This class, whose instances `build` then untracks from the cyclic garbage collector: for a class whose
    /// instances never close a reference cycle (gateway.ingest's Produce and DeliveryRef hold strs, bytes, ints, a
    /// DeliveryRef and a headers tuple; an IncomingEvent the decoder built holds a payload decoded for it alone,
    /// which refers to nothing else). Reference counting frees them as before; the collector no longer walks them
    /// (a young collection walked every event's two to three such instances alive since the last one: about a
    /// tenth of the native core's CPU per event in benchmarks/gateway_hotpath.py), as CPython itself untracks a
    /// tuple or a dict that holds no container.
    pub fn untracked(mut self) -> Self {
        self.untracked = true;
        self
    }

    /// `class(*values)`, without its `__init__`: `values` has one value per field, in `__match_args__` order.
    pub fn build<'py>(
        &self,
        py: Python<'py>,
        values: &[&Bound<'py, PyAny>],
    ) -> PyResult<Bound<'py, PyAny>> {
        assert_eq!(values.len(), self.offsets.len(), "one value per field");
        // SAFETY: tp_alloc of the probed class gives a zeroed instance (NULL slots, GC-tracked for a GC type) or
        // NULL with an exception set; each slot then gets a new reference, as `__init__`'s stores would. No Python
        // code runs between the allocation and the last store.
        unsafe {
            let instance = (self.alloc)(self.class.as_ptr().cast(), 0);
            if instance.is_null() {
                return Err(PyErr::fetch(py));
            }
            for (&offset, value) in self.offsets.iter().zip(values) {
                let slot = instance
                    .cast::<u8>()
                    .add(offset)
                    .cast::<*mut ffi::PyObject>();
                *slot = (*value).clone().into_ptr();
            }
            if self.untracked && ffi::PyType_IS_GC(ffi::Py_TYPE(instance)) != 0 {
                ffi::PyObject_GC_UnTrack(instance.cast());
            }
            Ok(Bound::from_owned_ptr(py, instance))
        }
    }
}

impl SlotsClass {
    /// Field `index` (in `__match_args__` order) of `object` when it is an instance of exactly this class and the
    /// field is set: read from its slot, without the descriptor call `getattr` makes. None otherwise.
    pub fn get<'py>(&self, object: &Bound<'py, PyAny>, index: usize) -> Option<Bound<'py, PyAny>> {
        let py = object.py();
        let offset = *self.offsets.get(index)?;
        if !object.get_type().is(self.class.bind(py)) {
            return None;
        }
        // SAFETY: `object` is an instance of the probed class, whose slot for this field lies at `offset`; the GIL
        // is held, so the reference read is alive until another Python operation, and is taken as a new one.
        unsafe {
            let value = read_slot(object.as_ptr(), offset);
            (!value.is_null()).then(|| Bound::from_borrowed_ptr(py, value))
        }
    }
}

/// The pointer stored at `offset` bytes into the object.
///
/// # Safety
/// `offset` must lie within the object's basicsize, pointer-aligned.
unsafe fn read_slot(object: *mut ffi::PyObject, offset: usize) -> *mut ffi::PyObject {
    *object.cast::<u8>().add(offset).cast::<*mut ffi::PyObject>()
}

impl SlotsClass {
    /// `get` without a new reference: the field's object as the instance holds it, for a caller that reads many
    /// (native/src/deliveries.rs reads five fields of each of thousands of instances in one call).
    ///
    /// # Safety
    /// `object` must point to a live object and the GIL be held; the pointer returned is valid as long as
    /// `object` is alive and that field is not assigned (no Python code runs in between).
    pub unsafe fn get_raw(
        &self,
        object: *mut ffi::PyObject,
        index: usize,
    ) -> Option<*mut ffi::PyObject> {
        let offset = *self.offsets.get(index)?;
        if ffi::Py_TYPE(object) != self.class.as_ptr().cast::<ffi::PyTypeObject>() {
            return None;
        }
        let value = read_slot(object, offset);
        (!value.is_null()).then_some(value)
    }
}
