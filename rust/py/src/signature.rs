//! `jitkey.Signature`: call arguments → key → cached value in one native call.
//!
//! A signature is built once per kernel from per-parameter rules (described in Python by
//! `jitkey.rules`, each rule object returning a plain spec tuple from `__jitkey_rule__()`),
//! compiled into a `jitkey_core::signature::Rule` plan plus a precomputed header (plan
//! description + `extra`). Per call, the plan walks the arguments and writes the key into the
//! thread-local encoder, hashes it and probes a `jitkey.LruCache`; a hit returns the cached object
//! without building any Python object.
//!
//! Tensor metadata is read through interned attribute names; dtype objects (torch singletons) are
//! mapped to their names through a lock-free pointer table, so a dtype costs one attribute read
//! and a pointer compare.

use std::ffi::c_int;
use std::ptr::addr_of_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use jitkey_core::key::{Encoder, Value};
use jitkey_core::signature::{
    self as core_sig, tag as stag, ByType, DeviceMode, IntMode, Rule, ShapeMode, StrideMode, TensorRule,
};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PySequence, PyString, PyTuple};

use crate::errors::{ArgumentError, SignatureError};
use crate::keys::{encode_into, fast_hash_state, with_encoder};
use crate::lru::PyLruCache;

// ---- the miss sentinel -------------------------------------------------------------------------

/// The type of `jitkey.MISS`, what `Signature.lookup` returns when the cache has no entry.
#[pyclass(name = "_Miss", module = "jitkey._core", frozen)]
pub(crate) struct Miss;

#[pymethods]
impl Miss {
    fn __repr__(&self) -> &'static str {
        "jitkey.MISS"
    }
    fn __bool__(&self) -> bool {
        false
    }
}

static MISS: PyOnceLock<Py<Miss>> = PyOnceLock::new();

fn miss(py: Python<'_>) -> &Py<Miss> {
    MISS.get_or_init(py, || Py::new(py, Miss).expect("allocating jitkey.MISS"))
}

// ---- torch types and dtype names ---------------------------------------------------------------

