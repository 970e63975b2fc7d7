//! `jitkey.LruCache`: the Python face of `jitkey_core::lru::Cache<Slot>`.
//!
//! * Keys are key trees (as for `jitkey.encode`), stored under their canonical bytes, so two keys
//!   never share an entry. Keys made only of exact builtins and dtypes (the usual tuples) take the
//!   structural route on lookups: the slot is picked by `keys::structural_hash` (a walk over the
//!   objects, CPython's cached str hashes, no encoding built) and the probe is compared with the
//!   stored key object by `keys::structural_eq`, identity first. Both agree exactly with byte
//!   equality of encodings, so the route is a speed-up, never a different answer. Other keys
//!   (big ints, devices, `__jitkey__` objects) are hashed and compared by their encoding.
//! * A hit (`get`, `[]`, the hit path of `get_or_insert`) takes no lock: the value is incref'd
//!   while the core's epoch guard protects the entry. With a GIL (every build but free-threaded
//!   ones) calls are serialised anyway, and a structural hit uses the core's unguarded probe; there
//!   `cache[key]` is also answered by a native `mp_subscript` slot (see "the `cache[key]` slot").
//! * Values displaced by a write (replaced, evicted, removed, cleared) come back from the core
//!   once no reader can see them and are decref'd here, attached, after the shard lock was
//!   released: a value's `__del__` may use the cache freely.
//! * `get_or_insert` is single-flight: concurrent misses on one key wait (detached from the
//!   interpreter) for the one thread running the factory.
//!
//! Free-threaded CPython: the class is frozen; the core's shard locks are never held while
//! Python code runs or while waiting on the interpreter (critical sections are pure Rust), and
//! every lock this module waits on is taken with `lock_py_attached` or inside `Python::detach`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::ThreadId;

use jitkey_core::lru::Cache;
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::sync::MutexExt;
use pyo3::types::{PyDict, PyTuple};

use crate::keys::{fast_hash_state, structural_eq, structural_hash, with_encoding};

/// What the core stores per entry: the value, and for structural keys the key object itself
/// (an immutable tuple/scalar tree) to compare probes against.
pub(crate) struct Slot {
    value: Py<PyAny>,
    key: Option<Py<PyAny>>,
}

/// Calls `f(hash, encoding, structural)` with the hash the key's route uses (see the module docs);
/// `structural` says whether the key takes the structural route (and so is stored with its object).
fn with_key<R>(key: &Bound<'_, PyAny>, f: impl FnOnce(u64, &[u8], bool) -> R) -> PyResult<R> {
    let structural = structural_hash(key);
    with_encoding(key, "key", |enc| {
        f(structural.unwrap_or_else(|| fast_hash_state().hash(enc)), enc, structural.is_some())
    })
}

/// Whether this interpreter has a GIL (a build without `Py_GIL_DISABLED`): then every call into a
/// cache runs attached, one thread at a time, and hits may use the core's serialised probe
/// (`Cache::get_with_eq_serialized`). Set once by `register`; false (the guarded probe) until then
/// and on free-threaded builds, even where the GIL was switched back on at run time.
static GIL_SERIALISES: AtomicBool = AtomicBool::new(false);

fn interpreter_has_gil(py: Python<'_>) -> PyResult<bool> {
    let v = py.import("sysconfig")?.call_method1("get_config_var", ("Py_GIL_DISABLED",))?;
    Ok(v.is_none() || !v.is_truthy()?)
}

/// How often a `get_or_insert` waiter wakes up to run signal handlers.
const WAKE_FOR_SIGNALS: std::time::Duration = std::time::Duration::from_millis(50);

/// The outcome of one factory run, shared by the threads that waited for it.
enum FlightState {
    Pending,
    Ready(Py<PyAny>),
    Failed(PyErr),
}

/// One in-progress `get_or_insert` miss.
struct Flight {
    leader: ThreadId,
    /// The process the leader runs in: after `fork()` a flight led by a thread of the parent has
    /// no leader in the child (it would never complete), so the child ignores it.
    pid: u32,
    state: Mutex<FlightState>,
    done: Condvar,
}

