//! `_TierBase`: the native local-hit path of `jitkey.TieredIndex` (python/jitkey/remote.py).
//!
//! A child of the `disk` module so that it can call `DiskIndex.get`'s Rust code directly.

use std::sync::OnceLock;

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::PyDiskIndex;

/// Base class of `jitkey.TieredIndex`: `get(key)` looks the key up in the local `DiskIndex` natively and
/// calls the subclass's Python `_on_miss(key)` only on a local miss, so a local hit costs what `DiskIndex.get`
/// costs. (The subclass hook by method name, as `_KernelBase` calls `_subscript`.)
#[pyclass(name = "_TierBase", module = "jitkey._core", subclass, frozen)]
pub(crate) struct TierBase {
    local: OnceLock<Py<PyDiskIndex>>,
}

#[pymethods]
impl TierBase {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self { local: OnceLock::new() }
    }

    /// Sets the local index (once per object).
    #[pyo3(signature = (local, /))]
    fn _tier_init(&self, local: Py<PyDiskIndex>) -> PyResult<()> {
        self.local.set(local).map_err(|_| PyRuntimeError::new_err("_TierBase is already initialised"))
    }

    /// The local value, else `self._on_miss(key)`.
    fn get<'py>(slf: &Bound<'py, Self>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let Some(local) = slf.get().local.get() else {
            return Err(PyRuntimeError::new_err("TieredIndex.__init__ was not called"));
        };
        match local.get().get(py, key)? {
            Some(value) => Ok(value.into_any()),
            None => slf.call_method1(intern!(py, "_on_miss"), (key,)),
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TierBase>()
}