static TENSOR_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// Imports torch and caches `torch.Tensor` (kept alive forever) the first time a tensor rule is
/// compiled; never on the hot path.
fn ensure_tensor_type(py: Python<'_>) -> PyResult<()> {
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

// ---- direct TensorImpl reads (installed only after python/jitkey/_tensor_fields.py verified them) --

/// A verified layout of torch's tensor objects (see `_tensor_fields.py` for how it is proven).
struct Layout {
    /// `torch.Tensor`, `torch.nn.Parameter` (exact types only take the direct path).
    types: [usize; 2],
    impl_vtable: usize,
    storage_vtable: usize,
    /// TypeMeta index → (itemsize, the dtype's short name as the key writes it: length byte + bytes).
    dtypes: Vec<Option<(u64, &'static [u8])>>,
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

/// A tensor whose fields may be read directly: a plain `TensorImpl` of a known dtype.
struct Direct {
    imp: *const u8,
    /// The dtype's TypeMeta index (process-local).
    idx: u16,
    /// The dtype's name as `write_short` writes it.
    short: &'static [u8],
    itemsize: u64,
    l: &'static Layout,
}

#[inline]
unsafe fn rd(p: *const u8, off: usize) -> usize {
    // SAFETY: the caller passes an offset inside an object the verified layout describes.
    unsafe { p.add(off).cast::<usize>().read_unaligned() }
}

/// The direct view of `obj`, or `None` (then the attribute path is used).
#[inline]
fn direct(obj: &Bound<'_, PyAny>) -> Option<Direct> {
    direct_with(LAYOUT.get()?, obj.as_ptr())
}

/// `direct` with the layout already loaded (for loops over many arguments).
#[inline(always)]
fn direct_with(l: &'static Layout, obj: *mut ffi::PyObject) -> Option<Direct> {
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
        let (itemsize, short) = (*l.dtypes.get(usize::from(raw_idx))?)?;
        Some(Direct { imp, idx: raw_idx, short, itemsize, l })
    }
}

impl Direct {
    /// `data_ptr()`, or `None` if the storage is not a plain `StorageImpl`.
    #[inline]
    fn data_ptr(&self) -> Option<u64> {
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
    fn device(&self) -> Option<(&'static str, i64)> {
        let (code, index, has) = self.device_raw();
        if has != 1 {
            return None;
        }
        let name = DEVICE_CODES.get(usize::try_from(code).ok()?)?.get()?;
        Some((name, i64::from(index)))
    }

    /// Pointers to `ndim` sizes and strides (`i64`s).
    #[inline]
    fn dims(&self) -> (usize, *const i64, *const i64) {
        // SAFETY: verified SizesAndStrides layout: inline up to `max_inline_dims`, else a heap
        // array of sizes followed by strides.
        unsafe {
            let n = rd(self.imp, self.l.impl_ndim);
            if n <= self.l.max_inline_dims {
                (
                    n,
                    self.imp.add(self.l.impl_sizes).cast::<i64>(),
                    self.imp.add(self.l.impl_inline_strides).cast::<i64>(),
                )
            } else {
                let heap = rd(self.imp, self.l.impl_sizes) as *const i64;
                (n, heap, heap.add(n))
            }
        }
    }
}

/// c10::DeviceType::CUDA (a fixed enum value of c10).
const CUDA_DEVICE_CODE: i8 = 1;

/// The data pointer of a plain CUDA tensor on device `index`, read from its `TensorImpl`; `None`
/// for anything else (another device, host memory, a subclass, an unverified layout).
#[inline]
pub(crate) fn cuda_data_ptr(obj: *mut ffi::PyObject, index: i64) -> Option<u64> {
    let d = direct_with(LAYOUT.get()?, obj)?;
    let (code, idx, has) = d.device_raw();
    if has != 1 || code != CUDA_DEVICE_CODE || i64::from(idx) != index {
        return None;
    }
    d.data_ptr()
}

/// `_install_tensor_layout(layout, /)`: called once by `jitkey._tensor_fields.install()`.
#[pyfunction]
#[pyo3(signature = (layout, /))]
fn _install_tensor_layout(layout: &Bound<'_, pyo3::types::PyDict>) -> PyResult<bool> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        layout.get_item(k)?.ok_or_else(|| PyValueError::new_err(format!("layout lacks {k}")))
    };
    let types = get("tensor_types")?;
    let t0 = types.get_item(0)?;
    let t1 = types.get_item(1)?;
    let offs = get("offsets")?;
    let off = |k: &str| -> PyResult<usize> { offs.get_item(k)?.extract() };
    let mut dtypes: Vec<Option<(u64, &'static [u8])>> = Vec::new();
    for entry in get("dtypes")?.try_iter()? {
        let (idx, name, size): (usize, String, u64) = entry?.extract()?;
        if idx > u16::MAX as usize {
            return Err(PyValueError::new_err("dtype index out of range"));
        }
        if dtypes.len() <= idx {
            dtypes.resize(idx + 1, None);
        }
        let len = u8::try_from(name.len())
            .map_err(|_| PyValueError::new_err("dtype name longer than 255 bytes"))?;
        let short: &'static [u8] = Box::leak([&[len][..], name.as_bytes()].concat().into_boxed_slice());
        dtypes[idx] = Some((size, short));
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

#[inline]
fn is_tensor(tp: *mut ffi::PyTypeObject) -> bool {
    let t = TENSOR_TYPE.load(Ordering::Relaxed);
    // SAFETY: both are live type objects (the Tensor type is leaked).
    !t.is_null() && (tp == t || unsafe { ffi::PyType_IsSubtype(tp, t) } != 0)
}

const DTYPE_SLOTS: usize = 128;
/// dtype object pointers (kept alive forever), published after their names.
static DTYPE_PTRS: [AtomicUsize; DTYPE_SLOTS] = [const { AtomicUsize::new(0) }; DTYPE_SLOTS];
static DTYPE_NAMES: [OnceLock<Box<str>>; DTYPE_SLOTS] = [const { OnceLock::new() }; DTYPE_SLOTS];
static DTYPE_LOCK: Mutex<()> = Mutex::new(());

/// The short name of a `torch.dtype` (`float16`): a pointer scan of the published table, else the
/// cold path that validates the type, reads `str(dtype)` and publishes it.
#[inline]
fn dtype_name(d: &Bound<'_, PyAny>) -> Result<&'static str, Fail> {
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
fn dtype_name_slow(d: &Bound<'_, PyAny>) -> Result<&'static str, Fail> {
    // The real type object (issue 13): a class merely named torch.dtype must not fill the table.
    if !crate::keys::is_torch_dtype(d) {
        return Err(Fail::msg(format!("tensor.dtype is not a torch.dtype (got {})", type_name(d))));
    }
    // str(torch.float16) is torch's own fixed spelling "torch.float16" (exact type checked above).
    let full = d.str().map_err(Fail::py)?;
    let full = full.to_str().map_err(Fail::py)?;
    let short = full.strip_prefix("torch.").unwrap_or(full);
    if short.is_empty() || short.len() > 255 || !short.is_ascii() {
        return Err(Fail::msg(format!("unusable dtype name {short:?}")));
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
    Err(Fail::msg("more distinct torch.dtype objects than jitkey's table holds".into()))
}

const DEVICE_SLOTS: usize = 64;
/// Canonical `torch.device` objects (kept alive forever), published after their (type, index).
static DEVICE_PTRS: [AtomicUsize; DEVICE_SLOTS] = [const { AtomicUsize::new(0) }; DEVICE_SLOTS];
static DEVICE_VALS: [OnceLock<(Box<str>, i64)>; DEVICE_SLOTS] = [const { OnceLock::new() }; DEVICE_SLOTS];
static DEVICE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// `(type, index)` of a `torch.device` (index −1 when it has none).
///
/// `tensor.device` builds a new object per call and reading `.type` from it costs ~250 ns (it
/// builds a str), so devices are compared with torch's C-level `==` against a small table of
/// canonical device objects seen before. `==` is only used on exact `torch.device` objects, so no
/// Python code runs.
#[inline]
fn device_of(dev: &Bound<'_, PyAny>) -> Result<(&'static str, i64), Fail> {
    // SAFETY: live object; the cached type is kept alive forever.
    let tp = unsafe { ffi::Py_TYPE(dev.as_ptr()) };
    if tp == DEVICE_TYPE.load(Ordering::Acquire) {
        for (i, slot) in DEVICE_PTRS.iter().enumerate() {
            let p = slot.load(Ordering::Acquire);
            if p == 0 {
                break;
            }
            // SAFETY: both are live exact torch.device objects (published slots are never freed).
            let eq =
                unsafe { ffi::PyObject_RichCompareBool(dev.as_ptr(), p as *mut ffi::PyObject, ffi::Py_EQ) };
            if eq == 1 {
                let (ty, idx) = DEVICE_VALS[i].get().expect("published after its value");
                return Ok((ty, *idx));
            }
            if eq < 0 {
                return Err(Fail::py(PyErr::fetch(dev.py())));
            }
        }
    }
    device_of_slow(dev)
}

#[cold]
fn device_of_slow(dev: &Bound<'_, PyAny>) -> Result<(&'static str, i64), Fail> {
    let py = dev.py();
    let ty = dev.get_type();
    if !crate::keys::is_torch_device(dev) {
        return Err(Fail::msg(format!("tensor.device is not a torch.device (got {})", type_name(dev))));
    }
    let type_str = dev.getattr(intern!(py, "type")).map_err(Fail::py)?;
    let type_str: String = type_str.extract().map_err(Fail::py)?;
    if type_str.is_empty() || type_str.len() > 255 || !type_str.is_ascii() {
        return Err(Fail::msg(format!("unusable device type {type_str:?}")));
    }
    let idx = dev.getattr(intern!(py, "index")).map_err(Fail::py)?;
    let idx = if idx.is_none() { -1 } else { idx.extract::<i64>().map_err(Fail::py)? };
    let tp = ty.as_ptr().cast::<ffi::PyTypeObject>();
    let _guard = DEVICE_LOCK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if DEVICE_TYPE.load(Ordering::Acquire).is_null() {
        std::mem::forget(ty.clone().unbind());
        DEVICE_TYPE.store(tp, Ordering::Release);
    }
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

static DEVICE_LOCK: Mutex<()> = Mutex::new(());

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().fully_qualified_name().map_or_else(|_| "<unknown type>".to_owned(), |n| n.to_string())
}

// ---- failures ----------------------------------------------------------------------------------

/// Why an argument could not be keyed; turned into `ArgumentError` naming the parameter.
pub(crate) struct Fail {
    msg: String,
    cause: Option<PyErr>,
    /// Innermost first (tuple items).
    path: Vec<usize>,
}

impl Fail {
    fn msg(msg: String) -> Self {
        Self { msg, cause: None, path: Vec::new() }
    }
    fn py(err: PyErr) -> Self {
        Self { msg: String::new(), cause: Some(err), path: Vec::new() }
    }
    fn wrong_type(obj: &Bound<'_, PyAny>, expected: &str) -> Self {
        Self::msg(format!("expected {expected}, got {}", type_name(obj)))
    }
    fn at(mut self, i: usize) -> Self {
        self.path.push(i);
        self
    }
    #[cold]
    fn into_pyerr(self, py: Python<'_>, param: &str) -> PyErr {
        // KeyboardInterrupt / SystemExit raised while reading an argument pass through unchanged.
        if let Some(c) =
            self.cause.as_ref().filter(|c| !c.is_instance_of::<pyo3::exceptions::PyException>(py))
        {
            return c.clone_ref(py);
        }
        let mut at = format!("'{param}'");
        for i in self.path.iter().rev() {
            at.push_str(&format!("[{i}]"));
        }
        let msg = match (&self.cause, self.msg.is_empty()) {
            (Some(c), true) => format!("parameter {at}: {}", c.value(py)),
            _ => format!("parameter {at}: {}", self.msg),
        };
        let err = ArgumentError::new_err(msg);
        if let Some(c) = self.cause {
            err.set_cause(py, Some(c));
        }
        err
    }
}

type FResult = Result<(), Fail>;

// ---- rule compilation --------------------------------------------------------------------------

fn spec_err(param: &str, msg: impl std::fmt::Display) -> PyErr {
    SignatureError::new_err(format!("parameter '{param}': {msg}"))
}

fn item<'py>(spec: &Bound<'py, PyTuple>, i: usize, param: &str) -> PyResult<Bound<'py, PyAny>> {
    spec.get_item(i).map_err(|_| spec_err(param, format!("rule spec {spec} is too short")))
}

fn get_bool(spec: &Bound<'_, PyTuple>, i: usize, param: &str) -> PyResult<bool> {
    let v = item(spec, i, param)?;
    v.cast::<pyo3::types::PyBool>()
        .map(|b| b.is_true())
        .map_err(|_| spec_err(param, format!("rule spec item {i} must be a bool, got {v}")))
}

fn get_str(spec: &Bound<'_, PyTuple>, i: usize, param: &str) -> PyResult<String> {
    let v = item(spec, i, param)?;
    v.extract::<String>().map_err(|_| spec_err(param, format!("rule spec item {i} must be a str, got {v}")))
}

fn parse_tensor(spec: &Bound<'_, PyTuple>, param: &str) -> PyResult<TensorRule> {
    // ("tensor", dtype: bool, align: int, shape: str, strides: str, device: str, numel_i64: bool)
    if spec.len() != 7 {
        return Err(spec_err(param, format!("tensor rule spec needs 7 items, got {spec}")));
    }
    let align: u32 = item(spec, 2, param)?
        .extract()
        .map_err(|_| spec_err(param, "tensor align must be an int in 0..=2**31"))?;
    if align != 0 && !align.is_power_of_two() {
        return Err(spec_err(param, format!("tensor align must be 0 or a power of two, got {align}")));
    }
    let shape = match get_str(spec, 3, param)?.as_str() {
        "ignore" => ShapeMode::Ignore,
        "exact" => ShapeMode::Exact,
        "bucket" => ShapeMode::Bucket,
        other => {
            return Err(spec_err(param, format!("tensor shape must be exact/bucket/ignore, got {other:?}")))
        }
    };
    let strides = match get_str(spec, 4, param)?.as_str() {
        "ignore" => StrideMode::Ignore,
        "exact" => StrideMode::Exact,
        "contiguous" => StrideMode::Contiguous,
        other => {
            return Err(spec_err(
                param,
                format!("tensor strides must be exact/contiguous/ignore, got {other:?}"),
            ))
        }
    };
    let device = match get_str(spec, 5, param)?.as_str() {
        "ignore" => DeviceMode::Ignore,
        "type" => DeviceMode::Type,
        "type_index" => DeviceMode::TypeIndex,
        other => {
            return Err(spec_err(
                param,
                format!("tensor device must be type/type_index/ignore, got {other:?}"),
            ))
        }
    };
    ensure_tensor_type(spec.py())?;
    Ok(TensorRule {
        dtype: get_bool(spec, 1, param)?,
        align,
        shape,
        strides,
        device,
        numel_i64: get_bool(spec, 6, param)?,
    })
}

fn parse_int(spec: &Bound<'_, PyTuple>, param: &str) -> PyResult<IntMode> {
    // ("int", mode: str, specialize: bool, align: bool)
    if spec.len() != 4 {
        return Err(spec_err(param, format!("int rule spec needs 4 items, got {spec}")));
    }
    Ok(match get_str(spec, 1, param)?.as_str() {
        "value" => IntMode::Value,
        "type" => IntMode::Type,
        "triton" => {
            IntMode::Triton { specialize: get_bool(spec, 2, param)?, align: get_bool(spec, 3, param)? }
        }
        other => return Err(spec_err(param, format!("int mode must be value/type/triton, got {other:?}"))),
    })
}

fn parse_spec(spec: &Bound<'_, PyAny>, param: &str) -> PyResult<Rule> {
    let spec = spec
        .cast::<PyTuple>()
        .map_err(|_| spec_err(param, format!("rule spec must be a tuple, got {spec}")))?;
    let kind = get_str(spec, 0, param)?;
    let fixed = |n: usize, r: Rule| -> PyResult<Rule> {
        if spec.len() == n {
            Ok(r)
        } else {
            Err(spec_err(param, format!("{kind} rule spec needs {n} items, got {spec}")))
        }
    };
    match kind.as_str() {
        "tensor" => Ok(Rule::Tensor(parse_tensor(spec, param)?)),
        "int" => Ok(Rule::Int(parse_int(spec, param)?)),
        "float" => {
            if spec.len() != 2 {
                return Err(spec_err(param, format!("float rule spec needs 2 items, got {spec}")));
            }
            Ok(Rule::Float { value: get_bool(spec, 1, param)? })
        }
        "bool" => {
            if spec.len() != 2 {
                return Err(spec_err(param, format!("bool rule spec needs 2 items, got {spec}")));
            }
            Ok(Rule::Bool { value: get_bool(spec, 1, param)? })
        }
        "none" => fixed(1, Rule::NoneValue),
        "constexpr" => fixed(1, Rule::Constexpr),
        "any" => fixed(1, Rule::Any),
        "ignore" => fixed(1, Rule::Ignore),
        "by_type" => {
            // ("by_type", tensor|None, int|None, float|None, bool|None, none, tuples, lists, any
            //  [, items: by_type spec|None [, objects]])
            if !(9..=11).contains(&spec.len()) {
                return Err(spec_err(param, format!("by_type rule spec needs 9 to 11 items, got {spec}")));
            }
            let opt = |i: usize| -> PyResult<Option<Bound<'_, PyTuple>>> {
                let v = item(spec, i, param)?;
                if v.is_none() {
                    return Ok(None);
                }
                v.cast_into::<PyTuple>()
                    .map(Some)
                    .map_err(|_| spec_err(param, format!("by_type item {i} must be a rule spec or None")))
            };
            let tensor = opt(1)?.map(|t| parse_tensor(&t, param)).transpose()?;
            let int = opt(2)?.map(|t| parse_int(&t, param)).transpose()?;
            let float = match opt(3)? {
                None => None,
                Some(t) => match parse_spec(t.as_any(), param)? {
                    Rule::Float { value } => Some(value),
                    _ => return Err(spec_err(param, "by_type float alternative must be a float rule")),
                },
            };
            let bool_ = match opt(4)? {
                None => None,
                Some(t) => match parse_spec(t.as_any(), param)? {
                    Rule::Bool { value } => Some(value),
                    _ => return Err(spec_err(param, "by_type bool alternative must be a bool rule")),
                },
            };
            let b = ByType {
                tensor,
                int,
                float,
                bool_,
                none: get_bool(spec, 5, param)?,
                tuples: get_bool(spec, 6, param)?,
                lists: get_bool(spec, 7, param)?,
                any: get_bool(spec, 8, param)?,
                objects: spec.len() == 11 && get_bool(spec, 10, param)?,
                items: match if spec.len() >= 10 { opt(9)? } else { None } {
                    None => None,
                    Some(t) => match parse_spec(t.as_any(), param)? {
                        Rule::ByType(inner) => Some(inner),
                        _ => return Err(spec_err(param, "by_type items must be a by_type rule")),
                    },
                },
            };
            if b.lists && !b.tuples {
                return Err(spec_err(param, "by_type: lists need tuples"));
            }
            Ok(Rule::ByType(Box::new(b)))
        }
        other => Err(spec_err(param, format!("unknown rule kind {other:?}"))),
    }
}

/// A rule object (from `jitkey.rules`) or a raw spec tuple → the compiled rule.
fn compile_rule(rule: &Bound<'_, PyAny>, param: &str) -> PyResult<Rule> {
    let py = rule.py();
    if rule.is_instance_of::<PyTuple>() {
        return parse_spec(rule, param);
    }
    let method = rule.getattr(intern!(py, "__jitkey_rule__")).map_err(|_| {
        spec_err(param, format!("{} is not a jitkey rule (see jitkey.rules)", type_name(rule)))
    })?;
    parse_spec(&method.call0()?, param)
}

// ---- the per-call walk -------------------------------------------------------------------------

#[inline]
fn write_short(enc: &mut Encoder, s: &str) -> FResult {
    let n = u8::try_from(s.len()).map_err(|_| Fail::msg(format!("name {s:?} longer than 255 bytes")))?;
    enc.raw_u8(n);
    enc.raw(s.as_bytes());
    Ok(())
}

/// Reads an exact-or-subclass int's value as i64 (no Python code runs for real ints).
#[inline]
fn long_i64(ptr: *mut ffi::PyObject) -> Option<i64> {
    let mut overflow: c_int = 0;
    // SAFETY: ptr is a live int (PyLong_Check passed).
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow) };
    if overflow == 0 && !(v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() }) {
        Some(v)
    } else {
        None
    }
}

/// Any int's value as i128 when it fits in [-2**63, 2**64), else `None` (error state cleared).
fn long_i128(obj: &Bound<'_, PyAny>) -> Option<i128> {
    let ptr = obj.as_ptr();
    let mut overflow: c_int = 0;
    // SAFETY: ptr is a live int.
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow) };
    if overflow == 0 {
        if v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() } {
            let _ = PyErr::take(obj.py());
            return None;
        }
        return Some(i128::from(v));
    }
    if overflow > 0 {
        // SAFETY: as above.
        let u = unsafe { ffi::PyLong_AsUnsignedLongLong(ptr) };
        if u == u64::MAX && unsafe { !ffi::PyErr_Occurred().is_null() } {
            let _ = PyErr::take(obj.py());
            return None;
        }
        return Some(i128::from(u));
    }
    None
}

