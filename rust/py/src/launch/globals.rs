//! Triton's globals check on a warm launch, with no Python frame while nothing it reads has changed.
//!
//! `JITFunction.run` checks, before every launch, that each global its kernel read at compile time
//! still compares equal: `globals_dict.get(name, not_present) != val` must be false, where `val` is a
//! deep copy taken at compile time. For Helion's kernels (`_BLOCK_SIZE_0 = tl.constexpr(32)`) and
//! any kernel that reads a module-level `tl.constexpr`, that is a Python `constexpr.__ne__`, a
//! `constexpr` made for its result and its `__bool__`, per launch.
//!
//! Here the full check is the kernel's own `_jk_check_globals()` (Triton's loop, raising as Triton
//! does). After it passes, a snapshot records, per global, the object the name was bound to and,
//! for a `tl.constexpr`, the object its `value` was bound to. A later launch whose globals are
//! still bound to those very objects passes without calling Python, where that is exactly Triton's
//! answer: the object is an immutable builtin (`int`, `float`, `bool`, `str`, `bytes`), or an exact
//! `tl.constexpr` whose `value` is still the same immutable builtin (its `__ne__` reads nothing
//! else; the class has no `__getattribute__` of its own, so reading `value` runs no Python code).
//! `val` itself is Triton's private deep copy. Anything else (a name rebound, a `value` reassigned,
//! a mutable global, a dict that is not a plain dict) runs the full check, and a global of a kind
//! the snapshot cannot vouch for makes every launch run it, as before. Taking a snapshot never
//! fails a launch: where it cannot be taken, the full check runs every time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

/// One global as it was when the full check last passed.
struct Item {
    gdict: Py<PyDict>,
    name: Py<PyString>,
    /// The object the name was bound to.
    seen: Py<PyAny>,
    /// For an exact `tl.constexpr`: the object its `value` was bound to.
    value: Option<Py<PyAny>>,
}

struct Snapshot {
    /// The `used_global_vals` dict it was taken from, and its length then.
    src: Py<PyAny>,
    len: usize,
    items: Box<[Item]>,
}

/// Whether `p`'s `!=` against a fixed value gives the same answer every time it is asked: the
/// exact immutable builtin scalars.
fn immutable(p: *mut ffi::PyObject) -> bool {
    // SAFETY: p is a live object; the checks read its type only.
    unsafe {
        ffi::PyLong_CheckExact(p) != 0
            || ffi::PyFloat_CheckExact(p) != 0
            || ffi::PyBool_Check(p) != 0
            || ffi::PyUnicode_CheckExact(p) != 0
            || ffi::PyBytes_CheckExact(p) != 0
    }
}

impl Item {
    /// Whether the global is still bound as the snapshot saw it (no Python code runs: `gdict` is an
    /// exact dict and `name` an exact str; a constexpr's class has the generic attribute lookup).
    fn holds(&self, py: Python<'_>) -> bool {
        // SAFETY: gdict is an exact dict and name an exact str (checked when taken); the item is a
        // borrowed reference, compared by address only.
        let cur = unsafe { ffi::PyDict_GetItemWithError(self.gdict.as_ptr(), self.name.as_ptr()) };
        if cur.is_null() {
            if PyErr::occurred(py) {
                drop(PyErr::fetch(py));
            }
            return false;
        }
        if cur != self.seen.as_ptr() {
            return false;
        }
        match &self.value {
            None => true,
            Some(v) => instance_value(py, cur).is_some_and(|now| now.is(v)),
        }
    }
}

/// `obj.value` as a new reference, or None (an error is dropped: the full check then runs and says).
fn instance_value(py: Python<'_>, obj: *mut ffi::PyObject) -> Option<Py<PyAny>> {
    // SAFETY: obj is live; the result is a new reference or null with an error set.
    let v = unsafe { ffi::PyObject_GetAttr(obj, intern!(py, "value").as_ptr()) };
    if v.is_null() {
        drop(PyErr::fetch(py));
        return None;
    }
    // SAFETY: v is a new reference owned from here.
    Some(unsafe { Bound::from_owned_ptr(py, v) }.unbind())
}

