//! `_TritonEntry`: what a launcher hit launches, stored in the kernel's cache under the call's key.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};

use super::call_with;
use super::plan::LaunchPlan;

/// What a hit launches: its `plan` when the plan takes the call, else `target(gx, gy, gz, stream,
/// function, packed_metadata, metadata, enter, exit, *params)` (`target` is `ck.run`, as
/// `JITFunction.run` calls it); then the hit returns `ck`.
#[pyclass(name = "_TritonEntry", module = "jitkey._core", frozen)]
pub(crate) struct Entry {
    pub(super) ck: Py<PyAny>,
    pub(super) target: Py<PyAny>,
    pub(super) function: Py<PyAny>,
    pub(super) packed_metadata: Py<PyAny>,
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
    #[pyo3(signature = (ck, target, function, packed_metadata, kcache = None, tkey = None, plan = None, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        ck: Py<PyAny>,
        target: Py<PyAny>,
        function: Py<PyAny>,
        packed_metadata: Py<PyAny>,
        kcache: Option<Py<PyAny>>,
        tkey: Option<Py<PyAny>>,
        plan: Option<Py<LaunchPlan>>,
    ) -> Self {
        Self { ck, target, function, packed_metadata, kcache, tkey, plan }
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
    fn packed_metadata(&self, py: Python<'_>) -> Py<PyAny> {
        self.packed_metadata.clone_ref(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.ck)?;
        visit.call(&self.target)?;
        visit.call(&self.function)?;
        visit.call(&self.packed_metadata)?;
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

impl Entry {
    /// `target(gx, gy, gz, stream, function, packed_metadata, metadata, enter, exit, *params)`: the
    /// launch through Triton's launcher, for a call the plan does not take.
    pub(super) fn call_target(
        &self,
        py: Python<'_>,
        grid: [&Bound<'_, PyAny>; 3],
        stream: &Bound<'_, PyAny>,
        hooks: [&Bound<'_, PyAny>; 3],
        params: &[*mut ffi::PyObject],
    ) -> PyResult<()> {
        let [g0, g1, g2] = grid;
        let [md, enter, exit] = hooks;
        let head = [
            g0.as_ptr(),
            g1.as_ptr(),
            g2.as_ptr(),
            stream.as_ptr(),
            self.function.as_ptr(),
            self.packed_metadata.as_ptr(),
            md.as_ptr(),
            enter.as_ptr(),
            exit.as_ptr(),
        ];
        call_with(py, self.target.bind(py), &[&head, params]).map(drop)
    }
}