/// The length of a `torch.Size` / stride tuple, checked to be a tuple.
#[inline]
fn dims_len(seq: &Bound<'_, PyAny>, what: &str) -> Result<usize, Fail> {
    // SAFETY: seq is live; torch.Size / stride() results are tuples (or tuple subclasses).
    if unsafe { ffi::PyTuple_Check(seq.as_ptr()) } == 0 {
        return Err(Fail::msg(format!("tensor {what} is not a tuple ({})", type_name(seq))));
    }
    Ok(unsafe { ffi::PyTuple_Size(seq.as_ptr()) } as usize)
}

/// Calls `f` with each size of a tuple checked by [`dims_len`] (no allocation).
#[inline]
fn for_dims(seq: &Bound<'_, PyAny>, n: usize, what: &str, mut f: impl FnMut(i64)) -> FResult {
    for i in 0..n {
        // SAFETY: i < n = len of a tuple we hold; borrowed item.
        let it = unsafe { ffi::PyTuple_GetItem(seq.as_ptr(), i as ffi::Py_ssize_t) };
        if unsafe { ffi::PyLong_Check(it) } == 0 {
            return Err(Fail::msg(format!("tensor {what} holds a non-int (symbolic sizes are not keyable)")));
        }
        f(long_i64(it).ok_or_else(|| Fail::msg(format!("tensor {what} out of range")))?);
    }
    Ok(())
}

