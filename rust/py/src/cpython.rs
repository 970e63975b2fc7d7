//! The binding's access to CPython objects, shared by the key walks (`crate::keys`), the signature
//! walk, the launch packer and binder (`crate::launch`) and DSL sites (`crate::dsl`): tuple items,
//! int values, str hashes and UTF-8, exact-type checks.
//!
//! The abi3 build may only call functions for tuple items and str hashes (`PyTuple_GetItem`,
//! `PyObject_Hash`); those calls were a third of a warm structural hash. On the CPython builds an
//! abi3 wheel can load into (3.10-3.14, GIL, no Py_TRACE_REFS), a tuple's items follow its 24-byte
//! `PyVarObject` header and a str caches its hash in the 4th word of `PyASCIIObject`. jitkey reads
//! them directly only after `init_layout` proved, on live objects at import, that direct reads
//! equal the API's answers; on any other interpreter it keeps calling the API.

use std::ffi::c_int;
use std::ptr::addr_of_mut;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use pyo3::ffi;
use pyo3::prelude::*;

static FAST_LAYOUT: AtomicBool = AtomicBool::new(false);

const TUPLE_ITEMS_OFFSET: usize = 3 * std::mem::size_of::<usize>();
const STR_HASH_WORD: usize = 3;

/// Item `i` of an exact tuple (borrowed).
///
/// # Safety
/// `tuple` is a live exact tuple and `0 <= i < len`.
#[inline(always)]
pub(crate) unsafe fn tuple_item(tuple: *mut ffi::PyObject, i: ffi::Py_ssize_t) -> *mut ffi::PyObject {
    if FAST_LAYOUT.load(Ordering::Relaxed) {
        // SAFETY: layout verified by `init_layout`; index in range per the contract.
        unsafe { *tuple.cast::<u8>().add(TUPLE_ITEMS_OFFSET).cast::<*mut ffi::PyObject>().add(i as usize) }
    } else {
        // SAFETY: a live tuple and an index in range (the contract); the item is borrowed.
        unsafe { ffi::PyTuple_GetItem(tuple, i) }
    }
}

/// Fills slot `i` of a tuple just made by `PyTuple_New`, stealing `item` (a new reference).
///
/// # Safety
/// `tuple` is a fresh, not yet shared tuple, `0 <= i < len`, and slot `i` is still empty.
#[inline(always)]
pub(crate) unsafe fn tuple_fill(tuple: *mut ffi::PyObject, i: ffi::Py_ssize_t, item: *mut ffi::PyObject) {
    if FAST_LAYOUT.load(Ordering::Relaxed) {
        // SAFETY: layout verified by `init_layout`; the slot is empty, so nothing is overwritten.
        unsafe {
            *tuple.cast::<u8>().add(TUPLE_ITEMS_OFFSET).cast::<*mut ffi::PyObject>().add(i as usize) = item
        }
    } else {
        // SAFETY: a fresh tuple, an index in range and an empty slot (the contract); the
        // reference to `item` is stolen.
        unsafe { ffi::PyTuple_SetItem(tuple, i, item) };
    }
}

/// Length of an exact tuple. `ob_size` of `PyVarObject` is part of the stable ABI (`Py_SIZE`).
///
/// # Safety
/// `tuple` is a live exact tuple.
#[inline(always)]
pub(crate) unsafe fn tuple_len(tuple: *mut ffi::PyObject) -> ffi::Py_ssize_t {
    // SAFETY: `PyVarObject { ob_refcnt, ob_type, ob_size }` is stable-ABI layout.
    unsafe { (*tuple.cast::<ffi::PyVarObject>()).ob_size }
}

/// CPython's hash of an exact str, from its cache when the layout allows.
///
/// # Safety
/// `s` is a live exact str.
#[inline(always)]
pub(crate) unsafe fn str_hash(s: *mut ffi::PyObject) -> ffi::Py_hash_t {
    if FAST_LAYOUT.load(Ordering::Relaxed) {
        // SAFETY: layout verified by `init_layout`.
        let cached = unsafe { *s.cast::<ffi::Py_hash_t>().add(STR_HASH_WORD) };
        if cached != -1 {
            return cached;
        }
    }
    // SAFETY: `s` is a live exact str (the contract); its hash never fails and runs no Python
    // code (the hash is then cached in the object).
    unsafe { ffi::PyObject_Hash(s) }
}

