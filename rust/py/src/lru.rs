//! `jitkey.LruCache`: the Python face of `jitkey_core::lru::Cache<Py<PyAny>>`.
//!
//! INTERFACE STUB (foundation commit): the crate-visible API below (`get_encoded`,
//! `insert_encoded`) is what `Signature` builds on; issue #3 completes the Python API.

use jitkey_core::lru::Cache;
use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::keys::{fast_hash_state, with_encoding};

#[pyclass(name = "LruCache", module = "jitkey._core", frozen)]
pub(crate) struct PyLruCache {
    inner: Cache<Py<PyAny>>,
}

impl PyLruCache {
    /// The value stored under an encoding (with its fast hash), as a new strong reference.
    pub(crate) fn get_encoded<'py>(
        &self,
        py: Python<'py>,
        hash: u64,
        key: &[u8],
    ) -> Option<Bound<'py, PyAny>> {
        self.inner.get_with(hash, key, |v| v.bind(py).clone())
    }

    /// Stores `value` under an encoding; displaced values are dropped after the cache's locks.
    pub(crate) fn insert_encoded(&self, hash: u64, key: &[u8], value: Py<PyAny>) {
        drop(self.inner.insert(hash, key, value));
    }
}

#[pymethods]
impl PyLruCache {
    #[new]
    #[pyo3(signature = (capacity, *, shards = None))]
    fn new(capacity: usize, shards: Option<usize>) -> PyResult<Self> {
        if capacity == 0 {
            return Err(PyValueError::new_err("capacity must be at least 1"));
        }
        Ok(Self { inner: Cache::new(capacity, shards) })
    }

    #[pyo3(signature = (key, default = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let hit = with_encoding(key, "key", |enc| self.get_encoded(py, fast_hash_state().hash(enc), enc))?;
        Ok(hit.or(default).unwrap_or_else(|| py.None().into_bound(py)))
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        with_encoding(key, "key", |enc| self.get_encoded(py, fast_hash_state().hash(enc), enc))?
            .ok_or_else(|| PyKeyError::new_err(key.clone().unbind()))
    }

    fn __setitem__(&self, key: &Bound<'_, PyAny>, value: Py<PyAny>) -> PyResult<()> {
        with_encoding(key, "key", |enc| self.insert_encoded(fast_hash_state().hash(enc), enc, value))
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        with_encoding(key, "key", |enc| self.inner.contains(fast_hash_state().hash(enc), enc))
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("inserts", s.inserts)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("size", s.size)?;
        d.set_item("capacity", s.capacity)?;
        Ok(d)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLruCache>()
}
