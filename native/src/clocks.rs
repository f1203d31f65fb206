//! The reference mapping of timesync/clocks.py (`t_ref = t_source + offset_us`, and the error bound), compiled: the
//! per-event step between the reorderer and the merge, which the native reorderer's `take_run`, the merger and the
//! record builder used to ask of the Python mapping about twice per event (`to_reference` at the take, and again
//! for the error bound of an event released in a later call than it was pushed in).
//!
//! `ReferenceClocks` stands for one Python mapping (gateway/native.py's `native_reference_mapping` builds it) and
//! answers as it does, value for value: `IdentityMapping` (every source is on the reference clock),
//! `FixedOffsetMapping` (its offsets and error bound, read once: the mapping copies them when built and never
//! changes them), and `EstimateMapping` over a live dict of estimates (a `SourceInfoStore`'s entries, or the
//! mapping's own dict), read at every call: each source's estimate is looked up in that dict (a C dict lookup, no
//! Python frame) and its parameters are parsed again only when the entry is another object than the last time (a
//! store update replaces it; both classes are frozen), so an update or a removal counts from the next event on,
//! exactly as the Python mapping's lookup does. `ClockEstimate.to_reference_us` and `error_bound_us` are computed
//! with the same float operations in the same order (Python's int -> float conversions and Rust's round to
//! nearest, ties to even, alike; `round` is ties to even, `math.ceil` is `ceil`). Anything else (a result outside
//! i64, a non-finite float, a field of another type, an entry of another class, a source id that is not a str)
//! is answered by the Python mapping itself: tests/unit/native/test_native_reference_clocks.py holds both to
//! the same results.

use std::collections::HashMap;
use std::sync::Mutex;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyInt, PyString, PyTuple, PyType};

/// timesync.clocks.UNKNOWN_ERROR_BOUND_US: the bound of a source without an estimate.
pub const UNKNOWN_ERROR_BOUND_US: i64 = 3_600_000_000;
/// timesync.estimator._US_PER_PPM_S.
const US_PER_PPM_S: f64 = 1e-6;
/// Floats and ints above this convert to each other exactly, so `int + int` then float equals float + float.
const EXACT_FLOAT_INT: i64 = 1 << 52;

/// The fields of a `ClockEstimate` its mapping reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EstimateParams {
    pub offset_us: i64,
    pub skew_ppm: f64,
    pub sync_ref_us: i64,
    pub root_error_us: f64,
    pub dispersion_ppm: f64,
    pub skew_error_ppm: f64,
}

impl EstimateParams {
    /// `(est.to_reference_us(ts), est.error_bound_us(that))` as `EstimateMapping.to_reference` computes them, or
    /// None where Python's result is not an i64 (a bigger int, or the error of a non-finite float).
    pub fn to_reference(&self, source_ts_us: i64) -> Option<(i64, i64)> {
        // offset_at_us(approx_ref_us) = offset_us + skew_ppm * _US_PER_PPM_S * (approx_ref_us - sync_ref_us)
        let approx_ref_us = i128::from(source_ts_us) + i128::from(self.offset_us);
        let since_sync = (approx_ref_us - i128::from(self.sync_ref_us)) as f64;
        let offset_at_us = self.offset_us as f64 + self.skew_ppm * US_PER_PPM_S * since_sync;
        let ref_us = exact_i64((source_ts_us as f64 + offset_at_us).round_ties_even())?;
        // error_bound_us(ref_us) = ceil(root_error_us + (dispersion + skew_error) * _US_PER_PPM_S * |ref - sync|)
        let elapsed_us = (i128::from(ref_us) - i128::from(self.sync_ref_us)).abs() as f64;
        let growth = (self.dispersion_ppm + self.skew_error_ppm) * US_PER_PPM_S * elapsed_us;
        let error_us = exact_i64((self.root_error_us + growth).ceil())?;
        Some((ref_us, error_us))
    }
}

