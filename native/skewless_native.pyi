# Types of the compiled module (native/src): maturin ships this file in the wheel; mypy reads it through mypy_path.
# One section per Rust module, in the order of native/src/lib.rs.

NATIVE_ABI: int