/// A bounded, thread-safe cache from key trees (as for :func:`encode`) to any Python objects.
///
/// Keys are compared by their canonical encoding (``1``, ``True``, ``1.0`` and ``"1"`` are four
/// different keys; a hash collision can never return another key's value). A hit takes no lock
/// and writes no shared memory, so lookups scale across threads, free-threaded CPython included.
///
/// Eviction is SIEVE, an LRU approximation: a hit marks the entry visited; when a shard is full,
/// a hand sweeps from the oldest entry, clearing marks, and evicts the first unmarked one. It is
/// scan-resistant (a burst of one-off keys evicts itself, not the hot set). The capacity is
/// split evenly among ``shards``, each evicting on its own, so a cache may start evicting a
/// little before it holds ``capacity`` entries.
///
/// Values that are replaced, evicted, popped or cleared are released outside the cache's locks,
/// once no concurrent lookup can still be reading them (with concurrent readers, possibly at a
/// later write): a value's ``__del__`` may use the cache.
#[pyclass(name = "LruCache", module = "jitkey._core", frozen)]
pub(crate) struct PyLruCache {
    inner: Cache<Slot>,
    /// Keys whose factory is running, by encoding. Locked only briefly, never around Python.
    flights: Mutex<HashMap<Box<[u8]>, Arc<Flight>>>,
}

/// Completes a flight: publishes `outcome`, wakes the waiters and forgets the key. Runs from
/// `Drop` too, so waiters are released even if the leader unwinds.
struct FlightGuard<'a, 'py> {
    py: Python<'py>,
    cache: &'a PyLruCache,
    key: &'a [u8],
    flight: Arc<Flight>,
    outcome: Option<FlightState>,
}

impl Drop for FlightGuard<'_, '_> {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or_else(|| {
            FlightState::Failed(PyRuntimeError::new_err("get_or_insert: the factory call was abandoned"))
        });
        // Neither lock is held while Python runs, but another thread may hold one while it waits
        // to re-attach: wait for them detached.
        let py = self.py;
        self.cache.flights.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner).remove(self.key);
        *self.flight.state.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner) = outcome;
        self.flight.done.notify_all();
    }
}

enum Role {
    Hit(Py<PyAny>),
    Lead(Arc<Flight>),
    Wait(Arc<Flight>),
}

