//! Python value → canonical encoding (format v1, see `jitkey_core::key`).
//!
//! The walk dispatches on the *exact* type of each object, so a subclass can never smuggle in its
//! own `__eq__`/`__hash__`/`__str__`; nothing is ever keyed through `repr()` or `str()`.
//! Exact builtins are read through the C API (borrowed tuple items, cached UTF-8 of str objects);
//! `torch.dtype` / `torch.device` are recognised by their type objects, cached on first sight;
//! any other object must define `__jitkey__()`, else the walk fails naming the type and position.

use std::cell::Cell;
use std::ffi::c_int;
use std::ptr::addr_of_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::RwLock;

use jitkey_core::key::{EncodeError, Encoder, FastHashState, MAX_DEPTH};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use crate::errors::{KeyDepthError, KeyLengthError, UnsupportedKeyError};

/// One step of the path from the root of a key tree to the failing leaf.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step {
    Index(usize),
    JitKey,
}

/// Why a walk failed, with the path to the failing object. Boxed, so that the `Result` every
/// level of the walk returns stays one word wide on the (error-free) hot path.
#[derive(Debug)]
pub(crate) struct WalkError(Box<WalkErrorInner>);

#[derive(Debug)]
struct WalkErrorInner {
    kind: WalkErrorKind,
    /// Innermost step first: steps are pushed while the error unwinds.
    path: Vec<Step>,
}

#[derive(Debug)]
enum WalkErrorKind {
    Unsupported { type_name: String, why: &'static str },
    Key(EncodeError),
    Py(PyErr),
}

impl WalkError {
    #[cold]
    fn new(kind: WalkErrorKind) -> Self {
        Self(Box::new(WalkErrorInner { kind, path: Vec::new() }))
    }

    #[cold]
    fn unsupported(obj: &Bound<'_, PyAny>, why: &'static str) -> Self {
        let ty = obj.get_type();
        let type_name =
            ty.fully_qualified_name().map_or_else(|_| "<unknown type>".to_owned(), |n| n.to_string());
        Self::new(WalkErrorKind::Unsupported { type_name, why })
    }

    #[cold]
    fn at(mut self, step: Step) -> Self {
        self.0.path.push(step);
        self
    }

    /// Renders the failing position as `root[2][0].__jitkey__()`.
    pub(crate) fn position(&self, root: &str) -> String {
        let mut s = root.to_owned();
        for step in self.0.path.iter().rev() {
            match step {
                Step::Index(i) => {
                    s.push('[');
                    s.push_str(&i.to_string());
                    s.push(']');
                }
                Step::JitKey => s.push_str(".__jitkey__()"),
            }
        }
        s
    }

