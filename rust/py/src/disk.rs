//! `jitkey.DiskIndex`: the Python face of `jitkey_core::disk::DiskIndex`.
//!
//! File I/O and lock waits run with the GIL released (`py.detach`); a hit is served with the GIL
//! held and no I/O (hash lookup + checksum of one record + one bytes object).

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};

#[cfg(feature = "fault-injection")]
use jitkey_core::disk::Fault;
use jitkey_core::disk::{
    default_dir, verify, Access, DiskError, DiskIndex, Durability, Options, Probe, VerifyError, MAX_VALUE,
};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use crate::errors::{DiskIndexWarning, IndexClosedError, KeyLengthError, ValueTooLargeError};
use crate::keys::with_encoding;

mod tier; // jitkey.TieredIndex's native local-hit path (the Redis tier, python/jitkey/remote.py)

type Digest = [u8; 32];

/// A persistent key → bytes index in one directory, shared by many processes (unix only).
///
/// One append-only log, ``index.v1.jki``, with 8-byte aligned, xxh3-64 checksummed records.
/// Writers append under an advisory ``flock`` on ``index.lock`` (one write per batch, identical
/// values are not written twice); readers take no lock: they index only records that validate and
/// re-check a record's checksum and key before returning its value, so a torn, damaged or foreign
/// file gives a miss, never a wrong value. A get that misses looks for new appends (or a file
/// compacted by another process) at once; a hit notices another process's update of the same key
/// within 200 ms, or at once after :meth:`refresh`. When the file passes ``max_bytes`` (or is more
/// than half dead above 8 MiB), the writer rewrites the live entries to a temp file, fsyncs it and
/// renames it over the log, evicting the oldest entries down to 3/4 of ``max_bytes``.
///
/// ``path`` is a directory, created with mode 0700 if missing. Default: ``$JITKEY_CACHE_DIR``,
/// else ``$XDG_CACHE_HOME/jitkey``, else ``~/.cache/jitkey``. ``durability="none"`` (default):
/// a killed process loses at most the batch it was writing, power loss may lose recent appends;
/// ``"full"``: ``fdatasync`` after every batch and an fsync of the directory after renames.
///
/// Keys: a 32-byte ``bytes`` is used as the digest itself (e.g. from :func:`digest`); any other
/// keyable value (as for :func:`encode`) is digested. Values: ``bytes`` of at most
/// :attr:`MAX_VALUE` bytes.
///
/// The environment never raises: an unusable, foreign-owned or group/world-writable directory (a
/// sticky one such as ``/tmp`` only when named explicitly, by ``path`` or ``$JITKEY_CACHE_DIR``), a
/// file that is not an index, a symlink, FIFO or file of another user under the index's names, a
/// network filesystem, a full disk or a lock held longer than 10 s make the index read-only (hits
/// from the file, puts kept in this process's memory) or memory-only, with one
/// :class:`jitkey.errors.DiskIndexWarning` per kind; see :attr:`mode` and :attr:`mode_reason`.
/// After ENOSPC/EDQUOT/EFBIG, writes stay in memory for 60 s, then retry. A file that shrinks
/// or is copied over while mapped gives misses (never a signal) and is rewritten from what is
/// left by the next writer. ``JITKEY_DISK_CACHE=ro`` or ``0`` forces read-only or memory-only mode.
///
/// Raises:
///     ValueError: ``durability`` not ``"none"``/``"full"``, ``max_bytes`` below 65536, or a bad
///         ``JITKEY_DISK_CACHE``.
#[pyclass(name = "DiskIndex", module = "jitkey._core", frozen)]
pub(crate) struct PyDiskIndex {
    inner: Arc<DiskIndex>,
}

/// Every live index, for the fork hook. Touched only attached to the interpreter (creation and
/// the hook), so no thread holds it across a fork in a GIL build.
static LIVE: Mutex<Vec<Weak<DiskIndex>>> = Mutex::new(Vec::new());

