//! `_TritonEntry`: what a launcher hit launches, stored in the kernel's cache under the call's key.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyTuple;

use super::plan::LaunchPlan;

/// What a hit launches: `target(gx, gy, gz, stream, function, *mid, metadata, enter, exit,
/// *params)`, then returns `ck`. `target` is `ck.run` (then `mid` is `(packed_metadata,)`), or
/// the launcher's own C `launch` when the Python side proved `ck.run` would only forward to it.
/// The most `mid` arguments an entry takes (the known launchers insert 1 or 5).
pub(super) const MAX_MID: usize = 8;

#[pyclass(name = "_TritonEntry", module = "jitkey._core", frozen)]
pub(crate) struct Entry {
    pub(super) ck: Py<PyAny>,
    pub(super) target: Py<PyAny>,
    pub(super) function: Py<PyAny>,
    pub(super) mid: Vec<Py<PyAny>>,
    /// Where Triton keeps `ck`: its per-device kernel cache (a dict) and the key in it. A hit is
    /// valid only while `kernel.device_caches[device][0][tkey] is ck`, so whatever drops or
    /// replaces Triton's entry (`device_caches.clear()`, a test, a source change handled by the
    /// caller) drops jitkey's too. `None`: not checked.
    pub(super) kcache: Option<Py<PyAny>>,
    pub(super) tkey: Option<Py<PyAny>>,
    /// The kernel's launch as jitkey packs it itself (`None`: every hit calls `target`).
    pub(super) plan: Option<Py<LaunchPlan>>,
}

#[pymethods]
impl Entry {
    #[new]
    #[pyo3(signature = (ck, target, function, mid, kcache = None, tkey = None, plan = None, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        ck: Py<PyAny>,
        target: Py<PyAny>,
        function: Py<PyAny>,
        mid: &Bound<'_, PyTuple>,
        kcache: Option<Py<PyAny>>,
        tkey: Option<Py<PyAny>>,
        plan: Option<Py<LaunchPlan>>,
    ) -> PyResult<Self> {
        if mid.len() > MAX_MID {
            return Err(PyValueError::new_err(format!(
                "_TritonEntry: at most {MAX_MID} arguments between function and the launch metadata"
            )));
        }
        Ok(Self { ck, target, function, mid: mid.iter().map(Bound::unbind).collect(), kcache, tkey, plan })
    }

    #[getter]
    fn ck(&self, py: Python<'_>) -> Py<PyAny> {
        self.ck.clone_ref(py)
    }

    #[getter]
    fn target(&self, py: Python<'_>) -> Py<PyAny> {
        self.target.clone_ref(py)
    }

    #[getter]
    fn function(&self, py: Python<'_>) -> Py<PyAny> {
        self.function.clone_ref(py)
    }

    #[getter]
    fn plan(&self, py: Python<'_>) -> Option<Py<LaunchPlan>> {
        self.plan.as_ref().map(|p| p.clone_ref(py))
    }

    #[getter]
    fn mid<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.mid.iter().map(|m| m.bind(py)))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.ck)?;
        visit.call(&self.target)?;
        visit.call(&self.function)?;
        for m in &self.mid {
            visit.call(m)?;
        }
        if let Some(k) = &self.kcache {
            visit.call(k)?;
        }
        if let Some(k) = &self.tkey {
            visit.call(k)?;
        }
        if let Some(p) = &self.plan {
            visit.call(p)?;
        }
        Ok(())
    }
}
