//! The public face of the disk index: [`DiskIndex`], its [`Options`] and the values its methods
//! return. The `DiskIndex` struct, opening, the accessors, `sync`, `close` and the fork hook live
//! here; the other methods live with the machinery they drive (reads in `view`, puts and deletes in
//! `append`, `compact`/`clear` in `compact`, `stats` in `stats`; rustdoc shows them together).
//!
//! Invariant: no method fails because of the environment. Opening never fails (an unusable
//! directory or file gives [`Mode::ReadOnly`] or [`Mode::Memory`] with a reason, decided in
//! `trust`); a write the file cannot take is kept in this process's memory and reported once per
//! kind through [`DiskIndex::take_warnings`]. Only caller mistakes and a closed index are errors
//! ([`DiskError`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use super::append::Writer;
use super::format::{Digest, FORMAT_MAJOR};
use super::stats::Counters;
use super::view::{DigestHash, View};

/// The lock file's name; the lock holder is the only process that writes the log.
pub(super) const LOCK_NAME: &str = "index.lock";

/// The live log's name (the format major is part of it: another major is another file).
pub fn log_name() -> String {
    format!("index.v{FORMAT_MAJOR}.jki")
}

/// How hard an append tries to survive power loss (a killed process loses at most the batch it
/// was writing in either mode). Compaction always fsyncs its temp file before the rename.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// No fsync per batch: a kill loses at most the in-flight batch; power loss may lose recent ones.
    None,
    /// `fdatasync` after every batch and an fsync of the directory after each rename.
    Full,
}

/// The access the caller asks for (`JITKEY_DISK_CACHE=rw|ro|0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read and append (`rw`, the default).
    ReadWrite,
    /// Read the file, keep puts in this process's memory (`ro`).
    ReadOnly,
    /// Touch no file at all (`0`).
    Memory,
}

/// The mode the index actually runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Reads and appends go to the file.
    ReadWrite,
    /// Hits are served from the file; puts stay in this process's memory.
    ReadOnly,
    /// No file: puts and gets use this process's memory only.
    Memory,
}

impl Mode {
    /// The mode's name as `jitkey` reports it: `rw`, `ro` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadWrite => "rw",
            Mode::ReadOnly => "ro",
            Mode::Memory => "memory",
        }
    }
}

/// How [`DiskIndex::open`] sets up an index; [`Options::default`] is what `jitkey.DiskIndex()` uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// Soft cap on the file size: compaction evicts the oldest entries down to 3/4 of it.
    pub max_bytes: u64,
    /// Whether appends are `fdatasync`ed (see [`Durability`]).
    pub durability: Durability,
    /// The access asked for; the environment may grant less (see [`DiskIndex::mode`]).
    pub access: Access,
    /// How long an append waits for the file lock before it keeps the batch in memory.
    pub lock_timeout: Duration,
    /// How often a hit checks whether another process appended or compacted.
    pub refresh_interval: Duration,
    /// How long disk writes stay off after ENOSPC / EDQUOT / EFBIG.
    pub disable_for: Duration,
    /// The caller named this directory explicitly: a group/world-writable directory with the
    /// sticky bit (like `/tmp`) is then used, with every file in it required to be this user's
    /// own. Otherwise such a directory degrades to memory-only like any other shared one.
    pub trust_sticky_dir: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            max_bytes: 64 << 20,
            durability: Durability::None,
            access: Access::ReadWrite,
            lock_timeout: Duration::from_secs(10),
            refresh_interval: Duration::from_millis(200),
            disable_for: Duration::from_secs(60),
            trust_sticky_dir: false,
        }
    }
}

/// Kinds of environment trouble; each is reported once per index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    /// The index runs read-only or memory-only (the reason is in the message).
    Mode = 0,
    /// A write failed (disk full, I/O error); writes stay in memory for a while.
    WriteFailed = 1,
    /// The file lock was held longer than [`Options::lock_timeout`]; the write stayed in memory.
    LockTimeout = 2,
    /// The file was damaged (bad header, moved aside) or shrank under the process (rewritten).
    Corrupt = 3,
}

/// What a put did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PutOutcome {
    /// Records appended to the file.
    pub written: usize,
    /// Values skipped because the file already held the same value under the key.
    pub deduped: usize,
    /// Kept in this process's memory because the file could not take them.
    pub memory_only: usize,
    /// The sequence number of the first record this batch wrote (compaction never evicts it).
    pub first_seq: u64,
}

/// Why an operation could not run at all (the environment never causes one: see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskError {
    /// [`DiskIndex::close`] ran before (or during) the operation.
    Closed,
    /// Value number `index` of the batch is `len` bytes, more than [`MAX_VALUE`](super::MAX_VALUE);
    /// nothing of the batch was written.
    ValueTooLarge {
        /// The position of the value in the batch.
        index: usize,
        /// Its length in bytes.
        len: usize,
    },
}

