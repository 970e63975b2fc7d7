//! The reader's view of the log: an index of the validated records (key → offset) and the mmap
//! they are read from ([`View`]), and the lock-free read path over it ([`Reader`]: `probe`,
//! `refresh`, `reopen`).
//!
//! Invariants:
//! * Readers never repair. New bytes are read with `pread` into a private buffer and validated
//!   there; an invalid or incomplete tail means "not yet" and is left for the lock holder (see
//!   `append`), never touched by a reader. This is a matter of types: a view holds only a
//!   read-only descriptor, private to this module (no method hands it out), and neither `View`
//!   nor `Reader` has a method that writes, pads or renames a file; the write descriptor and the
//!   file lock belong to the writer (`append`).
//! * The mapping is only sliced below the validated end, and a get copies the record out and
//!   re-validates the copy (magic, length, key, checksum) before returning its value, so a damaged,
//!   shrunk or replaced file gives a miss, never a wrong value. A page lost to a shrink reads as
//!   zeros instead of raising SIGBUS (see `sigbus`).
//! * The view follows one inode (`ident`): a different file at the path (another process
//!   compacted) is a reopen, a shorter one is a rescan from the header.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use super::api::Probe;
use super::format::{
    parse_record, Digest, Header, HeaderError, HEADER_LEN, MAGIC, MAX_RECORD, TYPE_PUT, TYPE_TOMBSTONE,
};
use super::shared::{ForkReset, Shared};
use super::sigbus;
use super::stats::ViewNumbers;
use super::trust::open_trusted;

/// The size of one `pread` when scanning new bytes (and of compaction's write buffer).
pub(super) const CHUNK: usize = 1 << 20;

#[derive(Clone, Copy)]
pub(super) struct Loc {
    pub(super) off: u64,
    pub(super) len: u32,
    pub(super) seq: u64,
}

/// Keys are blake2b digests, already uniform: the table hash folds two of their words with a
/// per-process seed (one multiply) instead of hashing 32 bytes again. A caller who hand-crafts
/// digests to collide only slows down its own process.
#[derive(Clone)]
pub(super) struct DigestHash(u64);

impl Default for DigestHash {
    fn default() -> Self {
        use std::hash::BuildHasher;
        DigestHash(foldhash::fast::RandomState::default().hash_one(0x6a69_746b_6579u64) | 1)
    }
}

impl std::hash::BuildHasher for DigestHash {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(self.0)
    }
}

pub(super) struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        if bytes.len() >= 16 {
            let a = u64::from_le_bytes(bytes[0..8].try_into().expect("8 bytes"));
            let b = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
            let m = u128::from(a ^ self.0) * u128::from(b ^ 0x9E37_79B9_7F4A_7C15);
            self.0 = (m as u64) ^ ((m >> 64) as u64);
        } else {
            for &x in bytes {
                self.0 = (self.0 ^ u64::from(x)).wrapping_mul(0x100_0000_01B3);
            }
        }
    }
    fn write_usize(&mut self, _len: usize) {}
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(super) type KeyDir = HashMap<Digest, Loc, DigestHash>;
pub(super) type Ident = (u64, u64);

/// One inode of the log as this process validated it. Its fields are private: the only changes
/// are indexing more validated bytes (`extend`, `apply_written`) and starting over (`forget_all`).
pub(super) struct View {
    /// Opened read-only, and never handed out of this module.
    file: Arc<File>,
    ident: Ident,
    map: Option<Arc<sigbus::GuardedMap>>,
    /// End of the validated prefix of the file.
    end: u64,
    generation: u64,
    keydir: KeyDir,
    live_bytes: u64,
    max_seq: u64,
}

impl View {
    /// The inode this view follows.
    pub(super) fn ident(&self) -> Ident {
        self.ident
    }

    /// The end of the validated prefix of the file.
    pub(super) fn end(&self) -> u64 {
        self.end
    }

    /// The file's generation (one more per compaction).
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes of the live records.
    pub(super) fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// The highest sequence number indexed.
    pub(super) fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// Where the live record of `key` is.
    pub(super) fn loc(&self, key: &Digest) -> Option<Loc> {
        self.keydir.get(key).copied()
    }