    /// The Python exception for this failure; `root` names the top of the tree in the message.
    #[cold]
    pub(crate) fn into_pyerr(self, py: Python<'_>, root: &str) -> PyErr {
        let at = self.position(root);
        match self.0.kind {
            WalkErrorKind::Unsupported { type_name, why } => UnsupportedKeyError::new_err(format!(
                "cannot key a value of type '{type_name}' at {at}: {why}"
            )),
            WalkErrorKind::Key(e @ EncodeError::TooDeep { .. }) => {
                KeyDepthError::new_err(format!("{e} (at {at})"))
            }
            WalkErrorKind::Key(e @ EncodeError::TooLong { .. }) => {
                KeyLengthError::new_err(format!("{e} (at {at})"))
            }
            WalkErrorKind::Key(e) => {
                UnsupportedKeyError::new_err(format!("cannot key the value at {at}: {e}"))
            }
            // KeyboardInterrupt, SystemExit, GeneratorExit (raised inside __jitkey__ or a
            // __str__): not a key problem; they pass through unchanged.
            WalkErrorKind::Py(err) if !err.is_instance_of::<pyo3::exceptions::PyException>(py) => err,
            WalkErrorKind::Py(err) => {
                let wrapped = UnsupportedKeyError::new_err(format!(
                    "computing the key at {at} raised {}",
                    err.get_type(py).name().map_or_else(|_| "an exception".into(), |n| n.to_string())
                ));
                wrapped.set_cause(py, Some(err));
                wrapped
            }
        }
    }
}

impl From<EncodeError> for WalkError {
    #[cold]
    fn from(e: EncodeError) -> Self {
        Self::new(WalkErrorKind::Key(e))
    }
}

impl From<PyErr> for WalkError {
    #[cold]
    fn from(e: PyErr) -> Self {
        Self::new(WalkErrorKind::Py(e))
    }
}

pub(crate) type WalkResult<T = ()> = Result<T, WalkError>;

const UNSUPPORTED_WHY: &str = "jitkey keys None, bool, int, float, str, bytes, tuple, torch.dtype, \
     torch.device and objects defining __jitkey__(); subclasses of builtins need __jitkey__() too";

// ---- object layout fast paths ------------------------------------------------------------------
//
// The abi3 build may only call functions for tuple items and str hashes (`PyTuple_GetItem`,
// `PyObject_Hash`); those calls were a third of a warm structural hash. On the CPython builds an
// abi3 wheel can load into (3.10-3.14, GIL, no Py_TRACE_REFS), a tuple's items follow its 24-byte
// `PyVarObject` header and a str caches its hash in the 4th word of `PyASCIIObject`. jitkey reads
// them directly only after `init_layout` proved, on live objects at import, that direct reads
// equal the API's answers; on any other interpreter it keeps calling the API.

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
unsafe fn str_hash(s: *mut ffi::PyObject) -> ffi::Py_hash_t {
    if FAST_LAYOUT.load(Ordering::Relaxed) {
        // SAFETY: layout verified by `init_layout`.
        let cached = unsafe { *s.cast::<ffi::Py_hash_t>().add(STR_HASH_WORD) };
        if cached != -1 {
            return cached;
        }
    }
    // Never fails for an exact str (the hash is then cached in the object).
    unsafe { ffi::PyObject_Hash(s) }
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
    let after = unsafe { *sp.cast::<ffi::Py_hash_t>().add(STR_HASH_WORD) };
    Ok(before == -1 && after == hash && hash != -1)
}

// ---- torch type recognition --------------------------------------------------------------------

static DTYPE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());
static DEVICE_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// dtype object → short name. torch's dtype objects are module-level singletons; the entries hold
/// a strong reference (`Py`), so a pointer can never be reused by another object.
type DtypeEntry = (usize, Box<str>, Py<PyAny>);
static DTYPE_NAMES: RwLock<Vec<DtypeEntry>> = RwLock::new(Vec::new());

#[derive(Clone, Copy, PartialEq, Eq)]
enum TorchKind {
    Dtype,
    Device,
}

