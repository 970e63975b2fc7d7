//! Compaction, eviction, `clear`, and every other way a new log file comes into being: creating
//! a missing one, moving a damaged one aside, rewriting one that shrank. [`Compactor`] does all of
//! it, and also the full sync before a write (`sync`), which is where those are found.
//!
//! Invariant: compaction is a rename. The live file's bytes are never rewritten in place: a new
//! file (the live set, oldest entries evicted past the cap, or just a header) is written under a
//! temp name, fsynced, and renamed over the live one, all under the lock; readers that still map
//! the old inode keep reading it, and notice the new one on their next refresh. A damaged file is
//! renamed aside, never deleted. A temp file found while holding the lock is an orphan of a dead
//! compactor and is removed.
//!
//! Only the lock holder compacts, by type: a [`Compactor`] is made from a [`Locked`] guard (see
//! `append`) and borrows it for its whole life.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use super::api::{log_name, Durability, WarningKind};
use super::append::{Locked, Synced, WriteFail};
use super::fault::Fault;
use super::format::{Digest, Header, HeaderError, HEADER_LEN, MAX_RECORD};
use super::shared::Shared;
use super::trust::open_trusted;
use super::view::{load_view, Loc, CHUNK};

/// Compact when dead bytes exceed half of a file larger than this.
const COMPACT_MIN_FILE: u64 = 8 << 20;

pub(super) fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces the live file (see the module doc); exists only while its [`Locked`] guard is held.
pub(super) struct Compactor<'l, 'a> {
    l: &'l mut Locked<'a>,
}

impl<'l, 'a> Compactor<'l, 'a> {
    pub(super) fn new(l: &'l mut Locked<'a>) -> Self {
        Self { l }
    }