impl PyLruCache {
    /// The value stored under an encoding (with its fast hash), as a new strong reference.
    /// Also releases displaced values that concurrent readers were still holding back at their
    /// write (free-threaded builds), so a hit-only phase does not keep evicted objects alive.
    #[inline]
    pub(crate) fn get_encoded<'py>(
        &self,
        py: Python<'py>,
        hash: u64,
        key: &[u8],
    ) -> Option<Bound<'py, PyAny>> {
        let out = self.inner.get_with(hash, key, |s| s.value.bind(py).clone());
        if self.inner.has_displaced() {
            self.release_displaced();
        }
        out
    }

    #[cold]
    fn release_displaced(&self) {
        drop(self.inner.take_displaced());
    }

    /// Stores `value` under an encoding. Displaced values are dropped here, after the cache's
    /// locks were released; call it attached to the interpreter (as every pymethod is).
    pub(crate) fn insert_encoded(&self, hash: u64, key: &[u8], value: Py<PyAny>) {
        drop(self.inner.insert(hash, key, Slot { value, key: None }));
    }

    /// The value under a key tree, by its route (structural or encoded). A miss on the
    /// structural route still encodes the key, so an unkeyable key raises on every lookup.
    #[inline]
    fn lookup<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(hash) = structural_hash(key) else {
            return with_encoding(key, "key", |enc| self.get_encoded(py, fast_hash_state().hash(enc), enc));
        };
        let out = self.probe_structural(py, hash, key, true);
        if self.inner.has_displaced() {
            self.release_displaced();
        }
        if out.is_none() {
            with_encoding(key, "key", |_| ())?;
        }
        Ok(out)
    }

    /// The value under a structural key with its structural `hash`, as a new strong reference.
    /// `count_miss`: false when the caller counts a miss by looking the key up again (only the
    /// native slot, installed only with a GIL).
    #[inline(always)]
    fn probe_structural<'py>(
        &self,
        py: Python<'py>,
        hash: u64,
        key: &Bound<'py, PyAny>,
        count_miss: bool,
    ) -> Option<Bound<'py, PyAny>> {
        // Identity first, inline: a warm hit usually probes with the very tuple it stored.
        let is_key = |_: &[u8], s: &Slot| {
            s.key.as_ref().is_some_and(|k| k.as_ptr() == key.as_ptr() || structural_eq(k.bind(py), key))
        };
        let value = |s: &Slot| s.value.bind(py).clone();
        if GIL_SERIALISES.load(Ordering::Relaxed) {
            // SAFETY: with a GIL every call into this cache runs attached, so one at a time; the
            // comparison (exact builtins only) and the incref run no Python code, so the GIL is
            // not released during this call.
            unsafe { self.inner.get_with_eq_serialized(hash, count_miss, is_key, value) }
        } else {
            // Without a GIL the native slot is not installed, so every caller here counts misses.
            self.inner.get_with_eq(hash, is_key, value)
        }
    }

    /// After a counted miss on an encoding: the result of `factory`, stored under it. Single-flight:
    /// concurrent callers missing on the same key wait (detached) for one factory run and share
    /// its result or its exception; a failed run stores nothing.
    ///
    /// A factory that calls back into this for the *same* key on the same thread gets a
    /// `RuntimeError` (waiting would never end). Two factories waiting on each other's keys from
    /// two threads deadlock, as with any single-flight scheme; do not build such cycles.
    pub(crate) fn fill_miss<'py>(
        &self,
        py: Python<'py>,
        hash: u64,
        key: &[u8],
        key_obj: Option<&Bound<'py, PyAny>>,
        factory: impl FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let role = {
            let mut flights = self.flights.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner);
            if let Some(f) = flights.get(key).filter(|f| f.pid == std::process::id()) {
                Role::Wait(f.clone())
            } else if let Some(v) = self.inner.peek_with(hash, key, |s| s.value.clone_ref(py)) {
                // Another thread finished the flight between our miss and taking the lock.
                Role::Hit(v)
            } else {
                let f = Arc::new(Flight {
                    leader: std::thread::current().id(),
                    pid: std::process::id(),
                    state: Mutex::new(FlightState::Pending),
                    done: Condvar::new(),
                });
                flights.insert(key.into(), f.clone());
                Role::Lead(f)
            }
        };
        match role {
            Role::Hit(v) => Ok(v.into_bound(py)),
            Role::Lead(flight) => {
                let mut guard = FlightGuard { py, cache: self, key, flight, outcome: None };
                match factory(py) {
                    Ok(v) => {
                        // Store before the flight ends, so a late caller finds it in the cache.
                        let slot =
                            Slot { value: v.clone().unbind(), key: key_obj.map(|k| k.clone().unbind()) };
                        let displaced = self.inner.insert(hash, key, slot);
                        guard.outcome = Some(FlightState::Ready(v.clone().unbind()));
                        drop(guard);
                        drop(displaced);
                        Ok(v)
                    }
                    Err(e) => {
                        guard.outcome = Some(FlightState::Failed(e.clone_ref(py)));
                        drop(guard);
                        Err(e)
                    }
                }
            }
            Role::Wait(flight) => {
                if flight.leader == std::thread::current().id() {
                    return Err(PyRuntimeError::new_err(
                        "get_or_insert: the factory for this key re-entered get_or_insert for the same \
                         key on the same thread (it would wait for itself)",
                    ));
                }
                // Wait detached, re-attaching every 50 ms to run signal handlers: Ctrl-C (or any
                // handler that raises) interrupts a waiter, while the flight goes on for the rest.
                loop {
                    let done = py.detach(|| {
                        let st = flight.state.lock().unwrap_or_else(PoisonError::into_inner);
                        let (st, _) = flight
                            .done
                            .wait_timeout_while(st, WAKE_FOR_SIGNALS, |s| matches!(s, FlightState::Pending))
                            .unwrap_or_else(PoisonError::into_inner);
                        !matches!(*st, FlightState::Pending)
                    });
                    if done {
                        break;
                    }
                    py.check_signals()?;
                }
                let st = flight.state.lock_py_attached(py).unwrap_or_else(PoisonError::into_inner);
                match &*st {
                    FlightState::Ready(v) => Ok(v.bind(py).clone()),
                    FlightState::Failed(e) => Err(e.clone_ref(py)),
                    FlightState::Pending => unreachable!("waited until the flight completed"),
                }
            }
        }
    }
}

