//! Everything the binding knows about torch, in one place: the `torch.Tensor` type, the verified
//! direct reads of `TensorImpl` fields (`tensor_impl`), reading a tensor's metadata under a rule
//! and handing it to `jitkey_core::signature::write_tensor` (`tensor`), and the tables that map
//! `torch.dtype` / `torch.device` objects to the names a key holds (here).
//!
//! The dtype and device tables are shared by the signature walk (`crate::signature`) and the
//! general key encoder (`crate::keys`): one table per concept, one concurrency design. Both are
//! arrays of pointer slots read without a lock (an acquire load per slot, most recent types first
//! found within a few compares) and filled under a mutex on first sight; every object in a slot is
//! kept alive forever, so a slot's address can never be reused by another object.
//!
//! Nothing here runs Python code on the hot path: a dtype costs a pointer scan, a device torch's
//! C-level `==` against canonical device objects, a tensor's fields a few loads once
//! `python/jitkey/_tensor_fields.py` has proven their layout.
//!
//! `current`: the current CUDA device and stream through torch's stable C shim (`_TorchCurrent`).
//! `alloc`: fresh CUDA tensors through the same shim and torch's tensor wrapper (`_TorchAlloc`).
//! `modes`: grad, inference, torch function and torch dispatch modes through torch's C++ functions (`_TorchModes`).

mod alloc;
mod current;
mod modes;
mod tensor;
mod tensor_impl;

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use jitkey_core::key::EncodeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;

pub(crate) use alloc::TorchAlloc;
pub(crate) use current::TorchCurrent;
pub(crate) use modes::TorchModes;
pub(crate) use tensor::{encode_in_process, encode_tensor};
use tensor_impl::{_install_tensor_layout, _tensor_layout_installed};
pub(crate) use tensor_impl::{cuda_data_ptr, layout, CudaPointers};

/// Why a dtype or device could not be named: a message, or the Python error raised reading it.
pub(crate) enum TorchError {
    Msg(String),
    Py(PyErr),
}

impl From<EncodeError> for TorchError {
    #[cold]
    fn from(e: EncodeError) -> Self {
        Self::Msg(e.to_string())
    }
}

impl From<PyErr> for TorchError {
    #[cold]
    fn from(e: PyErr) -> Self {
        Self::Py(e)
    }
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().fully_qualified_name().map_or_else(|_| "<unknown type>".to_owned(), |n| n.to_string())
}

// ---- torch.Tensor ------------------------------------------------------------------------------

static TENSOR_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
static PARAMETER_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// Set by the key walks when they key a tensor whose type is neither `torch.Tensor` nor
    /// `nn.Parameter` (see [`take_subclass_seen`]).
    static SUBCLASS_SEEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes a keyed tensor of type `tp` (see [`take_subclass_seen`]).
#[inline(always)]
pub(crate) fn note_tensor_type(tp: *mut ffi::PyTypeObject) {
    if tp != TENSOR_TYPE.load(Ordering::Relaxed) && tp != PARAMETER_TYPE.load(Ordering::Relaxed) {
        SUBCLASS_SEEN.with(|s| s.set(true));
    }
}

/// Whether a tensor subclass other than `nn.Parameter` was keyed since the last call (and clears
/// the flag). Tensor rules key no type, so a caller that must tell a subclass (whose
/// `__torch_function__` may change what the call does) from a plain tensor asks this after keying.
pub(crate) fn take_subclass_seen() -> bool {
    SUBCLASS_SEEN.with(|s| s.replace(false))
}

/// Imports torch and caches `torch.Tensor` (kept alive forever) the first time a tensor rule is
/// compiled; never on the hot path.
pub(crate) fn ensure_tensor_type(py: Python<'_>) -> PyResult<()> {
    if !TENSOR_TYPE.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let tensor = py.import("torch")?.getattr("Tensor")?;
    let parameter = py.import("torch.nn.parameter")?.getattr("Parameter")?;
    PARAMETER_TYPE.store(parameter.as_ptr().cast::<ffi::PyTypeObject>(), Ordering::Release);
    std::mem::forget(parameter.unbind());
    let ptr = tensor.as_ptr().cast::<ffi::PyTypeObject>();
    std::mem::forget(tensor.unbind());
    TENSOR_TYPE.store(ptr, Ordering::Release);
    // Calibrate the direct field reads once; any failure leaves the attribute path in place.
    if let Err(e) = py.import("jitkey._tensor_fields").and_then(|m| m.getattr("install")?.call0()) {
        drop(e);
    }
    Ok(())
}