    fn shared(&self) -> &'a Shared {
        self.l.shared()
    }

    fn tmp_path(&self) -> PathBuf {
        self.shared().dir.join(format!("{}.tmp.{}.{:x}", log_name(), std::process::id(), now_unix_ns()))
    }

    /// Under the lock: make the view match the live file exactly, pad a torn tail, and open a
    /// write fd on the same inode (`Locked::sync_once`). A missing file is created, a damaged one
    /// moved aside, and one that shrank below what we validated is rewritten to a new inode first,
    /// so that no append ever lands past a hole.
    pub(super) fn sync(&mut self) -> Result<(), WriteFail> {
        if self.l.first_sweep() {
            // Holding the lock proves any temp file is an orphan of a dead compactor.
            self.sweep_tmp();
        }
        for _ in 0..6 {
            match self.l.sync_once()? {
                Synced::Ready => return Ok(()),
                Synced::Again => {}
                Synced::Missing => self.create_fresh(1)?,
                Synced::Corrupt => self.quarantine_and_create()?,
                Synced::Shrunk => self.rewrite_shrunk()?,
            }
        }
        Err(io::Error::other("index file keeps changing under the lock").into())
    }

    /// Writes a header-only file under a temp name and renames it into place (under the lock).
    fn create_fresh(&self, generation: u64) -> io::Result<()> {
        let shared = self.shared();
        let tmp = self.tmp_path();
        let r = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(&Header::new(generation, now_unix_ns()).encode())?;
            f.sync_all()?;
            fs::rename(&tmp, &shared.path)?;
            if shared.opts.durability == Durability::Full {
                fsync_dir(&shared.dir)?;
            }
            Ok(())
        })();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    pub(super) fn create_if_missing(&self) -> Result<(), WriteFail> {
        match fs::metadata(&self.shared().path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(self.create_fresh(1)?),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn quarantine_and_create(&self) -> Result<(), WriteFail> {
        let shared = self.shared();
        // Re-check under the lock: another process may already have replaced it.
        if let Ok(f) = open_trusted(&shared.path, false, false) {
            if !matches!(load_view(f), Err(Ok(HeaderError::Corrupt))) {
                return Ok(());
            }
            let aside = shared.dir.join(format!("{}.corrupt-{}", log_name(), now_unix_ns()));
            fs::rename(&shared.path, &aside)?;
            shared.warn(
                WarningKind::Corrupt,
                format!(
                    "{} had a damaged header; moved to {} and started fresh",
                    shared.path.display(),
                    aside.display()
                ),
            );
        }
        self.create_if_missing()
    }

    fn sweep_tmp(&self) {
        let shared = self.shared();
        let prefix = format!("{}.tmp.", log_name());
        if let Ok(rd) = fs::read_dir(&shared.dir) {
            for e in rd.flatten() {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// After the live file shrank below our validated end: index what is still valid in it (read
    /// with `pread`, never through the mapping), then compact that to a new file renamed over it.
    fn rewrite_shrunk(&mut self) -> Result<(), WriteFail> {
        let shared = self.shared();
        shared.counters.shrinks_seen.fetch_add(1, Relaxed);
        shared.warn(
            WarningKind::Corrupt,
            format!(
                "jitkey DiskIndex: {} shrank under this process (truncated or copied over); rewrote it from \
                 what was left",
                shared.path.display()
            ),
        );
        let Some(v) = self.l.load()? else { return self.quarantine_and_create() };
        *self.l.reader().view_mut() = Some(v);
        self.l.file_replaced();
        self.compact(false, 0)
    }

    /// `keep_from_seq`: records of the batch just written (seq >= it) are never evicted, so a put
    /// that returned is never undone by the compaction it triggered (0: no such batch).
    pub(super) fn maybe_compact(&mut self, keep_from_seq: u64) -> Result<(), WriteFail> {
        let shared = self.shared();
        let (size, live) = {
            let g = self.l.reader().view();
            let v = g.as_ref().ok_or(WriteFail::Closed)?;
            (v.end(), v.live_bytes())
        };
        let dead = size.saturating_sub(HEADER_LEN as u64 + live);
        if size > shared.opts.max_bytes || (size > COMPACT_MIN_FILE && dead * 2 > size) {
            self.compact(false, keep_from_seq)?;
        }
        Ok(())
    }

    /// Rewrites the live set (oldest entries evicted past the cap; none at all when `empty`) to a
    /// new file and renames it over the live one.
    pub(super) fn compact(&mut self, empty: bool, keep_from_seq: u64) -> Result<(), WriteFail> {
        let shared = self.shared();
        self.sweep_tmp();
        let tmp = self.tmp_path();
        let r = self.write_compacted(&tmp, empty, keep_from_seq);
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
            return r;
        }
        self.l.fault_hit(Fault::CompactAfterRename);
        shared.counters.compactions.fetch_add(1, Relaxed);
        if !self.l.reader().reopen(shared) {
            return Err(io::Error::other("compacted file did not reopen").into());
        }
        self.l.file_replaced();
        self.l.fault_hit(Fault::CompactBeforeUnlock);
        Ok(())
    }

    fn write_compacted(&mut self, tmp: &Path, empty: bool, keep_from_seq: u64) -> Result<(), WriteFail> {
        let shared = self.shared();
        let g = self.l.reader().view();
        let view = g.as_ref().ok_or(WriteFail::Closed)?;
        let mut entries: Vec<(Digest, Loc)> =
            if empty { Vec::new() } else { view.locs().map(|(k, l)| (*k, *l)).collect() };
        entries.sort_unstable_by_key(|(_, l)| (l.seq, l.off));
        let target = shared.opts.max_bytes / 4 * 3;
        let mut total = HEADER_LEN as u64 + entries.iter().map(|(_, l)| u64::from(l.len)).sum::<u64>();
        let mut skip = 0;
        let evictable = |l: &Loc| keep_from_seq == 0 || l.seq < keep_from_seq;
        while total > target && skip < entries.len() && evictable(&entries[skip].1) {
            total -= u64::from(entries[skip].1.len);
            skip += 1;
        }
        if !empty {
            shared.counters.evictions.fetch_add(skip as u64, Relaxed);
        }
        let entries = &entries[skip..];
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(tmp)?;
        self.l.fault_hit(Fault::CompactTmpCreated);
        let mut buf = Vec::with_capacity(CHUNK + MAX_RECORD);
        buf.extend_from_slice(&Header::new(view.generation() + 1, now_unix_ns()).encode());
        let half = entries.len() / 2;
        for (i, (k, loc)) in entries.iter().enumerate() {
            if i == half && self.l.fault_due(Fault::CompactMidWrite) {
                f.write_all(&buf)?;
                buf.clear();
                self.l.fault_hit(Fault::CompactMidWrite);
            }
            if view.with_record(k, *loc, |rec, _| buf.extend_from_slice(rec)).is_none() {
                shared.counters.corrupt_records_skipped.fetch_add(1, Relaxed);
            }
            if buf.len() >= CHUNK {
                f.write_all(&buf)?;
                buf.clear();
            }
        }
        f.write_all(&buf)?;
        f.sync_all()?;
        self.l.fault_hit(Fault::CompactAfterFsync);
        drop(f);
        fs::rename(tmp, &shared.path)?;
        if shared.opts.durability == Durability::Full {
            fsync_dir(&shared.dir)?;
        }
        Ok(())
    }
}