    /// Whether `key` has a live record.
    pub(super) fn contains(&self, key: &Digest) -> bool {
        self.keydir.contains_key(key)
    }

    /// The number of live keys.
    pub(super) fn len(&self) -> usize {
        self.keydir.len()
    }

    /// Every live key and where its record is, in no particular order.
    pub(super) fn locs(&self) -> impl Iterator<Item = (&Digest, &Loc)> {
        self.keydir.iter()
    }

    /// The file's current size, read on the view's own descriptor.
    pub(super) fn file_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// `fdatasync` of the file (what the writer appended through its own descriptor).
    pub(super) fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Copies the record at `loc` out of the mapping, re-validates the copy against `key` and
    /// calls `f(record bytes, value)` on it; `None` if the bytes changed. Validating the copy (not
    /// the mapping) means a foreign writer or a shrinking file can give a miss, never a value that
    /// differs from the one that was checksummed. A page lost to a shrink reads as zeros (see
    /// [`sigbus`]), which fails validation.
    pub(super) fn with_record<R>(
        &self,
        key: &Digest,
        loc: Loc,
        f: impl FnOnce(&[u8], &[u8]) -> R,
    ) -> Option<R> {
        let map = self.map.as_ref()?;
        let (off, len) = (loc.off as usize, loc.len as usize);
        if off + len > self.end as usize || off + len > map.len() {
            return None;
        }
        let src = &map.bytes()[off..off + len];
        let mut small = [0u8; 512];
        let mut big = Vec::new();
        let copy: &mut [u8] = if len <= small.len() {
            &mut small[..len]
        } else {
            big.resize(len, 0);
            &mut big[..]
        };
        copy.copy_from_slice(src);
        match parse_record(copy) {
            Some(r) if r.ty == TYPE_PUT && r.key == key && r.len == len => Some(f(copy, r.value)),
            _ => None,
        }
    }

    fn apply(&mut self, off: u64, ty: u8, seq: u64, key: &Digest, len: usize) {
        self.max_seq = self.max_seq.max(seq);
        match ty {
            TYPE_PUT => {
                if let Some(old) = self.keydir.insert(*key, Loc { off, len: len as u32, seq }) {
                    self.live_bytes -= u64::from(old.len);
                }
                self.live_bytes += len as u64;
            }
            TYPE_TOMBSTONE => {
                if let Some(old) = self.keydir.remove(key) {
                    self.live_bytes -= u64::from(old.len);
                }
            }
            _ => {}
        }
    }

    /// Validates `[self.end, EOF)` with `pread` and indexes what is valid; maps the new end.
    /// Returns the file size it saw.
    pub(super) fn extend(&mut self) -> io::Result<u64> {
        let size = self.file.metadata()?.len();
        if size > self.end {
            let file = Arc::clone(&self.file);
            // Most records are small: reserve for ~one entry per 128 new bytes.
            self.keydir.reserve(((size - self.end) / 128) as usize);
            let from = self.end;
            self.end = scan(&file, from, size, |off, r| self.apply(off, r.ty, r.seq, r.key, r.len))?;
        }
        self.ensure_mapped()?;
        Ok(size)
    }

    /// Drops everything indexed: the next [`extend`](Self::extend) rescans from the header.
    pub(super) fn forget_all(&mut self) {
        self.keydir.clear();
        self.live_bytes = 0;
        self.end = HEADER_LEN as u64;
    }

    /// Indexes records this process just wrote at `at` (== the validated end, under the lock),
    /// without reading them back.
    pub(super) fn apply_written(&mut self, at: u64, buf: &[u8]) -> io::Result<()> {
        debug_assert_eq!(at, self.end);
        let mut pos = 0;
        while let Some(r) = parse_record(&buf[pos..]) {
            let (ty, seq, key, len) = (r.ty, r.seq, *r.key, r.len);
            self.apply(at + pos as u64, ty, seq, &key, len);
            pos += len;
        }
        debug_assert_eq!(pos, buf.len());
        self.end = at + pos as u64;
        self.ensure_mapped()
    }