fn ndim_u8(n: usize) -> Result<u8, Fail> {
    u8::try_from(n).map_err(|_| Fail::msg("tensor has more than 255 dims".into()))
}

fn encode_tensor(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    let py = obj.py();
    enc.raw_u8(stag::TENSOR);
    let fast = direct(obj);
    if t.dtype {
        match &fast {
            Some(f) => enc.raw(f.short),
            None => {
                let d = obj.getattr(intern!(py, "dtype")).map_err(Fail::py)?;
                write_short(enc, dtype_name(&d)?)?;
            }
        }
    }
    if t.align != 0 {
        if let Some(v) = fast.as_ref().and_then(Direct::data_ptr) {
            enc.raw_u8(u8::from(v & u64::from(t.align - 1) == 0));
        } else {
            encode_align_slow(t, obj, enc)?;
        }
    }
    if let Some(f) = &fast {
        if t.shape != ShapeMode::Ignore || t.strides == StrideMode::Exact {
            let (n, sizes, strides) = f.dims();
            let n8 = ndim_u8(n)?;
            // SAFETY: `dims` returns pointers to `n` sizes and `n` strides of a live TensorImpl.
            let (sizes, strides) =
                unsafe { (std::slice::from_raw_parts(sizes, n), std::slice::from_raw_parts(strides, n)) };
            match t.shape {
                ShapeMode::Ignore => {}
                ShapeMode::Exact => {
                    enc.raw_u8(n8);
                    for d in sizes {
                        enc.raw(&d.to_le_bytes());
                    }
                }
                ShapeMode::Bucket => {
                    enc.raw_u8(n8);
                    for d in sizes {
                        enc.raw_u8(core_sig::bucket_dim(*d));
                    }
                }
            }
            if t.strides == StrideMode::Exact {
                if t.shape == ShapeMode::Ignore {
                    enc.raw_u8(n8);
                }
                for d in strides {
                    enc.raw(&d.to_le_bytes());
                }
            }
            return encode_tensor_rest(t, obj, enc, Some(f));
        }
        // No dims keyed (Triton's rules): nothing for the attribute path to read either.
        return encode_tensor_rest(t, obj, enc, Some(f));
    }
    encode_tensor_dims_slow(t, obj, enc)?;
    encode_tensor_rest(t, obj, enc, fast.as_ref())
}

#[inline]
fn encode_align_slow(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    let py = obj.py();
    {
        let p = obj.call_method0(intern!(py, "data_ptr")).map_err(Fail::py)?;
        // SAFETY: p is a live object; checked to be an int.
        let v = unsafe {
            if ffi::PyLong_Check(p.as_ptr()) == 0 {
                return Err(Fail::msg("data_ptr() did not return an int".into()));
            }
            ffi::PyLong_AsUnsignedLongLong(p.as_ptr())
        };
        if v == u64::MAX && PyErr::occurred(py) {
            return Err(Fail::py(PyErr::fetch(py)));
        }
        enc.raw_u8(u8::from(v & u64::from(t.align - 1) == 0));
    }
    Ok(())
}

/// Shape and strides through the attribute path.
fn encode_tensor_dims_slow(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    let py = obj.py();
    let mut ndim: Option<usize> = None;
    if t.shape != ShapeMode::Ignore {
        let s = obj.getattr(intern!(py, "shape")).map_err(Fail::py)?;
        let n = dims_len(&s, "shape")?;
        enc.raw_u8(ndim_u8(n)?);
        let exact = t.shape == ShapeMode::Exact;
        for_dims(&s, n, "shape", |d| {
            if exact {
                enc.raw(&d.to_le_bytes());
            } else {
                enc.raw_u8(core_sig::bucket_dim(d));
            }
        })?;
        ndim = Some(n);
    }
    match t.strides {
        StrideMode::Ignore => {}
        StrideMode::Exact => {
            let s = obj.call_method0(intern!(py, "stride")).map_err(Fail::py)?;
            let n = dims_len(&s, "stride")?;
            match ndim {
                Some(k) if k != n => {
                    return Err(Fail::msg("tensor stride rank differs from its shape".into()))
                }
                Some(_) => {}
                None => enc.raw_u8(ndim_u8(n)?),
            }
            for_dims(&s, n, "stride", |d| enc.raw(&d.to_le_bytes()))?;
        }
        StrideMode::Contiguous => {}
    }
    Ok(())
}