/// `os.register_at_fork(after_in_child=...)`: frees the child from locks other threads of the
/// parent held at the fork (an in-flight put, a refresh), see `DiskIndex::after_fork_in_child`.
#[pyfunction]
fn _after_fork_in_child() {
    let Ok(mut live) = LIVE.try_lock() else { return };
    live.retain(|w| w.strong_count() > 0);
    for idx in live.iter().filter_map(Weak::upgrade) {
        // SAFETY: called by os.fork in the child, single-threaded, outside every index method.
        unsafe { idx.after_fork_in_child() };
    }
}

/// A 32-byte `bytes` is taken as a digest; any other keyable value is digested.
fn key_digest(key: &Bound<'_, PyAny>) -> PyResult<Digest> {
    if let Ok(b) = key.cast_exact::<PyBytes>() {
        let s = b.as_bytes();
        return <Digest>::try_from(s).map_err(|_| {
            KeyLengthError::new_err(format!(
                "a bytes key must be a 32-byte digest (got {} bytes); use jitkey.digest(value) or pass a \
                 non-bytes keyable value",
                s.len()
            ))
        });
    }
    with_encoding(key, "key", jitkey_core::key::digest)
}

/// `_key_digest(key, /) -> bytes`: the 32-byte digest a `DiskIndex` files `key` under (a 32-byte
/// `bytes` is the digest itself, any other keyable value is digested); the Redis tier files its keys
/// by the same rule.
#[pyfunction]
#[pyo3(name = "_key_digest", signature = (key, /))]
fn py_key_digest<'py>(key: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    Ok(PyBytes::new(key.py(), &key_digest(key)?))
}

fn disk_err(e: DiskError) -> PyErr {
    match e {
        DiskError::Closed => IndexClosedError::new_err("DiskIndex is closed"),
        DiskError::ValueTooLarge { index, len } => ValueTooLargeError::new_err(format!(
            "value #{index} is {len} bytes; DiskIndex values are at most {MAX_VALUE} bytes (DiskIndex.MAX_VALUE)"
        )),
    }
}

impl PyDiskIndex {
    /// Turns environment trouble the core recorded into `DiskIndexWarning`s (each kind once).
    fn flush_warnings(&self, py: Python<'_>) -> PyResult<()> {
        if !self.inner.has_warnings() {
            return Ok(());
        }
        let cat = py.get_type::<DiskIndexWarning>();
        for msg in self.inner.take_warnings() {
            let msg = CString::new(msg.replace('\0', " ")).expect("no NUL");
            PyErr::warn(py, cat.as_any(), &msg, 2)?;
        }
        Ok(())
    }

    fn lookup<'py>(&self, py: Python<'py>, key: &Digest) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let hit = match self.inner.probe(key, false, |v| PyBytes::new(py, v)).map_err(disk_err)? {
            Probe::Hit(b) => Some(b),
            Probe::Miss => None,
            Probe::Refresh => {
                py.detach(|| self.inner.refresh());
                match self.inner.probe(key, true, |v| PyBytes::new(py, v)).map_err(disk_err)? {
                    Probe::Hit(b) => Some(b),
                    _ => None,
                }
            }
        };
        self.flush_warnings(py)?;
        Ok(hit)
    }
}