    fn ensure_mapped(&mut self) -> io::Result<()> {
        if self.map.as_ref().is_some_and(|m| m.len() as u64 >= self.end) {
            return Ok(());
        }
        // Reserve address space past the end so that appends rarely need a new mapping; only
        // bytes below the validated end are ever touched.
        let len = (self.end * 2).max(16 << 20).next_multiple_of(1 << 20);
        self.map = Some(Arc::new(sigbus::GuardedMap::new(&self.file, len as usize)?));
        Ok(())
    }
}

pub(super) fn ident_of(m: &fs::Metadata) -> Ident {
    (m.dev(), m.ino())
}

/// Reads `[from, to)` in chunks and calls `f` for each valid record in order; returns the end of
/// the valid prefix (the first invalid or incomplete record stops the scan).
pub(super) fn scan(file: &File, from: u64, to: u64, mut f: impl FnMut(u64, parsed::Rec)) -> io::Result<u64> {
    let mut pos = from;
    let mut buf = Vec::new();
    while pos < to {
        let want = ((to - pos) as usize).min(CHUNK.max(MAX_RECORD));
        buf.resize(want, 0);
        let got = read_full_at(file, &mut buf, pos)?;
        buf.truncate(got);
        let mut at = 0usize;
        while let Some(r) = parse_record(&buf[at..]) {
            f(pos + at as u64, parsed::Rec { ty: r.ty, seq: r.seq, key: r.key, len: r.len });
            at += r.len;
        }
        let chunk_end = pos + buf.len() as u64;
        pos += at as u64;
        // Stop at an invalid record, or when the chunk reached the end of what was read.
        if chunk_end >= to || got < want || buf.len() - at >= MAX_RECORD {
            break;
        }
    }
    Ok(pos)
}

pub(super) mod parsed {
    pub struct Rec<'a> {
        pub ty: u8,
        pub seq: u64,
        pub key: &'a super::Digest,
        pub len: usize,
    }
}

pub(super) fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Opens a file as an index view: header check, then a validated scan of every record.
pub(super) fn load_view(file: File) -> Result<View, Result<HeaderError, io::Error>> {
    let meta = file.metadata().map_err(Err)?;
    let mut head = [0u8; HEADER_LEN];
    let n = read_full_at(&file, &mut head, 0).map_err(Err)?;
    if n < HEADER_LEN && MAGIC.starts_with(&head[..n.min(MAGIC.len())]) {
        // Empty, or a prefix of our magic: our file cut short (a truncation), never another
        // program's. Damaged: quarantined by a writer, nothing is lost that was still there.
        return Err(Ok(HeaderError::Corrupt));
    }
    let header = Header::decode(&head[..n]).map_err(Ok)?;
    let mut view = View {
        file: Arc::new(file),
        ident: ident_of(&meta),
        map: None,
        end: HEADER_LEN as u64,
        generation: header.generation,
        keydir: KeyDir::default(),
        live_bytes: 0,
        max_seq: 0,
    };
    view.extend().map_err(Err)?;
    Ok(view)
}

/// The read side of an index: the view, and when it last checked the file. Every method is
/// lock-free with respect to the file (no `flock`) and none writes a file (see the module doc).
pub(super) struct Reader {
    view: ForkReset<RwLock<Option<View>>>,
    base: Instant,
    last_check_ns: AtomicU64,
}

impl Reader {
    pub(super) fn new() -> Self {
        Self {
            view: ForkReset::new(RwLock::new(None)),
            base: Instant::now(),
            last_check_ns: AtomicU64::new(0),
        }
    }

    /// The view (`None`: memory mode, or closed).
    pub(super) fn view(&self) -> RwLockReadGuard<'_, Option<View>> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The view, to replace it or index more validated bytes into it.
    pub(super) fn view_mut(&self) -> RwLockWriteGuard<'_, Option<View>> {
        self.view.write().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    /// Records that the view was just checked against the file.
    pub(super) fn touch_check(&self) {
        self.last_check_ns.store(self.now_ns(), Relaxed);
    }

