//! Compaction, eviction, `clear`, and every other way a new log file comes into being.
//!
//! Invariant: compaction is a rename. The live file's bytes are never rewritten in place: a new
//! file (the live set, oldest entries evicted past the cap, or just a header) is written under a
//! temp name, fsynced, and renamed over the live one, all under the lock; readers that still map
//! the old inode keep reading it, and notice the new one on their next refresh. A damaged file is
//! renamed aside, never deleted. A temp file found while holding the lock is an orphan of a dead
//! compactor and is removed.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use super::append::{WriteFail, Writer};
use super::fault::{self, Fault};
use super::format::{Digest, Header, HeaderError, HEADER_LEN, MAX_RECORD};
use super::index::{log_name, DiskError, DiskIndex, Durability, Mode, WarningKind};
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

impl DiskIndex {
    fn tmp_path(&self) -> PathBuf {
        self.dir.join(format!("{}.tmp.{}.{:x}", log_name(), std::process::id(), now_unix_ns()))
    }

    /// Writes a header-only file under a temp name and renames it into place (under the lock).
    pub(super) fn create_fresh(&self, generation: u64) -> io::Result<()> {
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
            fs::rename(&tmp, &self.path)?;
            if self.opts.durability == Durability::Full {
                fsync_dir(&self.dir)?;
            }
            Ok(())
        })();
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        r
    }

    pub(super) fn create_if_missing(&self, _w: &mut Writer) -> Result<(), WriteFail> {
        match fs::metadata(&self.path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(self.create_fresh(1)?),
            Err(e) => Err(e.into()),
        }
    }

    pub(super) fn quarantine_and_create(&self, _w: &mut Writer) -> Result<(), WriteFail> {
        // Re-check under the lock: another process may already have replaced it.
        if let Ok(f) = open_trusted(&self.path, false, false) {
            if !matches!(load_view(f), Err(Ok(HeaderError::Corrupt))) {
                return Ok(());
            }
            let aside = self.dir.join(format!("{}.corrupt-{}", log_name(), now_unix_ns()));
            fs::rename(&self.path, &aside)?;
            self.warn(
                WarningKind::Corrupt,
                format!(
                    "{} had a damaged header; moved to {} and started fresh",
                    self.path.display(),
                    aside.display()
                ),
            );
        }
        self.create_if_missing(_w)
    }

    pub(super) fn sweep_tmp(&self) {
        let prefix = format!("{}.tmp.", log_name());
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// `keep_from_seq`: records of the batch just written (seq >= it) are never evicted, so a put
    /// that returned is never undone by the compaction it triggered (0: no such batch).
    pub(super) fn maybe_compact(&self, w: &mut Writer, keep_from_seq: u64) -> Result<(), WriteFail> {
        let (size, live) = {
            let g = self.view_ref();
            let v = g.as_ref().ok_or(WriteFail::Closed)?;
            (v.end, v.live_bytes)
        };
        let dead = size.saturating_sub(HEADER_LEN as u64 + live);
        if size > self.opts.max_bytes || (size > COMPACT_MIN_FILE && dead * 2 > size) {
            self.compact_locked(w, false, keep_from_seq)?;
        }
        Ok(())
    }

    /// Rewrites the live set (oldest entries evicted past the cap) to a new file and renames it
    /// over the live one.
    pub fn compact(&self) -> Result<bool, DiskError> {
        self.rewrite(false)
    }

    /// Removes every entry (compaction to an empty file) and forgets memory-only entries.
    pub fn clear(&self) -> Result<bool, DiskError> {
        self.check_open()?;
        let mut ov = self.overlay.write().unwrap_or_else(|p| p.into_inner());
        ov.clear();
        self.overlay_bytes.store(0, Relaxed);
        drop(ov);
        self.rewrite(true)
    }

    fn rewrite(&self, empty: bool) -> Result<bool, DiskError> {
        self.check_open()?;
        if self.mode().0 != Mode::ReadWrite {
            return Ok(false);
        }
        let res = self.locked(|w| {
            self.sync_locked(w)?;
            self.compact_locked(w, empty, 0)
        });
        match res {
            Ok(()) => Ok(true),
            Err(WriteFail::Closed) => Err(DiskError::Closed),
            Err(fail) => {
                self.handle_write_failure(fail);
                Ok(false)
            }
        }
    }

    pub(super) fn compact_locked(
        &self,
        w: &mut Writer,
        empty: bool,
        keep_from_seq: u64,
    ) -> Result<(), WriteFail> {
        self.sweep_tmp();
        let tmp = self.tmp_path();
        let r = self.write_compacted(w, &tmp, empty, keep_from_seq);
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
            return r;
        }
        fault::hit(w, Fault::CompactAfterRename);
        self.counters.compactions.fetch_add(1, Relaxed);
        if !self.reopen_view() {
            return Err(io::Error::other("compacted file did not reopen").into());
        }
        w.wfile = None;
        fault::hit(w, Fault::CompactBeforeUnlock);
        Ok(())
    }

    fn write_compacted(
        &self,
        w: &mut Writer,
        tmp: &Path,
        empty: bool,
        keep_from_seq: u64,
    ) -> Result<(), WriteFail> {
        let g = self.view_ref();
        let view = g.as_ref().ok_or(WriteFail::Closed)?;
        let mut entries: Vec<(Digest, Loc)> =
            if empty { Vec::new() } else { view.keydir.iter().map(|(k, l)| (*k, *l)).collect() };
        entries.sort_unstable_by_key(|(_, l)| (l.seq, l.off));
        let target = self.opts.max_bytes / 4 * 3;
        let mut total = HEADER_LEN as u64 + entries.iter().map(|(_, l)| u64::from(l.len)).sum::<u64>();
        let mut skip = 0;
        let evictable = |l: &Loc| keep_from_seq == 0 || l.seq < keep_from_seq;
        while total > target && skip < entries.len() && evictable(&entries[skip].1) {
            total -= u64::from(entries[skip].1.len);
            skip += 1;
        }
        if !empty {
            self.counters.evictions.fetch_add(skip as u64, Relaxed);
        }
        let entries = &entries[skip..];
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(tmp)?;
        fault::hit(w, Fault::CompactTmpCreated);
        let mut buf = Vec::with_capacity(CHUNK + MAX_RECORD);
        buf.extend_from_slice(&Header::new(view.generation + 1, now_unix_ns()).encode());
        let half = entries.len() / 2;
        for (i, (k, loc)) in entries.iter().enumerate() {
            if i == half && fault::due(w, Fault::CompactMidWrite) {
                f.write_all(&buf)?;
                buf.clear();
                fault::hit(w, Fault::CompactMidWrite);
            }
            if view.with_record(k, *loc, |rec, _| buf.extend_from_slice(rec)).is_none() {
                self.counters.corrupt_records_skipped.fetch_add(1, Relaxed);
            }
            if buf.len() >= CHUNK {
                f.write_all(&buf)?;
                buf.clear();
            }
        }
        f.write_all(&buf)?;
        f.sync_all()?;
        fault::hit(w, Fault::CompactAfterFsync);
        drop(f);
        fs::rename(tmp, &self.path)?;
        if self.opts.durability == Durability::Full {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }
}