/// `torch.Tensor` itself (null until a tensor rule was compiled): exact-type checks compare with it.
#[inline(always)]
pub(crate) fn tensor_type() -> *mut ffi::PyTypeObject {
    TENSOR_TYPE.load(Ordering::Relaxed)
}

/// Whether `tp` is `torch.Tensor` or a subclass of it.
#[inline]
pub(crate) fn is_tensor(tp: *mut ffi::PyTypeObject) -> bool {
    let t = tensor_type();
    // SAFETY: both are live type objects: `tp` is the type of a live object, and the cached
    // Tensor type is leaked, so it is never freed.
    !t.is_null() && (tp == t || unsafe { ffi::PyType_IsSubtype(tp, t) } != 0)
}

// ---- torch.dtype / torch.device type recognition -----------------------------------------------

static DTYPE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
static DEVICE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
static LAYOUT_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
static MEMORY_FORMAT_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// `torch.dtype` once a dtype has been met (null before): for a pointer compare on hot paths.
#[inline(always)]
pub(crate) fn dtype_type() -> *mut ffi::PyTypeObject {
    DTYPE_TYPE.load(Ordering::Acquire)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TorchKind {
    Dtype,
    Device,
    Layout,
    MemoryFormat,
}

/// Whether `tp` (the type of `obj`) is `torch.dtype` / `torch.device`. The fast check is a pointer
/// compare; the first sighting of each type must be the very type object
/// `sys.modules["torch"].<name>` (a C type, not a Python class), then is cached (leaked,
/// immortal). A class that only calls itself `torch.dtype` (its `__module__`/`__name__`) is an
/// ordinary object: it must never fill the dtype table, and is keyed only via `__jitkey__`.
pub(crate) fn torch_kind(obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject) -> Option<TorchKind> {
    if tp == DTYPE_TYPE.load(Ordering::Acquire) {
        return Some(TorchKind::Dtype);
    }
    if tp == DEVICE_TYPE.load(Ordering::Acquire) {
        return Some(TorchKind::Device);
    }
    if tp == LAYOUT_TYPE.load(Ordering::Acquire) {
        return Some(TorchKind::Layout);
    }
    if tp == MEMORY_FORMAT_TYPE.load(Ordering::Acquire) {
        return Some(TorchKind::MemoryFormat);
    }
    torch_kind_slow(obj, tp)
}

#[cold]
fn torch_kind_slow(obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject) -> Option<TorchKind> {
    let ty = obj.get_type();
    let py = obj.py();
    let module = ty.getattr(intern!(py, "__module__")).ok()?;
    if module.extract::<&str>().ok()? != "torch" {
        return None;
    }
    let name = ty.name().ok()?;
    let (kind, slot, attr) = match name.to_str().ok()? {
        "dtype" => (TorchKind::Dtype, &DTYPE_TYPE, intern!(py, "dtype")),
        "device" => (TorchKind::Device, &DEVICE_TYPE, intern!(py, "device")),
        "layout" => (TorchKind::Layout, &LAYOUT_TYPE, intern!(py, "layout")),
        "memory_format" => (TorchKind::MemoryFormat, &MEMORY_FORMAT_TYPE, intern!(py, "memory_format")),
        _ => return None,
    };
    // SAFETY: `tp` is the live type of `obj`.
    let heap = unsafe { ffi::PyType_GetFlags(tp) } & ffi::Py_TPFLAGS_HEAPTYPE != 0;
    let modules = py.import(intern!(py, "sys")).ok()?.getattr(intern!(py, "modules")).ok()?;
    let real = modules.get_item(intern!(py, "torch")).ok()?.getattr(attr).ok()?;
    if heap || !std::ptr::eq(real.as_ptr(), tp.cast()) {
        return None;
    }
    // Keep the type alive forever: the cached pointer must never dangle.
    std::mem::forget(ty.clone().unbind());
    slot.store(tp, Ordering::Release);
    Some(kind)
}

/// The short name of a real `torch.layout` or `torch.memory_format` (`strided`, `channels_last`;
/// the caller checked the exact type with [`torch_kind`]): `str()` of torch's own C type, its fixed
/// spelling `torch.<name>`, not a user-controlled repr. Each is a singleton of torch's module.
#[cold]
pub(crate) fn torch_enum_name(obj: &Bound<'_, PyAny>) -> Result<String, TorchError> {
    let full = obj.str()?;
    let full = full.to_str()?;
    match full.strip_prefix("torch.") {
        Some(short) if !short.is_empty() && short.len() <= 255 && short.is_ascii() => Ok(short.to_owned()),
        _ => Err(TorchError::Msg(format!("unusable {} name {full:?}", type_name(obj)))),
    }
}

/// Whether `obj` is a real `torch.dtype` (see [`torch_kind`]).
pub(crate) fn is_torch_dtype(obj: &Bound<'_, PyAny>) -> bool {
    torch_kind(obj, obj.get_type_ptr()) == Some(TorchKind::Dtype)
}

/// Whether `obj` is a real `torch.device` (see [`torch_kind`]).
pub(crate) fn is_torch_device(obj: &Bound<'_, PyAny>) -> bool {
    torch_kind(obj, obj.get_type_ptr()) == Some(TorchKind::Device)
}

// ---- the dtype table ---------------------------------------------------------------------------

const DTYPE_SLOTS: usize = 128;
/// dtype object pointers (kept alive forever), published after their names.
static DTYPE_PTRS: [AtomicUsize; DTYPE_SLOTS] = [const { AtomicUsize::new(0) }; DTYPE_SLOTS];
static DTYPE_NAMES: [OnceLock<Box<str>>; DTYPE_SLOTS] = [const { OnceLock::new() }; DTYPE_SLOTS];
static DTYPE_LOCK: Mutex<()> = Mutex::new(());

/// The short name of a `torch.dtype` (`float16`): a pointer scan of the published table, else the
/// cold path that validates the type, reads `str(dtype)` and publishes it.
#[inline]
pub(crate) fn dtype_name(d: &Bound<'_, PyAny>) -> Result<&'static str, TorchError> {
    match find_dtype(d.as_ptr() as usize) {
        Ok(name) => Ok(name),
        Err(_) => dtype_name_slow(d),
    }
}

/// Where the dtype at address `key` stands in the published table: `Ok(name)`, or `Err(i)` with
/// the first empty slot `i` (`DTYPE_SLOTS` when the table is full).
#[inline]
fn find_dtype(key: usize) -> Result<&'static str, usize> {
    for (i, slot) in DTYPE_PTRS.iter().enumerate() {
        let p = slot.load(Ordering::Acquire);
        if p == key {
            return Ok(DTYPE_NAMES[i].get().expect("published after its name"));
        }
        if p == 0 {
            return Err(i);
        }
    }
    Err(DTYPE_SLOTS)
}

#[cold]
fn dtype_name_slow(d: &Bound<'_, PyAny>) -> Result<&'static str, TorchError> {
    if !is_torch_dtype(d) {
        return Err(TorchError::Msg(format!("tensor.dtype is not a torch.dtype (got {})", type_name(d))));
    }
    // str(torch.float16) is torch's own fixed spelling "torch.float16" (exact type checked above),
    // not a user-controlled repr.
    let full = d.str()?;
    let full = full.to_str()?;
    let short = full.strip_prefix("torch.").unwrap_or(full);
    if short.is_empty() || short.len() > 255 || !short.is_ascii() {
        return Err(TorchError::Msg(format!("unusable dtype name {short:?}")));
    }
    let _guard = DTYPE_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = d.as_ptr() as usize;
    match find_dtype(key) {
        Ok(name) => Ok(name),
        Err(i) if i < DTYPE_SLOTS => {
            let stored = DTYPE_NAMES[i].get_or_init(|| short.into());
            // Keep the dtype alive forever so its address is never reused by another object.
            std::mem::forget(d.clone().unbind());
            DTYPE_PTRS[i].store(key, Ordering::Release);
            Ok(stored)
        }
        Err(_) => Err(TorchError::Msg("more distinct torch.dtype objects than jitkey's table holds".into())),
    }
}

// ---- the device table --------------------------------------------------------------------------

const DEVICE_SLOTS: usize = 64;
/// Canonical `torch.device` objects (kept alive forever), published after their (type, index).
static DEVICE_PTRS: [AtomicUsize; DEVICE_SLOTS] = [const { AtomicUsize::new(0) }; DEVICE_SLOTS];
static DEVICE_VALS: [OnceLock<(Box<str>, i64)>; DEVICE_SLOTS] = [const { OnceLock::new() }; DEVICE_SLOTS];
static DEVICE_LOCK: Mutex<()> = Mutex::new(());

/// `(type, index)` of a `torch.device` (index −1 when it has none).
///
/// `tensor.device` builds a new object per call and reading `.type` from it costs ~250 ns (it
/// builds a str), so devices are compared with torch's C-level `==` against a small table of
/// canonical device objects seen before. `==` is only used on exact `torch.device` objects, so no
/// Python code runs.
#[inline]
pub(crate) fn device_of(dev: &Bound<'_, PyAny>) -> Result<(&'static str, i64), TorchError> {
    // SAFETY: `dev` is a live object; `Py_TYPE` reads its type pointer.
    let tp = unsafe { ffi::Py_TYPE(dev.as_ptr()) };
    if tp == DEVICE_TYPE.load(Ordering::Acquire) {
        for (i, slot) in DEVICE_PTRS.iter().enumerate() {
            let p = slot.load(Ordering::Acquire);
            if p == 0 {
                break;
            }
            // SAFETY: both are live exact torch.device objects (published slots are never freed);
            // their `==` is torch's C comparison, which runs no Python code.
            let eq =
                unsafe { ffi::PyObject_RichCompareBool(dev.as_ptr(), p as *mut ffi::PyObject, ffi::Py_EQ) };
            if eq == 1 {
                let (ty, idx) = DEVICE_VALS[i].get().expect("published after its value");
                return Ok((ty, *idx));
            }
            if eq < 0 {
                return Err(TorchError::Py(PyErr::fetch(dev.py())));
            }
        }
    }
    device_of_slow(dev)
}

#[cold]
fn device_of_slow(dev: &Bound<'_, PyAny>) -> Result<(&'static str, i64), TorchError> {
    let py = dev.py();
    if !is_torch_device(dev) {
        return Err(TorchError::Msg(format!("tensor.device is not a torch.device (got {})", type_name(dev))));
    }
    let type_str = dev.getattr(intern!(py, "type"))?;
    let type_str: String = type_str.extract()?;
    if type_str.is_empty() || type_str.len() > 255 || !type_str.is_ascii() {
        return Err(TorchError::Msg(format!("unusable device type {type_str:?}")));
    }
    let idx = dev.getattr(intern!(py, "index"))?;
    let idx = if idx.is_none() { -1 } else { idx.extract::<i64>()? };
    let _guard = DEVICE_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    for (i, slot) in DEVICE_PTRS.iter().enumerate() {
        if slot.load(Ordering::Acquire) == 0 {
            let v = DEVICE_VALS[i].get_or_init(|| (type_str.clone().into(), idx));
            std::mem::forget(dev.clone().unbind());
            slot.store(dev.as_ptr() as usize, Ordering::Release);
            return Ok((&v.0, v.1));
        }
    }
    // Table full (more than 64 distinct devices): answer uncached; device type names are few, so
    // each distinct one is leaked once.
    static TYPE_NAMES: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut names = TYPE_NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = names.iter().find(|n| **n == type_str) {
        return Ok((n, idx));
    }
    let leaked: &'static str = Box::leak(type_str.into_boxed_str());
    names.push(leaked);
    Ok((leaked, idx))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_install_tensor_layout, m)?)?;
    m.add_function(wrap_pyfunction!(_tensor_layout_installed, m)?)?;
    m.add_class::<TorchCurrent>()?;
    m.add_class::<TorchAlloc>()?;
    m.add_class::<TorchModes>()?;
    Ok(())
}
