//! `_SiteMethod`: a DSL class's `__call__` that reaches an instance's site with no Python frame.
//!
//! A DSL whose entry points are objects (a `helion.Kernel`) is called through its class's
//! `__call__`. Patching that with a Python function costs a frame per call, with its `*args`
//! tuple and `**kwargs` dict, before the native site is reached. As a class attribute this
//! descriptor resolves `instance.__call__` to the instance's own per-call callable instead:
//! `getattr(instance, attr).call` (the site's native `call`), which CPython's call slot then calls
//! with the caller's arguments. Where that is None (no site yet, or the instance is left to the
//! DSL), `instance.__call__` is `slow` bound to the instance: the adapter's Python `__call__`, which
//! makes the site or runs the DSL's own path. Read from the class, it is `slow` itself, so
//! `Class.__call__(instance, ...)` and introspection see a plain function.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyString;

#[pyclass(name = "_SiteMethod", module = "jitkey._core", frozen)]
pub(crate) struct SiteMethod {
    /// The instance attribute that holds the per-instance object with a `call` attribute.
    attr: Py<PyString>,
    /// The Python function that stands for the method where there is no native call.
    slow: Py<PyAny>,
}

#[pymethods]
impl SiteMethod {
    /// `_SiteMethod(attr, slow, /)`: see the module docs.
    #[new]
    #[pyo3(signature = (attr, slow, /))]
    fn new(py: Python<'_>, attr: &str, slow: Py<PyAny>) -> PyResult<Self> {
        if !slow.bind(py).is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err("_SiteMethod: slow must be callable"));
        }
        Ok(Self { attr: PyString::intern(py, attr).unbind(), slow })
    }

    fn __get__<'py>(
        &self,
        py: Python<'py>,
        instance: Option<Bound<'py, PyAny>>,
        owner: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(instance) = instance.filter(|i| !i.is_none()) else {
            return Ok(self.slow.bind(py).clone());
        };
        if let Some(r) = instance.getattr_opt(self.attr.bind(py))? {
            if let Some(call) = r.getattr_opt(intern!(py, "call"))? {
                if !call.is_none() {
                    return Ok(call);
                }
            }
        }
        // `slow` bound to the instance, as a function read from an instance is.
        self.slow.bind(py).call_method1(intern!(py, "__get__"), (instance, owner))
    }

    /// The Python function the method stands for where there is no native call.
    #[getter]
    fn slow(&self, py: Python<'_>) -> Py<PyAny> {
        self.slow.clone_ref(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.attr)?;
        visit.call(&self.slow)
    }
}
