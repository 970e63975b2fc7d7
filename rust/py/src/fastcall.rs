//! METH_FASTCALL builtins written in Rust: a launcher's `launch` and `kernel[grid]` (`crate::launch`),
//! a DSL site's `call` (`crate::dsl`). Their method definitions, their argument pointers and the
//! wrapper of their bodies; CPython calls them with no argument tuple or dict built.

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

/// A call's argument pointers: the `nargs` positional ones, then one value per name in `kwnames`.
///
/// # Safety
/// As CPython calls a METH_FASTCALL | METH_KEYWORDS function: `args` holds `nargs` (flag bits
/// stripped) + len(`kwnames`) live pointers, and `kwnames` is null or a tuple.
#[inline]
pub(crate) unsafe fn args<'a>(
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
pub(crate) fn c_body(
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
