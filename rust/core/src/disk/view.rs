//! The reader's view of the log: an index of the validated records (key → offset), the mmap they
//! are read from, and the lock-free read path (`probe`, `get`, `refresh`, `len`).
//!
//! Invariants:
//! * Readers never repair. New bytes are read with `pread` into a private buffer and validated
//!   there; an invalid or incomplete tail means "not yet" and is left for the lock holder (see
//!   `append`), never touched by a reader.
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
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::format::{
    parse_record, Digest, Header, HeaderError, HEADER_LEN, MAGIC, MAX_RECORD, TYPE_PUT, TYPE_TOMBSTONE,
};
use super::index::{DiskError, DiskIndex, Probe};
use super::sigbus;
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

pub(super) struct View {
    pub(super) file: Arc<File>,
    pub(super) ident: Ident,
    pub(super) map: Option<Arc<sigbus::GuardedMap>>,
    /// End of the validated prefix of the file.
    pub(super) end: u64,
    pub(super) generation: u64,
    pub(super) keydir: KeyDir,
    pub(super) live_bytes: u64,
    pub(super) max_seq: u64,
}

impl View {
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
    fn forget_all(&mut self) {
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

impl DiskIndex {
    /// Looks `key` up without any I/O. `final_probe` turns `Refresh` into `Miss` (and counts it).
    pub fn probe<R>(
        &self,
        key: &Digest,
        final_probe: bool,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Probe<R>, DiskError> {
        self.check_open()?;
        if self.overlay_used.load(Relaxed) {
            let ov = self.overlay.read().unwrap_or_else(|p| p.into_inner());
            match ov.get(key) {
                Some(Some(v)) => {
                    self.counters.hits.fetch_add(1, Relaxed);
                    return Ok(Probe::Hit(f(v)));
                }
                Some(None) => {
                    self.counters.misses.fetch_add(1, Relaxed);
                    return Ok(Probe::Miss);
                }
                None => {}
            }
        }
        let stale = !final_probe
            && self.now_ns().saturating_sub(self.last_check_ns.load(Relaxed))
                > self.opts.refresh_interval.as_nanos() as u64;
        {
            let guard = self.view_ref();
            if let Some(view) = guard.as_ref() {
                if let Some(&loc) = view.keydir.get(key) {
                    if stale {
                        return Ok(Probe::Refresh);
                    }
                    if let Some(r) = view.with_record(key, loc, |_, v| f(v)) {
                        self.counters.hits.fetch_add(1, Relaxed);
                        return Ok(Probe::Hit(r));
                    }
                    self.counters.corrupt_records_skipped.fetch_add(1, Relaxed);
                }
            } else if !final_probe {
                // Memory mode: nothing to refresh.
                self.counters.misses.fetch_add(1, Relaxed);
                return Ok(Probe::Miss);
            }
        }
        if final_probe {
            self.counters.misses.fetch_add(1, Relaxed);
            Ok(Probe::Miss)
        } else {
            Ok(Probe::Refresh)
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
        if self.closed.load(Relaxed) {
            return;
        }
        self.touch_check();
        let (ident, end, file) = match self.view_ref().as_ref() {
            Some(v) => (v.ident, v.end, Arc::clone(&v.file)),
            None => return,
        };
        self.counters.refreshes.fetch_add(1, Relaxed);
        let Ok(meta) = fs::metadata(&self.path) else { return };
        if ident_of(&meta) != ident {
            self.reopen_view();
            return;
        }
        let Ok(size) = file.metadata().map(|m| m.len()) else { return };
        if size < end {
            // The file shrank under us (a truncation, a copy over it): what we indexed past its
            // end is gone. Start over from the file as it is now.
            self.counters.shrinks_seen.fetch_add(1, Relaxed);
            if !self.reopen_view() {
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

    /// Replaces the view with the file now at `path` (if it is a valid index).
    pub(super) fn reopen_view(&self) -> bool {
        let Ok(f) = open_trusted(&self.path, false, false) else { return false };
        match load_view(f) {
            Ok(v) => {
                *self.view_mut() = Some(v);
                self.counters.reopens.fetch_add(1, Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether `key` has a value (a [`get`](Self::get) that drops the value).
    pub fn contains(&self, key: &Digest) -> Result<bool, DiskError> {
        Ok(self.get(key)?.is_some())
    }

    /// The number of live keys this process sees (file plus memory-only entries).
    pub fn len(&self) -> Result<usize, DiskError> {
        self.check_open()?;
        let guard = self.view_ref();
        let base = guard.as_ref().map_or(0, |v| v.keydir.len());
        if !self.overlay_used.load(Relaxed) {
            return Ok(base);
        }
        let ov = self.overlay.read().unwrap_or_else(|p| p.into_inner());
        let mut n = base as isize;
        for (k, v) in ov.iter() {
            let on_disk = guard.as_ref().is_some_and(|view| view.keydir.contains_key(k));
            match (v.is_some(), on_disk) {
                (true, false) => n += 1,
                (false, true) => n -= 1,
                _ => {}
            }
        }
        Ok(n.max(0) as usize)
    }

    /// Whether [`len`](Self::len) is 0.
    pub fn is_empty(&self) -> Result<bool, DiskError> {
        Ok(self.len()? == 0)
    }
}