/// Whether `tp` is `torch.dtype` / `torch.device`. The fast check is a pointer compare; the first
/// sighting of each type must be the very type object `sys.modules["torch"].<name>` (a C type,
/// not a Python class), then is cached (leaked, immortal). A class that only calls itself
/// `torch.dtype` (its `__module__`/`__name__`) is an ordinary object, keyed only via `__jitkey__`.
fn torch_kind(obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject) -> Option<TorchKind> {
    if tp == DTYPE_TYPE.load(Ordering::Acquire) {
        return Some(TorchKind::Dtype);
    }
    if tp == DEVICE_TYPE.load(Ordering::Acquire) {
        return Some(TorchKind::Device);
    }
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

/// `module.qualname` of a `__jitkey__` object's type, as `_reference._type_name` spells it: only
/// `builtins` is left out. (PyO3's `fully_qualified_name` also drops `__main__`, which made a class
/// of the main script share keys with a module's class of the same dotted name.)
fn object_type_name(ty: &Bound<'_, PyType>) -> PyResult<String> {
    let py = ty.py();
    let module = ty.getattr(intern!(py, "__module__"))?;
    let module = module.str()?;
    let module = module.to_str()?;
    let qualname = ty.getattr(intern!(py, "__qualname__"))?;
    let qualname = qualname.str()?;
    let qualname = qualname.to_str()?;
    Ok(if module == "builtins" || module == "__builtin__" {
        qualname.to_owned()
    } else {
        format!("{module}.{qualname}")
    })
}

fn dtype_name(obj: &Bound<'_, PyAny>) -> WalkResult<Box<str>> {
    let key = obj.as_ptr() as usize;
    if let Ok(names) = DTYPE_NAMES.read() {
        if let Some((_, name, _)) = names.iter().find(|(p, _, _)| *p == key) {
            return Ok(name.clone());
        }
    }
    // str(torch.float32) == "torch.float32": the exact type was checked, so this is torch's own,
    // fixed spelling of the dtype, not a user-controlled repr.
    let full = obj.str()?;
    let full = full.to_str()?;
    let short: Box<str> = full.strip_prefix("torch.").unwrap_or(full).into();
    if let Ok(mut names) = DTYPE_NAMES.write() {
        if !names.iter().any(|(p, _, _)| *p == key) {
            names.push((key, short.clone(), obj.clone().unbind()));
        }
    }
    Ok(short)
}

fn encode_device(obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> WalkResult {
    let py = obj.py();
    let dev_type = obj.getattr(intern!(py, "type"))?;
    let dev_type = dev_type.extract::<&str>()?;
    let index = obj.getattr(intern!(py, "index"))?;
    let index = if index.is_none() { None } else { Some(index.extract::<i64>()?) };
    enc.device(dev_type, index)?;
    Ok(())
}

// ---- the walk ----------------------------------------------------------------------------------

#[inline]
fn is_type(tp: *mut ffi::PyTypeObject, builtin: *mut ffi::PyTypeObject) -> bool {
    std::ptr::eq(tp, builtin)
}

/// Appends the canonical encoding of `obj` to `enc`.
///
/// # Errors
/// A [`WalkError`] naming the failing position; `enc` may hold a partial encoding then.
pub(crate) fn encode_into(obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> WalkResult {
    walk(obj, enc, 0)
}

fn walk(obj: &Bound<'_, PyAny>, enc: &mut Encoder, depth: usize) -> WalkResult {
    // SAFETY: `obj` is a live object; `Py_TYPE` reads its type pointer.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    match leaf(obj, tp, enc) {
        Leaf::Done => Ok(()),
        Leaf::Err(e) => Err(e),
        Leaf::Tuple => walk_tuple(obj, enc, depth),
        Leaf::Other => walk_other(obj, tp, enc, depth),
    }
}

enum Leaf {
    Done,
    Tuple,
    Other,
    Err(WalkError),
}

/// Encodes `obj` if it is an exact scalar builtin. Kept inline in the tuple loop, so scalar items
/// cost no recursive call (the walk's frame is large; its prologue dominated the profile).
#[inline(always)]
fn leaf(obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject, enc: &mut Encoder) -> Leaf {
    let ptr = obj.as_ptr();
    // SAFETY: `ptr` is a live object of type `tp`; the builtin type objects are static, and
    // each branch calls only C-API functions valid for that exact type.
    unsafe {
        if is_type(tp, addr_of_mut!(ffi::PyUnicode_Type)) {
            let mut size: ffi::Py_ssize_t = 0;
            let data = ffi::PyUnicode_AsUTF8AndSize(ptr, &mut size);
            if data.is_null() {
                return Leaf::Err(lone_surrogates(obj));
            }
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), size as usize);
            return match enc.str(std::str::from_utf8_unchecked(bytes)) {
                Ok(()) => Leaf::Done,
                Err(e) => Leaf::Err(e.into()),
            };
        }
        if is_type(tp, addr_of_mut!(ffi::PyLong_Type)) {
            let mut overflow: c_int = 0;
            let v = ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow);
            if overflow == 0 {
                enc.int(v);
                return Leaf::Done;
            }
            return match walk_bigint(obj, enc) {
                Ok(()) => Leaf::Done,
                Err(e) => Leaf::Err(e),
            };
        }
        if is_type(tp, addr_of_mut!(ffi::PyTuple_Type)) {
            return Leaf::Tuple;
        }
        if ptr == ffi::Py_None() {
            enc.none();
            return Leaf::Done;
        }
        if is_type(tp, addr_of_mut!(ffi::PyBool_Type)) {
            enc.bool(ptr == ffi::Py_True());
            return Leaf::Done;
        }
        if is_type(tp, addr_of_mut!(ffi::PyFloat_Type)) {
            enc.float(ffi::PyFloat_AsDouble(ptr));
            return Leaf::Done;
        }
        if is_type(tp, addr_of_mut!(ffi::PyBytes_Type)) {
            let data = ffi::PyBytes_AsString(ptr);
            let size = ffi::PyBytes_Size(ptr);
            let bytes = std::slice::from_raw_parts(data.cast::<u8>(), size as usize);
            return match enc.bytes(bytes) {
                Ok(()) => Leaf::Done,
                Err(e) => Leaf::Err(e.into()),
            };
        }
    }
    Leaf::Other
}