#[pymethods]
impl PyLruCache {
    #[new]
    #[pyo3(signature = (capacity, *, shards = None))]
    fn new(capacity: usize, shards: Option<usize>) -> PyResult<Self> {
        if capacity == 0 {
            return Err(PyValueError::new_err("capacity must be at least 1"));
        }
        if shards == Some(0) {
            return Err(PyValueError::new_err("shards must be at least 1"));
        }
        Ok(Self { inner: Cache::new(capacity, shards), flights: Mutex::new(HashMap::new()) })
    }

    /// Return the value stored under ``key`` (marking it recently used), else ``default``.
    ///
    /// Raises:
    ///     jitkey.errors.UnsupportedKeyError: ``key`` is not a key tree, or its ``__jitkey__``
    ///         raised (chained as ``__cause__``).
    ///     jitkey.errors.KeyDepthError: ``key`` nests deeper than :data:`MAX_DEPTH`.
    #[pyo3(signature = (key, default = None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let hit = self.lookup(py, key)?;
        Ok(hit.or(default).unwrap_or_else(|| py.None().into_bound(py)))
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.lookup(py, key)?.ok_or_else(|| PyKeyError::new_err((key.clone().unbind(),)))
    }

    fn __setitem__(&self, key: &Bound<'_, PyAny>, value: Py<PyAny>) -> PyResult<()> {
        with_key(key, |hash, enc, structural| {
            let slot = Slot { value, key: structural.then(|| key.clone().unbind()) };
            drop(self.inner.insert(hash, enc, slot));
        })
    }

    fn __delitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let (found, displaced) = with_key(key, |hash, enc, _| self.inner.remove(hash, enc))?;
        drop(displaced);
        if found {
            Ok(())
        } else {
            Err(PyKeyError::new_err((key.clone().unbind(),)))
        }
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        with_key(key, |hash, enc, _| self.inner.contains(hash, enc))
    }

    /// Remove ``key`` and return its value; else return ``default``, or raise ``KeyError``.
    #[pyo3(signature = (key, *default))]
    fn pop<'py>(
        &self,
        key: &Bound<'py, PyAny>,
        default: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = key.py();
        if default.len() > 1 {
            return Err(PyTypeError::new_err(format!(
                "pop expected at most 2 arguments, got {}",
                default.len() + 1
            )));
        }
        let (found, displaced) =
            with_key(key, |hash, enc, _| self.inner.remove_with(hash, enc, |s| s.value.clone_ref(py)))?;
        drop(displaced);
        match found {
            Some(v) => Ok(v.into_bound(py)),
            None if default.len() == 1 => default.get_item(0),
            None => Err(PyKeyError::new_err((key.clone().unbind(),))),
        }
    }

    /// Return the value under ``key``; on a miss, call ``factory()``, store and return its result.
    ///
    /// Single-flight: when several threads miss on the same key at once, ``factory`` runs once
    /// (in the first of them) and all of them get its result. The others wait with the
    /// interpreter released (no deadlock with the GIL or with a free-threaded stop-the-world).
    /// If ``factory`` raises, nothing is stored and every waiting caller gets the same
    /// exception. The factory runs with no cache lock held and may use the cache, but calling
    /// ``get_or_insert`` for the *same* key from inside its own factory raises ``RuntimeError``
    /// (it would wait for itself); two factories waiting on each other's keys from two threads
    /// deadlock, as in any single-flight scheme.
    fn get_or_insert<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        factory: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // The factory runs inside `with_encoding`: the encoding stays borrowed from this
        // thread's buffer, and any key the factory encodes gets a fresh buffer.
        // Hits take the lookup path (structural when it can); only a miss encodes the key.
        if let Some(hit) = self.lookup(py, key)? {
            return Ok(hit);
        }
        with_key(key, |hash, enc, structural| {
            self.fill_miss(py, hash, enc, structural.then_some(key), |_| factory.call0())
        })?
    }

    /// Remove every entry (counters are kept).
    fn clear(&self) {
        drop(self.inner.clear());
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Most entries the cache holds.
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }

    /// Number of shards (see the constructor).
    #[getter]
    fn shards(&self) -> usize {
        self.inner.shards()
    }

    /// Counters: ``hits``, ``misses`` (lookups by ``get``/``[]``/``get_or_insert``),
    /// ``inserts`` (stores, replacements included), ``evictions`` (entries dropped to stay
    /// within capacity), ``size`` and ``capacity``.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        drop(self.inner.take_displaced());
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("inserts", s.inserts)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("size", s.size)?;
        d.set_item("capacity", s.capacity)?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!(
            "LruCache(capacity={}, size={}, shards={})",
            self.inner.capacity(),
            self.inner.len(),
            self.inner.shards()
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        // Lock-free snapshot of the live values; values already displaced but not yet handed
        // back are not visited (the GC then just sees them as externally referenced).
        let mut out = Ok(());
        self.inner.for_each_value(|s| {
            if out.is_ok() {
                out = visit.call(&s.value);
            }
            if let (Ok(()), Some(k)) = (&out, &s.key) {
                out = visit.call(k);
            }
        });
        out
    }

    fn __clear__(&self) {
        drop(self.inner.clear());
    }
}

