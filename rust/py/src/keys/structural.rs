//! `jitkey.LruCache` keys are usually small tuples of exact builtins. For those, the warm path does
//! not build the canonical encoding: it hashes the objects directly (CPython's cached str/bytes
//! hash, ints by value, floats by canonical bits, dtypes by identity — torch dtypes are singletons)
//! and compares a probe with the stored key object structurally, identity first. Both are defined
//! so that `structural_eq(a, b)` holds exactly when `encode(a) == encode(b)`: exact types only, bool
//! never equal to int, floats by bits. Trees holding anything else (big ints, devices, `__jitkey__`
//! objects, unsupported types, nesting past MAX_DEPTH) are not structural: `structural_hash` says
//! `None` and the caller keys them by their encoding. The choice depends only on the tree's types
//! and values, so a key always takes the same route.

use std::ffi::c_int;
use std::ptr::addr_of_mut;

use jitkey_core::key::MAX_DEPTH;
use pyo3::ffi;
use pyo3::prelude::*;

use super::fast_hash_state;
use crate::cpython::{is_type, small_int, str_hash, tuple_item, tuple_len};
use crate::torch::{dtype_type, torch_kind, TorchKind};

const K_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn mix(h: u64, x: u64) -> u64 {
    let r = u128::from(h ^ x) * u128::from(K_MUL);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Process seed of the structural hash (random, so request-controlled shapes cannot flood a shard).
fn structural_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| fast_hash_state().hash(b"jitkey-structural-seed") | 1)
}

/// The structural hash of a key tree, or `None` when the tree must be keyed by its encoding.
#[inline]
pub(crate) fn structural_hash(obj: &Bound<'_, PyAny>) -> Option<u64> {
    struct_hash(obj, structural_seed(), 0)
}

fn struct_hash(obj: &Bound<'_, PyAny>, h: u64, depth: usize) -> Option<u64> {
    // SAFETY: `obj` is live.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    match struct_leaf(obj, tp, h) {
        StructLeaf::Hash(h) => Some(h),
        StructLeaf::Tuple => struct_hash_tuple(obj, h, depth),
        StructLeaf::No => None,
    }
}

enum StructLeaf {
    Hash(u64),
    Tuple,
    No,
}

/// Hashes `obj` if it is a structural scalar; inline in the tuple loop (no recursive call per
/// item, as in the encoding walk).
#[inline(always)]
fn struct_leaf(obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject, h: u64) -> StructLeaf {
    let ptr = obj.as_ptr();
    // SAFETY: `ptr` is live and of type `tp`; every branch uses C-API calls valid for the exact
    // type it checked.
    unsafe {
        if is_type(tp, addr_of_mut!(ffi::PyUnicode_Type)) {
            // Cached in the object after the first call; never fails for an exact str.
            return StructLeaf::Hash(mix(h ^ 6, str_hash(ptr) as u64));
        }
        if is_type(tp, addr_of_mut!(ffi::PyLong_Type)) {
            if let Some(v) = small_int(ptr) {
                return StructLeaf::Hash(mix(h ^ 3, v as u64));
            }
            let mut overflow: c_int = 0;
            let v = ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow);
            return if overflow == 0 { StructLeaf::Hash(mix(h ^ 3, v as u64)) } else { StructLeaf::No };
        }
        if is_type(tp, addr_of_mut!(ffi::PyBool_Type)) {
            return StructLeaf::Hash(mix(h, if ptr == ffi::Py_True() { 0x102 } else { 0x101 }));
        }
        if is_type(tp, addr_of_mut!(ffi::PyTuple_Type)) {
            return StructLeaf::Tuple;
        }
        // A dtype already seen is one pointer compare here (the call in `struct_other` is cold).
        if tp == dtype_type() {
            return StructLeaf::Hash(mix(h ^ 9, ptr as u64));
        }
        if ptr == ffi::Py_None() {
            return StructLeaf::Hash(mix(h, 0x100));
        }
        if is_type(tp, addr_of_mut!(ffi::PyFloat_Type)) {
            let v = ffi::PyFloat_AsDouble(ptr);
            let bits = if v.is_nan() { jitkey_core::key::CANONICAL_NAN_BITS } else { v.to_bits() };
            return StructLeaf::Hash(mix(h ^ 5, bits));
        }
        if is_type(tp, addr_of_mut!(ffi::PyBytes_Type)) {
            return StructLeaf::Hash(mix(h ^ 7, ffi::PyObject_Hash(ptr) as u64));
        }
    }
    struct_other(obj, tp, h)
}