/// How an exact int with at most one digit is read directly (`small_int`): 0 = not at all (the C
/// API is called), 1 = sign and digit count in `ob_size` (3.10-3.11), 2 = in `lv_tag` (3.12-3.14).
/// Either way the 30-bit digits follow the 16-byte `PyObject` header and one word.
static INT_LAYOUT: AtomicU8 = AtomicU8::new(0);

const INT_DIGITS_OFFSET: usize = 3 * std::mem::size_of::<usize>();

/// The value of an exact int of at most one 30-bit digit, read directly where `init_layout` proved
/// the layout; `None` for bigger ints or elsewhere (the caller then asks the C API).
///
/// # Safety
/// `v` is a live exact int.
#[inline(always)]
pub(crate) unsafe fn small_int(v: *mut ffi::PyObject) -> Option<i64> {
    let (sign, word) = match INT_LAYOUT.load(Ordering::Relaxed) {
        // SAFETY: layout proven by `init_int_layout`; the word after the header is in the object.
        1 => match unsafe { *v.cast::<isize>().add(2) } {
            w @ -1..=1 => (w as i64, w),
            _ => return None,
        },
        // Compact (fewer than 2 digits): bits 0-1 are the sign, 0 +, 1 zero, 2 -.
        // SAFETY: as above, for the `lv_tag` word.
        2 => match unsafe { *v.cast::<usize>().add(2) } {
            tag @ 0..16 => (1 - (tag & 3) as i64, 1),
            _ => return None,
        },
        _ => return None,
    };
    if word == 0 {
        return Some(0);
    }
    // SAFETY: an int with one digit holds it right after the header word.
    let digit = unsafe { *v.cast::<u8>().add(INT_DIGITS_OFFSET).cast::<u32>() };
    Some(sign * i64::from(digit))
}

/// Proves the direct int read on live ints before enabling it (only after the tuple/str proof).
fn init_int_layout(py: Python<'_>, minor: u32) -> PyResult<()> {
    let info = py.import("sys")?.getattr("int_info")?;
    let (bits, size): (u32, u32) =
        (info.getattr("bits_per_digit")?.extract()?, info.getattr("sizeof_digit")?.extract()?);
    if bits != 30 || size != 4 {
        return Ok(());
    }
    INT_LAYOUT.store(if minor <= 11 { 1 } else { 2 }, Ordering::Relaxed);
    let one_digit = [0i64, 1, -1, 7, -7, 256, 1000, (1 << 30) - 1, -((1 << 30) - 1)];
    let mut ok = true;
    for v in one_digit.into_iter().chain([1 << 30, -(1 << 30), i64::MAX, i64::MIN]) {
        let obj = v.into_pyobject(py)?;
        // SAFETY: `obj` is a live exact int.
        let read = unsafe { small_int(obj.as_ptr()) };
        ok &= read == one_digit.contains(&v).then_some(v);
    }
    if !ok {
        INT_LAYOUT.store(0, Ordering::Relaxed);
    }
    Ok(())
}

/// Enables the direct reads above if this interpreter provably lays objects out as expected.
pub(crate) fn init_layout(py: Python<'_>) -> PyResult<bool> {
    let sys = py.import("sys")?;
    let version = sys.getattr("version_info")?;
    let (major, minor): (u32, u32) =
        (version.getattr("major")?.extract()?, version.getattr("minor")?.extract()?);
    let gil = match sys.getattr("_is_gil_enabled") {
        Ok(f) => f.call0()?.extract::<bool>()?,
        Err(_) => true,
    };
    let trace_refs = sys.hasattr("getobjects")?;
    let known = major == 3 && (10..=14).contains(&minor) && gil && !trace_refs;
    let ok = known && layout_matches(py)?;
    FAST_LAYOUT.store(ok, Ordering::Relaxed);
    if ok {
        init_int_layout(py, minor)?;
    }
    Ok(ok)
}