/// Contiguity, device and the int64-indexing flag.
fn encode_tensor_rest(
    t: &TensorRule,
    obj: &Bound<'_, PyAny>,
    enc: &mut Encoder,
    fast: Option<&Direct>,
) -> FResult {
    let py = obj.py();
    match t.strides {
        StrideMode::Ignore | StrideMode::Exact => {}
        StrideMode::Contiguous => {
            let c = obj.call_method0(intern!(py, "is_contiguous")).map_err(Fail::py)?;
            enc.raw_u8(u8::from(c.as_ptr() == unsafe { ffi::Py_True() }));
        }
    }
    if t.device != DeviceMode::Ignore {
        let (ty, idx) = match fast.and_then(Direct::device) {
            Some(d) => d,
            None => {
                let dev = obj.getattr(intern!(py, "device")).map_err(Fail::py)?;
                let (ty, idx) = device_of(&dev)?;
                if let Some(f) = fast {
                    // Learn this device type's code once the attribute path has named it.
                    let (code, index, has) = f.device_raw();
                    if has == 1 && i64::from(index) == idx {
                        if let Some(slot) = usize::try_from(code).ok().and_then(|c| DEVICE_CODES.get(c)) {
                            let _ = slot.set(ty);
                        }
                    }
                }
                (ty, idx)
            }
        };
        write_short(enc, ty)?;
        if t.device == DeviceMode::TypeIndex {
            enc.raw(&idx.to_le_bytes());
        }
    }
    if t.numel_i64 {
        let n: i64 = match fast {
            // SAFETY: verified offset of numel_ in a plain TensorImpl.
            Some(f) => unsafe { rd(f.imp, f.l.impl_numel) as i64 },
            None => obj.call_method0(intern!(py, "numel")).map_err(Fail::py)?.extract().map_err(Fail::py)?,
        };
        enc.raw_u8(u8::from(n > i64::from(i32::MAX)));
    }
    Ok(())
}

fn encode_int(mode: IntMode, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    match mode {
        IntMode::Type => enc.raw_u8(stag::INT_TYPE),
        IntMode::Value => match long_i64(obj.as_ptr()) {
            Some(v) => enc.int(v),
            None => {
                // SAFETY: clearing a possible error state from the failed fast read.
                let _ = PyErr::take(obj.py());
                // Exact ints of any size go through the canonical walker; subclasses must fit i64.
                if unsafe { ffi::PyLong_CheckExact(obj.as_ptr()) } != 0 {
                    encode_into(obj, enc).map_err(|e| Fail::py(e.into_pyerr(obj.py(), "value")))?;
                } else {
                    return Err(Fail::msg("int subclass value outside the i64 range".into()));
                }
            }
        },
        IntMode::Triton { specialize, align } => {
            let v = match long_i64(obj.as_ptr()) {
                Some(v) => i128::from(v),
                None => {
                    let _ = PyErr::take(obj.py());
                    long_i128(obj).ok_or_else(|| {
                        Fail::msg("int outside Triton's range [-2**63, 2**64) (Triton cannot pass it)".into())
                    })?
                }
            };
            let b = core_sig::triton_int_bucket(v, specialize, align).ok_or_else(|| {
                Fail::msg("int outside Triton's range [-2**63, 2**64) (Triton cannot pass it)".into())
            })?;
            core_sig::write_triton_int(enc, b);
        }
    }
    Ok(())
}

fn encode_float(value: bool, obj: &Bound<'_, PyAny>, enc: &mut Encoder) {
    if value {
        // SAFETY: PyFloat_Check passed; PyFloat_AsDouble reads the value of a float (subclass).
        enc.float(unsafe { ffi::PyFloat_AsDouble(obj.as_ptr()) });
    } else {
        enc.raw_u8(stag::FLOAT_TYPE);
    }
}

#[inline]
fn encode_bool(value: bool, ptr: *mut ffi::PyObject, enc: &mut Encoder) {
    if value {
        // SAFETY: comparing against the True singleton.
        enc.bool(ptr == unsafe { ffi::Py_True() });
    } else {
        enc.raw_u8(stag::BOOL_TYPE);
    }
}

fn encode_keyable(obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    encode_into(obj, enc).map_err(|e| Fail::py(e.into_pyerr(obj.py(), "value")))
}

fn encode_rule(rule: &Rule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    let ptr = obj.as_ptr();
    // SAFETY: ptr is live; type objects are static builtins.
    let tp = unsafe { ffi::Py_TYPE(ptr) };
    let is_bool = std::ptr::eq(tp, addr_of_mut!(ffi::PyBool_Type));
    match rule {
        Rule::Tensor(t) => {
            if !is_tensor(tp) {
                return Err(Fail::wrong_type(obj, "a torch.Tensor"));
            }
            encode_tensor(t, obj, enc)
        }
        Rule::Int(mode) => {
            if is_bool || unsafe { ffi::PyLong_Check(ptr) } == 0 {
                return Err(Fail::wrong_type(obj, "an int (bool is not accepted as an int)"));
            }
            encode_int(*mode, obj, enc)
        }
        Rule::Float { value } => {
            if unsafe { ffi::PyFloat_Check(ptr) } == 0 {
                return Err(Fail::wrong_type(obj, "a float"));
            }
            encode_float(*value, obj, enc);
            Ok(())
        }
        Rule::Bool { value } => {
            if !is_bool {
                return Err(Fail::wrong_type(obj, "a bool"));
            }
            encode_bool(*value, ptr, enc);
            Ok(())
        }
        Rule::NoneValue => {
            if !obj.is_none() {
                return Err(Fail::wrong_type(obj, "None"));
            }
            enc.none();
            Ok(())
        }
        Rule::Constexpr | Rule::Any => encode_keyable(obj, enc),
        Rule::Ignore => Ok(()),
        Rule::ByType(b) => encode_by_type(b, obj, enc, 0),
    }
}

fn encode_by_type(b: &ByType, obj: &Bound<'_, PyAny>, enc: &mut Encoder, depth: usize) -> FResult {
    let ptr = obj.as_ptr();
    // SAFETY: as in encode_rule.
    let tp = unsafe { ffi::Py_TYPE(ptr) };
    // The exact Tensor type first: the common case of a kernel argument, and one pointer compare
    // (PyFloat_Check would otherwise walk a tensor's MRO before it is reached).
    if let Some(t) = &b.tensor {
        if tp == TENSOR_TYPE.load(Ordering::Relaxed) {
            return encode_tensor(t, obj, enc);
        }
    }
    unsafe {
        if std::ptr::eq(tp, addr_of_mut!(ffi::PyBool_Type)) {
            if let Some(v) = b.bool_ {
                encode_bool(v, ptr, enc);
                return Ok(());
            }
        } else if ffi::PyLong_Check(ptr) != 0 {
            if let Some(m) = b.int {
                return encode_int(m, obj, enc);
            }
        } else if ffi::PyFloat_Check(ptr) != 0 {
            if let Some(v) = b.float {
                encode_float(v, obj, enc);
                return Ok(());
            }
        } else if ptr == ffi::Py_None() {
            if b.none {
                enc.none();
                return Ok(());
            }
        } else if let Some(t) = &b.tensor {
            if is_tensor(tp) {
                return encode_tensor(t, obj, enc);
            }
        }
        let is_tuple = std::ptr::eq(tp, addr_of_mut!(ffi::PyTuple_Type));
        let is_list = std::ptr::eq(tp, addr_of_mut!(ffi::PyList_Type));
        if b.tuples && (is_tuple || (b.lists && is_list)) {
            if depth >= jitkey_core::key::MAX_DEPTH {
                return Err(Fail::msg("arguments nested too deeply".into()));
            }
            // Lists are snapshotted into a tuple first (their length may change under us otherwise).
            let items: Bound<'_, PyTuple> = if is_tuple {
                obj.cast::<PyTuple>().expect("exact tuple").clone()
            } else {
                obj.cast::<PyList>().expect("exact list").to_tuple()
            };
            enc.raw_u8(if is_tuple { jitkey_core::key::tag::TUPLE } else { stag::LIST });
            return encode_items(b, &items, enc, depth);
        }
        if b.tuples && ffi::PyTuple_Check(ptr) != 0 {
            if let Some(fields) = namedtuple_fields(obj) {
                return encode_namedtuple(b, obj, &fields, enc, depth);
            }
        }
    }
    if b.objects && !b.any && !is_builtin_value(tp) {
        // Every leaf the canonical walker writes for a non-builtin object (an object header, a
        // dtype, a device) starts with a tag no other alternative above writes.
        return encode_keyable(obj, enc);
    }
    if b.any {
        // Every alternative above writes a leaf whose first tag differs from what the canonical
        // walker writes for the same type, and a type handled above never reaches this line.
        return encode_keyable(obj, enc);
    }
    Err(Fail::wrong_type(obj, &expected_types(b)))
}

