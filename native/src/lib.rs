//! The gateway's per-event data plane, compiled. Each module mirrors one Python core (its executable
//! specification, named in the module's doc) and is tested against it by the differential property tests in
//! tests/unit/native/test_native_*.py.

use pyo3::prelude::*;

pub mod clocks;
pub mod decode;
pub mod dedup;
pub mod deliveries;
pub mod direct_produce;
pub mod events;
pub mod frame;
pub mod merger;
pub mod payload;
pub mod pipeline;
pub mod produce_loop;
pub mod pyrecords;
pub mod records;
pub mod sequence;

/// The ABI of this module: the Python side refuses a build whose version differs (a stale `maturin develop`).
pub const NATIVE_ABI: u32 = 1;

#[pymodule]
fn skewless_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("NATIVE_ABI", NATIVE_ABI)?;
    sequence::py::register(m)?;
    decode::register(m)?;
    m.add_class::<frame::EventFrame>()?;
    records::register(m)?;
    merger::python::register(m)?;
    dedup::register(m)?;
    clocks::register(m)?;
    deliveries::register(m)?;
    produce_loop::register(m)?;
    direct_produce::register(m)?;
    Ok(())
}