/// A whole float in i64's range as that i64 (exact: the float is whole).
fn exact_i64(value: f64) -> Option<i64> {
    // 2^63 is a float exactly; every float below it in magnitude that is whole fits.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    (value.is_finite() && (-LIMIT..LIMIT).contains(&value)).then_some(value as i64)
}

/// One source's entry as last parsed: the entry object (kept, so its address cannot be another's) and what it says.
struct Parsed {
    entry: Py<PyAny>,
    /// None: an entry this module does not compute (the Python mapping answers).
    params: Option<EstimateParams>,
    rtt_us: Py<PyAny>,
}

enum Table {
    Identity,
    /// FixedOffsetMapping's offsets and error bound; None when one of them is not an i64 (Python answers).
    Offsets(Option<(HashMap<String, i64>, i64)>),
    Estimates {
        entries: Py<PyDict>,
        info_class: Py<PyType>,
        estimate_class: Py<PyType>,
        parsed: Mutex<HashMap<String, Parsed>>,
    },
}

/// A Python mapping (timesync.clocks.ReferenceMapping) and its arithmetic in Rust.
#[pyclass(name = "ReferenceClocks", module = "skewless_native", frozen)]
pub struct ReferenceClocks {
    mapping: Py<PyAny>,
    table: Table,
}

impl ReferenceClocks {
    /// `to_reference(source_id, source_ts_us)` computed here, or None where the Python mapping must answer.
    pub fn map_native(
        &self,
        source_id: &Bound<'_, PyString>,
        source_ts_us: i64,
    ) -> PyResult<Option<(i64, i64)>> {
        match &self.table {
            Table::Identity => Ok(Some((source_ts_us, 0))),
            Table::Offsets(None) => Ok(None),
            Table::Offsets(Some((offsets, error_us))) => {
                let offset = offsets.get(source_id.to_str()?).copied().unwrap_or(0);
                Ok(source_ts_us
                    .checked_add(offset)
                    .map(|ref_us| (ref_us, *error_us)))
            }
            Table::Estimates { .. } => Ok(match self.estimate_of(source_id)? {
                Lookup::Unknown => Some((source_ts_us, UNKNOWN_ERROR_BOUND_US)),
                Lookup::Known(params, _) => params.to_reference(source_ts_us),
                Lookup::Python => None,
            }),
        }
    }

    /// `rtt_us(source_id)` read here, or None where the Python mapping must answer.
    pub fn rtt_native<'py>(
        &self,
        source_id: &Bound<'py, PyString>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let py = source_id.py();
        match &self.table {
            Table::Identity | Table::Offsets(_) => Ok(Some(py.None().into_bound(py))),
            Table::Estimates { .. } => Ok(match self.estimate_of(source_id)? {
                Lookup::Unknown => Some(py.None().into_bound(py)),
                Lookup::Known(_, rtt_us) => Some(rtt_us),
                Lookup::Python => None,
            }),
        }
    }

    fn estimate_of<'py>(&self, source_id: &Bound<'py, PyString>) -> PyResult<Lookup<'py>> {
        let Table::Estimates {
            entries,
            info_class,
            estimate_class,
            parsed,
        } = &self.table
        else {
            return Ok(Lookup::Python);
        };
        let py = source_id.py();
        let entry = entries.bind(py).get_item(source_id)?;
        let key = source_id.to_str()?;
        let Ok(mut parsed) = parsed.try_lock() else {
            return Ok(match entry {
                None => Lookup::Unknown,
                Some(_) => Lookup::Python,
            });
        };
        let Some(entry) = entry else {
            // A source the store forgot: its parsed estimate goes too, so the cache holds no more sources than
            // the store (none when no source has an estimate).
            if !parsed.is_empty() {
                parsed.remove(key);
            }
            return Ok(Lookup::Unknown);
        };
        if let Some(known) = parsed.get(key).filter(|p| p.entry.bind(py).is(&entry)) {
            return Ok(known.lookup(py));
        }
        let estimate = if entry.get_type().is(info_class.bind(py)) {
            entry.getattr(intern!(py, "estimate"))?
        } else {
            entry.clone()
        };
        let params = if estimate.get_type().is(estimate_class.bind(py)) {
            estimate_params(&estimate)?
        } else {
            None
        };
        let rtt_us = match params {
            Some(_) => estimate.getattr(intern!(py, "rtt_us"))?.unbind(),
            None => py.None(),
        };
        let known = Parsed {
            entry: entry.unbind(),
            params,
            rtt_us,
        };
        let lookup = known.lookup(py);
        parsed.insert(key.to_owned(), known);
        Ok(lookup)
    }

    fn python_mapping<'py>(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.mapping.bind(py)
    }
}

