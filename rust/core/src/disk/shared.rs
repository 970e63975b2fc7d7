//! What every part of an index reads: where its files are, the options, the counters, the mode
//! and the warnings, and whether it is closed ([`Shared`]); and [`ForkReset`], the lock wrapper
//! the fork hook replaces.
//!
//! Invariant: nothing here touches a file. `Shared` holds paths, never a descriptor or the view,
//! so a part that is handed only `&Shared` can report (count, warn, degrade the mode) but cannot
//! read or write the log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::Relaxed};
use std::sync::{Mutex, RwLock};

use super::api::{log_name, DiskError, Mode, Options, WarningKind, LOCK_NAME};
use super::stats::Counters;

/// A lock that can be replaced in a forked child. After `fork()` only the forking thread exists:
/// a lock another thread held at that moment stays held forever in the child. The child-side
/// fork hook ([`DiskIndex::after_fork_in_child`](super::DiskIndex::after_fork_in_child)) replaces
/// such a lock (and the state it guarded, which may be half-updated) with a fresh one; the old one
/// is leaked, never dropped.
pub(super) struct ForkReset<T>(std::cell::UnsafeCell<T>);

// SAFETY: shared access goes through `T` (a Sync lock); `reset` is only called in a forked child
// while it is single-threaded, with no borrow of the old value alive.
unsafe impl<T: Sync> Sync for ForkReset<T> {}
// SAFETY: a `ForkReset<T>` owns its `T` like a plain wrapper; moving it to another thread moves
// the `T`, which is `Send`.
unsafe impl<T: Send> Send for ForkReset<T> {}

impl<T> ForkReset<T> {
    pub(super) fn new(v: T) -> Self {
        Self(std::cell::UnsafeCell::new(v))
    }

    /// # Safety
    /// Only in a forked child before it starts other threads, with no reference to the old value
    /// alive (the fork hook runs from the interpreter, outside every `DiskIndex` method).
    pub(super) unsafe fn reset(&self, v: T) {
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

/// The index's paths, options, counters, mode, warnings and closed flag (see the module doc).
pub(super) struct Shared {
    pub(super) dir: PathBuf,
    pub(super) path: PathBuf,
    pub(super) lock_path: PathBuf,
    pub(super) opts: Options,
    pub(super) counters: Counters,
    mode: ForkReset<RwLock<(Mode, String)>>,
    warned: AtomicU8,
    pending: AtomicBool,
    warnings: ForkReset<Mutex<Vec<String>>>,
    closed: AtomicBool,
}

impl Shared {
    pub(super) fn new(dir: &Path, opts: Options) -> Self {
        Self {
            dir: dir.to_path_buf(),
            path: dir.join(log_name()),
            lock_path: dir.join(LOCK_NAME),
            opts,
            counters: Counters::default(),
            mode: ForkReset::new(RwLock::new((Mode::Memory, String::new()))),
            warned: AtomicU8::new(0),
            pending: AtomicBool::new(false),
            warnings: ForkReset::new(Mutex::new(Vec::new())),
            closed: AtomicBool::new(false),
        }
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

    pub(super) fn mode(&self) -> (Mode, String) {
        self.mode.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn warn(&self, kind: WarningKind, msg: String) {
        let bit = 1u8 << (kind as u8);
        if self.warned.fetch_or(bit, Relaxed) & bit == 0 {
            self.warnings.lock().unwrap_or_else(|p| p.into_inner()).push(msg);
            self.pending.store(true, Relaxed);
        }
    }

    pub(super) fn take_warnings(&self) -> Vec<String> {
        if !self.pending.swap(false, Relaxed) {
            return Vec::new();
        }
        std::mem::take(&mut *self.warnings.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(super) fn has_warnings(&self) -> bool {
        self.pending.load(Relaxed)
    }

    pub(super) fn check_open(&self) -> Result<(), DiskError> {
        if self.closed.load(Relaxed) {
            Err(DiskError::Closed)
        } else {
            Ok(())
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }

    /// Marks the index closed; only `Writer::close` calls it, holding the writer mutex (see there).
    pub(super) fn set_closed(&self) {
        self.closed.store(true, Relaxed);
    }

    /// Replaces the mode and warnings locks if a vanished thread of the parent held them.
    ///
    /// # Safety
    /// The contract of [`DiskIndex::after_fork_in_child`](super::DiskIndex::after_fork_in_child):
    /// a single-threaded child, called from outside every method of this index.
    pub(super) unsafe fn after_fork_in_child(&self) {
        use std::sync::TryLockError::WouldBlock;
        if matches!(self.mode.try_write(), Err(WouldBlock)) {
            // SAFETY: the contract above; the mode lock was held by a vanished thread.
            unsafe { self.mode.reset(RwLock::new((Mode::ReadOnly, "reset after fork".to_owned()))) };
        }
        if matches!(self.warnings.try_lock(), Err(WouldBlock)) {
            // SAFETY: the contract above; the warnings mutex was held by a vanished thread.
            unsafe { self.warnings.reset(Mutex::new(Vec::new())) };
        }
    }
}