fn layout_matches(py: Python<'_>) -> PyResult<bool> {
    let items =
        [py.None(), 7i64.into_pyobject(py)?.into_any().unbind(), py.import("sys")?.into_any().unbind()];
    let tuple = pyo3::types::PyTuple::new(py, &items)?;
    let tp = tuple.as_ptr();
    for i in 0..3 {
        // SAFETY: `tuple` is a live 3-tuple; the direct read stays inside its allocation.
        let (api, direct) = unsafe {
            (
                ffi::PyTuple_GetItem(tp, i),
                *tp.cast::<u8>().add(TUPLE_ITEMS_OFFSET).cast::<*mut ffi::PyObject>().add(i as usize),
            )
        };
        if api != direct {
            return Ok(false);
        }
    }
    // A fresh (never hashed) str reads -1; after hashing, the word holds exactly the hash.
    let probe = pyo3::types::PyString::new(py, &format!("jitkey-layout-probe-{:x}", std::process::id()));
    let sp = probe.as_ptr();
    // SAFETY: `probe` is a live str of at least 4 words (header + length + hash).
    let before = unsafe { *sp.cast::<ffi::Py_hash_t>().add(STR_HASH_WORD) };
    let hash = probe.hash()?;
    // SAFETY: as above; `probe` is still alive.
    let after = unsafe { *sp.cast::<ffi::Py_hash_t>().add(STR_HASH_WORD) };
    Ok(before == -1 && after == hash && hash != -1)
}

/// Whether `tp` is exactly the builtin type `builtin`.
#[inline]
pub(crate) fn is_type(tp: *mut ffi::PyTypeObject, builtin: *mut ffi::PyTypeObject) -> bool {
    std::ptr::eq(tp, builtin)
}

/// Whether `p` (a live object) is `None` or exactly an `int`, `float` or `bool`: a value whose keying
/// runs no Python code and allocates no object the GC tracks.
#[inline]
pub(crate) fn is_plain_scalar(p: *mut ffi::PyObject) -> bool {
    // SAFETY: `p` is live (the caller's contract); `Py_TYPE` reads its type pointer, and the
    // builtin type objects are static.
    unsafe {
        let tp = ffi::Py_TYPE(p);
        p == ffi::Py_None()
            || is_type(tp, std::ptr::addr_of_mut!(ffi::PyLong_Type))
            || is_type(tp, std::ptr::addr_of_mut!(ffi::PyFloat_Type))
            || is_type(tp, std::ptr::addr_of_mut!(ffi::PyBool_Type))
    }
}

/// An int's value when it fits in i64, else `None` (any error it set is cleared). An exact int of
/// at most one digit is read from the object itself (`small_int`), the rest through
/// `PyLong_AsLongLongAndOverflow`.
///
/// # Safety
/// `ptr` is a live int (`PyLong_Check` passed); reading it runs no Python code.
#[inline]
pub(crate) unsafe fn int_i64(ptr: *mut ffi::PyObject) -> Option<i64> {
    // SAFETY: the contract; `ob_type` is stable-ABI layout and `small_int` is only used on an exact
    // int; the error indicator is checked and cleared with the GIL held.
    unsafe {
        if is_type((*ptr).ob_type, addr_of_mut!(ffi::PyLong_Type)) {
            if let Some(v) = small_int(ptr) {
                return Some(v);
            }
        }
        let mut overflow: c_int = 0;
        let v = ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow);
        if overflow != 0 {
            return None;
        }
        if v == -1 && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(v)
    }
}

/// An int's value when it fits in `[-2**63, 2**64)`, else `None` (any error it set is cleared).
/// Shared by the signature walk (Triton's int range) and the launch packer.
///
/// # Safety
/// `ptr` is a live int (`PyLong_Check` passed); reading it runs no Python code.
#[inline]
pub(crate) unsafe fn int_i128(ptr: *mut ffi::PyObject) -> Option<i128> {
    // SAFETY: the contract.
    if let Some(v) = unsafe { int_i64(ptr) } {
        return Some(i128::from(v));
    }
    // Outside i64: only `[2**63, 2**64)` is read (a negative int raises here, and is cleared).
    // SAFETY: the contract; the error indicator is checked and cleared with the GIL held.
    unsafe {
        let u = ffi::PyLong_AsUnsignedLongLong(ptr);
        if u == u64::MAX && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(i128::from(u))
    }
}

/// The UTF-8 bytes of a `str` as the object caches them (no copy); empty for anything that has none
/// (not a str, lone surrogates): how keyword names sort and compare.
pub(crate) fn str_utf8<'a>(p: *mut ffi::PyObject) -> &'a [u8] {
    // SAFETY: `p` is a live object kept alive by the call; PyUnicode_AsUTF8AndSize returns the
    // str's own cached UTF-8 buffer, valid while the str lives, or null with an error set, which is
    // cleared here.
    unsafe {
        if ffi::PyUnicode_Check(p) == 0 {
            return &[];
        }
        let mut size: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(p, &mut size);
        if data.is_null() {
            ffi::PyErr_Clear();
            return &[];
        }
        std::slice::from_raw_parts(data.cast::<u8>(), size as usize)
    }
}