enum Lookup<'py> {
    Unknown,
    Known(EstimateParams, Bound<'py, PyAny>),
    Python,
}

impl Parsed {
    fn lookup<'py>(&self, py: Python<'py>) -> Lookup<'py> {
        match self.params {
            Some(params) => Lookup::Known(params, self.rtt_us.bind(py).clone()),
            None => Lookup::Python,
        }
    }
}

/// A ClockEstimate's fields, or None when one has a type whose Python arithmetic differs from the f64/i64 one
/// (a float offset, a huge int among the float fields, a bool).
fn estimate_params(estimate: &Bound<'_, PyAny>) -> PyResult<Option<EstimateParams>> {
    let py = estimate.py();
    let int = |name: &Bound<'_, PyString>| -> PyResult<Option<i64>> {
        let value = estimate.getattr(name)?;
        Ok(if value.is_exact_instance_of::<PyInt>() {
            value.extract::<i64>().ok()
        } else {
            None
        })
    };
    let float = |name: &Bound<'_, PyString>| -> PyResult<Option<f64>> {
        let value = estimate.getattr(name)?;
        Ok(if value.is_exact_instance_of::<PyFloat>() {
            value.extract::<f64>().ok()
        } else if value.is_exact_instance_of::<PyInt>() {
            value
                .extract::<i64>()
                .ok()
                .filter(|v| v.abs() <= EXACT_FLOAT_INT)
                .map(|v| v as f64)
        } else {
            None
        })
    };
    let (Some(offset_us), Some(sync_ref_us)) = (
        int(intern!(py, "offset_us"))?,
        int(intern!(py, "sync_ref_us"))?,
    ) else {
        return Ok(None);
    };
    let (Some(skew_ppm), Some(root_error_us), Some(dispersion_ppm), Some(skew_error_ppm)) = (
        float(intern!(py, "skew_ppm"))?,
        float(intern!(py, "root_error_us"))?,
        float(intern!(py, "dispersion_ppm"))?,
        float(intern!(py, "skew_error_ppm"))?,
    ) else {
        return Ok(None);
    };
    Ok(Some(EstimateParams {
        offset_us,
        skew_ppm,
        sync_ref_us,
        root_error_us,
        dispersion_ppm,
        skew_error_ppm,
    }))
}

/// FixedOffsetMapping's offsets and error bound as i64s, or None when one is not an exact int of that range.
fn offsets_of(
    offsets_us: &Bound<'_, PyDict>,
    error_bound_us: &Bound<'_, PyAny>,
) -> PyResult<Option<(HashMap<String, i64>, i64)>> {
    let small = |value: &Bound<'_, PyAny>| {
        value
            .is_exact_instance_of::<PyInt>()
            .then(|| value.extract::<i64>().ok())
            .flatten()
    };
    let Some(error_us) = small(error_bound_us) else {
        return Ok(None);
    };
    let mut offsets = HashMap::with_capacity(offsets_us.len());
    for (source_id, offset) in offsets_us.iter() {
        let (Ok(source_id), Some(offset)) = (source_id.cast_exact::<PyString>(), small(&offset))
        else {
            return Ok(None);
        };
        offsets.insert(source_id.to_str()?.to_owned(), offset);
    }
    Ok(Some((offsets, error_us)))
}

/// What `clock.to_reference(source_id, source_ts_us)` gave: its two ints, or the Python mapping's own answer.
pub enum Mapped<'py> {
    Native(i64, i64),
    Python(Bound<'py, PyAny>),
}