/// Whether `tp` is a builtin value type (or a subclass of one) that the by-type alternatives
/// either handle or refuse; such objects never reach the `objects` alternative.
fn is_builtin_value(tp: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: tp is a live type object; the flag checks read its tp_flags.
    unsafe {
        let flags = ffi::Py_TPFLAGS_LONG_SUBCLASS
            | ffi::Py_TPFLAGS_TUPLE_SUBCLASS
            | ffi::Py_TPFLAGS_LIST_SUBCLASS
            | ffi::Py_TPFLAGS_BYTES_SUBCLASS
            | ffi::Py_TPFLAGS_UNICODE_SUBCLASS
            | ffi::Py_TPFLAGS_DICT_SUBCLASS;
        ffi::PyType_GetFlags(tp) & flags != 0
            || ffi::PyType_IsSubtype(tp, addr_of_mut!(ffi::PyFloat_Type)) != 0
    }
}

/// The field names of a tuple subclass: a named tuple's `_fields` (a tuple of str), or none for a
/// plain tuple subclass such as `torch.Size` (Triton binds both like tuples). `None`: some other
/// `_fields`, not keyed.
fn namedtuple_fields<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyTuple>> {
    let py = obj.py();
    let Ok(fields) = obj.get_type().getattr(intern!(py, "_fields")) else {
        return Some(PyTuple::empty(py));
    };
    let fields = fields.cast_into_exact::<PyTuple>().ok()?;
    fields.iter().all(|f| f.is_exact_instance_of::<pyo3::types::PyString>()).then_some(fields)
}

/// A tuple subclass (a named tuple, `torch.Size`): tag, the v1 encoding of `(qualified type name,
/// field names)`, then the items as for a tuple. Triton keys it like a tuple of its items; the type
/// and the field names make this finer.
fn encode_namedtuple(
    b: &ByType,
    obj: &Bound<'_, PyAny>,
    fields: &Bound<'_, PyTuple>,
    enc: &mut Encoder,
    depth: usize,
) -> FResult {
    if depth >= jitkey_core::key::MAX_DEPTH {
        return Err(Fail::msg("arguments nested too deeply".into()));
    }
    let name = obj.get_type().fully_qualified_name().map_err(Fail::py)?;
    enc.raw_u8(stag::NAMEDTUPLE);
    let head = PyTuple::new(obj.py(), [name.into_any(), fields.clone().into_any()]).map_err(Fail::py)?;
    encode_keyable(head.as_any(), enc)?;
    encode_items(b, obj.cast::<PyTuple>().expect("a tuple subclass"), enc, depth)
}

/// A sequence's items under a by-type rule (after its tag): u32 LE count, then each item with
/// `b.items` (or `b` itself).
fn encode_items(b: &ByType, items: &Bound<'_, PyTuple>, enc: &mut Encoder, depth: usize) -> FResult {
    let n = u32::try_from(items.len()).map_err(|_| Fail::msg("sequence too long".into()))?;
    enc.raw(&n.to_le_bytes());
    for (i, it) in items.iter().enumerate() {
        encode_by_type(b.items.as_deref().unwrap_or(b), &it, enc, depth + 1).map_err(|e| e.at(i))?;
    }
    Ok(())
}

fn expected_types(b: &ByType) -> String {
    let mut v = Vec::new();
    if b.tensor.is_some() {
        v.push("torch.Tensor");
    }
    if b.int.is_some() {
        v.push("int");
    }
    if b.float.is_some() {
        v.push("float");
    }
    if b.bool_.is_some() {
        v.push("bool");
    }
    if b.none {
        v.push("None");
    }
    if b.tuples {
        v.push(if b.lists { "tuple/list of these" } else { "tuple of these" });
    }
    if b.any {
        v.push("a keyable value");
    }
    if v.is_empty() {
        "nothing (the rule accepts no type)".into()
    } else {
        v.join(", ")
    }
}

// ---- the Signature class -----------------------------------------------------------------------

/// Call arguments → key, compiled once per kernel from per-parameter rules (see :mod:`jitkey.rules`).
///
/// ``params`` is a sequence of ``(name, rule)`` or ``(name, rule, default)`` tuples (parameters with
/// defaults come last and may be left out of a call). ``extra`` is any keyable value folded into
/// every key: the function's identity, device, options, knob state.
///
/// A call's key is a header (tag ``0x10``, the plan's description, then ``extra``'s encoding)
/// followed by one leaf per parameter; the encoding is injective, so equal keys mean equal
/// signatures, extras and per-parameter leaves.
///
/// Raises:
///     jitkey.errors.SignatureError: a malformed parameter or rule, a duplicate name, a required
///         parameter after a defaulted one, or an ``extra`` / default that cannot be keyed.
#[pyclass(name = "Signature", module = "jitkey._core", frozen)]
pub(crate) struct Signature {
    names: Vec<String>,
    rules: Vec<Rule>,
    defaults: Vec<Option<Py<PyAny>>>,
    /// Required positional parameters (those before the first default).
    required: usize,
    header: Box<[u8]>,
    extra: Py<PyAny>,
    /// Per parameter: `Some(align)` when its rule keys a tensor by dtype (+ `data_ptr() % align`,
    /// 0 = not keyed) and nothing else, so `encode_param_in_process` may use the short form.
    dtype_align_only: Vec<Option<u32>>,
}

impl Signature {
    /// Writes the key of `args` into `enc` (header included).
    #[inline]
    fn encode_args(&self, args: &Bound<'_, PyTuple>, enc: &mut Encoder) -> PyResult<()> {
        let py = args.py();
        let n = args.len();
        if n < self.required || n > self.rules.len() {
            return Err(self.count_error(n));
        }
        enc.raw(&self.header);
        for (i, rule) in self.rules.iter().enumerate() {
            let r = if i < n {
                // SAFETY: i < len of a tuple we hold.
                let a = unsafe { args.get_borrowed_item_unchecked(i) };
                encode_rule(rule, &a, enc)
            } else {
                let d = self.defaults[i].as_ref().expect("positions past `required` have defaults");
                encode_rule(rule, d.bind(py), enc)
            };
            if let Err(e) = r {
                return Err(e.into_pyerr(py, &self.names[i]));
            }
        }
        Ok(())
    }

