//! Appends: the file lock, bringing the view in line with the file under it, padding a torn tail,
//! the append itself, and what a write failure does to later writes.
//!
//! Invariants:
//! * Only the lock holder writes to the live file, and only at the validated end: it first makes
//!   its view match the file exactly (`sync_once`), then writes one batch with `pwrite`.
//! * Only the lock holder pads: an invalid (torn) tail past the validated end, left by a writer
//!   that died mid-write, is covered with PAD records under the lock; nobody else repairs.
//! * Never past a hole: a file found shorter than what was validated is rewritten to a new inode
//!   (see `compact`) before anything is appended, and an append that finds the file cut under it
//!   is redone on the rewritten file.
//!
//! The first two are kept by types. The write descriptor, the lock file and the armed crash point
//! live in [`Writer`]'s private state. The one way to write through them is [`Writer::lock`],
//! which returns a [`Locked`] guard only once it holds both the writer mutex and the exclusive
//! `flock` (released when the guard drops); `Writer`'s other methods open or drop the lock file,
//! arm a crash point or pause writes, and none of them writes the log. Padding and appending are
//! methods of `Locked`, and a `Compactor` (see `compact`) is made only from one: without the lock
//! there is nothing to call.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use super::api::{Durability, Mode, PutOutcome, WarningKind};
use super::fault::{CrashPoints, Fault};
use super::format::{
    encode_pads, encode_record, pad_len_for, Digest, HeaderError, HEADER_LEN, TYPE_PUT, TYPE_TOMBSTONE,
};
use super::shared::{ForkReset, Shared};
use super::trust::open_trusted;
use super::view::{ident_of, load_view, Ident, Reader, View};

/// The writer's state, reachable only through the writer mutex.
struct State {
    pid: u32,
    lock: Option<File>,
    /// A read-write fd on the inode of the current view, for `pwrite`.
    wfile: Option<(File, Ident)>,
    disabled_until: Option<Instant>,
    swept: bool,
    /// The armed crash point (see `fault`).
    faults: CrashPoints,
}

impl State {
    fn new() -> Self {
        Self {
            pid: std::process::id(),
            lock: None,
            wfile: None,
            disabled_until: None,
            swept: false,
            faults: CrashPoints::default(),
        }
    }

    fn open_lock(&mut self, shared: &Shared) -> io::Result<()> {
        let pid = std::process::id();
        if self.pid != pid {
            // Forked child: the inherited fd shares the parent's open file description, so its
            // flock is the parent's lock. Take our own description (closing ours leaves theirs).
            self.pid = pid;
            self.lock = None;
            self.wfile = None;
        }
        if self.lock.is_none() {
            self.lock = Some(open_trusted(&shared.lock_path, true, true)?);
        }
        Ok(())
    }
}

/// The write side of an index: the file lock and the write descriptor (see the module doc).
pub(super) struct Writer {
    state: ForkReset<Mutex<State>>,
}

pub(super) enum WriteFail {
    Timeout,
    Io(io::Error),
    /// `close()` ran (possibly in another thread) before or during the operation.
    Closed,
}

impl From<io::Error> for WriteFail {
    fn from(e: io::Error) -> Self {
        WriteFail::Io(e)
    }
}

/// What one pass of [`Locked::sync_once`] found.
pub(super) enum Synced {
    /// The view matches the file, a torn tail is padded, the write fd is on the same inode.
    Ready,
    /// The file changed while we looked: look again.
    Again,
    /// There is no log file.
    Missing,
    /// The file at the path has our magic and a damaged header.
    Corrupt,
    /// The file is shorter than what we validated: appending would leave a hole.
    Shrunk,
}

/// Whether the file has a hole (bytes never written) below `at`: a sign that it was cut while we
/// wrote past the cut. Filesystems without `SEEK_HOLE` report none.
fn hole_below(file: &File, at: u64) -> bool {
    matches!(rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(HEADER_LEN as u64)), Ok(h) if h < at)
}

fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(c) if c == libc_errno::ENOSPC || c == libc_errno::EDQUOT || c == libc_errno::EFBIG)
}

