//! METH_FASTCALL builtins written in Rust: a launcher's `launch` and `kernel[grid]` (`crate::launch`),
//! a DSL site's `call` (`crate::dsl`). Each is a [`Body`]; this file holds the one C entry point
//! that runs them ([`entry`]), their method definitions and their argument pointers. CPython calls
//! them with no argument tuple or dict built.

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::prelude::*;

/// A method definition, made once and kept for the life of the process (CPython holds a pointer to it).
pub(crate) struct MethodDef(*mut ffi::PyMethodDef);
// SAFETY: a definition is written once, then only read (by CPython).
unsafe impl Send for MethodDef {}
// SAFETY: as for Send: never written after it is made.
unsafe impl Sync for MethodDef {}

impl MethodDef {
    /// The definition kept in `cell` (made at the first call): `name(...)`, calling `f`
    /// (METH_FASTCALL | METH_KEYWORDS), with the docstring `doc`.
    pub(crate) fn get(
        cell: &'static OnceLock<MethodDef>,
        name: &'static CStr,
        f: ffi::PyCFunctionFastWithKeywords,
        doc: &'static CStr,
    ) -> *mut ffi::PyMethodDef {
        // (`f` is `entry::<B>` for the builtin's `Body`.)
        cell.get_or_init(|| {
            MethodDef(Box::into_raw(Box::new(ffi::PyMethodDef {
                ml_name: name.as_ptr(),
                ml_meth: ffi::PyMethodDefPointer { PyCFunctionFastWithKeywords: f },
                ml_flags: ffi::METH_FASTCALL | ffi::METH_KEYWORDS,
                ml_doc: doc.as_ptr(),
            })))
        })
        .0
    }
}

/// A builtin's call as CPython makes it: `self`, the positional arguments, then one value per name
/// in `kwnames` (null: no keyword arguments).
#[derive(Clone, Copy)]
pub(crate) struct Args<'a> {
    pub(crate) slf: *mut ffi::PyObject,
    pub(crate) all: &'a [*mut ffi::PyObject],
    pub(crate) nargs: usize,
    pub(crate) kwnames: *mut ffi::PyObject,
}

impl<'a> Args<'a> {
    /// The positional arguments.
    #[inline]
    pub(crate) fn positional(&self) -> &'a [*mut ffi::PyObject] {
        &self.all[..self.nargs]
    }

    /// The keyword arguments' values and their names, if any were passed.
    #[inline]
    pub(crate) fn keywords(&self) -> Option<(&'a [*mut ffi::PyObject], *mut ffi::PyObject)> {
        (self.all.len() > self.nargs).then(|| (&self.all[self.nargs..], self.kwnames))
    }
}

/// What a builtin does with its `self` and its arguments.
pub(crate) trait Body {
    /// The message of the `PanicException` a panic in [`Body::call`] becomes.
    const PANICKED: &'static str;

    /// The builtin's body.
    ///
    /// # Safety
    /// `a.slf` is the object the builtin was bound to by the definition naming `entry::<Self>`.
    unsafe fn call(py: Python<'_>, a: Args<'_>) -> PyResult<*mut ffi::PyObject>;
}

/// The C entry point of the METH_FASTCALL | METH_KEYWORDS builtin whose body is `B`.
///
/// # Safety
/// Called by CPython for a function made from a definition naming `entry::<B>`, attached to the
/// interpreter, with `nargs` (flag bits stripped) + len(`kwnames`) live argument pointers.
pub(crate) unsafe extern "C" fn entry<B: Body>(
    slf: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls it attached (the contract).
    let py = unsafe { Python::assume_attached() };
    c_body(py, B::PANICKED, || {
        let nargs = nargs as usize;
        // SAFETY: the contract.
        let all = unsafe { arguments(args, nargs, kwnames) };
        // SAFETY: `slf` is what the definition was bound to (the contract).
        unsafe { B::call(py, Args { slf, all, nargs, kwnames }) }
    })
}

/// A call's argument pointers: the `nargs` positional ones, then one value per name in `kwnames`.
///
/// # Safety
/// As CPython calls a METH_FASTCALL | METH_KEYWORDS function: `args` holds `nargs` (flag bits
/// stripped) + len(`kwnames`) live pointers, and `kwnames` is null or a tuple.
#[inline]
unsafe fn arguments<'a>(
    args: *const *mut ffi::PyObject,
    nargs: usize,
    kwnames: *mut ffi::PyObject,
) -> &'a [*mut ffi::PyObject] {
    let nkw = if kwnames.is_null() {
        0
    } else {
        // SAFETY: a non-null kwnames is a tuple (the contract).
        (unsafe { ffi::PyTuple_Size(kwnames) }) as usize
    };
    if nargs + nkw == 0 {
        &[]
    } else {
        // SAFETY: `args` holds nargs + len(kwnames) live pointers (the contract).
        unsafe { std::slice::from_raw_parts(args, nargs + nkw) }
    }
}

/// Runs `f` as the body of a C function: an error is restored (null returned), and a panic becomes
/// a `PanicException` saying `panicked`.
#[inline]
fn c_body(
    py: Python<'_>,
    panicked: &'static str,
    f: impl FnOnce() -> PyResult<*mut ffi::PyObject>,
) -> *mut ffi::PyObject {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            e.restore(py);
            null_mut()
        }
        Err(_) => {
            pyo3::panic::PanicException::new_err(panicked).restore(py);
            null_mut()
        }
    }
}