    /// Looks `key` up in the view without any I/O. `final_probe` turns `Refresh` into `Miss` (and
    /// counts it).
    #[inline]
    pub(super) fn probe<R>(
        &self,
        shared: &Shared,
        key: &Digest,
        final_probe: bool,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Probe<R> {
        let counters = &shared.counters;
        let stale = !final_probe
            && self.now_ns().saturating_sub(self.last_check_ns.load(Relaxed))
                > shared.opts.refresh_interval.as_nanos() as u64;
        {
            let guard = self.view();
            if let Some(view) = guard.as_ref() {
                if let Some(&loc) = view.keydir.get(key) {
                    if stale {
                        return Probe::Refresh;
                    }
                    if let Some(r) = view.with_record(key, loc, |_, v| f(v)) {
                        counters.hits.fetch_add(1, Relaxed);
                        return Probe::Hit(r);
                    }
                    counters.corrupt_records_skipped.fetch_add(1, Relaxed);
                }
            } else if !final_probe {
                // Memory mode: nothing to refresh.
                counters.misses.fetch_add(1, Relaxed);
                return Probe::Miss;
            }
        }
        if final_probe {
            counters.misses.fetch_add(1, Relaxed);
            Probe::Miss
        } else {
            Probe::Refresh
        }
    }

    /// Brings the view up to date with the file: new appends, or a new file after another
    /// process compacted. Lock-free; never repairs anything; errors leave the view as is.
    pub(super) fn refresh(&self, shared: &Shared) {
        if shared.is_closed() {
            return;
        }
        self.touch_check();
        let (ident, end, file) = match self.view().as_ref() {
            Some(v) => (v.ident, v.end, Arc::clone(&v.file)),
            None => return,
        };
        shared.counters.refreshes.fetch_add(1, Relaxed);
        let Ok(meta) = fs::metadata(&shared.path) else { return };
        if ident_of(&meta) != ident {
            self.reopen(shared);
            return;
        }
        let Ok(size) = file.metadata().map(|m| m.len()) else { return };
        if size < end {
            // The file shrank under us (a truncation, a copy over it): what we indexed past its
            // end is gone. Start over from the file as it is now.
            shared.counters.shrinks_seen.fetch_add(1, Relaxed);
            if !self.reopen(shared) {
                let mut guard = self.view_mut();
                if let Some(view) = guard.as_mut().filter(|v| v.ident == ident) {
                    view.forget_all();
                }
            }
        } else if size > end {
            let mut guard = self.view_mut();
            if let Some(view) = guard.as_mut() {
                if view.ident == ident {
                    let _ = view.extend();
                }
            }
        }
    }

    /// Replaces the view with the file now at the index's path (if it is a valid index).
    pub(super) fn reopen(&self, shared: &Shared) -> bool {
        let Ok(f) = open_trusted(&shared.path, false, false) else { return false };
        match load_view(f) {
            Ok(v) => {
                *self.view_mut() = Some(v);
                shared.counters.reopens.fetch_add(1, Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// What the view contributes to [`Stats`](super::Stats).
    pub(super) fn numbers(&self) -> ViewNumbers {
        self.view().as_ref().map_or(ViewNumbers::default(), |v| ViewNumbers {
            entries: v.keydir.len() as u64,
            file_bytes: v.end,
            live_bytes: v.live_bytes,
            generation: v.generation,
        })
    }

    /// Replaces the view lock if a vanished thread of the parent held it; `true` when it did (the
    /// view is then gone and the caller reloads it).
    ///
    /// # Safety
    /// The contract of [`DiskIndex::after_fork_in_child`](super::DiskIndex::after_fork_in_child):
    /// a single-threaded child, called from outside every method of this index.
    pub(super) unsafe fn after_fork_in_child(&self) -> bool {
        use std::sync::TryLockError::WouldBlock;
        if matches!(self.view.try_write(), Err(WouldBlock)) {
            // SAFETY: the contract above; the view lock was held by a vanished thread.
            unsafe { self.view.reset(RwLock::new(None)) };
            return true;
        }
        false
    }
}
