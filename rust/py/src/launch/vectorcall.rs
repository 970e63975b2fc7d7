//! The C entry points of a warm launch: `launch(grid, /, *args, **kwargs)` (bound to a launcher)
//! and `kernel[grid](*args, **kwargs)` (bound to a `(launcher, grid)` tuple by `_KernelBase`), both
//! METH_FASTCALL builtins, so neither the subscript nor the call builds an argument tuple or dict.

use std::ptr::null_mut;
use std::sync::OnceLock;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyInt, PyTuple};

use super::{Call, Launcher};
use crate::cpython::tuple_item;
use crate::fastcall::{self, Args, Body, MethodDef};

/// `launch(grid, /, *args, **kwargs)`, bound to a launcher.
pub(super) fn launch_def() -> *mut ffi::PyMethodDef {
    static DEF: OnceLock<MethodDef> = OnceLock::new();
    MethodDef::get(
        &DEF,
        c"launch",
        fastcall::entry::<Launch>,
        c"launch(grid, /, *args, **kwargs): kernel[grid](*args, **kwargs)",
    )
}

/// `kernel[grid]`: `(*args, **kwargs)`, bound to a `(launcher, grid)` tuple.
fn bound_def() -> *mut ffi::PyMethodDef {
    static DEF: OnceLock<MethodDef> = OnceLock::new();
    MethodDef::get(
        &DEF,
        c"launch",
        fastcall::entry::<Subscripted>,
        c"kernel[grid](*args, **kwargs) (jitkey.triton)",
    )
}

const PANICKED: &str = "jitkey.triton launcher panicked";

/// `launch(grid, /, *args, **kwargs)`: `slf` is the launcher, `args[0]` the grid.
struct Launch;

impl Body for Launch {
    const PANICKED: &'static str = PANICKED;

    #[inline(always)]
    unsafe fn call(py: Python<'_>, a: Args<'_>) -> PyResult<*mut ffi::PyObject> {
        let Some(&grid) = a.positional().first() else {
            return Err(PyTypeError::new_err("launch() missing the grid argument"));
        };
        // SAFETY: `Launcher::launch` binds this builtin to a live launcher.
        unsafe { launch(py, a.slf, grid, 1, a) }
    }
}

/// `kernel[grid](*args, **kwargs)`: `slf` is the `(launcher, grid)` tuple `__getitem__` made.
struct Subscripted;

impl Body for Subscripted {
    const PANICKED: &'static str = PANICKED;

    #[inline(always)]
    unsafe fn call(py: Python<'_>, a: Args<'_>) -> PyResult<*mut ffi::PyObject> {
        // SAFETY: `KernelBase::__getitem__` binds this builtin to an exact `(launcher, grid)` tuple.
        unsafe { launch(py, tuple_item(a.slf, 0), tuple_item(a.slf, 1), 0, a) }
    }
}

/// `launcher`'s launch on `grid` of the call's arguments, positional ones from `first`.
///
/// # Safety
/// `launcher` is a live `_TritonLauncher`.
#[inline(always)]
unsafe fn launch(
    py: Python<'_>,
    launcher: *mut ffi::PyObject,
    grid: *mut ffi::PyObject,
    first: usize,
    a: Args<'_>,
) -> PyResult<*mut ffi::PyObject> {
    // SAFETY: the contract.
    let launcher = unsafe { Borrowed::from_ptr(py, launcher).cast_unchecked::<Launcher>() };
    let call = Call { grid, pos: &a.positional()[first..], kw_values: &a.all[a.nargs..], kwnames: a.kwnames };
    if crate::dsl::recording() {
        // A DSL call is being recorded (jitkey.dsl): the recorder learns of the launch first,
        // and of its end.
        let (g, args, k) = call.to_python(py)?;
        if let Some(end) = crate::dsl::on_launch(py, (&launcher, &g, &args, &k))? {
            let out = launcher.get().run(py, &call);
            end.call0()?;
            return out.map(Bound::into_ptr);
        }
    }
    launcher.get().run(py, &call).map(Bound::into_ptr)
}

