//! Appends: the file lock, bringing the view in line with the file under it, padding a torn tail,
//! the append itself, and the fallbacks (memory-only entries, write failures).
//!
//! Invariants:
//! * Only the lock holder writes to the live file, and only at the validated end: it first makes
//!   its view match the file exactly (`sync_locked`), then writes one batch with `pwrite`.
//! * Only the lock holder pads: an invalid (torn) tail past the validated end, left by a writer
//!   that died mid-write, is covered with PAD records under the lock; nobody else repairs.
//! * Never past a hole: a file found shorter than what was validated is rewritten to a new inode
//!   (see `compact`) before anything is appended, and an append that finds the file cut under it
//!   is redone on the rewritten file.
//! * An environment failure never fails a put: the batch is kept in this process's memory (a
//!   bounded overlay) and reported once.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use super::fault::{self, Fault};
use super::format::{
    encode_pads, encode_record, pad_len_for, record_len, Digest, HeaderError, HEADER_LEN, MAX_VALUE,
    TYPE_PUT, TYPE_TOMBSTONE,
};
use super::index::{DiskError, DiskIndex, Durability, Mode, PutOutcome, WarningKind};
use super::trust::open_trusted;
use super::view::{ident_of, load_view, Ident};

pub(super) struct Writer {
    pub(super) pid: u32,
    pub(super) lock: Option<File>,
    /// A read-write fd on the inode of the current view, for `pwrite`.
    pub(super) wfile: Option<(File, Ident)>,
    pub(super) disabled_until: Option<Instant>,
    pub(super) swept: bool,
    /// The armed crash point and how many more passes it lets by (see `fault`).
    #[cfg(feature = "fault-injection")]
    pub(super) fault: Option<(Fault, u32)>,
}

impl Writer {
    pub(super) fn new() -> Self {
        Self {
            pid: std::process::id(),
            lock: None,
            wfile: None,
            disabled_until: None,
            swept: false,
            #[cfg(feature = "fault-injection")]
            fault: None,
        }
    }
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

impl DiskIndex {
    pub(super) fn open_lock(&self, w: &mut Writer) -> io::Result<()> {
        let pid = std::process::id();
        if w.pid != pid {
            // Forked child: the inherited fd shares the parent's open file description, so its
            // flock is the parent's lock. Take our own description (closing ours leaves theirs).
            w.pid = pid;
            w.lock = None;
            w.wfile = None;
        }
        if w.lock.is_none() {
            w.lock = Some(open_trusted(&self.lock_path, true, true)?);
        }
        Ok(())
    }