#[cold]
fn lone_surrogates(obj: &Bound<'_, PyAny>) -> WalkError {
    // Lone surrogates have no UTF-8 form; refuse rather than key a lossy version.
    let _ = PyErr::take(obj.py());
    WalkError::unsupported(obj, "str contains lone surrogates (not UTF-8)")
}

#[cold]
fn walk_bigint(obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> WalkResult {
    let py = obj.py();
    let bits: usize = obj.call_method0(intern!(py, "bit_length"))?.extract()?;
    let nbytes = (bits + 8) / 8;
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "signed"), true)?;
    let raw = obj.call_method(intern!(py, "to_bytes"), (nbytes, intern!(py, "little")), Some(&kwargs))?;
    let raw = raw.cast::<PyBytes>().map_err(PyErr::from)?;
    enc.bigint_le(raw.as_bytes())?;
    Ok(())
}

fn walk_tuple(obj: &Bound<'_, PyAny>, enc: &mut Encoder, depth: usize) -> WalkResult {
    if depth >= MAX_DEPTH {
        return Err(EncodeError::TooDeep { limit: MAX_DEPTH }.into());
    }
    let ptr = obj.as_ptr();
    // SAFETY: exact tuple; items are borrowed from an immutable tuple we keep alive.
    let len = unsafe { tuple_len(ptr) } as usize;
    enc.tuple_header(len)?;
    for i in 0..len {
        let item = unsafe { Borrowed::from_ptr(obj.py(), tuple_item(ptr, i as ffi::Py_ssize_t)) };
        let tp = unsafe { ffi::Py_TYPE(item.as_ptr()) };
        let res = match leaf(&item, tp, enc) {
            Leaf::Done => continue,
            Leaf::Err(e) => Err(e),
            Leaf::Tuple => walk_tuple(&item, enc, depth + 1),
            Leaf::Other => walk_other(&item, tp, enc, depth + 1),
        };
        res.map_err(|e| e.at(Step::Index(i)))?;
    }
    Ok(())
}

#[cold]
fn walk_other(
    obj: &Bound<'_, PyAny>,
    tp: *mut ffi::PyTypeObject,
    enc: &mut Encoder,
    depth: usize,
) -> WalkResult {
    let py = obj.py();
    match torch_kind(obj, tp) {
        Some(TorchKind::Dtype) => {
            let name = dtype_name(obj)?;
            enc.dtype(&name)?;
            return Ok(());
        }
        Some(TorchKind::Device) => return encode_device(obj, enc),
        None => {}
    }
    let ty = obj.get_type();
    let adapter = adapter_for(py, tp);
    if adapter.is_none() && !ty.hasattr(intern!(py, "__jitkey__"))? {
        return Err(WalkError::unsupported(obj, UNSUPPORTED_WHY));
    }
    if depth >= MAX_DEPTH {
        return Err(EncodeError::TooDeep { limit: MAX_DEPTH }.into());
    }
    let type_name = object_type_name(&ty)?;
    enc.object_header(&type_name)?;
    let value = match adapter {
        Some(f) => f.bind(py).call1((obj,)),
        None => obj.call_method0(intern!(py, "__jitkey__")),
    }
    .map_err(|e| WalkError::from(e).at(Step::JitKey))?;
    walk(&value, enc, depth + 1).map_err(|e| e.at(Step::JitKey))
}