/// The result of a lookup that does no I/O.
#[derive(Debug)]
pub enum Probe<R> {
    /// Found: what the callback made of the value.
    Hit(R),
    /// Not there (or only a damaged copy, which is never served).
    Miss,
    /// Call [`DiskIndex::refresh`] (I/O) and probe again with `final_probe`.
    Refresh,
}

/// `$JITKEY_CACHE_DIR`, else `$XDG_CACHE_HOME/jitkey`, else `~/.cache/jitkey`.
pub fn default_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("JITKEY_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|p| p.join("jitkey")))
        .or_else(|| var("HOME").map(|p| p.join(".cache").join("jitkey")))
}

/// A lock that can be replaced in a forked child. After `fork()` only the forking thread exists:
/// a lock another thread held at that moment stays held forever in the child. The child-side
/// fork hook ([`DiskIndex::after_fork_in_child`]) replaces such a lock (and the state it
/// guarded, which may be half-updated) with a fresh one; the old one is leaked, never dropped.
pub(super) struct ForkReset<T>(std::cell::UnsafeCell<T>);

// SAFETY: shared access goes through `T` (a Sync lock); `reset` is only called in a forked child
// while it is single-threaded, with no borrow of the old value alive.
unsafe impl<T: Sync> Sync for ForkReset<T> {}
// SAFETY: a `ForkReset<T>` owns its `T` like a plain wrapper; moving it to another thread moves
// the `T`, which is `Send`.
unsafe impl<T: Send> Send for ForkReset<T> {}

impl<T> ForkReset<T> {
    fn new(v: T) -> Self {
        Self(std::cell::UnsafeCell::new(v))
    }

    /// # Safety
    /// Only in a forked child before it starts other threads, with no reference to the old value
    /// alive (the fork hook runs from the interpreter, outside every `DiskIndex` method).
    unsafe fn reset(&self, v: T) {
        // SAFETY: per the contract; the old value is overwritten without being dropped.
        unsafe { std::ptr::write(self.0.get(), v) }
    }
}

impl<T> std::ops::Deref for ForkReset<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: only `reset` writes, under the contract above.
        unsafe { &*self.0.get() }
    }
}

pub(super) type Overlay = HashMap<Digest, Option<Arc<[u8]>>, DigestHash>;

/// An append-only, crash-safe key → bytes index in one directory, shared by processes.
///
/// Never fails to open: an unusable environment gives [`Mode::ReadOnly`] or [`Mode::Memory`]
/// with a reason and one warning (see [`DiskIndex::take_warnings`]).
pub struct DiskIndex {
    pub(super) dir: PathBuf,
    pub(super) path: PathBuf,
    pub(super) lock_path: PathBuf,
    pub(super) opts: Options,
    pub(super) view: ForkReset<RwLock<Option<View>>>,
    pub(super) writer: ForkReset<Mutex<Writer>>,
    pub(super) overlay: ForkReset<RwLock<Overlay>>,
    pub(super) overlay_used: AtomicBool,
    pub(super) overlay_bytes: AtomicU64,
    pub(super) mode: ForkReset<RwLock<(Mode, String)>>,
    pub(super) counters: Counters,
    pub(super) warned: AtomicU8,
    pub(super) pending: AtomicBool,
    pub(super) warnings: ForkReset<Mutex<Vec<String>>>,
    pub(super) closed: AtomicBool,
    pub(super) base: Instant,
    pub(super) last_check_ns: AtomicU64,
}

impl DiskIndex {
    /// Opens (creating if needed) the index in `dir`.
    pub fn open(dir: &Path, opts: Options) -> Self {
        let idx = Self {
            dir: dir.to_path_buf(),
            path: dir.join(log_name()),
            lock_path: dir.join(LOCK_NAME),
            opts,
            view: ForkReset::new(RwLock::new(None)),
            writer: ForkReset::new(Mutex::new(Writer::new())),
            overlay: ForkReset::new(RwLock::new(Overlay::default())),
            overlay_used: AtomicBool::new(false),
            overlay_bytes: AtomicU64::new(0),
            mode: ForkReset::new(RwLock::new((Mode::Memory, String::new()))),
            counters: Counters::default(),
            warned: AtomicU8::new(0),
            pending: AtomicBool::new(false),
            warnings: ForkReset::new(Mutex::new(Vec::new())),
            closed: AtomicBool::new(false),
            base: Instant::now(),
            last_check_ns: AtomicU64::new(0),
        };
        match idx.open_inner() {
            Ok((mode, reason)) => idx.set_mode(mode, reason),
            Err(reason) => idx.set_mode(Mode::Memory, reason),
        }
        idx
    }