fn is_permission(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(c) if c == libc_errno::EACCES || c == libc_errno::EROFS || c == libc_errno::EPERM)
}

mod libc_errno {
    use rustix::io::Errno;
    pub const ENOSPC: i32 = Errno::NOSPC.raw_os_error();
    pub const EDQUOT: i32 = Errno::DQUOT.raw_os_error();
    pub const EFBIG: i32 = Errno::FBIG.raw_os_error();
    pub const EACCES: i32 = Errno::ACCESS.raw_os_error();
    pub const EROFS: i32 = Errno::ROFS.raw_os_error();
    pub const EPERM: i32 = Errno::PERM.raw_os_error();
}

impl Writer {
    pub(super) fn new() -> Self {
        Self { state: ForkReset::new(Mutex::new(State::new())) }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens (creating if needed) the lock file, without taking the lock: whether writing is
    /// possible at all.
    pub(super) fn open_lock(&self, shared: &Shared) -> io::Result<()> {
        self.state().open_lock(shared)
    }

    /// Takes the in-process writer mutex and the exclusive file lock (waiting at most
    /// `lock_timeout` for it); the lock is released when the guard drops.
    pub(super) fn lock<'a>(
        &'a self,
        shared: &'a Shared,
        reader: &'a Reader,
    ) -> Result<Locked<'a>, WriteFail> {
        let mut w = self.state();
        // `close()` takes the writer mutex before it drops the view: once we hold it, the view
        // stays until we let go, and a closed index is refused here, not found missing later.
        if shared.is_closed() {
            return Err(WriteFail::Closed);
        }
        w.open_lock(shared)?;
        let start = Instant::now();
        let mut backoff = Duration::from_micros(20);
        {
            let Some(lock) = w.lock.as_ref() else { return Err(WriteFail::Closed) };
            loop {
                match flock(lock, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => break,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(rustix::io::Errno::WOULDBLOCK) => {
                        if start.elapsed() >= shared.opts.lock_timeout {
                            shared.counters.lock_timeouts.fetch_add(1, Relaxed);
                            return Err(WriteFail::Timeout);
                        }
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(Duration::from_millis(2));
                    }
                    Err(e) => return Err(WriteFail::Io(e.into())),
                }
            }
        }
        let waited = start.elapsed().as_micros() as u64;
        let bucket = (64 - waited.leading_zeros()).min(31) as usize;
        shared.counters.lock_wait[bucket].fetch_add(1, Relaxed);
        shared.counters.lock_acquisitions.fetch_add(1, Relaxed);
        Ok(Locked { w, shared, reader })
    }

    /// Whether writes are off for a while after a failure (see [`failed`](Self::failed)); an
    /// expired pause is lifted here.
    pub(super) fn paused(&self) -> bool {
        let mut w = self.state();
        match w.disabled_until {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                w.disabled_until = None;
                false
            }
            None => false,
        }
    }

    /// Reports a write that failed, and degrades: a permission error makes the index read-only;
    /// any other I/O error pauses writes for `disable_for`.
    pub(super) fn failed(&self, shared: &Shared, fail: WriteFail) {
        match fail {
            WriteFail::Closed => {}
            WriteFail::Timeout => shared.warn(
                WarningKind::LockTimeout,
                format!(
                    "jitkey DiskIndex: waited {:?} for {}; kept the write in memory",
                    shared.opts.lock_timeout,
                    shared.lock_path.display()
                ),
            ),
            WriteFail::Io(e) => {
                shared.counters.write_errors.fetch_add(1, Relaxed);
                if is_permission(&e) {
                    shared.set_mode(Mode::ReadOnly, format!("writing {} failed: {e}", shared.path.display()));
                } else {
                    self.state().disabled_until = Some(Instant::now() + shared.opts.disable_for);
                    let what = if is_disk_full(&e) { "disk full" } else { "write failed" };
                    shared.warn(
                        WarningKind::WriteFailed,
                        format!(
                            "jitkey DiskIndex: {what} at {} ({e}); writes stay in memory for {:?}, then retry",
                            shared.path.display(),
                            shared.opts.disable_for
                        ),
                    );
                }
            }
        }
    }

    /// Closes the index: marks it closed and drops the view and the descriptors, holding the
    /// writer mutex, so it waits for an in-flight write and every later one is refused.
    pub(super) fn close(&self, shared: &Shared, reader: &Reader) {
        let mut w = self.state();
        shared.set_closed();
        *reader.view_mut() = None;
        w.wfile = None;
        w.lock = None;
    }

    /// Arms a crash point (see `fault`).
    #[cfg(feature = "fault-injection")]
    pub(super) fn arm_fault(&self, fault: Fault, after: u32) {
        self.state().faults.arm(fault, after);
    }

    /// Replaces the writer mutex if a vanished thread of the parent held it.
    ///
    /// # Safety
    /// The contract of [`DiskIndex::after_fork_in_child`](super::DiskIndex::after_fork_in_child):
    /// a single-threaded child, called from outside every method of this index.
    pub(super) unsafe fn after_fork_in_child(&self) {
        use std::sync::TryLockError::WouldBlock;
        if matches!(self.state.try_lock(), Err(WouldBlock)) {
            // SAFETY: the contract above; the writer mutex was held by a vanished thread.
            unsafe { self.state.reset(Mutex::new(State::new())) };
        }
    }
}

