//! Python value → canonical encoding (format v2, see `jitkey_core::key`).
//!
//! The walk dispatches on the *exact* type of each object, so a subclass can never smuggle in its
//! own `__eq__`/`__hash__`/`__str__`; nothing is ever keyed through `repr()` or `str()`.
//! Exact builtins are read through the C API (borrowed tuple items, cached UTF-8 of str objects);
//! `torch.dtype` / `torch.device` are recognised by their type objects and named through the
//! tables of `crate::torch` (shared with the signature walk); any other object must define
//! `__jitkey__()`, else the walk fails naming the type and position.
//!
//! Submodule `structural`: the in-memory hash and equality of `jitkey.LruCache` keys without encoding.
//! The CPython reads (tuple items, ints, str hashes) are `crate::cpython`'s.

use std::cell::Cell;
use std::ffi::c_int;
use std::ptr::addr_of_mut;
use std::sync::RwLock;

mod structural;

use jitkey_core::key::{EncodeError, Encoder, FastHashState, MAX_DEPTH};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString, PyType};

use crate::cpython::{init_layout, is_type, tuple_item, tuple_len};
use crate::errors::{KeyDepthError, KeyLengthError, UnsupportedKeyError};
use crate::torch::{device_of, dtype_name, torch_enum_name, torch_kind, TorchError, TorchKind};
pub(crate) use structural::{structural_eq, structural_hash};

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
    Unsupported {
        type_name: String,
        why: &'static str,
    },
    Key(EncodeError),
    /// A dtype or device that cannot be named (see `crate::torch`).
    Torch(String),
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
            WalkErrorKind::Torch(msg) => {
                UnsupportedKeyError::new_err(format!("cannot key the value at {at}: {msg}"))
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

impl From<TorchError> for WalkError {
    #[cold]
    fn from(e: TorchError) -> Self {
        match e {
            TorchError::Msg(m) => Self::new(WalkErrorKind::Torch(m)),
            TorchError::Py(e) => Self::new(WalkErrorKind::Py(e)),
        }
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
     torch.device, torch.layout, torch.memory_format and objects defining __jitkey__(); subclasses of builtins \
     need __jitkey__() too";

/// A type's identity in keys: its `__module__` and `__qualname__`, two separate fields (key format
/// v2). Both may contain dots, so no single dotted string names a type unambiguously (a class `K` of
/// module `pkg.sub` and a class `sub.K` of module `pkg`), and nothing is left out (`builtins`,
/// `__main__`). Shared by `__jitkey__` objects and by `Signature`'s named tuples.
///
/// # Errors
/// [`WalkError`] (an `UnsupportedKeyError`) when either attribute is missing or is not an exact
/// `str`: anything else would have to be keyed through its `str()`, which is how names collide.
pub(crate) fn type_identity(ty: &Bound<'_, PyType>) -> WalkResult<(String, String)> {
    let py = ty.py();
    let field = |name: &Bound<'_, PyString>| -> WalkResult<String> {
        let v = ty.getattr(name)?;
        match v.cast_exact::<PyString>() {
            Ok(s) => Ok(s.to_str()?.to_owned()),
            Err(_) => Err(WalkError::new(WalkErrorKind::Unsupported {
                type_name: format!("type with a non-str {name}"),
                why: "a type's __module__ and __qualname__ must be str to key it",
            })),
        }
    };
    Ok((field(intern!(py, "__module__"))?, field(intern!(py, "__qualname__"))?))
}

/// A `torch.dtype` / `torch.device` / `torch.layout` / `torch.memory_format` (exact type checked by
/// `torch_kind`), named through `crate::torch`.
#[cold]
fn encode_torch(obj: &Bound<'_, PyAny>, kind: TorchKind, enc: &mut Encoder) -> WalkResult {
    match kind {
        TorchKind::Dtype => enc.dtype(dtype_name(obj)?)?,
        TorchKind::Device => {
            let (ty, index) = device_of(obj)?;
            enc.device(ty, (index >= 0).then_some(index))?;
        }
        TorchKind::Layout => enc.layout(&torch_enum_name(obj)?)?,
        TorchKind::MemoryFormat => enc.memory_format(&torch_enum_name(obj)?)?,
    }
    Ok(())
}

// ---- the walk ----------------------------------------------------------------------------------

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
        // SAFETY: i < len of the exact tuple `obj`, which keeps the borrowed item alive.
        let item = unsafe { Borrowed::from_ptr(obj.py(), tuple_item(ptr, i as ffi::Py_ssize_t)) };
        // SAFETY: `item` is a live object; `Py_TYPE` reads its type pointer.
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
    if let Some(kind) = torch_kind(obj, tp) {
        return encode_torch(obj, kind, enc);
    }
    let ty = obj.get_type();
    let adapter = adapter_for(py, tp);
    if adapter.is_none() && !ty.hasattr(intern!(py, "__jitkey__"))? {
        return Err(WalkError::unsupported(obj, UNSUPPORTED_WHY));
    }
    if depth >= MAX_DEPTH {
        return Err(EncodeError::TooDeep { limit: MAX_DEPTH }.into());
    }
    let (module, qualname) = type_identity(&ty)?;
    enc.object_header(&module, &qualname)?;
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
/// ``bytes``, ``tuple`` (nested up to :data:`MAX_DEPTH`), ``torch.dtype``, ``torch.device``, ``torch.layout``,
/// ``torch.memory_format`` and objects
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