// ---- the `cache[key]` slot ----------------------------------------------------------------------
//
// A warm `cache[key]` hit on a small tuple costs about as much as `dict[key]`, so the fixed cost of
// the call matters: PyO3's generated `mp_subscript` (its attach-count bookkeeping, a type check, the
// panic trap, error conversion) is a sizeable share. With a GIL and the proven CPython layout, the
// type's `mp_subscript` is replaced by `fast_subscript`, which answers structural hits itself and
// hands everything else (other keys, misses, errors, pending displaced values) to PyO3's function,
// unchanged. Only the slot is replaced: `LruCache.__getitem__` and `.get` stay PyO3's.

/// PyO3's `mp_subscript` of `LruCache`, called by `fast_subscript` for all but structural hits.
static PYO3_SUBSCRIPT: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `PyMappingMethods` (not in the limited API; its layout is fixed since Python 3.0).
#[repr(C)]
struct MappingMethods {
    mp_length: *mut c_void,
    mp_subscript: *mut c_void,
    mp_ass_subscript: *mut c_void,
}

/// Word index of `tp_as_mapping` in `PyTypeObject` (GIL builds without `Py_TRACE_REFS`, 3.0-3.14):
/// after the 3-word `PyVarObject` header, tp_name, tp_basicsize, tp_itemsize, tp_dealloc,
/// tp_vectorcall_offset, tp_getattr, tp_setattr, tp_as_async, tp_repr, tp_as_number, tp_as_sequence.
const TP_AS_MAPPING_WORD: usize = 14;

type BinaryFunc = unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject) -> *mut ffi::PyObject;