impl<'py> Mapped<'py> {
    /// The `(ref_us, error_us)` tuple the Python mapping returns.
    pub fn into_tuple(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Mapped::Native(ref_us, error_us) => {
                Ok(PyTuple::new(py, [ref_us, error_us])?.into_any())
            }
            Mapped::Python(mapped) => Ok(mapped),
        }
    }
}

/// `clock.to_reference(source_id, source_ts_us)`: in Rust when `clock` is a ReferenceClocks that computes it,
/// else the Python call.
pub fn to_reference<'py>(
    clock: &Bound<'py, PyAny>,
    source_id: &Bound<'py, PyAny>,
    source_ts_us: &Bound<'py, PyAny>,
) -> PyResult<Mapped<'py>> {
    let py = clock.py();
    let Ok(clocks) = clock.cast::<ReferenceClocks>() else {
        return clock
            .call_method1(intern!(py, "to_reference"), (source_id, source_ts_us))
            .map(Mapped::Python);
    };
    let clocks = clocks.get();
    if let Ok(source) = source_id.cast_exact::<PyString>() {
        if source_ts_us.is_exact_instance_of::<PyInt>() {
            if let Ok(ts) = source_ts_us.extract::<i64>() {
                if let Some((ref_us, error_us)) = clocks.map_native(source, ts)? {
                    return Ok(Mapped::Native(ref_us, error_us));
                }
            }
        }
    }
    clocks
        .python_mapping(py)
        .call_method1(intern!(py, "to_reference"), (source_id, source_ts_us))
        .map(Mapped::Python)
}

/// `clock.rtt_us(source_id)`: read in Rust when `clock` is a ReferenceClocks that has it, else the Python call.
pub fn rtt_us<'py>(
    clock: &Bound<'py, PyAny>,
    source_id: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = clock.py();
    if let Ok(clocks) = clock.cast::<ReferenceClocks>() {
        if let Some(rtt_us) = clocks.get().rtt_native(source_id)? {
            return Ok(rtt_us);
        }
        return clocks
            .get()
            .python_mapping(py)
            .call_method1(intern!(py, "rtt_us"), (source_id,));
    }
    clock.call_method1(intern!(py, "rtt_us"), (source_id,))
}

#[pymethods]
impl ReferenceClocks {
    /// `mapping` is an IdentityMapping: every source maps to itself with a zero bound.
    #[staticmethod]
    fn identity(mapping: &Bound<'_, PyAny>) -> Self {
        ReferenceClocks {
            mapping: mapping.clone().unbind(),
            table: Table::Identity,
        }
    }

    /// `mapping` is a FixedOffsetMapping with these offsets (a source not among them: 0) and error bound.
    #[staticmethod]
    fn fixed_offsets(
        mapping: &Bound<'_, PyAny>,
        offsets_us: &Bound<'_, PyDict>,
        error_bound_us: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        Ok(ReferenceClocks {
            mapping: mapping.clone().unbind(),
            table: Table::Offsets(offsets_of(offsets_us, error_bound_us)?),
        })
    }

    /// `mapping` is an EstimateMapping whose lookup is `entries.get`: each value a `info_class` (SourceInfo, whose
    /// `estimate` is read) or an `estimate_class` (ClockEstimate); `entries` is read at every call.
    #[staticmethod]
    fn estimates(
        mapping: &Bound<'_, PyAny>,
        entries: &Bound<'_, PyDict>,
        info_class: &Bound<'_, PyType>,
        estimate_class: &Bound<'_, PyType>,
    ) -> Self {
        ReferenceClocks {
            mapping: mapping.clone().unbind(),
            table: Table::Estimates {
                entries: entries.clone().unbind(),
                info_class: info_class.clone().unbind(),
                estimate_class: estimate_class.clone().unbind(),
                parsed: Mutex::new(HashMap::new()),
            },
        }
    }

