//! Everything the binding knows about torch, in one place: the `torch.Tensor` type, the verified
//! direct reads of `TensorImpl` fields, and the tables that map `torch.dtype` / `torch.device`
//! objects to the names a key holds.
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

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Why a dtype or device could not be named: a message, or the Python error raised reading it.
pub(crate) enum TorchError {
    Msg(String),
    Py(PyErr),
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

/// Imports torch and caches `torch.Tensor` (kept alive forever) the first time a tensor rule is
/// compiled; never on the hot path.
pub(crate) fn ensure_tensor_type(py: Python<'_>) -> PyResult<()> {
    if !TENSOR_TYPE.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let tensor = py.import("torch")?.getattr("Tensor")?;
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

// ---- direct TensorImpl reads (installed only after python/jitkey/_tensor_fields.py verified them) --

/// A verified layout of torch's tensor objects (see `_tensor_fields.py` for how it is proven).
pub(crate) struct Layout {
    /// `torch.Tensor`, `torch.nn.Parameter` (exact types only take the direct path).
    types: [usize; 2],
    impl_vtable: usize,
    storage_vtable: usize,
    /// TypeMeta index → (itemsize, the dtype's short name).
    dtypes: Vec<Option<(u64, &'static str)>>,
    pyobj_tensorimpl: usize,
    impl_storage: usize,
    storage_data: usize,
    impl_ndim: usize,
    impl_sizes: usize,
    impl_inline_strides: usize,
    max_inline_dims: usize,
    impl_storage_offset: usize,
    impl_numel: usize,
    impl_dtype: usize,
    impl_device: usize,
}

/// c10::DeviceType code → device type name: seeded by calibration (cpu, meta), then learned from
/// tensors whose device the attribute path resolved (the enum is fixed, so an entry never changes).
static DEVICE_CODES: [OnceLock<&'static str>; 64] = [const { OnceLock::new() }; 64];

static LAYOUT: OnceLock<Layout> = OnceLock::new();

/// The installed layout, if any (load it once for loops over many arguments).
#[inline(always)]
pub(crate) fn layout() -> Option<&'static Layout> {
    LAYOUT.get()
}

/// A tensor whose fields may be read directly: a plain `TensorImpl` of a known dtype.
pub(crate) struct Direct {
    imp: *const u8,
    /// The dtype's TypeMeta index (process-local).
    pub(crate) idx: u16,
    /// The dtype's short name.
    pub(crate) dtype: &'static str,
    itemsize: u64,
    l: &'static Layout,
}

/// Reads the word at `p + off`.
///
/// # Safety
/// `p + off .. p + off + 8` lies inside a live object whose layout the verified `Layout`
/// describes (the caller passes one of its offsets into the object it belongs to).
#[inline]
unsafe fn rd(p: *const u8, off: usize) -> usize {
    // SAFETY: in bounds of a live object per the contract; unaligned reads are allowed.
    unsafe { p.add(off).cast::<usize>().read_unaligned() }
}

/// The direct view of `obj`, or `None` (then the attribute path is used).
#[inline]
pub(crate) fn direct(obj: &Bound<'_, PyAny>) -> Option<Direct> {
    direct_with(LAYOUT.get()?, obj.as_ptr())
}

/// `direct` with the layout already loaded. `obj` must be a live object.
#[inline(always)]
pub(crate) fn direct_with(l: &'static Layout, obj: *mut ffi::PyObject) -> Option<Direct> {
    let p = obj.cast::<u8>().cast_const();
    // SAFETY: obj is live; its exact type is torch.Tensor/Parameter, whose C layout starts with
    // THPVariable (PyObject_HEAD, then the TensorImpl pointer); the TensorImpl is only read
    // further once its vtable proves it is a plain TensorImpl, whose field offsets were verified.
    unsafe {
        let tp = ffi::Py_TYPE(obj) as usize;
        if tp != l.types[0] && tp != l.types[1] {
            return None;
        }
        let imp = rd(p, l.pyobj_tensorimpl) as *const u8;
        if imp.is_null() || rd(imp, 0) != l.impl_vtable {
            return None;
        }
        let raw_idx = imp.add(l.impl_dtype).cast::<u16>().read_unaligned();
        let (itemsize, dtype) = (*l.dtypes.get(usize::from(raw_idx))?)?;
        Some(Direct { imp, idx: raw_idx, dtype, itemsize, l })
    }
}

impl Direct {
    /// `data_ptr()`, or `None` if the storage is not a plain `StorageImpl`.
    #[inline]
    pub(crate) fn data_ptr(&self) -> Option<u64> {
        // SAFETY: offsets verified for plain TensorImpl/StorageImpl; the storage is followed only
        // when non-null and its vtable is the calibrated plain StorageImpl one.
        unsafe {
            let sp = rd(self.imp, self.l.impl_storage) as *const u8;
            if sp.is_null() || rd(sp, 0) != self.l.storage_vtable {
                return None;
            }
            // torch's TensorImpl::data(): nullptr when numel == 0, else data + offset * itemsize
            // (even for a null data pointer, as meta tensors have).
            if rd(self.imp, self.l.impl_numel) == 0 {
                return Some(0);
            }
            let data = rd(sp, self.l.storage_data) as u64;
            let off = rd(self.imp, self.l.impl_storage_offset) as u64;
            Some(data.wrapping_add(off.wrapping_mul(self.itemsize)))
        }
    }

    /// `(code, index, has_value)` of the tensor's device.
    #[inline]
    fn device_raw(&self) -> (i8, i8, u8) {
        // SAFETY: verified offset of device_opt_ (three bytes) in a plain TensorImpl.
        unsafe {
            let p = self.imp.add(self.l.impl_device);
            (p.cast::<i8>().read(), p.add(1).cast::<i8>().read(), p.add(2).read())
        }
    }

    /// The device as `(type, index)` if its type code is known.
    #[inline]
    pub(crate) fn device(&self) -> Option<(&'static str, i64)> {
        let (code, index, has) = self.device_raw();
        if has != 1 {
            return None;
        }
        let name = DEVICE_CODES.get(usize::try_from(code).ok()?)?.get()?;
        Some((name, i64::from(index)))
    }

    /// Learns the name of this tensor's device type code from `(ty, idx)`, the device the
    /// attribute path resolved for this same tensor.
    #[cold]
    pub(crate) fn learn_device(&self, ty: &'static str, idx: i64) {
        let (code, index, has) = self.device_raw();
        if has == 1 && i64::from(index) == idx {
            if let Some(slot) = usize::try_from(code).ok().and_then(|c| DEVICE_CODES.get(c)) {
                let _ = slot.set(ty);
            }
        }
    }

    /// The sizes and strides, borrowed from the live `TensorImpl`.
    #[inline]
    pub(crate) fn dims(&self) -> (&[i64], &[i64]) {
        // SAFETY: verified SizesAndStrides layout: `ndim` sizes and `ndim` strides, inline up to
        // `max_inline_dims`, else a heap array of sizes followed by strides; they live as long as
        // the tensor, which the caller holds for as long as it borrows `self`.
        unsafe {
            let n = rd(self.imp, self.l.impl_ndim);
            let (sizes, strides) = if n <= self.l.max_inline_dims {
                (
                    self.imp.add(self.l.impl_sizes).cast::<i64>(),
                    self.imp.add(self.l.impl_inline_strides).cast::<i64>(),
                )
            } else {
                let heap = rd(self.imp, self.l.impl_sizes) as *const i64;
                (heap, heap.add(n))
            };
            (std::slice::from_raw_parts(sizes, n), std::slice::from_raw_parts(strides, n))
        }
    }

    /// `numel()`.
    #[inline]
    pub(crate) fn numel(&self) -> i64 {
        // SAFETY: verified offset of numel_ in a plain TensorImpl.
        unsafe { rd(self.imp, self.l.impl_numel) as i64 }
    }
}

/// `_install_tensor_layout(layout, /)`: called once by `jitkey._tensor_fields.install()`.
#[pyfunction]
#[pyo3(signature = (layout, /))]
fn _install_tensor_layout(layout: &Bound<'_, PyDict>) -> PyResult<bool> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        layout.get_item(k)?.ok_or_else(|| PyValueError::new_err(format!("layout lacks {k}")))
    };
    let types = get("tensor_types")?;
    let t0 = types.get_item(0)?;
    let t1 = types.get_item(1)?;
    let offs = get("offsets")?;
    let off = |k: &str| -> PyResult<usize> { offs.get_item(k)?.extract() };
    let mut dtypes: Vec<Option<(u64, &'static str)>> = Vec::new();
    for entry in get("dtypes")?.try_iter()? {
        let (idx, name, size): (usize, String, u64) = entry?.extract()?;
        if idx > u16::MAX as usize {
            return Err(PyValueError::new_err("dtype index out of range"));
        }
        if dtypes.len() <= idx {
            dtypes.resize(idx + 1, None);
        }
        if name.len() > 255 {
            return Err(PyValueError::new_err("dtype name longer than 255 bytes"));
        }
        dtypes[idx] = Some((size, Box::leak(name.into_boxed_str())));
    }
    let l = Layout {
        types: [t0.as_ptr() as usize, t1.as_ptr() as usize],
        impl_vtable: get("impl_vtable")?.extract()?,
        storage_vtable: get("storage_vtable")?.extract()?,
        dtypes,
        pyobj_tensorimpl: off("pyobj_tensorimpl")?,
        impl_storage: off("impl_storage")?,
        storage_data: off("storage_data")?,
        impl_ndim: off("impl_ndim")?,
        impl_sizes: off("impl_sizes")?,
        impl_inline_strides: off("impl_inline_strides")?,
        max_inline_dims: off("max_inline_dims")?,
        impl_storage_offset: off("impl_storage_offset")?,
        impl_numel: off("impl_numel")?,
        impl_dtype: off("impl_dtype")?,
        impl_device: off("impl_device")?,
    };
    for entry in get("devices")?.try_iter()? {
        let (code, name): (usize, String) = entry?.extract()?;
        if let Some(slot) = DEVICE_CODES.get(code) {
            let _ = slot.set(Box::leak(name.into_boxed_str()));
        }
    }
    // The type objects must outlive the cached pointers.
    std::mem::forget(t0.unbind());
    std::mem::forget(t1.unbind());
    Ok(LAYOUT.set(l).is_ok())
}

/// `_tensor_layout_installed()`: whether tensor fields are read directly.
#[pyfunction]
fn _tensor_layout_installed() -> bool {
    LAYOUT.get().is_some()
}

// ---- torch.dtype / torch.device type recognition -----------------------------------------------

static DTYPE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
static DEVICE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TorchKind {
    Dtype,
    Device,
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
    let key = d.as_ptr() as usize;
    for (i, slot) in DTYPE_PTRS.iter().enumerate() {
        let p = slot.load(Ordering::Acquire);
        if p == key {
            return Ok(DTYPE_NAMES[i].get().expect("published after its name"));
        }
        if p == 0 {
            break;
        }
    }
    dtype_name_slow(d)
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
    for (i, slot) in DTYPE_PTRS.iter().enumerate() {
        let p = slot.load(Ordering::Acquire);
        if p == key {
            return Ok(DTYPE_NAMES[i].get().expect("published"));
        }
        if p == 0 {
            let stored = DTYPE_NAMES[i].get_or_init(|| short.into());
            // Keep the dtype alive forever so its address is never reused by another object.
            std::mem::forget(d.clone().unbind());
            slot.store(key, Ordering::Release);
            return Ok(stored);
        }
    }
    Err(TorchError::Msg("more distinct torch.dtype objects than jitkey's table holds".into()))
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
    Ok(())
}