#[pymethods]
impl PyDiskIndex {
    #[new]
    #[pyo3(signature = (path = None, *, max_bytes = 67108864, durability = "none"))]
    fn new(py: Python<'_>, path: Option<PathBuf>, max_bytes: u64, durability: &str) -> PyResult<Self> {
        let durability = match durability {
            "none" => Durability::None,
            "full" => Durability::Full,
            other => {
                return Err(PyValueError::new_err(format!(
                    "durability must be 'none' or 'full', not {other:?}"
                )))
            }
        };
        if max_bytes < 1 << 16 {
            return Err(PyValueError::new_err(format!("max_bytes must be at least 65536, got {max_bytes}")));
        }
        let mut access = match std::env::var("JITKEY_DISK_CACHE").as_deref() {
            Err(_) | Ok("") | Ok("rw") | Ok("1") => Access::ReadWrite,
            Ok("ro") => Access::ReadOnly,
            Ok("0") | Ok("off") | Ok("memory") => Access::Memory,
            Ok(other) => {
                return Err(PyValueError::new_err(format!(
                    "JITKEY_DISK_CACHE must be rw, ro or 0, not {other:?}"
                )))
            }
        };
        // A directory named by the caller (an argument or $JITKEY_CACHE_DIR) may be a sticky shared
        // one (files there must still be this user's own); a derived default may not.
        let explicit = path.is_some() || std::env::var_os("JITKEY_CACHE_DIR").is_some_and(|v| !v.is_empty());
        let dir = path.or_else(default_dir).unwrap_or_else(|| {
            access = Access::Memory;
            PathBuf::new()
        });
        let opts =
            Options { max_bytes, durability, access, trust_sticky_dir: explicit, ..Options::default() };
        let inner = Arc::new(py.detach(|| DiskIndex::open(&dir, opts)));
        {
            let mut live = LIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            live.retain(|w| w.strong_count() > 0);
            live.push(Arc::downgrade(&inner));
        }
        let this = Self { inner };
        this.flush_warnings(py)?;
        Ok(this)
    }

    /// The largest value, in bytes.
    #[classattr]
    #[allow(non_snake_case)]
    fn MAX_VALUE() -> usize {
        MAX_VALUE
    }

