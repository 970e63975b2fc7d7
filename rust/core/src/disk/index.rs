//! The public face of the disk index: [`DiskIndex`], a facade over the parts that do the work,
//! and the sequences that need more than one part (opening, a put, a compaction).
//!
//! The parts, each owning exactly the state it may touch:
//! * `Shared` (`shared`): paths, options, counters, mode, warnings, the closed flag. No file.
//! * `Reader` (`view`): the view and the lock-free read path. A read-only descriptor; nothing
//!   that writes a file.
//! * `Overlay` (`overlay`): memory-only entries.
//! * `Writer` (`append`): the lock file and the write descriptor, reachable only through the
//!   `Locked` guard that holds the file lock; padding and appends are its methods.
//! * `Compactor` (`compact`): replacing the live file; made from a `Locked` guard only.
//!
//! Invariant: no method fails because of the environment. Opening never fails (an unusable
//! directory or file gives [`Mode::ReadOnly`] or [`Mode::Memory`] with a reason, decided by
//! `trust`'s checks); a write the file cannot take is kept in this process's memory (the bounded
//! overlay) and reported once per kind through [`DiskIndex::take_warnings`]. Only caller mistakes
//! and a closed index are errors ([`DiskError`]).

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use super::api::{DiskError, Mode, Options, Probe, PutOutcome};
use super::append::{Locked, WriteFail, Writer};
use super::compact::Compactor;
#[cfg(feature = "fault-injection")]
use super::fault::Fault;
use super::format::{Digest, HeaderError, FORMAT_MAJOR, MAX_VALUE};
use super::overlay::Overlay;
use super::shared::Shared;
use super::stats::Stats;
use super::trust::{check_dir, open_trusted};
use super::view::{load_view, Reader};

/// An append-only, crash-safe key → bytes index in one directory, shared by processes.
///
/// Never fails to open: an unusable environment gives [`Mode::ReadOnly`] or [`Mode::Memory`]
/// with a reason and one warning (see [`DiskIndex::take_warnings`]).
pub struct DiskIndex {
    shared: Shared,
    reader: Reader,
    writer: Writer,
    overlay: Overlay,
}

impl DiskIndex {
    /// Opens (creating if needed) the index in `dir`.
    pub fn open(dir: &Path, opts: Options) -> Self {
        let idx = Self {
            shared: Shared::new(dir, opts),
            reader: Reader::new(),
            writer: Writer::new(),
            overlay: Overlay::new(),
        };
        match idx.open_inner() {
            Ok((mode, reason)) => idx.shared.set_mode(mode, reason),
            Err(reason) => idx.shared.set_mode(Mode::Memory, reason),
        }
        idx
    }