    /// Runs `f` holding the in-process writer mutex and the exclusive file lock.
    pub(super) fn locked<R>(
        &self,
        f: impl FnOnce(&mut Writer) -> Result<R, WriteFail>,
    ) -> Result<R, WriteFail> {
        let mut w = self.writer();
        // `close()` takes the writer mutex before it drops the view: once we hold it, the view
        // stays until we let go, and a closed index is refused here, not found missing later.
        if self.closed.load(Relaxed) {
            return Err(WriteFail::Closed);
        }
        self.open_lock(&mut w)?;
        let start = Instant::now();
        let mut backoff = Duration::from_micros(20);
        {
            let Some(lock) = w.lock.as_ref() else { return Err(WriteFail::Closed) };
            loop {
                match flock(lock, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => break,
                    Err(rustix::io::Errno::INTR) => {}
                    Err(rustix::io::Errno::WOULDBLOCK) => {
                        if start.elapsed() >= self.opts.lock_timeout {
                            self.counters.lock_timeouts.fetch_add(1, Relaxed);
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
        self.counters.lock_wait[bucket].fetch_add(1, Relaxed);
        self.counters.lock_acquisitions.fetch_add(1, Relaxed);
        let r = f(&mut w);
        if let Some(lock) = w.lock.as_ref() {
            let _ = flock(lock, FlockOperation::Unlock);
        }
        r
    }

    /// Under the lock: make the view match the live file exactly, pad a torn tail, and open a
    /// write fd on the same inode. A file that shrank below what we validated is rewritten to a
    /// new inode first, so that no append ever lands past a hole.
    pub(super) fn sync_locked(&self, w: &mut Writer) -> Result<(), WriteFail> {
        if !w.swept {
            // Holding the lock proves any temp file is an orphan of a dead compactor.
            self.sweep_tmp();
            w.swept = true;
        }
        for _ in 0..6 {
            let meta = match fs::symlink_metadata(&self.path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.create_fresh(1)?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let cur = ident_of(&meta);
            let same = self.view_ref().as_ref().is_some_and(|v| v.ident == cur);
            if !same {
                match open_trusted(&self.path, false, false).map_err(Err).and_then(load_view) {
                    Ok(v) => {
                        *self.view_mut() = Some(v);
                        self.counters.reopens.fetch_add(1, Relaxed);
                    }
                    Err(Ok(HeaderError::Corrupt)) => {
                        self.quarantine_and_create(w)?;
                        continue;
                    }
                    Err(Ok(_)) => {
                        return Err(io::Error::other(format!(
                            "{} was replaced by a file that is not a jitkey index",
                            self.path.display()
                        ))
                        .into())
                    }
                    Err(Err(e)) => return Err(e.into()),
                }
            }
            let (ident, end, size) = {
                let mut g = self.view_mut();
                let v = g.as_mut().ok_or(WriteFail::Closed)?;
                let size = v.file.metadata()?.len();
                if size < v.end {
                    // Shrunk under us. Appending at our end would leave a hole that stops every
                    // fresh reader before our record: rebuild from what is left, to a new inode
                    // (every process notices the rename).
                    drop(g);
                    self.rewrite_shrunk(w)?;
                    continue;
                }
                if size > v.end {
                    v.extend()?;
                }
                (v.ident, v.end, size)
            };
            if w.wfile.as_ref().is_none_or(|(_, id)| *id != ident) {
                let f = open_trusted(&self.path, true, false)?;
                let id = ident_of(&f.metadata()?);
                if id != ident {
                    w.wfile = None;
                    continue;
                }
                w.wfile = Some((f, id));
            }
            if size > end {
                // A dead writer's torn tail: cover [end, size) with PAD records.
                let gap = (size - end) as usize;
                let mut pads = Vec::new();
                encode_pads(&mut pads, pad_len_for(gap));
                w.wfile.as_ref().ok_or(WriteFail::Closed)?.0.write_all_at(&pads, end)?;
                self.counters.torn_tails_padded.fetch_add(1, Relaxed);
                self.counters.invalid_bytes_padded.fetch_add(gap as u64, Relaxed);
                self.view_mut().as_mut().ok_or(WriteFail::Closed)?.extend()?;
            }
            return Ok(());
        }
        Err(io::Error::other("index file keeps changing under the lock").into())
    }

    /// Under the lock, after the live file shrank below our validated end: index what is still
    /// valid in it (read with `pread`, never through the mapping), then compact that to a new
    /// file renamed over it.
    fn rewrite_shrunk(&self, w: &mut Writer) -> Result<(), WriteFail> {
        self.counters.shrinks_seen.fetch_add(1, Relaxed);
        self.warn(
            WarningKind::Corrupt,
            format!(
                "jitkey DiskIndex: {} shrank under this process (truncated or copied over); rewrote it from \
                 what was left",
                self.path.display()
            ),
        );
        match open_trusted(&self.path, false, false).map_err(Err).and_then(load_view) {
            Ok(v) => *self.view_mut() = Some(v),
            Err(Ok(HeaderError::Corrupt)) => return self.quarantine_and_create(w),
            Err(Ok(_)) => {
                return Err(io::Error::other(format!(
                    "{} was overwritten by a file that is not a jitkey index",
                    self.path.display()
                ))
                .into())
            }
            Err(Err(e)) => return Err(e.into()),
        }
        w.wfile = None;
        self.compact_locked(w, false, 0)
    }

    fn memory_put(&self, key: &Digest, value: Option<&[u8]>) {
        let mut ov = self.overlay.write().unwrap_or_else(|p| p.into_inner());
        // Memory-only entries are bounded by `max_bytes` too (record-sized accounting); past it
        // they are dropped wholesale: this is a cache, and dropping never gives a wrong value.
        let add = record_len(value.map_or(0, <[u8]>::len)) as u64;
        if self.overlay_bytes.load(Relaxed) + add > self.opts.max_bytes {
            self.counters.evictions.fetch_add(ov.len() as u64, Relaxed);
            ov.clear();
            self.overlay_bytes.store(0, Relaxed);
        }
        self.overlay_bytes.fetch_add(add, Relaxed);
        ov.insert(*key, value.map(Arc::from));
        self.overlay_used.store(true, Relaxed);
        self.counters.memory_only_puts.fetch_add(1, Relaxed);
    }

    fn forget_overlay(&self, keys: impl Iterator<Item = Digest>) {
        if self.overlay_used.load(Relaxed) {
            let mut ov = self.overlay.write().unwrap_or_else(|p| p.into_inner());
            for k in keys {
                ov.remove(&k);
            }
        }
    }

    /// Stores `value` under `key`. `memory_only` in the outcome says the file could not take it
    /// (it is served from this process's memory only and would not survive the process).
    pub fn put(&self, key: &Digest, value: &[u8]) -> Result<PutOutcome, DiskError> {
        self.put_many(&[(*key, value)])
    }

    /// Stores a batch with one lock acquisition and one write. Values over [`MAX_VALUE`] are
    /// refused before anything is written. Environment failures keep the batch in memory.
    pub fn put_many(&self, items: &[(Digest, &[u8])]) -> Result<PutOutcome, DiskError> {
        self.check_open()?;
        if let Some((index, (_, v))) = items.iter().enumerate().find(|(_, (_, v))| v.len() > MAX_VALUE) {
            return Err(DiskError::ValueTooLarge { index, len: v.len() });
        }
        let ops: Vec<(Digest, Option<&[u8]>)> = items.iter().map(|(k, v)| (*k, Some(*v))).collect();
        self.write_ops(&ops)
    }

    /// Removes `key` (a tombstone record). Returns whether it was present.
    pub fn delete(&self, key: &Digest) -> Result<bool, DiskError> {
        let present = self.contains(key)?;
        if present {
            self.write_ops(&[(*key, None)])?;
        }
        Ok(present)
    }

    fn write_ops(&self, ops: &[(Digest, Option<&[u8]>)]) -> Result<PutOutcome, DiskError> {
        let mut out = PutOutcome::default();
        if ops.is_empty() {
            return Ok(out);
        }
        let to_memory = |out: &mut PutOutcome| {
            for (k, v) in ops {
                self.memory_put(k, *v);
            }
            out.memory_only = ops.len();
        };
        if self.mode().0 != Mode::ReadWrite {
            to_memory(&mut out);
            return Ok(out);
        }
        {
            let mut w = self.writer();
            if let Some(until) = w.disabled_until {
                if Instant::now() < until {
                    drop(w);
                    to_memory(&mut out);
                    return Ok(out);
                }
                w.disabled_until = None;
            }
        }
        let res = self.locked(|w| {
            // Twice at most: a write that finds the file shrank under it is redone once on the
            // rewritten file.
            for _ in 0..2 {
                out = PutOutcome::default();
                self.sync_locked(w)?;
                if self.append_locked(w, ops, &mut out)? {
                    break;
                }
            }
            self.counters.dedup_skips.fetch_add(out.deduped as u64, Relaxed);
            self.forget_overlay(ops.iter().map(|(k, _)| *k));
            self.maybe_compact(w, out.first_seq)?;
            Ok(())
        });
        match res {
            Ok(()) => Ok(out),
            Err(WriteFail::Closed) => Err(DiskError::Closed),
            Err(fail) => {
                self.handle_write_failure(fail);
                out = PutOutcome::default();
                to_memory(&mut out);
                Ok(out)
            }
        }
    }

    /// Encodes `ops` (skipping values already stored) and appends them at the validated end.
    /// `false` when the file turned out to have shrunk under the write (redo after a sync).
    fn append_locked(
        &self,
        w: &mut Writer,
        ops: &[(Digest, Option<&[u8]>)],
        out: &mut PutOutcome,
    ) -> Result<bool, WriteFail> {
        let mut buf = Vec::new();
        let at;
        {
            let g = self.view_ref();
            let view = g.as_ref().ok_or(WriteFail::Closed)?;
            at = view.end;
            let mut seq = view.max_seq;
            out.first_seq = seq + 1;
            for (k, v) in ops {
                let existing = view.keydir.get(k).and_then(|&loc| match v {
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
        let file = &w.wfile.as_ref().ok_or(WriteFail::Closed)?.0;
        // The file must still end exactly where we validated it: a truncation by anyone (they
        // take no lock) would turn this write into one past a hole.
        if file.metadata()?.len() != at {
            return Ok(false);
        }
        if fault::due(w, Fault::SplitWrite) {
            // Not a multiple of 8, so the cut always lands inside a record.
            let half = buf.len() / 2 + 4;
            file.write_all_at(&buf[..half], at)?;
        }
        fault::hit(w, Fault::SplitWrite);
        let file = &w.wfile.as_ref().ok_or(WriteFail::Closed)?.0;
        file.write_all_at(&buf, at)?;
        if self.opts.durability == Durability::Full {
            file.sync_data()?;
        }
        // And it must not have been cut between that check and the write: a hole below `at`.
        if hole_below(file, at) {
            return Ok(false);
        }
        self.view_mut().as_mut().ok_or(WriteFail::Closed)?.apply_written(at, &buf)?;
        self.counters.appends.fetch_add(out.written as u64, Relaxed);
        Ok(true)
    }

    pub(super) fn handle_write_failure(&self, fail: WriteFail) {
        match fail {
            WriteFail::Closed => {}
            WriteFail::Timeout => self.warn(
                WarningKind::LockTimeout,
                format!(
                    "jitkey DiskIndex: waited {:?} for {}; kept the write in memory",
                    self.opts.lock_timeout,
                    self.lock_path.display()
                ),
            ),
            WriteFail::Io(e) => {
                self.counters.write_errors.fetch_add(1, Relaxed);
                if is_permission(&e) {
                    self.set_mode(Mode::ReadOnly, format!("writing {} failed: {e}", self.path.display()));
                } else {
                    self.writer().disabled_until = Some(Instant::now() + self.opts.disable_for);
                    let what = if is_disk_full(&e) { "disk full" } else { "write failed" };
                    self.warn(
                        WarningKind::WriteFailed,
                        format!(
                            "jitkey DiskIndex: {what} at {} ({e}); writes stay in memory for {:?}, then retry",
                            self.path.display(),
                            self.opts.disable_for
                        ),
                    );
                }
            }
        }
    }
}