/// `cache[key]`: a structural hit answered here, anything else by PyO3's slot.
unsafe extern "C" fn fast_subscript(slf: *mut ffi::PyObject, key: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: CPython calls a type's slots attached, with live arguments; the slot is installed only
    // on `LruCache`, which cannot be subclassed, so `slf` is exactly a `PyLruCache`.
    // A panic (none is expected: the probe runs no Python code) must not unwind out of a C slot:
    // it becomes a miss here, and PyO3's path answers.
    let hit = std::panic::catch_unwind(|| unsafe {
        let py = Python::assume_attached();
        let cache = Borrowed::from_ptr(py, slf).cast_unchecked::<PyLruCache>();
        cache.get().subscript_hit(py, &Borrowed::from_ptr(py, key))
    })
    .ok()
    .flatten();
    if let Some(v) = hit {
        return v;
    }
    // SAFETY: set (non-null, PyO3's `mp_subscript` of this type) before this slot was installed.
    unsafe {
        let pyo3: BinaryFunc = std::mem::transmute(PYO3_SUBSCRIPT.load(Ordering::Relaxed));
        pyo3(slf, key)
    }
}

impl PyLruCache {
    /// A structural hit as a new reference, else `None` (the caller takes PyO3's path). Raises
    /// nothing. PyO3's attach count is not raised here, so nothing may depend on it: the probe runs
    /// no Python code and drops no `Py` handle; only the first sighting of a type that is not a
    /// builtin makes the structural hash ask Python whether it is `torch.dtype`, as PyO3's path would
    /// (an error there is dropped, and PyO3 releases its references at its next call).
    #[inline(always)]
    fn subscript_hit(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> Option<*mut ffi::PyObject> {
        if self.inner.has_displaced() {
            return None; // PyO3's path releases them
        }
        let hash = structural_hash(key)?;
        // A miss is counted by PyO3's path, which looks the key up again.
        self.probe_structural(py, hash, key, false).map(Bound::into_ptr)
    }
}

/// Installs `fast_subscript` on `LruCache` if the slot can be located with certainty; returns
/// whether it did.
fn install_fast_subscript(ty: &Bound<'_, pyo3::types::PyType>) -> PyResult<bool> {
    let tp = ty.as_type_ptr();
    let basicsize: usize = ty.get_type().getattr("__basicsize__")?.extract()?;
    // SAFETY: `tp` is a live heap type; `PyType_GetSlot` reads its slots (stable ABI, 3.10+). The
    // word read stays inside the type object (at most 15 words in, of `basicsize` bytes); the
    // candidate `PyMappingMethods` is dereferenced only if it lies wholly inside the same object,
    // where a heap type keeps its own, and is written only if both of its first two slots are the
    // functions CPython reports for this type.
    unsafe {
        let length = ffi::PyType_GetSlot(tp, ffi::Py_mp_length);
        let subscript = ffi::PyType_GetSlot(tp, ffi::Py_mp_subscript);
        if length.is_null() || subscript.is_null() || basicsize < (TP_AS_MAPPING_WORD + 1) * 8 {
            return Ok(false);
        }
        let start = tp as usize;
        let cand = *tp.cast::<*mut MappingMethods>().add(TP_AS_MAPPING_WORD);
        let c = cand as usize;
        if c <= start || c + std::mem::size_of::<MappingMethods>() > start + basicsize {
            return Ok(false);
        }
        if (*cand).mp_length != length || (*cand).mp_subscript != subscript {
            return Ok(false);
        }
        PYO3_SUBSCRIPT.store(subscript, Ordering::Relaxed);
        (*cand).mp_subscript = fast_subscript as BinaryFunc as *mut c_void;
        ffi::PyType_Modified(tp);
    }
    Ok(true)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let gil = interpreter_has_gil(m.py())?;
    GIL_SERIALISES.store(gil, Ordering::Relaxed);
    m.add_class::<PyLruCache>()?;
    // Layout reads are proven by `keys::register` (which runs first).
    let layout = m.getattr("_FAST_LAYOUT")?.is_truthy()?;
    let fast = gil && layout && install_fast_subscript(&m.py().get_type::<PyLruCache>())?;
    m.add("_LRU_FAST_SUBSCRIPT", fast)
}