/// torch.dtype objects are singletons: hashed by identity. `torch_kind` (not just the cached
/// pointer) decides, so a dtype met before any encode still takes this route.
#[cold]
fn struct_other(obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject, h: u64) -> StructLeaf {
    match torch_kind(obj, tp) {
        Some(TorchKind::Dtype) => StructLeaf::Hash(mix(h ^ 9, obj.as_ptr() as u64)),
        _ => StructLeaf::No,
    }
}

fn struct_hash_tuple(obj: &Bound<'_, PyAny>, mut h: u64, depth: usize) -> Option<u64> {
    if depth >= MAX_DEPTH {
        return None;
    }
    let ptr = obj.as_ptr();
    // SAFETY: exact tuple; items are borrowed from an immutable tuple we keep alive.
    let len = unsafe { tuple_len(ptr) };
    h = mix(h ^ 8, len as u64);
    for i in 0..len {
        // SAFETY: i < len of the exact tuple `obj`, which keeps the borrowed item alive.
        let item = unsafe { Borrowed::from_ptr(obj.py(), tuple_item(ptr, i)) };
        // SAFETY: `item` is a live object; `Py_TYPE` reads its type pointer.
        let tp = unsafe { ffi::Py_TYPE(item.as_ptr()) };
        h = match struct_leaf(&item, tp, h) {
            StructLeaf::Hash(h) => h,
            StructLeaf::Tuple => struct_hash_tuple(&item, h, depth + 1)?,
            StructLeaf::No => return None,
        };
    }
    Some(h)
}

/// Whether two structural key trees (both accepted by [`structural_hash`]) are the same key.
pub(crate) fn structural_eq(a: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> bool {
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    if pa == pb {
        return true;
    }
    // SAFETY: both are live; each branch checks both exact types before type-specific calls.
    unsafe {
        let tp = ffi::Py_TYPE(pa);
        if tp != ffi::Py_TYPE(pb) {
            return false;
        }
        if is_type(tp, addr_of_mut!(ffi::PyUnicode_Type)) || is_type(tp, addr_of_mut!(ffi::PyBytes_Type)) {
            // Exact str/bytes: the builtin comparison runs no user code. An error (impossible
            // for exact types) counts as "not equal", i.e. a miss.
            let r = ffi::PyObject_RichCompareBool(pa, pb, ffi::Py_EQ);
            if r < 0 {
                let _ = PyErr::take(a.py());
            }
            return r == 1;
        }
        if is_type(tp, addr_of_mut!(ffi::PyLong_Type)) {
            let (mut oa, mut ob): (c_int, c_int) = (0, 0);
            let va = ffi::PyLong_AsLongLongAndOverflow(pa, &mut oa);
            let vb = ffi::PyLong_AsLongLongAndOverflow(pb, &mut ob);
            return oa == 0 && ob == 0 && va == vb;
        }
        if is_type(tp, addr_of_mut!(ffi::PyTuple_Type)) {
            let len = tuple_len(pa);
            if len != tuple_len(pb) {
                return false;
            }
            for i in 0..len {
                let x = Borrowed::from_ptr(a.py(), tuple_item(pa, i));
                let y = Borrowed::from_ptr(a.py(), tuple_item(pb, i));
                if !structural_eq(&x, &y) {
                    return false;
                }
            }
            return true;
        }
        if is_type(tp, addr_of_mut!(ffi::PyFloat_Type)) {
            let canon = |v: f64| if v.is_nan() { jitkey_core::key::CANONICAL_NAN_BITS } else { v.to_bits() };
            return canon(ffi::PyFloat_AsDouble(pa)) == canon(ffi::PyFloat_AsDouble(pb));
        }
    }
    // None, bools and dtypes are singletons: equal only when identical (checked above).
    false
}