/// Proof that this process holds the file lock (and the writer mutex): the only way to pad,
/// append, or reach what `compact` needs to replace the file. Dropping it releases the lock.
pub(super) struct Locked<'a> {
    w: MutexGuard<'a, State>,
    shared: &'a Shared,
    reader: &'a Reader,
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(lock) = self.w.lock.as_ref() {
            let _ = flock(lock, FlockOperation::Unlock);
        }
    }
}

impl<'a> Locked<'a> {
    pub(super) fn shared(&self) -> &'a Shared {
        self.shared
    }

    pub(super) fn reader(&self) -> &'a Reader {
        self.reader
    }

    /// `true` the first time a lock holder of this writer asks: holding the lock proves any temp
    /// file is an orphan of a dead compactor, to be swept once.
    pub(super) fn first_sweep(&mut self) -> bool {
        !std::mem::replace(&mut self.w.swept, true)
    }

    /// The live file was replaced (renamed over): the write fd is on the old inode.
    pub(super) fn file_replaced(&mut self) {
        self.w.wfile = None;
    }

    /// Whether crash point `at` fires on this pass (see `fault`).
    pub(super) fn fault_due(&self, at: Fault) -> bool {
        self.w.faults.due(at)
    }

    /// Passes crash point `at` (see `fault`).
    pub(super) fn fault_hit(&mut self, at: Fault) {
        self.w.faults.hit(at);
    }

    /// Loads the file now at the path as a view: `Ok(None)` when it is a damaged jitkey index (the
    /// caller replaces it), an error when it is another kind of file (never touched).
    pub(super) fn load(&self) -> Result<Option<View>, WriteFail> {
        match open_trusted(&self.shared.path, false, false).map_err(Err).and_then(load_view) {
            Ok(v) => Ok(Some(v)),
            Err(Ok(HeaderError::Corrupt)) => Ok(None),
            Err(Ok(_)) => Err(io::Error::other(format!(
                "{} was replaced by a file that is not a jitkey index",
                self.shared.path.display()
            ))
            .into()),
            Err(Err(e)) => Err(e.into()),
        }
    }

    /// One pass of making the view match the live file exactly, padding a torn tail, and opening
    /// a write fd on the same inode. What it cannot do here (a missing, damaged or shrunk file
    /// must be replaced) it reports; `compact` replaces the file and calls it again.
    pub(super) fn sync_once(&mut self) -> Result<Synced, WriteFail> {
        let shared = self.shared;
        let meta = match fs::symlink_metadata(&shared.path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Synced::Missing),
            Err(e) => return Err(e.into()),
        };
        let cur = ident_of(&meta);
        let same = self.reader.view().as_ref().is_some_and(|v| v.ident() == cur);
        if !same {
            let Some(v) = self.load()? else { return Ok(Synced::Corrupt) };
            *self.reader.view_mut() = Some(v);
            shared.counters.reopens.fetch_add(1, Relaxed);
        }
        let (ident, end, size) = {
            let mut g = self.reader.view_mut();
            let v = g.as_mut().ok_or(WriteFail::Closed)?;
            let size = v.file_len()?;
            if size < v.end() {
                // Shrunk under us. Appending at our end would leave a hole that stops every
                // fresh reader before our record: rebuild from what is left, to a new inode
                // (every process notices the rename).
                return Ok(Synced::Shrunk);
            }
            if size > v.end() {
                v.extend()?;
            }
            (v.ident(), v.end(), size)
        };
        if self.w.wfile.as_ref().is_none_or(|(_, id)| *id != ident) {
            let f = open_trusted(&shared.path, true, false)?;
            let id = ident_of(&f.metadata()?);
            if id != ident {
                self.w.wfile = None;
                return Ok(Synced::Again);
            }
            self.w.wfile = Some((f, id));
        }
        if size > end {
            // A dead writer's torn tail: cover [end, size) with PAD records.
            let gap = (size - end) as usize;
            let mut pads = Vec::new();
            encode_pads(&mut pads, pad_len_for(gap));
            self.w.wfile.as_ref().ok_or(WriteFail::Closed)?.0.write_all_at(&pads, end)?;
            shared.counters.torn_tails_padded.fetch_add(1, Relaxed);
            shared.counters.invalid_bytes_padded.fetch_add(gap as u64, Relaxed);
            self.reader.view_mut().as_mut().ok_or(WriteFail::Closed)?.extend()?;
        }
        Ok(Synced::Ready)
    }

    /// Encodes `ops` (skipping values already stored) and appends them at the validated end.
    /// `false` when the file turned out to have shrunk under the write (redo after a sync).
    pub(super) fn append(
        &mut self,
        ops: &[(Digest, Option<&[u8]>)],
        out: &mut PutOutcome,
    ) -> Result<bool, WriteFail> {
        let mut buf = Vec::new();
        let at;
        {
            let g = self.reader.view();
            let view = g.as_ref().ok_or(WriteFail::Closed)?;
            at = view.end();
            let mut seq = view.max_seq();
            out.first_seq = seq + 1;
            for (k, v) in ops {
                let existing = view.loc(k).and_then(|loc| match v {
                    Some(v) => view.with_record(k, loc, |_, e| e == *v),
                    None => Some(false),
                });
                match (v, existing) {
                    (Some(_), Some(true)) => {
                        out.deduped += 1;
                        continue;
                    }
                    (None, None) => continue,
                    _ => {}
                }
                seq += 1;
                match v {
                    Some(v) => encode_record(&mut buf, TYPE_PUT, seq, k, v),
                    None => encode_record(&mut buf, TYPE_TOMBSTONE, seq, k, &[]),
                }
                out.written += 1;
            }
        }
        if buf.is_empty() {
            return Ok(true);
        }
        let file = &self.w.wfile.as_ref().ok_or(WriteFail::Closed)?.0;
        // The file must still end exactly where we validated it: a truncation by anyone (they
        // take no lock) would turn this write into one past a hole.
        if file.metadata()?.len() != at {
            return Ok(false);
        }
        if self.w.faults.due(Fault::SplitWrite) {
            // Not a multiple of 8, so the cut always lands inside a record.
            let half = buf.len() / 2 + 4;
            file.write_all_at(&buf[..half], at)?;
        }
        self.w.faults.hit(Fault::SplitWrite);
        let file = &self.w.wfile.as_ref().ok_or(WriteFail::Closed)?.0;
        file.write_all_at(&buf, at)?;
        if self.shared.opts.durability == Durability::Full {
            file.sync_data()?;
        }
        // And it must not have been cut between that check and the write: a hole below `at`.
        if hole_below(file, at) {
            return Ok(false);
        }
        self.reader.view_mut().as_mut().ok_or(WriteFail::Closed)?.apply_written(at, &buf)?;
        self.shared.counters.appends.fetch_add(out.written as u64, Relaxed);
        Ok(true)
    }
}
