//! How a core's outputs become Python objects: the record classes of reorder/records.py given by the caller (the
//! extension imports nothing of the Python packages), or tuples tagged by kind when none are given.

use pyo3::prelude::*;
use pyo3::types::{PyTuple, PyType};
use pyo3::IntoPyObjectExt;

/// The record class of each output kind. A tuple subclass (a NamedTuple) is built by `tuple.__new__` directly,
/// which its generated `__new__` calls anyway: one Python call fewer per record.
pub struct RecordClasses<const N: usize> {
    classes: [Py<PyAny>; N],
    tuple_new: Option<Py<PyAny>>,
}

impl<const N: usize> RecordClasses<N> {
    pub fn new(py: Python<'_>, classes: [Bound<'_, PyAny>; N]) -> PyResult<Self> {
        let tuple_type = py.get_type::<PyTuple>();
        let all_tuples = classes.iter().all(|c| {
            c.cast::<PyType>()
                .is_ok_and(|t| t.is_subclass(&tuple_type).unwrap_or(false))
        });
        let tuple_new = if all_tuples {
            Some(tuple_type.getattr("__new__")?.unbind())
        } else {
            None
        };
        Ok(Self {
            classes: classes.map(Bound::unbind),
            tuple_new,
        })
    }
}

/// Builds output `kind` from its fields: the caller's class, or `(kind, *fields)` without classes.
pub fn build_record<'py, const N: usize>(
    py: Python<'py>,
    classes: Option<&RecordClasses<N>>,
    kind: usize,
    fields: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    match classes {
        None => {
            let mut items = Vec::with_capacity(fields.len() + 1);
            items.push(kind.into_bound_py_any(py)?);
            items.extend(fields);
            Ok(PyTuple::new(py, items)?.into_any())
        }
        Some(records) => {
            let cls = records.classes[kind].bind(py);
            let args = PyTuple::new(py, fields)?;
            match &records.tuple_new {
                Some(tuple_new) => tuple_new.bind(py).call1((cls, args)),
                None => cls.call1(args),
            }
        }
    }
}