    /// Return the value stored under ``key``, or ``None``.
    ///
    /// Raises:
    ///     jitkey.errors.KeyLengthError: a ``bytes`` key that is not 32 bytes long.
    ///     jitkey.errors.UnsupportedKeyError: a key jitkey cannot encode.
    ///     jitkey.errors.IndexClosedError: the index was closed.
    fn get<'py>(&self, py: Python<'py>, key: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let k = key_digest(key)?;
        self.lookup(py, &k)
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = key_digest(key)?;
        Ok(self.lookup(py, &k)?.is_some())
    }

    /// Store ``value`` under ``key`` (the latest put wins, across processes).
    ///
    /// Returns ``True`` when the value is in the file, ``False`` when the environment kept it in
    /// this process's memory only (it is served here but does not outlive the process).
    ///
    /// Raises:
    ///     jitkey.errors.ValueTooLargeError: ``value`` is longer than :attr:`MAX_VALUE`.
    ///     TypeError: ``value`` is not ``bytes``; key errors as for :meth:`get`.
    fn put(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &[u8]) -> PyResult<bool> {
        let k = key_digest(key)?;
        let r = py.detach(|| self.inner.put(&k, value));
        self.flush_warnings(py)?;
        r.map(|o| o.memory_only == 0).map_err(disk_err)
    }

    /// Store many entries with one lock acquisition and one write; the return value is as
    /// for :meth:`put` (``True``: every entry is in the file).
    ///
    /// Nothing is written if any value is too large (:class:`jitkey.errors.ValueTooLargeError`).
    fn put_many(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<bool> {
        let iter = match items.cast::<PyDict>() {
            Ok(d) => d.call_method0("items")?.try_iter()?,
            Err(_) => items.try_iter()?,
        };
        let mut owned: Vec<(Digest, Bound<'_, PyBytes>)> = Vec::new();
        for item in iter {
            let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
            let v = v.cast_into::<PyBytes>().map_err(PyErr::from)?;
            owned.push((key_digest(&k)?, v));
        }
        let batch: Vec<(Digest, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let r = py.detach(|| self.inner.put_many(&batch));
        self.flush_warnings(py)?;
        r.map(|o| o.memory_only == 0).map_err(disk_err)
    }

    /// Remove ``key`` (a tombstone record); return whether it was present.
    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = key_digest(key)?;
        let r = py.detach(|| self.inner.delete(&k));
        self.flush_warnings(py)?;
        r.map_err(disk_err)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.inner.refresh());
        self.inner.len().map_err(disk_err)
    }

    /// Pick up other processes' appends and compactions now.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        if self.inner.is_closed() {
            return Err(disk_err(DiskError::Closed));
        }
        py.detach(|| self.inner.refresh());
        Ok(())
    }

    /// Rewrite the live entries to a new file now (evicting past the cap); ``False`` if the
    /// index is not writable or the rewrite failed (then with a warning).
    fn compact(&self, py: Python<'_>) -> PyResult<bool> {
        let r = py.detach(|| self.inner.compact());
        self.flush_warnings(py)?;
        r.map_err(disk_err)
    }

    /// Remove every entry, for every process (a compaction to an empty file).
    fn clear(&self, py: Python<'_>) -> PyResult<bool> {
        let r = py.detach(|| self.inner.clear());
        self.flush_warnings(py)?;
        r.map_err(disk_err)
    }

    /// Counters and state: ``mode``, ``mode_reason``, ``path``, ``hits``, ``misses``, ``appends``,
    /// ``dedup_skips``, ``torn_tails_padded``, ``invalid_bytes_padded``, ``corrupt_records_skipped``,
    /// ``compactions``, ``evictions``, ``lock_acquisitions``, ``lock_timeouts``, ``lock_wait_us_p50``
    /// and ``lock_wait_us_p99`` (power-of-two bucket bounds), ``write_errors``, ``memory_only_puts``,
    /// ``refreshes``, ``reopens``, ``shrinks_seen``, ``entries``, ``file_bytes``, ``live_bytes``, ``generation``,
    /// ``max_bytes``. Counters are per process.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let (mode, reason) = self.inner.mode();
        let d = PyDict::new(py);
        d.set_item("mode", mode.as_str())?;
        d.set_item("mode_reason", reason)?;
        d.set_item("path", self.inner.path())?;
        for (k, v) in [
            ("hits", s.hits),
            ("misses", s.misses),
            ("appends", s.appends),
            ("dedup_skips", s.dedup_skips),
            ("torn_tails_padded", s.torn_tails_padded),
            ("invalid_bytes_padded", s.invalid_bytes_padded),
            ("corrupt_records_skipped", s.corrupt_records_skipped),
            ("compactions", s.compactions),
            ("evictions", s.evictions),
            ("lock_acquisitions", s.lock_acquisitions),
            ("lock_timeouts", s.lock_timeouts),
            ("lock_wait_us_p50", s.lock_wait_us_p50),
            ("lock_wait_us_p99", s.lock_wait_us_p99),
            ("write_errors", s.write_errors),
            ("memory_only_puts", s.memory_only_puts),
            ("refreshes", s.refreshes),
            ("reopens", s.reopens),
            ("shrinks_seen", s.shrinks_seen),
            ("entries", s.entries),
            ("file_bytes", s.file_bytes),
            ("live_bytes", s.live_bytes),
            ("generation", s.generation),
            ("max_bytes", self.inner.options().max_bytes),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// ``"rw"``, ``"ro"`` (hits from the file, puts in memory) or ``"memory"``.
    #[getter]
    fn mode(&self) -> &'static str {
        self.inner.mode().0.as_str()
    }

    /// Why the mode is not ``"rw"`` (empty when it is).
    #[getter]
    fn mode_reason(&self) -> String {
        self.inner.mode().1
    }

    /// The log file (``<directory>/index.v1.jki``).
    #[getter]
    fn path(&self) -> PathBuf {
        self.inner.path().to_path_buf()
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Unmap and close the files; later calls raise :class:`jitkey.errors.IndexClosedError`.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }

    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        if slf.get().inner.is_closed() {
            return Err(disk_err(DiskError::Closed));
        }
        Ok(slf)
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("DiskIndex({:?}, mode={:?})", self.inner.dir(), self.inner.mode().0.as_str())
    }

    /// PRIVATE, for jitkey's crash tests only: SIGKILL this process the `after`-th time it reaches
    /// `point` (split_write, compact_tmp_created, compact_mid_write, compact_after_fsync,
    /// compact_after_rename, compact_before_unlock). Per instance; nothing arms it implicitly.
    /// Only in builds with the `fault-injection` feature (`make build`), never in a released wheel.
    #[cfg(feature = "fault-injection")]
    #[pyo3(signature = (point, after = 0))]
    fn _arm_fault(&self, point: &str, after: u32) -> PyResult<()> {
        let f = Fault::from_name(point)
            .ok_or_else(|| PyValueError::new_err(format!("unknown fault {point:?}")))?;
        self.inner.arm_fault(f, after);
        Ok(())
    }

    /// The directory used when ``path`` is ``None`` (from the environment).
    #[classmethod]
    fn default_directory(_cls: &Bound<'_, PyType>) -> Option<PathBuf> {
        default_dir()
    }
}