/// Base class of `jitkey.triton.TritonKernel`: `kernel[grid]` in C once a native launcher is set
/// (`_set_launcher`), else the subclass's Python `_subscript(grid)`.
#[pyclass(name = "_KernelBase", module = "jitkey._core", subclass, frozen)]
pub(crate) struct KernelBase {
    launcher: std::sync::RwLock<Option<Py<Launcher>>>,
    /// The last `self[grid]` made for a tuple of 1 to 3 ints, reused while the grid is equal: a
    /// loop of `kernel[grid](...)` then makes no function object per call. Only int tuples are
    /// kept (they hold nothing of the caller's), and `_set_launcher` drops it.
    last: std::sync::Mutex<Option<LastSubscript>>,
}

/// `kernel[grid]` as last made: the launcher it is bound to, the grid (a tuple of 1 to 3 exact
/// ints), the bound function.
struct LastSubscript {
    launcher: Py<Launcher>,
    grid: Py<PyAny>,
    f: Py<PyAny>,
}

/// Whether `g` is a tuple of 1 to 3 exact ints (what `kernel[grid]` may reuse).
fn is_int_grid(g: &Bound<'_, PyAny>) -> bool {
    let Ok(t) = g.cast_exact::<PyTuple>() else { return false };
    (1..=3).contains(&t.len()) && t.iter().all(|x| x.is_exact_instance_of::<PyInt>())
}

#[pymethods]
impl KernelBase {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        Self { launcher: std::sync::RwLock::new(None), last: std::sync::Mutex::new(None) }
    }

    /// Routes `self[grid]` to `launcher` (or back to `_subscript` with `None`).
    #[pyo3(signature = (launcher, /))]
    fn _set_launcher(&self, launcher: Option<Py<Launcher>>) {
        // The old values are dropped after the locks are released (a drop may run Python code).
        let _old_launcher = std::mem::replace(
            &mut *self.launcher.write().unwrap_or_else(std::sync::PoisonError::into_inner),
            launcher,
        );
        let _old_last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    }

    fn __getitem__<'py>(slf: &Bound<'py, Self>, grid: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let launcher = slf
            .get()
            .launcher
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|l| l.clone_ref(py));
        let Some(l) = launcher else { return slf.call_method1(intern!(py, "_subscript"), (grid,)) };
        let last = &slf.get().last;
        let int_grid = is_int_grid(grid);
        if let Ok(last) = last.try_lock() {
            if let Some(s) = last.as_ref() {
                // Tuples of exact ints: equal exactly when their values are.
                if s.launcher.is(&l) && (s.grid.is(grid) || int_grid && s.grid.bind(py).eq(grid)?) {
                    return Ok(s.f.clone_ref(py).into_bound(py));
                }
            }
        }
        let bound = PyTuple::new(py, [l.clone_ref(py).into_any().into_bound(py), grid.clone()])?;
        // SAFETY: a static method definition; the function object holds the tuple.
        let f = unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyCFunction_NewEx(bound_def(), bound.as_ptr(), null_mut()))?
        };
        if int_grid {
            let new = LastSubscript { launcher: l, grid: grid.clone().unbind(), f: f.clone().unbind() };
            // The one replaced is dropped after the lock is released (a drop may run Python code).
            let _old = last.try_lock().ok().and_then(|mut last| last.replace(new));
        }
        Ok(f)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(l) = self.launcher.try_read() {
            if let Some(l) = l.as_ref() {
                visit.call(l)?;
            }
        }
        if let Ok(last) = self.last.try_lock() {
            if let Some(s) = last.as_ref() {
                visit.call(&s.launcher)?;
                visit.call(&s.grid)?;
                visit.call(&s.f)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        let _launcher = self.launcher.try_write().ok().and_then(|mut l| l.take());
        let _last = self.last.try_lock().ok().and_then(|mut last| last.take());
    }
}