    pub(super) fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn view_mut(&self) -> std::sync::RwLockWriteGuard<'_, Option<View>> {
        self.view.write().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn view_ref(&self) -> std::sync::RwLockReadGuard<'_, Option<View>> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    pub(super) fn touch_check(&self) {
        self.last_check_ns.store(self.now_ns(), Relaxed);
    }

    pub(super) fn set_mode(&self, mode: Mode, reason: String) {
        if mode != Mode::ReadWrite {
            self.warn(
                WarningKind::Mode,
                format!("jitkey DiskIndex at {} runs {}: {reason}", self.dir.display(), mode.as_str()),
            );
        }
        *self.mode.write().unwrap_or_else(|p| p.into_inner()) = (mode, reason);
    }

    pub(super) fn warn(&self, kind: WarningKind, msg: String) {
        let bit = 1u8 << (kind as u8);
        if self.warned.fetch_or(bit, Relaxed) & bit == 0 {
            self.warnings.lock().unwrap_or_else(|p| p.into_inner()).push(msg);
            self.pending.store(true, Relaxed);
        }
    }

    pub(super) fn check_open(&self) -> Result<(), DiskError> {
        if self.closed.load(Relaxed) {
            Err(DiskError::Closed)
        } else {
            Ok(())
        }
    }

    /// Warnings raised since the last call (each kind at most once per index).
    pub fn take_warnings(&self) -> Vec<String> {
        if !self.pending.swap(false, Relaxed) {
            return Vec::new();
        }
        std::mem::take(&mut *self.warnings.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Whether [`take_warnings`](Self::take_warnings) has something (one relaxed load).
    pub fn has_warnings(&self) -> bool {
        self.pending.load(Relaxed)
    }

    /// The mode the index runs in, and why it is not [`Mode::ReadWrite`] (empty when it is).
    pub fn mode(&self) -> (Mode, String) {
        self.mode.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The log file (`<dir>/index.v1.jki`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory the index lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The options it was opened with.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Flushes appended data to stable storage (`fdatasync`), whatever the durability mode.
    pub fn sync(&self) -> Result<(), DiskError> {
        self.check_open()?;
        if let Some(v) = self.view_ref().as_ref() {
            let _ = v.file.sync_data();
        }
        Ok(())
    }

    /// Drops the mapping and file descriptors; later calls return [`DiskError::Closed`].
    /// Safe against every concurrent operation: it waits for an in-flight write (which holds the
    /// writer mutex); operations that start later get [`DiskError::Closed`]; lock-free readers
    /// hold their own reference to the mapping.
    pub fn close(&self) {
        let mut w = self.writer();
        self.closed.store(true, Relaxed);
        *self.view_mut() = None;
        w.wfile = None;
        w.lock = None;
        drop(w);
        self.overlay.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Whether [`close`](Self::close) ran.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }

    /// Call in a forked child, before it starts threads (jitkey's binding registers it with
    /// `os.register_at_fork`). Locks that another thread of the parent held at the fork are
    /// replaced (their state dropped: the view is reloaded from the file, a memory-only overlay
    /// that was mid-update is forgotten); the file lock and write fd are the child's own from its
    /// next write on. Without this, the child waited forever on its first write or get.
    ///
    /// # Safety
    /// Only in the child right after `fork()`, while it is single-threaded, and not from inside
    /// any method of this index.
    pub unsafe fn after_fork_in_child(&self) {
        use std::sync::TryLockError::WouldBlock;
        // Every reset below relies on the caller's contract: a single-threaded child, called from
        // outside every method of this index, so no borrow of the old value is alive.
        if matches!(self.writer.try_lock(), Err(WouldBlock)) {
            // SAFETY: the contract above; the writer mutex was held by a thread that no longer exists.
            unsafe { self.writer.reset(Mutex::new(Writer::new())) };
        }
        if matches!(self.overlay.try_write(), Err(WouldBlock)) {
            // SAFETY: the contract above; the overlay lock was held by a vanished thread.
            unsafe { self.overlay.reset(RwLock::new(Overlay::default())) };
            self.overlay_bytes.store(0, Relaxed);
        }
        if matches!(self.mode.try_write(), Err(WouldBlock)) {
            // SAFETY: the contract above; the mode lock was held by a vanished thread.
            unsafe { self.mode.reset(RwLock::new((Mode::ReadOnly, "reset after fork".to_owned()))) };
        }
        if matches!(self.warnings.try_lock(), Err(WouldBlock)) {
            // SAFETY: the contract above; the warnings mutex was held by a vanished thread.
            unsafe { self.warnings.reset(Mutex::new(Vec::new())) };
        }
        if matches!(self.view.try_write(), Err(WouldBlock)) {
            // SAFETY: the contract above; the view lock was held by a vanished thread.
            unsafe { self.view.reset(RwLock::new(None)) };
            if !self.closed.load(Relaxed) && !self.reopen_view() {
                self.set_mode(Mode::Memory, "the index could not be reloaded after fork".to_owned());
            }
        }
    }
}
