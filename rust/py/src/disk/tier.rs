//! `_TierBase`: the native local-hit path of `jitkey.TieredIndex` (python/jitkey/remote.py).
//!
//! A child of the `disk` module so that it can call `DiskIndex.get`'s Rust code directly.

use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::PyDiskIndex;

/// Base class of `jitkey.TieredIndex`: `get(key)` looks the key up in the local `DiskIndex` natively and
/// calls the Python `on_miss(key)` only on a local miss, so a local hit costs what `DiskIndex.get` costs.
#[pyclass(name = "_TierBase", module = "jitkey._core", subclass, frozen)]
pub(crate) struct TierBase {
    parts: OnceLock<(Py<PyDiskIndex>, Py<PyAny>)>,
}

#[pymethods]
impl TierBase {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self { parts: OnceLock::new() }
    }

    /// Sets the local index and the miss handler (once per object).
    #[pyo3(signature = (local, on_miss, /))]
    fn _tier_init(&self, local: Py<PyDiskIndex>, on_miss: Py<PyAny>) -> PyResult<()> {
        self.parts
            .set((local, on_miss))
            .map_err(|_| PyRuntimeError::new_err("_TierBase is already initialised"))
    }

    /// The local value, else `on_miss(key)`.
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let Some((local, on_miss)) = self.parts.get() else {
            return Err(PyRuntimeError::new_err("TieredIndex.__init__ was not called"));
        };
        match local.get().get(py, key)? {
            Some(value) => Ok(value.into_any()),
            None => on_miss.bind(py).call1((key,)),
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TierBase>()
}