    /// Parameter names, in order (for bindings that map keyword arguments).
    pub(crate) fn param_names(&self) -> &[String] {
        &self.names
    }

    /// The default of parameter `i`, if it has one.
    pub(crate) fn default_of(&self, i: usize) -> Option<&Py<PyAny>> {
        self.defaults[i].as_ref()
    }

    /// Writes the signature's header (plan description + `extra`).
    #[inline]
    pub(crate) fn encode_header(&self, enc: &mut Encoder) {
        enc.raw(&self.header);
    }

    /// Writes every parameter's part of the key, as `encode_param` would, except that an exact
    /// `torch.Tensor` read directly, under a rule that keys only its dtype and alignment, is written
    /// as a 4-byte process-local leaf (`tag::TENSOR_IN_PROCESS`, dtype index, aligned). For keys
    /// that never leave the process: equal buckets still give equal bytes (the same tensor always
    /// takes the same path), and the leaf's tag differs from every other leaf's, so distinct
    /// buckets never collide. `params[i]` are live objects; an error names the parameter.
    pub(crate) fn encode_params_in_process(
        &self,
        py: Python<'_>,
        params: &[*mut ffi::PyObject],
        enc: &mut Encoder,
    ) -> PyResult<()> {
        let tensor_type = TENSOR_TYPE.load(Ordering::Relaxed);
        let layout = LAYOUT.get();
        for (i, (&p, &fast)) in params.iter().zip(&self.dtype_align_only).enumerate() {
            if let (Some(align), Some(l)) = (fast, layout) {
                // SAFETY: p is live (the caller's contract).
                if unsafe { ffi::Py_TYPE(p) } == tensor_type {
                    if let Some(f) = direct_with(l, p) {
                        let aligned = if align == 0 {
                            Some(true)
                        } else {
                            f.data_ptr().map(|d| d & u64::from(align - 1) == 0)
                        };
                        if let Some(a) = aligned {
                            let [lo, hi] = f.idx.to_le_bytes();
                            enc.raw(&[stag::TENSOR_IN_PROCESS, lo, hi, u8::from(a)]);
                            continue;
                        }
                    }
                }
            }
            // SAFETY: as above.
            self.encode_param(i, &*unsafe { Borrowed::from_ptr(py, p) }, enc)?;
        }
        Ok(())
    }

    /// Writes parameter `i`'s part of the key (the caller writes the header and every parameter
    /// in order); an unkeyable value gives `ArgumentError` naming the parameter.
    #[inline]
    pub(crate) fn encode_param(&self, i: usize, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> PyResult<()> {
        encode_rule(&self.rules[i], obj, enc).map_err(|e| e.into_pyerr(obj.py(), &self.names[i]))
    }

    #[cold]
    fn count_error(&self, n: usize) -> PyErr {
        let total = self.rules.len();
        let expect =
            if self.required == total { format!("{total}") } else { format!("{} to {total}", self.required) };
        let missing =
            if n < self.required { format!("; missing '{}'", self.names[n]) } else { String::new() };
        ArgumentError::new_err(format!("signature takes {expect} arguments, got {n}{missing}"))
    }

    fn decode(&self, bytes: &[u8]) -> PyResult<(Value, Vec<Vec<core_sig::Component>>)> {
        core_sig::decode(&self.rules, self.header.len(), bytes)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::None => py.None().into_bound(py),
        Value::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::BigInt(b) => {
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("signed", true)?;
            py.get_type::<pyo3::types::PyInt>().call_method(
                "from_bytes",
                (PyBytes::new(py, b), "little"),
                Some(&kwargs),
            )?
        }
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::Tuple(items) => {
            let v = items.iter().map(|x| value_to_py(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, v)?.into_any()
        }
        Value::Dtype(d) => PyString::new(py, d).into_any(),
        Value::Device(t, i) => match i {
            Some(i) => PyString::new(py, &format!("{t}:{i}")).into_any(),
            None => PyString::new(py, t).into_any(),
        },
        Value::Object(name, inner) => {
            PyTuple::new(py, [PyString::new(py, name).into_any(), value_to_py(py, inner)?])?.into_any()
        }
    })
}

fn render(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::BigInt(b) => {
            let be: String = b.iter().rev().map(|x| format!("{x:02x}")).collect();
            format!("int.from_bytes(bytes.fromhex('{be}'), 'big', signed=True)")
        }
        Value::Float(f) => format!("{f:?}"),
        Value::Str(s) => format!("{s:?}"),
        Value::Bytes(b) => format!("<{} bytes>", b.len()),
        Value::Tuple(items) => {
            let inner: Vec<String> = items.iter().map(render).collect();
            if items.len() == 1 {
                format!("({},)", inner[0])
            } else {
                format!("({})", inner.join(", "))
            }
        }
        Value::Dtype(d) => d.clone(),
        Value::Device(t, Some(i)) => format!("{t}:{i}"),
        Value::Device(t, None) => t.clone(),
        Value::Object(n, inner) => format!("{n}({})", render(inner)),
    }
}

#[pymethods]
impl Signature {
    #[new]
    #[pyo3(signature = (params, *, extra = None))]
    fn new(py: Python<'_>, params: &Bound<'_, PyAny>, extra: Option<Bound<'_, PyAny>>) -> PyResult<Self> {
        let extra = extra.unwrap_or_else(|| PyTuple::empty(py).into_any());
        let seq = params.cast::<PySequence>().map_err(|_| {
            SignatureError::new_err("params must be a sequence of (name, rule[, default]) tuples")
        })?;
        let mut names = Vec::new();
        let mut rules = Vec::new();
        let mut defaults = Vec::new();
        let mut required = None;
        for (i, p) in seq.try_iter()?.enumerate() {
            let p = p?;
            let t = p.cast::<PyTuple>().map_err(|_| {
                SignatureError::new_err(format!(
                    "params[{i}] must be a (name, rule[, default]) tuple, got {p}"
                ))
            })?;
            if !(2..=3).contains(&t.len()) {
                return Err(SignatureError::new_err(format!(
                    "params[{i}] must be a (name, rule[, default]) tuple, got {} items",
                    t.len()
                )));
            }
            let name: String = t
                .get_item(0)?
                .extract()
                .map_err(|_| SignatureError::new_err(format!("params[{i}]: the name must be a str")))?;
            if names.contains(&name) {
                return Err(SignatureError::new_err(format!("duplicate parameter name '{name}'")));
            }
            let rule = compile_rule(&t.get_item(1)?, &name)?;
            if t.len() == 3 {
                required.get_or_insert(i);
                defaults.push(Some(t.get_item(2)?.unbind()));
            } else {
                if required.is_some() {
                    return Err(SignatureError::new_err(format!(
                        "parameter '{name}' without a default follows a parameter with a default"
                    )));
                }
                defaults.push(None);
            }
            names.push(name);
            rules.push(rule);
        }
        let required = required.unwrap_or(rules.len());
        let header = with_encoder(|enc| {
            encode_into(&extra, enc).map_err(|e| {
                let err = SignatureError::new_err("extra is not keyable");
                err.set_cause(py, Some(e.into_pyerr(py, "extra")));
                err
            })?;
            core_sig::header(&rules, enc.as_bytes()).map_err(|e| SignatureError::new_err(e.to_string()))
        })?;
        let dtype_align_only = rules
            .iter()
            .map(|r| {
                let t = match r {
                    Rule::Tensor(t) => Some(t),
                    Rule::ByType(b) => b.tensor.as_ref(),
                    _ => None,
                }?;
                let plain = t.dtype
                    && t.shape == ShapeMode::Ignore
                    && t.strides == StrideMode::Ignore
                    && t.device == DeviceMode::Ignore
                    && !t.numel_i64;
                plain.then_some(t.align)
            })
            .collect();
        let sig = Self {
            names,
            rules,
            defaults,
            required,
            header: header.into_boxed_slice(),
            extra: extra.unbind(),
            dtype_align_only,
        };
        // Defaults must be keyable by their rules: check now rather than on the first short call.
        for (i, d) in sig.defaults.iter().enumerate() {
            if let Some(d) = d {
                let r = with_encoder(|enc| encode_rule(&sig.rules[i], d.bind(py), enc));
                if let Err(e) = r {
                    let err = SignatureError::new_err(format!(
                        "default of parameter '{}' is not keyable by its rule",
                        sig.names[i]
                    ));
                    err.set_cause(py, Some(e.into_pyerr(py, &sig.names[i])));
                    return Err(err);
                }
            }
        }
        Ok(sig)
    }