// ---- key adapters ------------------------------------------------------------------------------

/// A type keyed by a function instead of its own `__jitkey__` (for types jitkey does not own, such
/// as Triton's `constexpr` and `dtype`): `(type, adapter, subclasses too)`. The adapter's result
/// is keyed exactly as a `__jitkey__()` result would be, under the type's qualified name. The
/// entries hold their type, so a type pointer is never reused while it is registered.
type AdapterEntry = (Py<PyType>, Py<PyAny>, bool);
static ADAPTERS: RwLock<Vec<AdapterEntry>> = RwLock::new(Vec::new());

fn adapter_for(py: Python<'_>, tp: *mut ffi::PyTypeObject) -> Option<Py<PyAny>> {
    let entries = ADAPTERS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let exact = entries.iter().find(|(t, _, _)| t.as_ptr().cast::<ffi::PyTypeObject>() == tp);
    let found = exact.or_else(|| {
        entries.iter().find(|(t, _, sub)| {
            // SAFETY: both are live type objects.
            *sub && unsafe { ffi::PyType_IsSubtype(tp, t.as_ptr().cast()) } != 0
        })
    });
    found.map(|(_, f, _)| f.clone_ref(py))
}

/// _register_key_adapter(type, adapter, /, *, subclasses=False): key objects of `type` (and of its
/// subclasses, if asked) as `adapter(obj)`, like a `__jitkey__` method. Registering a type again
/// replaces its adapter; `adapter=None` removes it.
#[pyfunction]
#[pyo3(signature = (tp, adapter, /, *, subclasses = false))]
fn _register_key_adapter(tp: Bound<'_, PyType>, adapter: Option<Py<PyAny>>, subclasses: bool) {
    let mut entries = ADAPTERS.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    let old = entries.iter().position(|(t, _, _)| t.is(&tp));
    let removed = old.map(|i| entries.remove(i));
    if let Some(f) = adapter {
        entries.push((tp.unbind(), f, subclasses));
    }
    drop(entries);
    drop(removed); // outside the lock: dropping may run Python code
}

// ---- the Python API ----------------------------------------------------------------------------