    /// How many sources' estimates are parsed and kept (never more than the store holds, once each source was
    /// looked up since its removal).
    #[getter]
    fn parsed_sources(&self) -> usize {
        match &self.table {
            Table::Estimates { parsed, .. } => parsed.lock().map_or(0, |parsed| parsed.len()),
            _ => 0,
        }
    }

    /// The Python mapping this one answers for.
    #[getter]
    fn mapping(&self, py: Python<'_>) -> Py<PyAny> {
        self.mapping.clone_ref(py)
    }

    #[pyo3(name = "to_reference")]
    fn py_to_reference<'py>(
        slf: &Bound<'py, Self>,
        source_id: &Bound<'py, PyAny>,
        source_ts_us: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        crate::decode::guard("ReferenceClocks.to_reference", || {
            to_reference(slf.as_any(), source_id, source_ts_us)?.into_tuple(py)
        })
    }

    #[pyo3(name = "rtt_us")]
    fn py_rtt_us<'py>(
        slf: &Bound<'py, Self>,
        source_id: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        match source_id.cast_exact::<PyString>() {
            Ok(source) => {
                crate::decode::guard("ReferenceClocks.rtt_us", || rtt_us(slf.as_any(), source))
            }
            Err(_) => slf
                .get()
                .python_mapping(py)
                .call_method1(intern!(py, "rtt_us"), (source_id,)),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "ReferenceClocks({})",
            self.mapping.bind(py).repr()?
        ))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ReferenceClocks>()?;
    m.add("UNKNOWN_ERROR_BOUND_US", UNKNOWN_ERROR_BOUND_US)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(offset_us: i64, skew_ppm: f64) -> EstimateParams {
        EstimateParams {
            offset_us,
            skew_ppm,
            sync_ref_us: 1_800_000_000_000_000,
            root_error_us: 200.0,
            dispersion_ppm: 15.0,
            skew_error_ppm: 1.0,
        }
    }

    #[test]
    fn an_estimate_maps_as_the_python_arithmetic_does() {
        // Python: est = ClockEstimate(offset_us=-1000, skew_ppm=20.0, rtt_us=400, sync_ref_us=1.8e15,
        // sample_count=10, root_error_us=200.0, skew_error_ppm=1.0, dispersion_ppm=15.0);
        // t = 1_800_000_010_001_000: ref = round(t + (-1000 + 20e-6 * (t - 1000 - sync))) = t - 1000 + 200
        // (10 s since the sync at 20 ppm); error = ceil(200 + 16e-6 * 10_000_200) = ceil(360.0032) = 361.
        let t = 1_800_000_010_001_000;
        assert_eq!(params(-1000, 20.0).to_reference(t), Some((t - 800, 361)));
        // No skew, at the sync point: the offset and the root error.
        let at_sync = params(5, 0.0).to_reference(1_800_000_000_000_000 - 5);
        assert_eq!(at_sync, Some((1_800_000_000_000_000, 200)));
    }

    #[test]
    fn round_is_ties_to_even_as_python_s() {
        // skew 0.5 ppm over 1 s is 0.5 us: round(t + 0.5) is t for an even t, t + 1 for an odd one.
        let mut p = params(0, 0.5);
        p.root_error_us = 0.0;
        p.dispersion_ppm = 0.0;
        p.skew_error_ppm = 0.0;
        let even = p.sync_ref_us + 1_000_000;
        assert_eq!(p.to_reference(even).map(|r| r.0), Some(even));
        assert_eq!(p.to_reference(even + 1).map(|r| r.0), Some(even + 2));
    }

    #[test]
    fn results_beyond_i64_or_not_finite_are_left_to_python() {
        assert_eq!(params(0, f64::NAN).to_reference(0), None);
        assert_eq!(params(i64::MAX, 0.0).to_reference(i64::MAX), None);
        let mut p = params(0, 0.0);
        p.root_error_us = f64::INFINITY;
        assert_eq!(p.to_reference(0), None);
        assert_eq!(exact_i64(-9_223_372_036_854_775_808.0), Some(i64::MIN));
        assert_eq!(exact_i64(9_223_372_036_854_775_808.0), None);
    }
}