    fn open_inner(&self) -> Result<(Mode, String), String> {
        let shared = &self.shared;
        let (mut rw, mut ro_reason) = check_dir(&shared.dir, &shared.opts)?;
        if rw {
            if let Err(e) = self.writer.open_lock(shared) {
                rw = false;
                ro_reason = format!("cannot open {} for writing: {e}", shared.lock_path.display());
            }
        }
        for _ in 0..4 {
            match open_trusted(&shared.path, false, false) {
                Ok(f) => match load_view(f) {
                    Ok(view) => {
                        if rw {
                            if let Err(e) = open_trusted(&shared.path, true, false) {
                                rw = false;
                                ro_reason = format!("cannot open {} for writing: {e}", shared.path.display());
                            }
                        }
                        *self.reader.view_mut() = Some(view);
                        self.reader.touch_check();
                        return Ok(if rw {
                            (Mode::ReadWrite, String::new())
                        } else {
                            (Mode::ReadOnly, ro_reason)
                        });
                    }
                    Err(Ok(HeaderError::Foreign)) => {
                        return Err(format!(
                            "{} is not a jitkey index; left untouched",
                            shared.path.display()
                        ))
                    }
                    Err(Ok(HeaderError::UnknownMajor(m))) => {
                        return Err(format!(
                            "{} has format major {m}, this jitkey reads {FORMAT_MAJOR}; left untouched",
                            shared.path.display()
                        ))
                    }
                    Err(Ok(HeaderError::Corrupt)) if rw => {
                        self.with_lock(|l| Compactor::new(l).quarantine_and_create())
                            .map_err(|e| self.fail_reason(e))?;
                    }
                    Err(Ok(HeaderError::Corrupt)) => {
                        return Err(format!("{} has a damaged header and {ro_reason}", shared.path.display()))
                    }
                    Err(Err(e)) => return Err(format!("cannot read {}: {e}", shared.path.display())),
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound && rw => {
                    self.with_lock(|l| Compactor::new(l).create_if_missing())
                        .map_err(|e| self.fail_reason(e))?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(format!("no index at {} and {ro_reason}", shared.path.display()))
                }
                Err(e) => return Err(format!("cannot open {}: {e}", shared.path.display())),
            }
        }
        Err(format!("{} keeps changing under us", shared.path.display()))
    }

    fn fail_reason(&self, e: WriteFail) -> String {
        match e {
            WriteFail::Timeout => format!("timed out waiting for {}", self.shared.lock_path.display()),
            WriteFail::Closed => "closed while opening".to_owned(),
            WriteFail::Io(e) => format!("cannot create {}: {e}", self.shared.path.display()),
        }
    }

    /// Runs `f` holding the in-process writer mutex and the exclusive file lock.
    fn with_lock<R>(&self, f: impl FnOnce(&mut Locked<'_>) -> Result<R, WriteFail>) -> Result<R, WriteFail> {
        f(&mut self.writer.lock(&self.shared, &self.reader)?)
    }

    /// Looks `key` up without any I/O. `final_probe` turns `Refresh` into `Miss` (and counts it).
    pub fn probe<R>(
        &self,
        key: &Digest,
        final_probe: bool,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Probe<R>, DiskError> {
        self.shared.check_open()?;
        match self.overlay.probe(key, &self.shared.counters, f) {
            Ok(p) => Ok(p),
            Err(f) => Ok(self.reader.probe(&self.shared, key, final_probe, f)),
        }
    }

    /// A full lookup (probe, refresh on miss or when stale, probe again); copies the value.
    pub fn get(&self, key: &Digest) -> Result<Option<Vec<u8>>, DiskError> {
        match self.probe(key, false, <[u8]>::to_vec)? {
            Probe::Hit(v) => Ok(Some(v)),
            Probe::Miss => Ok(None),
            Probe::Refresh => {
                self.refresh();
                match self.probe(key, true, <[u8]>::to_vec)? {
                    Probe::Hit(v) => Ok(Some(v)),
                    _ => Ok(None),
                }
            }
        }
    }

    /// Brings this process's view up to date with the file: new appends, or a new file after
    /// another process compacted. Lock-free; never repairs anything; errors leave the view as is.
    pub fn refresh(&self) {
        self.reader.refresh(&self.shared);
    }

    /// Whether `key` has a value (a [`get`](Self::get) that drops the value).
    pub fn contains(&self, key: &Digest) -> Result<bool, DiskError> {
        Ok(self.get(key)?.is_some())
    }

    /// The number of live keys this process sees (file plus memory-only entries).
    pub fn len(&self) -> Result<usize, DiskError> {
        self.shared.check_open()?;
        let guard = self.reader.view();
        let base = guard.as_ref().map_or(0, |v| v.len());
        Ok(self.overlay.len(base, |k| guard.as_ref().is_some_and(|view| view.contains(k))))
    }

    /// Whether [`len`](Self::len) is 0.
    pub fn is_empty(&self) -> Result<bool, DiskError> {
        Ok(self.len()? == 0)
    }

    /// Stores `value` under `key`. `memory_only` in the outcome says the file could not take it
    /// (it is served from this process's memory only and would not survive the process).
    pub fn put(&self, key: &Digest, value: &[u8]) -> Result<PutOutcome, DiskError> {
        self.put_many(&[(*key, value)])
    }

    /// Stores a batch with one lock acquisition and one write. Values over [`MAX_VALUE`] are
    /// refused before anything is written. Environment failures keep the batch in memory.
    pub fn put_many(&self, items: &[(Digest, &[u8])]) -> Result<PutOutcome, DiskError> {
        self.shared.check_open()?;
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
                self.overlay.put(k, *v, self.shared.opts.max_bytes, &self.shared.counters);
            }
            out.memory_only = ops.len();
        };
        if self.shared.mode().0 != Mode::ReadWrite || self.writer.paused() {
            to_memory(&mut out);
            return Ok(out);
        }
        let res = self.with_lock(|l| {
            // Twice at most: a write that finds the file shrank under it is redone once on the
            // rewritten file.
            for _ in 0..2 {
                out = PutOutcome::default();
                Compactor::new(l).sync()?;
                if l.append(ops, &mut out)? {
                    break;
                }
            }
            self.shared.counters.dedup_skips.fetch_add(out.deduped as u64, Relaxed);
            self.overlay.forget(ops.iter().map(|(k, _)| *k));
            Compactor::new(l).maybe_compact(out.first_seq)
        });
        match res {
            Ok(()) => Ok(out),
            Err(WriteFail::Closed) => Err(DiskError::Closed),
            Err(fail) => {
                self.writer.failed(&self.shared, fail);
                out = PutOutcome::default();
                to_memory(&mut out);
                Ok(out)
            }
        }
    }

    /// Rewrites the live set (oldest entries evicted past the cap) to a new file and renames it
    /// over the live one.
    pub fn compact(&self) -> Result<bool, DiskError> {
        self.rewrite(false)
    }

    /// Removes every entry (compaction to an empty file) and forgets memory-only entries.
    pub fn clear(&self) -> Result<bool, DiskError> {
        self.shared.check_open()?;
        self.overlay.clear();
        self.rewrite(true)
    }

    fn rewrite(&self, empty: bool) -> Result<bool, DiskError> {
        self.shared.check_open()?;
        if self.shared.mode().0 != Mode::ReadWrite {
            return Ok(false);
        }
        let res = self.with_lock(|l| {
            let mut c = Compactor::new(l);
            c.sync()?;
            c.compact(empty, 0)
        });
        match res {
            Ok(()) => Ok(true),
            Err(WriteFail::Closed) => Err(DiskError::Closed),
            Err(fail) => {
                self.writer.failed(&self.shared, fail);
                Ok(false)
            }
        }
    }

    /// A snapshot of the counters and of the view (entries, sizes, generation).
    pub fn stats(&self) -> Stats {
        self.shared.counters.snapshot(self.reader.numbers())
    }

    /// Warnings raised since the last call (each kind at most once per index).
    pub fn take_warnings(&self) -> Vec<String> {
        self.shared.take_warnings()
    }

    /// Whether [`take_warnings`](Self::take_warnings) has something (one relaxed load).
    pub fn has_warnings(&self) -> bool {
        self.shared.has_warnings()
    }

    /// The mode the index runs in, and why it is not [`Mode::ReadWrite`] (empty when it is).
    pub fn mode(&self) -> (Mode, String) {
        self.shared.mode()
    }

    /// The log file (`<dir>/index.v1.jki`).
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The directory the index lives in.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The options it was opened with.
    pub fn options(&self) -> &Options {
        &self.shared.opts
    }

    /// Flushes appended data to stable storage (`fdatasync`), whatever the durability mode.
    pub fn sync(&self) -> Result<(), DiskError> {
        self.shared.check_open()?;
        if let Some(v) = self.reader.view().as_ref() {
            let _ = v.sync_data();
        }
        Ok(())
    }

    /// Drops the mapping and file descriptors; later calls return [`DiskError::Closed`].
    /// Safe against every concurrent operation: it waits for an in-flight write (which holds the
    /// writer mutex); operations that start later get [`DiskError::Closed`]; lock-free readers
    /// hold their own reference to the mapping.
    pub fn close(&self) {
        self.writer.close(&self.shared, &self.reader);
        self.overlay.clear();
    }

    /// Whether [`close`](Self::close) ran.
    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// Arms a crash point: the `after`-th time (0 = next) the process reaches `fault`, it
    /// SIGKILLs itself. Only for the crash tests; only with the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    pub fn arm_fault(&self, fault: Fault, after: u32) {
        self.writer.arm_fault(fault, after);
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
        // Every part's reset relies on the caller's contract: a single-threaded child, called from
        // outside every method of this index, so no borrow of an old value is alive.
        // SAFETY: the contract above, which is the writer's.
        unsafe { self.writer.after_fork_in_child() };
        // SAFETY: the contract above, which is the overlay's.
        unsafe { self.overlay.after_fork_in_child() };
        // SAFETY: the contract above, which is the mode's and warnings'.
        unsafe { self.shared.after_fork_in_child() };
        // SAFETY: the contract above, which is the view's.
        if unsafe { self.reader.after_fork_in_child() }
            && !self.shared.is_closed()
            && !self.reader.reopen(&self.shared)
        {
            self.shared.set_mode(Mode::Memory, "the index could not be reloaded after fork".to_owned());
        }
    }
}