thread_local! {
    /// Reused encoding buffer. Taken (not borrowed) for the duration of a call, so a re-entrant
    /// call from a `__jitkey__` method simply gets a fresh buffer.
    static BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` with a cleared thread-local encoder and returns its result.
pub(crate) fn with_encoder<R>(f: impl FnOnce(&mut Encoder) -> R) -> R {
    let mut enc = Encoder::from_vec(BUF.with(Cell::take));
    let out = f(&mut enc);
    let mut buf = enc.into_vec();
    if buf.capacity() <= 1 << 16 {
        buf.clear();
        BUF.with(|b| b.set(buf));
    }
    out
}

/// The process-wide seeded state of the in-memory hash.
pub(crate) fn fast_hash_state() -> &'static FastHashState {
    static STATE: std::sync::OnceLock<FastHashState> = std::sync::OnceLock::new();
    STATE.get_or_init(FastHashState::new)
}

/// Encodes `value` with a thread-local buffer and hands the bytes to `f`.
pub(crate) fn with_encoding<R>(
    value: &Bound<'_, PyAny>,
    root: &str,
    f: impl FnOnce(&[u8]) -> R,
) -> PyResult<R> {
    with_encoder(|enc| match encode_into(value, enc) {
        Ok(()) => Ok(f(enc.as_bytes())),
        Err(e) => Err(e.into_pyerr(value.py(), root)),
    })
}

/// Return the canonical encoding of a key tree.
///
/// Leaves: ``None``, ``bool``, ``int`` (any size), ``float`` (bit-exact, one canonical NaN), ``str``,
/// ``bytes``, ``tuple`` (nested up to :data:`MAX_DEPTH`), ``torch.dtype``, ``torch.device`` and objects
/// whose type defines ``__jitkey__()`` (returning a key tree). Exact types only: subclasses of builtins
/// need ``__jitkey__`` too. Equal encodings mean equal key trees; ``True``, ``1``, ``1.0`` and ``"1"``
/// all differ.
///
/// Raises:
///     jitkey.errors.UnsupportedKeyError: a value of another type (a ``TypeError``); the message
///         names the type and its position, e.g. ``value[1][0]``.
///     jitkey.errors.KeyDepthError: nesting deeper than :data:`MAX_DEPTH`.
#[pyfunction]
#[pyo3(signature = (value, /))]
fn encode<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    with_encoding(value, "value", |b| PyBytes::new(value.py(), b))
}

/// Return the 32-byte persistent key of a key tree.
///
/// ``hashlib.blake2b(DIGEST_DOMAIN + encode(value), digest_size=32).digest()``, computed in Rust;
/// stable across processes, machines and Python versions. Raises like :func:`encode`.
#[pyfunction]
#[pyo3(signature = (value, /))]
fn digest<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let d = with_encoding(value, "value", jitkey_core::key::digest)?;
    Ok(PyBytes::new(value.py(), &d))
}

/// Return the in-memory 64-bit hash of a key tree (seeded per process; not stable across processes).
///
/// Raises like :func:`encode`.
#[pyfunction]
#[pyo3(signature = (value, /))]
fn fast_hash(value: &Bound<'_, PyAny>) -> PyResult<u64> {
    with_encoding(value, "value", |b| fast_hash_state().hash(b))
}

/// Return the 32-byte digest of an encoding obtained from :func:`encode`.
#[pyfunction]
#[pyo3(signature = (encoding, /))]
fn digest_encoding<'py>(py: Python<'py>, encoding: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &jitkey_core::key::digest(encoding))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("_FAST_LAYOUT", init_layout(m.py())?)?;
    m.add_function(wrap_pyfunction!(encode, m)?)?;
    m.add_function(wrap_pyfunction!(digest, m)?)?;
    m.add_function(wrap_pyfunction!(fast_hash, m)?)?;
    m.add_function(wrap_pyfunction!(digest_encoding, m)?)?;
    m.add_function(wrap_pyfunction!(_register_key_adapter, m)?)?;
    Ok(())
}

// ---- structural in-memory hashing --------------------------------------------------------------
//
// `jitkey.LruCache` keys are usually small tuples of exact builtins. For those, the warm path does
// not build the canonical encoding: it hashes the objects directly (CPython's cached str/bytes
// hash, ints by value, floats by canonical bits, dtypes by identity — torch dtypes are singletons)
// and compares a probe with the stored key object structurally, identity first. Both are defined
// so that `structural_eq(a, b)` holds exactly when `encode(a) == encode(b)`: exact types only, bool
// never equal to int, floats by bits. Trees holding anything else (big ints, devices, `__jitkey__`
// objects, unsupported types, nesting past MAX_DEPTH) are not structural: `structural_hash` says
// `None` and the caller keys them by their encoding. The choice depends only on the tree's types
// and values, so a key always takes the same route.

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
            let mut overflow: c_int = 0;
            let v = ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow);
            return if overflow == 0 { StructLeaf::Hash(mix(h ^ 3, v as u64)) } else { StructLeaf::No };
        }
        if is_type(tp, addr_of_mut!(ffi::PyTuple_Type)) {
            return StructLeaf::Tuple;
        }
        if ptr == ffi::Py_None() {
            return StructLeaf::Hash(mix(h, 0x100));
        }
        if is_type(tp, addr_of_mut!(ffi::PyBool_Type)) {
            return StructLeaf::Hash(mix(h, if ptr == ffi::Py_True() { 0x102 } else { 0x101 }));
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
        let item = unsafe { Borrowed::from_ptr(obj.py(), tuple_item(ptr, i)) };
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
