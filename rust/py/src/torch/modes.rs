//! torch's per-thread mode state, read through torch's own C++ functions instead of its Python
//! bindings: grad mode (`aoti_torch_grad_mode_is_enabled`, torch's stable C shim, in `libtorch_cpu`),
//! inference mode (`c10::InferenceMode::is_enabled()`, in `libc10`), whether a torch function mode is
//! active (`at::impl::torch_function_mode_enabled()`, in `libtorch_cpu`) and the torch dispatch mode
//! stack's length (`c10::impl::TorchDispatchModeTLS::stack_len()`, in `libc10`): the functions
//! `torch.is_grad_enabled`, `torch.is_inference_mode_enabled`, `torch._C._is_torch_function_mode_enabled`
//! and `torch._C._len_torch_dispatch_stack` wrap. A DSL site reads these on every call (its checks and
//! the state in its key); through Python each read costs a call of about 0.05-0.1 µs.
//!
//! The three C++ functions are resolved by their Itanium-mangled names, which are torch's ABI for
//! one build, not a promise: the reads are used only after `jitkey/_torch_modes.py` has proven, once
//! per process, that each returns what its Python function returns in every state it can be put in
//! (each mode on and off, alone and nested). They take no arguments, read thread-local state and
//! cannot throw. Resolved at run time from the libraries torch has loaded (as `current` resolves the
//! device and stream), so a torch without them keeps the Python functions.

use std::ffi::c_void;

use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyBool;

use super::current::symbol;

type BoolFn = unsafe extern "C" fn() -> bool;
type LenFn = unsafe extern "C" fn() -> i64;

/// `_TorchModes(cpu_lib, c10_lib, functions, /, *, loaded_only=True)`: see the module docs.
/// `functions` are the four Python functions the reads stand for: `torch.is_grad_enabled`,
/// `torch.is_inference_mode_enabled`, `torch._C._is_torch_function_mode_enabled`,
/// `torch._C._len_torch_dispatch_stack`, in this order.
#[pyclass(name = "_TorchModes", module = "jitkey._core", frozen)]
pub(crate) struct TorchModes {
    grad: BoolFn,
    inference: BoolFn,
    function_mode: BoolFn,
    dispatch_len: LenFn,
    functions: [Py<PyAny>; 4],
}

impl TorchModes {
    /// Which read stands for the Python function `f` (by identity).
    pub(crate) fn which(&self, f: &Bound<'_, PyAny>) -> Option<usize> {
        self.functions.iter().position(|g| g.bind(f.py()).is(f))
    }

    /// Read `i` as its Python function returns it (a bool, or the stack's length as an int).
    #[inline]
    pub(crate) fn read<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: each function was resolved by its name and has the C++ signature the module docs
        // name (no arguments; a bool or an int64_t); they read thread-local state and do not throw.
        unsafe {
            Ok(match i {
                0 => PyBool::new(py, (self.grad)()).to_owned().into_any(),
                1 => PyBool::new(py, (self.inference)()).to_owned().into_any(),
                2 => PyBool::new(py, (self.function_mode)()).to_owned().into_any(),
                3 => (self.dispatch_len)().into_pyobject(py)?.into_any(),
                _ => return Err(PyValueError::new_err(format!("_TorchModes: no read {i}"))),
            })
        }
    }
}

fn resolve<T>(lib: &str, name: &std::ffi::CStr, loaded_only: bool) -> PyResult<T> {
    let p: *mut c_void = symbol(lib, name, loaded_only).map_err(PyOSError::new_err)?;
    // SAFETY: only instantiated with the function pointer types above, for the symbols named there.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

#[pymethods]
impl TorchModes {
    #[new]
    #[pyo3(signature = (cpu_lib, c10_lib, functions, /, *, loaded_only = true))]
    fn new(
        py: Python<'_>,
        cpu_lib: &str,
        c10_lib: &str,
        functions: Vec<Py<PyAny>>,
        loaded_only: bool,
    ) -> PyResult<Self> {
        let functions: [Py<PyAny>; 4] = functions
            .try_into()
            .map_err(|_| PyTypeError::new_err("_TorchModes: functions must be four callables"))?;
        if functions.iter().any(|f| !f.bind(py).is_callable()) {
            return Err(PyTypeError::new_err("_TorchModes: functions must be four callables"));
        }
        Ok(Self {
            grad: resolve(cpu_lib, c"aoti_torch_grad_mode_is_enabled", loaded_only)?,
            inference: resolve(c10_lib, c"_ZN3c1013InferenceMode10is_enabledEv", loaded_only)?,
            function_mode: resolve(cpu_lib, c"_ZN2at4impl27torch_function_mode_enabledEv", loaded_only)?,
            dispatch_len: resolve(c10_lib, c"_ZN3c104impl20TorchDispatchModeTLS9stack_lenEv", loaded_only)?,
            functions,
        })
    }

    /// `values() -> tuple`: the four reads now, as the Python functions return them.
    fn values<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        pyo3::types::PyTuple::new(py, (0..4).map(|i| self.read(py, i)).collect::<PyResult<Vec<_>>>()?)
    }

    /// `functions -> tuple`: the Python functions the reads stand for.
    #[getter]
    fn functions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        pyo3::types::PyTuple::new(py, self.functions.iter().map(|f| f.bind(py)))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        for f in &self.functions {
            visit.call(f)?;
        }
        Ok(())
    }
}