    /// Parameter names, in order.
    #[getter]
    fn names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.names)
    }

    /// The value folded into every key (``()`` when ``extra`` was omitted or ``None``).
    #[getter]
    fn extra<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.extra.bind(py).clone()
    }

    /// The bytes every key of this signature starts with.
    #[getter]
    fn header<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.header)
    }

    fn __len__(&self) -> usize {
        self.rules.len()
    }

    fn __repr__(&self) -> String {
        format!("Signature({})", self.names.join(", "))
    }

    /// Return the key of a call (positional arguments as a tuple).
    ///
    /// Raises:
    ///     jitkey.errors.ArgumentError: wrong argument count, or an argument its rule cannot key
    ///         (the message names the parameter, e.g. ``parameter 'n': expected an int``).
    #[pyo3(signature = (args, /))]
    fn encode<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyBytes>> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            Ok(PyBytes::new(args.py(), enc.as_bytes()))
        })
    }

    /// Return the 32-byte persistent key of a call: blake2b-256 over ``DIGEST_DOMAIN + encode(args)``.
    #[pyo3(signature = (args, /))]
    fn digest<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyBytes>> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            Ok(PyBytes::new(args.py(), &jitkey_core::key::digest(enc.as_bytes())))
        })
    }

    /// Return the in-memory 64-bit hash of a call's key (seeded per process).
    #[pyo3(signature = (args, /))]
    fn fast_hash(&self, args: &Bound<'_, PyTuple>) -> PyResult<u64> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            Ok(fast_hash_state().hash(enc.as_bytes()))
        })
    }

    /// The hot path: key the call and probe ``cache`` in one native call.
    ///
    /// Returns the cached value, or :data:`MISS`. Builds no Python object on a hit.
    /// Raises like :meth:`encode`.
    #[pyo3(signature = (cache, args, /))]
    fn lookup<'py>(
        &self,
        cache: &Bound<'py, PyLruCache>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = args.py();
        let hit = with_encoder(|enc| {
            self.encode_args(args, enc)?;
            let b = enc.as_bytes();
            Ok::<_, PyErr>(cache.get().get_encoded(py, fast_hash_state().hash(b), b))
        })?;
        Ok(hit.unwrap_or_else(|| miss(py).bind(py).clone().into_any()))
    }

    /// Store ``value`` in ``cache`` under the call's key.
    #[pyo3(signature = (cache, args, value, /))]
    fn insert(
        &self,
        cache: &Bound<'_, PyLruCache>,
        args: &Bound<'_, PyTuple>,
        value: Py<PyAny>,
    ) -> PyResult<()> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            let b = enc.as_bytes();
            cache.get().insert_encoded(fast_hash_state().hash(b), b, value);
            Ok(())
        })
    }

    /// Return the cached value for the call, or call ``factory()``, store and return its result.
    ///
    /// The factory runs with no lock held; an exception from it propagates and stores nothing.
    /// Single-flight: concurrent misses on one call key run ``factory`` once and share its result
    /// (or its exception).
    #[pyo3(signature = (cache, args, factory, /))]
    fn get_or_insert<'py>(
        &self,
        cache: &Bound<'py, PyLruCache>,
        args: &Bound<'py, PyTuple>,
        factory: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = args.py();
        let (hash, key, hit) = with_encoder(|enc| {
            self.encode_args(args, enc)?;
            let b = enc.as_bytes();
            let h = fast_hash_state().hash(b);
            match cache.get().get_encoded(py, h, b) {
                Some(v) => Ok::<_, PyErr>((h, Vec::new(), Some(v))),
                None => Ok((h, b.to_vec(), None)),
            }
        })?;
        if let Some(v) = hit {
            return Ok(v);
        }
        cache.get().fill_miss(py, hash, &key, None, |_| factory.call0())
    }

    /// The key as a tuple: ``(extra, leaf_0, leaf_1, ...)``, one tuple of components per parameter.
    ///
    /// Holds the same information as :meth:`encode` (tensor dtypes and devices shown as strings).
    #[pyo3(signature = (args, /))]
    fn flatten<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        let py = args.py();
        let bytes = with_encoder(|enc| self.encode_args(args, enc).map(|()| enc.as_bytes().to_vec()))?;
        let (extra, params) = self.decode(&bytes)?;
        let mut out = vec![value_to_py(py, &extra)?];
        for comps in &params {
            let vals = comps.iter().map(|(_, v)| value_to_py(py, v)).collect::<PyResult<Vec<_>>>()?;
            out.push(PyTuple::new(py, vals)?.into_any());
        }
        PyTuple::new(py, out)
    }

    /// Name the parameters and buckets that make two calls key differently.
    ///
    /// E.g. ``["x.aligned: True != False", "n.equals_1: False != True"]``; ``[]`` when the keys are equal.
    #[pyo3(signature = (args_a, args_b, /))]
    fn explain(&self, args_a: &Bound<'_, PyTuple>, args_b: &Bound<'_, PyTuple>) -> PyResult<Vec<String>> {
        let a = with_encoder(|enc| self.encode_args(args_a, enc).map(|()| enc.as_bytes().to_vec()))?;
        let b = with_encoder(|enc| self.encode_args(args_b, enc).map(|()| enc.as_bytes().to_vec()))?;
        let (_, pa) = self.decode(&a)?;
        let (_, pb) = self.decode(&b)?;
        let mut out = Vec::new();
        for (i, (ca, cb)) in pa.iter().zip(&pb).enumerate() {
            if ca == cb {
                continue;
            }
            let name = &self.names[i];
            let names_a: Vec<&str> = ca.iter().map(|(n, _)| *n).collect();
            let names_b: Vec<&str> = cb.iter().map(|(n, _)| *n).collect();
            if names_a != names_b || ca.len() != cb.len() {
                out.push(format!(
                    "{name}: {} != {}",
                    render(&core_sig::components_value(ca)),
                    render(&core_sig::components_value(cb))
                ));
                continue;
            }
            for ((n, va), (_, vb)) in ca.iter().zip(cb) {
                if !va.same_key(vb) {
                    out.push(format!("{name}.{n}: {} != {}", render(va), render(vb)));
                }
            }
        }
        Ok(out)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_install_tensor_layout, m)?)?;
    m.add_function(wrap_pyfunction!(_tensor_layout_installed, m)?)?;
    m.add_class::<Signature>()?;
    m.add_class::<Miss>()?;
    m.add("MISS", miss(m.py()).clone_ref(m.py()))?;
    Ok(())
}