/// `jitkey cache verify`'s check (see `jitkey_core::disk::verify`): every record of the log in
/// `path` as committed when the call starts, read under the writers' lock (shared, for the length
/// only; waiting at most `lock_wait` seconds). Creates and writes nothing.
///
/// Returns ``path``, ``locked``, ``snapshot_bytes``, ``valid_bytes``, ``unvalidated_bytes``,
/// ``records``, ``entries``, ``live_bytes``, ``generation``; or ``path`` and ``problem`` when the file
/// is not a usable index. Raises ``FileNotFoundError`` when there is none, ``OSError`` when it
/// cannot be read.
#[pyfunction]
#[pyo3(signature = (path, lock_wait = 10.0))]
fn _verify_index(py: Python<'_>, path: PathBuf, lock_wait: f64) -> PyResult<Bound<'_, PyDict>> {
    let wait = std::time::Duration::try_from_secs_f64(lock_wait).map_err(|_| {
        PyValueError::new_err(format!("lock_wait must be a number of seconds >= 0, got {lock_wait}"))
    })?;
    let res = py.detach(|| verify(&path, wait));
    let d = PyDict::new(py);
    match res {
        Ok(v) => {
            d.set_item("path", &v.path)?;
            d.set_item("locked", v.locked)?;
            for (k, x) in [
                ("snapshot_bytes", v.snapshot_bytes),
                ("valid_bytes", v.valid_bytes),
                ("unvalidated_bytes", v.unvalidated_bytes()),
                ("records", v.records),
                ("entries", v.entries),
                ("live_bytes", v.live_bytes),
                ("generation", v.generation),
            ] {
                d.set_item(k, x)?;
            }
        }
        Err(VerifyError::Missing) => {
            return Err(pyo3::exceptions::PyFileNotFoundError::new_err(format!(
                "no index in {}",
                path.display()
            )))
        }
        Err(VerifyError::Io(e)) => return Err(e.into()),
        Err(e @ VerifyError::Header(_)) => {
            d.set_item("path", path.join(jitkey_core::disk::log_name()))?;
            d.set_item("problem", e.to_string())?;
        }
    }
    Ok(d)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDiskIndex>()?;
    m.add_function(wrap_pyfunction!(_verify_index, m)?)?;
    m.add_function(wrap_pyfunction!(py_key_digest, m)?)?;
    let hook = wrap_pyfunction!(_after_fork_in_child, m)?;
    m.add_function(hook.clone())?;
    let py = m.py();
    let kw = PyDict::new(py);
    kw.set_item("after_in_child", hook)?;
    py.import("os")?.call_method("register_at_fork", (), Some(&kw))?;
    tier::register(m)
}