/// The length of `d` if it is an exact dict (no Python code runs), else None.
fn exact_dict_len(d: &Bound<'_, PyAny>) -> Option<usize> {
    d.cast_exact::<PyDict>().ok().map(|d| d.len())
}

/// The launcher's globals check (see the module docs).
#[derive(Default)]
pub(super) struct GlobalsCheck {
    snap: Mutex<Option<Arc<Snapshot>>>,
    /// Checks passed by the snapshot, and full checks run.
    pub(super) native: AtomicU64,
    pub(super) full: AtomicU64,
}

impl GlobalsCheck {
    /// Checks `ugv` (the kernel's `used_global_vals`, non-empty) as Triton does: by the snapshot when
    /// it holds, else by `full()` (which raises Triton's error), after which the snapshot is taken again.
    pub(super) fn check(
        &self,
        py: Python<'_>,
        ugv: &Bound<'_, PyAny>,
        full: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let snap = self.snap.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(s) = snap {
            if s.src.is(ugv) && exact_dict_len(ugv) == Some(s.len) && s.items.iter().all(|it| it.holds(py)) {
                let n = self.native.load(Ordering::Relaxed);
                self.native.store(n + 1, Ordering::Relaxed);
                return Ok(());
            }
        }
        full.call0()?;
        self.full.fetch_add(1, Ordering::Relaxed);
        // An error here (none is expected: exact dicts, tuples and str) only costs the fast path.
        let taken = take(py, ugv).ok().flatten().map(Arc::new);
        *self.snap.lock().unwrap_or_else(PoisonError::into_inner) = taken;
        Ok(())
    }

    pub(super) fn visit(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(g) = self.snap.try_lock() {
            if let Some(s) = g.as_ref() {
                visit.call(&s.src)?;
                for it in s.items.iter() {
                    visit.call(&it.gdict)?;
                    visit.call(&it.name)?;
                    visit.call(&it.seen)?;
                    if let Some(v) = &it.value {
                        visit.call(v)?;
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn clear(&self) {
        if let Ok(mut g) = self.snap.try_lock() {
            *g = None;
        }
    }
}

/// The snapshot of `ugv` as bound now (just after the full check passed), or None when some global
/// is of a kind it cannot vouch for (every launch then runs the full check).
fn take(py: Python<'_>, ugv: &Bound<'_, PyAny>) -> PyResult<Option<Snapshot>> {
    let Ok(d) = ugv.cast_exact::<PyDict>() else { return Ok(None) };
    let constexpr = py.import(intern!(py, "triton.language"))?.getattr(intern!(py, "constexpr"))?;
    let getattribute = intern!(py, "__getattribute__");
    let plain_getattr =
        constexpr.getattr(getattribute)?.is(py.get_type::<pyo3::types::PyAny>().getattr(getattribute)?);
    let mut items = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        // Triton's layout: (name, id(globals)) -> (value, globals).
        let (Ok(k), Ok(v)) = (k.cast_exact::<PyTuple>(), v.cast_exact::<PyTuple>()) else { return Ok(None) };
        if k.len() != 2 || v.len() != 2 {
            return Ok(None);
        }
        let (Ok(name), Ok(gdict)) =
            (k.get_item(0)?.cast_into_exact::<PyString>(), v.get_item(1)?.cast_into_exact::<PyDict>())
        else {
            return Ok(None);
        };
        let Some(cur) = gdict.get_item(&name)? else { return Ok(None) };
        let value = if immutable(cur.as_ptr()) {
            None
        } else if cur.get_type().is(&constexpr) && plain_getattr {
            match instance_value(py, cur.as_ptr()) {
                Some(p) if immutable(p.as_ptr()) => Some(p),
                _ => return Ok(None),
            }
        } else {
            return Ok(None);
        };
        items.push(Item { gdict: gdict.unbind(), name: name.unbind(), seen: cur.unbind(), value });
    }
    Ok(Some(Snapshot { src: ugv.clone().unbind(), len: d.len(), items: items.into_boxed_slice() }))
}
