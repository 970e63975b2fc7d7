//! [`DiskIndex`]: many processes append to one log under `flock`; every process reads it
//! lock-free through an mmap, accepting only records that validated.
//!
//! Invariants the code relies on:
//! * The live file `index.v1.jki` only grows. Bytes below a process's validated end never change
//!   for the life of an inode: writers append at the valid end under the lock, and the only bytes
//!   ever overwritten are an invalid (torn) tail beyond every process's validated end, which the
//!   lock holder covers with PAD records. Compaction writes a new inode and renames it over.
//! * New bytes are read with `pread` into a private buffer and validated there; the mmap is only
//!   sliced below the validated end, and a get re-validates the record (magic, length, key,
//!   checksum) before returning its value, so a damaged or replaced file gives a miss, never a
//!   wrong value.
//! * Readers never repair: an invalid tail means "not yet". Only the lock holder pads.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memmap2::{Mmap, MmapOptions};
use rustix::fs::{flock, FlockOperation};

use super::format::{
    encode_pads, encode_record, pad_len_for, parse_record, record_len, Digest, Header, HeaderError,
    FORMAT_MAJOR, HEADER_LEN, MAX_RECORD, MAX_VALUE, TYPE_PUT, TYPE_TOMBSTONE,
};

const LOCK_NAME: &str = "index.lock";
const CHUNK: usize = 1 << 20;
/// Compact when dead bytes exceed half of a file larger than this.
const COMPACT_MIN_FILE: u64 = 8 << 20;

fn log_name() -> String {
    format!("index.v{FORMAT_MAJOR}.jki")
}

/// Durability of appends (R11). Compaction always fsyncs its temp file before the rename.
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
    ReadWrite,
    ReadOnly,
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
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadWrite => "rw",
            Mode::ReadOnly => "ro",
            Mode::Memory => "memory",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// Soft cap on the file size: compaction evicts the oldest entries down to 3/4 of it.
    pub max_bytes: u64,
    pub durability: Durability,
    pub access: Access,
    /// How long an append waits for the file lock before it keeps the batch in memory.
    pub lock_timeout: Duration,
    /// How often a hit checks whether another process appended or compacted.
    pub refresh_interval: Duration,
    /// How long disk writes stay off after ENOSPC / EDQUOT / EFBIG.
    pub disable_for: Duration,
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
        }
    }
}

/// Test-only crash points (T2, T3): when armed, the process SIGKILLs itself at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Write the first half of an append batch, then die (a torn record).
    SplitWrite,
    CompactTmpCreated,
    CompactMidWrite,
    CompactAfterFsync,
    CompactAfterRename,
    CompactBeforeUnlock,
}

impl Fault {
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "split_write" => Fault::SplitWrite,
            "compact_tmp_created" => Fault::CompactTmpCreated,
            "compact_mid_write" => Fault::CompactMidWrite,
            "compact_after_fsync" => Fault::CompactAfterFsync,
            "compact_after_rename" => Fault::CompactAfterRename,
            "compact_before_unlock" => Fault::CompactBeforeUnlock,
            _ => return None,
        })
    }
}

/// Kinds of environment trouble; each is reported once per index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    Mode = 0,
    WriteFailed = 1,
    LockTimeout = 2,
    Corrupt = 3,
}

/// What a put did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PutOutcome {
    pub written: usize,
    pub deduped: usize,
    /// Kept in this process's memory because the file could not take them.
    pub memory_only: usize,
}

/// A snapshot of the counters (R12).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub appends: u64,
    pub dedup_skips: u64,
    pub torn_tails_padded: u64,
    pub invalid_bytes_padded: u64,
    pub corrupt_records_skipped: u64,
    pub compactions: u64,
    pub evictions: u64,
    pub lock_acquisitions: u64,
    pub lock_timeouts: u64,
    /// Upper bounds of power-of-two microsecond buckets.
    pub lock_wait_us_p50: u64,
    pub lock_wait_us_p99: u64,
    pub write_errors: u64,
    pub memory_only_puts: u64,
    pub refreshes: u64,
    pub reopens: u64,
    pub entries: u64,
    pub file_bytes: u64,
    pub live_bytes: u64,
    pub generation: u64,
}

/// Why an operation could not run at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexError {
    Closed,
    ValueTooLarge { index: usize, len: usize },
}

/// The result of a lookup that does no I/O.
#[derive(Debug)]
pub enum Probe<R> {
    Hit(R),
    Miss,
    /// Call [`DiskIndex::refresh`] (I/O) and probe again with `final_probe`.
    Refresh,
}

#[derive(Clone, Copy)]
struct Loc {
    off: u64,
    len: u32,
    seq: u64,
}

/// Keys are blake2b digests, already uniform: the table hash folds two of their words with a
/// per-process seed (one multiply) instead of hashing 32 bytes again. A caller who hand-crafts
/// digests to collide only slows down its own process.
#[derive(Clone)]
struct DigestHash(u64);

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

struct DigestHasher(u64);

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

type KeyDir = HashMap<Digest, Loc, DigestHash>;
type Ident = (u64, u64);

struct View {
    file: Arc<File>,
    ident: Ident,
    map: Option<Arc<Mmap>>,
    /// End of the validated prefix of the file.
    end: u64,
    generation: u64,
    keydir: KeyDir,
    live_bytes: u64,
    max_seq: u64,
}

impl View {
    /// The validated record at `loc`, re-checked against `key`; `None` if the bytes changed.
    fn value_at(&self, key: &Digest, loc: Loc) -> Option<&[u8]> {
        let map = self.map.as_ref()?;
        let (off, len) = (loc.off as usize, loc.len as usize);
        if off + len > self.end as usize || off + len > map.len() {
            return None;
        }
        match parse_record(&map[off..off + len]) {
            Some(r) if r.ty == TYPE_PUT && r.key == key && r.len == len => Some(r.value),
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
    fn extend(&mut self) -> io::Result<u64> {
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

    /// Indexes records this process just wrote at `at` (== the validated end, under the lock),
    /// without reading them back.
    fn apply_written(&mut self, at: u64, buf: &[u8]) -> io::Result<()> {
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
        // bytes below the validated end (<= the file size, which never shrinks) are ever touched.
        let len = (self.end * 2).max(16 << 20).next_multiple_of(1 << 20);
        // SAFETY: the mapping is read-only; we only read below the validated end, bytes there
        // are never rewritten for the life of the inode (module invariants), and every value is
        // re-validated before use, so a foreign writer can cause a miss but not a wrong value.
        let map = unsafe { MmapOptions::new().len(len as usize).map(&*self.file)? };
        self.map = Some(Arc::new(map));
        Ok(())
    }
}

fn ident_of(m: &fs::Metadata) -> Ident {
    (m.dev(), m.ino())
}

/// Reads `[from, to)` in chunks and calls `f` for each valid record in order; returns the end of
/// the valid prefix (the first invalid or incomplete record stops the scan).
fn scan(file: &File, from: u64, to: u64, mut f: impl FnMut(u64, parsed::Rec)) -> io::Result<u64> {
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

mod parsed {
    pub struct Rec<'a> {
        pub ty: u8,
        pub seq: u64,
        pub key: &'a super::Digest,
        pub len: usize,
    }
}

fn read_full_at(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
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
fn load_view(file: File) -> Result<View, Result<HeaderError, io::Error>> {
    let meta = file.metadata().map_err(Err)?;
    let mut head = [0u8; HEADER_LEN];
    let n = read_full_at(&file, &mut head, 0).map_err(Err)?;
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

fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
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

/// `$JITKEY_CACHE_DIR`, else `$XDG_CACHE_HOME/jitkey`, else `~/.cache/jitkey`.
pub fn default_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("JITKEY_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|p| p.join("jitkey")))
        .or_else(|| var("HOME").map(|p| p.join(".cache").join("jitkey")))
}

/// Filesystems where flock/mmap coherence between hosts cannot be trusted (R10).
#[cfg(target_os = "linux")]
fn network_fs(dir: &Path) -> Option<&'static str> {
    let t = rustix::fs::statfs(dir).ok()?.f_type as i64 & 0xffff_ffff;
    Some(match t {
        0x6969 => "NFS",
        0xFF53_4D42 => "CIFS",
        0xFE53_4D42 => "SMB2",
        0x517B => "SMB",
        0x6573_5546 => "FUSE",
        0x0BD0_0BD0 => "Lustre",
        0x4750_4653 => "GPFS",
        0x0102_1997 => "9p",
        0x00C3_6400 => "Ceph",
        _ => return None,
    })
}

#[cfg(not(target_os = "linux"))]
fn network_fs(_dir: &Path) -> Option<&'static str> {
    None
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    appends: AtomicU64,
    dedup_skips: AtomicU64,
    torn_tails_padded: AtomicU64,
    invalid_bytes_padded: AtomicU64,
    corrupt_records_skipped: AtomicU64,
    compactions: AtomicU64,
    evictions: AtomicU64,
    lock_acquisitions: AtomicU64,
    lock_timeouts: AtomicU64,
    write_errors: AtomicU64,
    memory_only_puts: AtomicU64,
    refreshes: AtomicU64,
    reopens: AtomicU64,
    /// Power-of-two microsecond buckets of the time spent waiting for the file lock.
    lock_wait: [AtomicU64; 32],
}

impl Counters {
    fn percentile(&self, q: f64) -> u64 {
        let counts: Vec<u64> = self.lock_wait.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let want = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return 1u64 << i;
            }
        }
        1u64 << 31
    }
}

struct Writer {
    pid: u32,
    lock: Option<File>,
    /// A read-write fd on the inode of the current view, for `pwrite`.
    wfile: Option<(File, Ident)>,
    disabled_until: Option<Instant>,
    swept: bool,
    fault: Option<(Fault, u32)>,
}

enum WriteFail {
    Timeout,
    Io(io::Error),
}

impl From<io::Error> for WriteFail {
    fn from(e: io::Error) -> Self {
        WriteFail::Io(e)
    }
}

type Overlay = HashMap<Digest, Option<Arc<[u8]>>, DigestHash>;

/// An append-only, crash-safe key → bytes index in one directory, shared by processes.
///
/// Never fails to open: an unusable environment gives [`Mode::ReadOnly`] or [`Mode::Memory`]
/// with a reason and one warning (see [`DiskIndex::take_warnings`]).
pub struct DiskIndex {
    dir: PathBuf,
    path: PathBuf,
    lock_path: PathBuf,
    opts: Options,
    view: RwLock<Option<View>>,
    writer: Mutex<Writer>,
    overlay: RwLock<Overlay>,
    overlay_used: AtomicBool,
    overlay_bytes: AtomicU64,
    mode: RwLock<(Mode, String)>,
    counters: Counters,
    warned: AtomicU8,
    pending: AtomicBool,
    warnings: Mutex<Vec<String>>,
    closed: AtomicBool,
    base: Instant,
    last_check_ns: AtomicU64,
}

impl DiskIndex {
    /// Opens (creating if needed) the index in `dir`.
    pub fn open(dir: &Path, opts: Options) -> Self {
        let idx = Self {
            dir: dir.to_path_buf(),
            path: dir.join(log_name()),
            lock_path: dir.join(LOCK_NAME),
            opts,
            view: RwLock::new(None),
            writer: Mutex::new(Writer {
                pid: std::process::id(),
                lock: None,
                wfile: None,
                disabled_until: None,
                swept: false,
                fault: None,
            }),
            overlay: RwLock::new(Overlay::default()),
            overlay_used: AtomicBool::new(false),
            overlay_bytes: AtomicU64::new(0),
            mode: RwLock::new((Mode::Memory, String::new())),
            counters: Counters::default(),
            warned: AtomicU8::new(0),
            pending: AtomicBool::new(false),
            warnings: Mutex::new(Vec::new()),
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

    fn open_inner(&self) -> Result<(Mode, String), String> {
        if self.opts.access == Access::Memory {
            return Err("disk index disabled (access=memory, e.g. JITKEY_DISK_CACHE=0)".into());
        }
        let dir = &self.dir;
        if let Err(e) = fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            return Err(format!("cannot create {}: {e}", dir.display()));
        }
        let meta = fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
        let euid = rustix::process::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(format!(
                "{} is owned by uid {}, not by this user (uid {euid}); not trusting its contents",
                dir.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
            return Err(format!(
                "{} is group- or world-writable (mode {:o}) without the sticky bit; not trusting its contents",
                dir.display(),
                meta.mode() & 0o7777
            ));
        }
        let mut rw = self.opts.access == Access::ReadWrite;
        let mut ro_reason = if rw { String::new() } else { "read-only requested".to_owned() };
        if let Some(fs_name) = network_fs(dir).filter(|_| rw) {
            rw = false;
            ro_reason = format!(
                "{} is on a network filesystem ({fs_name}); flock/mmap are not coherent there",
                dir.display()
            );
        }
        if rw {
            let mut w = self.writer();
            if let Err(e) = self.open_lock(&mut w) {
                rw = false;
                ro_reason = format!("cannot open {} for writing: {e}", self.lock_path.display());
            }
        }
        for _ in 0..4 {
            match File::open(&self.path) {
                Ok(f) => match load_view(f) {
                    Ok(view) => {
                        if rw {
                            if let Err(e) = OpenOptions::new().read(true).write(true).open(&self.path) {
                                rw = false;
                                ro_reason = format!("cannot open {} for writing: {e}", self.path.display());
                            }
                        }
                        *self.view_mut() = Some(view);
                        self.touch_check();
                        return Ok(if rw {
                            (Mode::ReadWrite, String::new())
                        } else {
                            (Mode::ReadOnly, ro_reason)
                        });
                    }
                    Err(Ok(HeaderError::Foreign)) => {
                        return Err(format!("{} is not a jitkey index; left untouched", self.path.display()))
                    }
                    Err(Ok(HeaderError::UnknownMajor(m))) => {
                        return Err(format!(
                            "{} has format major {m}, this jitkey reads {FORMAT_MAJOR}; left untouched",
                            self.path.display()
                        ))
                    }
                    Err(Ok(HeaderError::Corrupt)) if rw => {
                        self.locked(|w| self.quarantine_and_create(w)).map_err(|e| self.fail_reason(e))?;
                    }
                    Err(Ok(HeaderError::Corrupt)) => {
                        return Err(format!("{} has a damaged header and {ro_reason}", self.path.display()))
                    }
                    Err(Err(e)) => return Err(format!("cannot read {}: {e}", self.path.display())),
                },
                Err(e) if e.kind() == io::ErrorKind::NotFound && rw => {
                    self.locked(|w| self.create_if_missing(w)).map_err(|e| self.fail_reason(e))?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(format!("no index at {} and {ro_reason}", self.path.display()))
                }
                Err(e) => return Err(format!("cannot open {}: {e}", self.path.display())),
            }
        }
        Err(format!("{} keeps changing under us", self.path.display()))
    }

    fn fail_reason(&self, e: WriteFail) -> String {
        match e {
            WriteFail::Timeout => format!("timed out waiting for {}", self.lock_path.display()),
            WriteFail::Io(e) => format!("cannot create {}: {e}", self.path.display()),
        }
    }

    // ----- small helpers -----

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn view_mut(&self) -> std::sync::RwLockWriteGuard<'_, Option<View>> {
        self.view.write().unwrap_or_else(|p| p.into_inner())
    }

    fn view_ref(&self) -> std::sync::RwLockReadGuard<'_, Option<View>> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn touch_check(&self) {
        self.last_check_ns.store(self.now_ns(), Relaxed);
    }

    fn set_mode(&self, mode: Mode, reason: String) {
        if mode != Mode::ReadWrite {
            self.warn(
                WarningKind::Mode,
                format!("jitkey DiskIndex at {} runs {}: {reason}", self.dir.display(), mode.as_str()),
            );
        }
        *self.mode.write().unwrap_or_else(|p| p.into_inner()) = (mode, reason);
    }

    fn warn(&self, kind: WarningKind, msg: String) {
        let bit = 1u8 << (kind as u8);
        if self.warned.fetch_or(bit, Relaxed) & bit == 0 {
            self.warnings.lock().unwrap_or_else(|p| p.into_inner()).push(msg);
            self.pending.store(true, Relaxed);
        }
    }

    fn check_open(&self) -> Result<(), IndexError> {
        if self.closed.load(Relaxed) {
            Err(IndexError::Closed)
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

    pub fn mode(&self) -> (Mode, String) {
        self.mode.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Arms a test-only crash point: the `after`-th time (0 = next) the process reaches
    /// `fault`, it SIGKILLs itself. Private API for the crash tests (T2, T3).
    pub fn arm_fault(&self, fault: Fault, after: u32) {
        self.writer().fault = Some((fault, after));
    }

    fn hit_fault(w: &mut Writer, at: Fault) {
        if let Some((f, n)) = w.fault {
            if f == at {
                if n == 0 {
                    let _ = rustix::process::kill_process(
                        rustix::process::getpid(),
                        rustix::process::Signal::KILL,
                    );
                    // SIGKILL cannot be caught; if kill failed, abort is the next best crash.
                    std::process::abort();
                }
                w.fault = Some((f, n - 1));
            }
        }
    }

    // ----- reads -----

    /// Looks `key` up without any I/O. `final_probe` turns `Refresh` into `Miss` (and counts it).
    pub fn probe<R>(
        &self,
        key: &Digest,
        final_probe: bool,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<Probe<R>, IndexError> {
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
                    if let Some(v) = view.value_at(key, loc) {
                        self.counters.hits.fetch_add(1, Relaxed);
                        return Ok(Probe::Hit(f(v)));
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
    pub fn get(&self, key: &Digest) -> Result<Option<Vec<u8>>, IndexError> {
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
        if file.metadata().is_ok_and(|m| m.len() > end) {
            let mut guard = self.view_mut();
            if let Some(view) = guard.as_mut() {
                if view.ident == ident {
                    let _ = view.extend();
                }
            }
        }
    }

    /// Replaces the view with the file now at `path` (if it is a valid index).
    fn reopen_view(&self) -> bool {
        let Ok(f) = File::open(&self.path) else { return false };
        match load_view(f) {
            Ok(v) => {
                *self.view_mut() = Some(v);
                self.counters.reopens.fetch_add(1, Relaxed);
                true
            }
            Err(_) => false,
        }
    }

    pub fn contains(&self, key: &Digest) -> Result<bool, IndexError> {
        Ok(self.get(key)?.is_some())
    }

    /// The number of live keys this process sees (file plus memory-only entries).
    pub fn len(&self) -> Result<usize, IndexError> {
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

    pub fn is_empty(&self) -> Result<bool, IndexError> {
        Ok(self.len()? == 0)
    }

    // ----- writes -----

    fn open_lock(&self, w: &mut Writer) -> io::Result<()> {
        let pid = std::process::id();
        if w.pid != pid {
            // Forked child: the inherited fd shares the parent's open file description, so its
            // flock is the parent's lock. Take our own description (closing ours leaves theirs).
            w.pid = pid;
            w.lock = None;
            w.wfile = None;
        }
        if w.lock.is_none() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&self.lock_path)?;
            w.lock = Some(f);
        }
        Ok(())
    }

    /// Runs `f` holding the in-process writer mutex and the exclusive file lock.
    fn locked<R>(&self, f: impl FnOnce(&mut Writer) -> Result<R, WriteFail>) -> Result<R, WriteFail> {
        let mut w = self.writer();
        self.open_lock(&mut w)?;
        let start = Instant::now();
        let mut backoff = Duration::from_micros(20);
        {
            let lock = w.lock.as_ref().expect("lock file open");
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

    fn tmp_path(&self) -> PathBuf {
        self.dir.join(format!("{}.tmp.{}.{:x}", log_name(), std::process::id(), now_unix_ns()))
    }

    /// Writes a header-only file under a temp name and renames it into place (under the lock).
    fn create_fresh(&self, generation: u64) -> io::Result<()> {
        let tmp = self.tmp_path();
        let r = (|| {
            let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
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

    fn create_if_missing(&self, _w: &mut Writer) -> Result<(), WriteFail> {
        match fs::metadata(&self.path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(self.create_fresh(1)?),
            Err(e) => Err(e.into()),
        }
    }

    fn quarantine_and_create(&self, _w: &mut Writer) -> Result<(), WriteFail> {
        // Re-check under the lock: another process may already have replaced it.
        if let Ok(f) = File::open(&self.path) {
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

    fn sweep_tmp(&self) {
        let prefix = format!("{}.tmp.", log_name());
        if let Ok(rd) = fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// Under the lock: make the view match the live file exactly, pad a torn tail, and open a
    /// write fd on the same inode.
    fn sync_locked(&self, w: &mut Writer) -> Result<(), WriteFail> {
        if !w.swept {
            // Holding the lock proves any temp file is an orphan of a dead compactor.
            self.sweep_tmp();
            w.swept = true;
        }
        for _ in 0..4 {
            let meta = match fs::metadata(&self.path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.create_fresh(1)?;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let cur = ident_of(&meta);
            let same = self.view_ref().as_ref().is_some_and(|v| v.ident == cur);
            let mut size = None;
            if !same {
                match File::open(&self.path).map_err(Err).and_then(load_view) {
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
            } else {
                let mut g = self.view_mut();
                size = Some(g.as_mut().expect("view present").extend()?);
            }
            let (ident, end, size) = {
                let g = self.view_ref();
                let v = g.as_ref().expect("view present");
                let size = match size {
                    Some(s) => s,
                    None => v.file.metadata()?.len(),
                };
                (v.ident, v.end, size)
            };
            if w.wfile.as_ref().is_none_or(|(_, id)| *id != ident) {
                let f = OpenOptions::new().read(true).write(true).open(&self.path)?;
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
                w.wfile.as_ref().expect("wfile").0.write_all_at(&pads, end)?;
                self.counters.torn_tails_padded.fetch_add(1, Relaxed);
                self.counters.invalid_bytes_padded.fetch_add(gap as u64, Relaxed);
                let mut g = self.view_mut();
                g.as_mut().expect("view present").extend()?;
            }
            return Ok(());
        }
        Err(io::Error::other("index file keeps changing under the lock").into())
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

    /// Stores `value` under `key`.
    pub fn put(&self, key: &Digest, value: &[u8]) -> Result<PutOutcome, IndexError> {
        self.put_many(&[(*key, value)])
    }

    /// Stores a batch with one lock acquisition and one write. Values over [`MAX_VALUE`] are
    /// refused before anything is written. Environment failures keep the batch in memory.
    pub fn put_many(&self, items: &[(Digest, &[u8])]) -> Result<PutOutcome, IndexError> {
        self.check_open()?;
        if let Some((index, (_, v))) = items.iter().enumerate().find(|(_, (_, v))| v.len() > MAX_VALUE) {
            return Err(IndexError::ValueTooLarge { index, len: v.len() });
        }
        let ops: Vec<(Digest, Option<&[u8]>)> = items.iter().map(|(k, v)| (*k, Some(*v))).collect();
        Ok(self.write_ops(&ops))
    }

    /// Removes `key` (a tombstone record). Returns whether it was present.
    pub fn delete(&self, key: &Digest) -> Result<bool, IndexError> {
        let present = self.contains(key)?;
        if present {
            self.write_ops(&[(*key, None)]);
        }
        Ok(present)
    }

    fn write_ops(&self, ops: &[(Digest, Option<&[u8]>)]) -> PutOutcome {
        let mut out = PutOutcome::default();
        if ops.is_empty() {
            return out;
        }
        let to_memory = |out: &mut PutOutcome| {
            for (k, v) in ops {
                self.memory_put(k, *v);
            }
            out.memory_only = ops.len();
        };
        if self.mode().0 != Mode::ReadWrite {
            to_memory(&mut out);
            return out;
        }
        {
            let mut w = self.writer();
            if let Some(until) = w.disabled_until {
                if Instant::now() < until {
                    drop(w);
                    to_memory(&mut out);
                    return out;
                }
                w.disabled_until = None;
            }
        }
        let res = self.locked(|w| {
            self.sync_locked(w)?;
            let mut buf = Vec::new();
            let at;
            {
                let g = self.view_ref();
                let view = g.as_ref().expect("view present");
                at = view.end;
                let mut seq = view.max_seq;
                for (k, v) in ops {
                    let existing = view.keydir.get(k).and_then(|&loc| view.value_at(k, loc));
                    match (v, existing) {
                        (Some(v), Some(e)) if *v == e => {
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
            if !buf.is_empty() {
                let file = &w.wfile.as_ref().expect("wfile").0;
                if matches!(w.fault, Some((Fault::SplitWrite, 0))) {
                    // Not a multiple of 8, so the cut always lands inside a record.
                    let half = buf.len() / 2 + 4;
                    file.write_all_at(&buf[..half], at)?;
                }
                Self::hit_fault(w, Fault::SplitWrite);
                let file = &w.wfile.as_ref().expect("wfile").0;
                file.write_all_at(&buf, at)?;
                if self.opts.durability == Durability::Full {
                    file.sync_data()?;
                }
                self.view_mut().as_mut().expect("view present").apply_written(at, &buf)?;
                self.counters.appends.fetch_add(out.written as u64, Relaxed);
            }
            self.counters.dedup_skips.fetch_add(out.deduped as u64, Relaxed);
            self.forget_overlay(ops.iter().map(|(k, _)| *k));
            self.maybe_compact(w)?;
            Ok(())
        });
        match res {
            Ok(()) => out,
            Err(fail) => {
                self.handle_write_failure(fail);
                out = PutOutcome::default();
                to_memory(&mut out);
                out
            }
        }
    }

    fn handle_write_failure(&self, fail: WriteFail) {
        match fail {
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

    fn maybe_compact(&self, w: &mut Writer) -> Result<(), WriteFail> {
        let (size, live) = {
            let g = self.view_ref();
            let v = g.as_ref().expect("view present");
            (v.end, v.live_bytes)
        };
        let dead = size.saturating_sub(HEADER_LEN as u64 + live);
        if size > self.opts.max_bytes || (size > COMPACT_MIN_FILE && dead * 2 > size) {
            self.compact_locked(w, false)?;
        }
        Ok(())
    }

    /// Rewrites the live set (oldest entries evicted past the cap) to a new file and renames it
    /// over the live one.
    pub fn compact(&self) -> Result<bool, IndexError> {
        self.rewrite(false)
    }

    /// Removes every entry (compaction to an empty file) and forgets memory-only entries.
    pub fn clear(&self) -> Result<bool, IndexError> {
        self.check_open()?;
        let mut ov = self.overlay.write().unwrap_or_else(|p| p.into_inner());
        ov.clear();
        self.overlay_bytes.store(0, Relaxed);
        drop(ov);
        self.rewrite(true)
    }

    fn rewrite(&self, empty: bool) -> Result<bool, IndexError> {
        self.check_open()?;
        if self.mode().0 != Mode::ReadWrite {
            return Ok(false);
        }
        let res = self.locked(|w| {
            self.sync_locked(w)?;
            self.compact_locked(w, empty)
        });
        match res {
            Ok(()) => Ok(true),
            Err(fail) => {
                self.handle_write_failure(fail);
                Ok(false)
            }
        }
    }

    fn compact_locked(&self, w: &mut Writer, empty: bool) -> Result<(), WriteFail> {
        self.sweep_tmp();
        let tmp = self.tmp_path();
        let r = self.write_compacted(w, &tmp, empty);
        if r.is_err() {
            let _ = fs::remove_file(&tmp);
            return r;
        }
        Self::hit_fault(w, Fault::CompactAfterRename);
        self.counters.compactions.fetch_add(1, Relaxed);
        if !self.reopen_view() {
            return Err(io::Error::other("compacted file did not reopen").into());
        }
        w.wfile = None;
        Self::hit_fault(w, Fault::CompactBeforeUnlock);
        Ok(())
    }

    fn write_compacted(&self, w: &mut Writer, tmp: &Path, empty: bool) -> Result<(), WriteFail> {
        let g = self.view_ref();
        let view = g.as_ref().expect("view present");
        let mut entries: Vec<(Digest, Loc)> =
            if empty { Vec::new() } else { view.keydir.iter().map(|(k, l)| (*k, *l)).collect() };
        entries.sort_unstable_by_key(|(_, l)| (l.seq, l.off));
        let target = self.opts.max_bytes / 4 * 3;
        let mut total = HEADER_LEN as u64 + entries.iter().map(|(_, l)| u64::from(l.len)).sum::<u64>();
        let mut skip = 0;
        while total > target && skip < entries.len() {
            total -= u64::from(entries[skip].1.len);
            skip += 1;
        }
        if !empty {
            self.counters.evictions.fetch_add(skip as u64, Relaxed);
        }
        let entries = &entries[skip..];
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).open(tmp)?;
        Self::hit_fault(w, Fault::CompactTmpCreated);
        let mut buf = Vec::with_capacity(CHUNK + MAX_RECORD);
        buf.extend_from_slice(&Header::new(view.generation + 1, now_unix_ns()).encode());
        let half = entries.len() / 2;
        for (i, (k, loc)) in entries.iter().enumerate() {
            if i == half && matches!(w.fault, Some((Fault::CompactMidWrite, 0))) {
                f.write_all(&buf)?;
                buf.clear();
                Self::hit_fault(w, Fault::CompactMidWrite);
            }
            match view
                .map
                .as_ref()
                .and_then(|m| m.get(loc.off as usize..(loc.off + u64::from(loc.len)) as usize))
            {
                Some(rec) if view.value_at(k, *loc).is_some() => buf.extend_from_slice(rec),
                _ => {
                    self.counters.corrupt_records_skipped.fetch_add(1, Relaxed);
                }
            }
            if buf.len() >= CHUNK {
                f.write_all(&buf)?;
                buf.clear();
            }
        }
        f.write_all(&buf)?;
        f.sync_all()?;
        Self::hit_fault(w, Fault::CompactAfterFsync);
        drop(f);
        fs::rename(tmp, &self.path)?;
        if self.opts.durability == Durability::Full {
            fsync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Flushes appended data to stable storage (`fdatasync`), whatever the durability mode.
    pub fn sync(&self) -> Result<(), IndexError> {
        self.check_open()?;
        if let Some(v) = self.view_ref().as_ref() {
            let _ = v.file.sync_data();
        }
        Ok(())
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let (entries, file_bytes, live_bytes, generation) = self
            .view_ref()
            .as_ref()
            .map_or((0, 0, 0, 0), |v| (v.keydir.len() as u64, v.end, v.live_bytes, v.generation));
        Stats {
            hits: c.hits.load(Relaxed),
            misses: c.misses.load(Relaxed),
            appends: c.appends.load(Relaxed),
            dedup_skips: c.dedup_skips.load(Relaxed),
            torn_tails_padded: c.torn_tails_padded.load(Relaxed),
            invalid_bytes_padded: c.invalid_bytes_padded.load(Relaxed),
            corrupt_records_skipped: c.corrupt_records_skipped.load(Relaxed),
            compactions: c.compactions.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            lock_acquisitions: c.lock_acquisitions.load(Relaxed),
            lock_timeouts: c.lock_timeouts.load(Relaxed),
            lock_wait_us_p50: c.percentile(0.5),
            lock_wait_us_p99: c.percentile(0.99),
            write_errors: c.write_errors.load(Relaxed),
            memory_only_puts: c.memory_only_puts.load(Relaxed),
            refreshes: c.refreshes.load(Relaxed),
            reopens: c.reopens.load(Relaxed),
            entries,
            file_bytes,
            live_bytes,
            generation,
        }
    }

    /// Drops the mapping and file descriptors; later calls return [`IndexError::Closed`].
    pub fn close(&self) {
        self.closed.store(true, Relaxed);
        *self.view_mut() = None;
        let mut w = self.writer();
        w.wfile = None;
        w.lock = None;
        drop(w);
        self.overlay.write().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u32) -> Digest {
        crate::key::digest(&i.to_le_bytes())
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("jitkey-disk-{name}-{}-{}", std::process::id(), now_unix_ns()));
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn put_get_reopen_delete_dedup() {
        let d = tmpdir("basic");
        let idx = DiskIndex::open(&d, Options::default());
        assert_eq!(idx.mode().0, Mode::ReadWrite, "{:?}", idx.mode());
        assert_eq!(idx.get(&k(1)).unwrap(), None);
        assert_eq!(idx.put(&k(1), b"one").unwrap().written, 1);
        assert_eq!(idx.put(&k(1), b"one").unwrap().deduped, 1);
        idx.put(&k(2), b"two").unwrap();
        idx.put(&k(2), b"TWO").unwrap();
        assert_eq!(idx.get(&k(2)).unwrap().as_deref(), Some(&b"TWO"[..]));
        let other = DiskIndex::open(&d, Options::default());
        assert_eq!(other.get(&k(1)).unwrap().as_deref(), Some(&b"one"[..]));
        assert_eq!(other.get(&k(2)).unwrap().as_deref(), Some(&b"TWO"[..]));
        assert!(other.delete(&k(1)).unwrap());
        // Hits see other processes' writes after a refresh (at most `refresh_interval` later).
        idx.refresh();
        assert_eq!(idx.get(&k(1)).unwrap(), None);
        assert_eq!(other.len().unwrap(), 1);
        assert!(matches!(idx.put(&k(3), &vec![0; MAX_VALUE + 1]), Err(IndexError::ValueTooLarge { .. })));
        idx.close();
        assert_eq!(idx.get(&k(2)), Err(IndexError::Closed));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn compaction_and_eviction_keep_latest_values() {
        let d = tmpdir("compact");
        let opts = Options { max_bytes: 256 << 10, ..Options::default() };
        let idx = DiskIndex::open(&d, opts.clone());
        let reader = DiskIndex::open(&d, opts);
        let val = |i: u32| format!("value-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes();
        for i in 0..5000 {
            idx.put(&k(i), &val(i)).unwrap();
        }
        let s = idx.stats();
        assert!(s.compactions > 0 && s.evictions > 0, "{s:?}");
        assert!(s.file_bytes <= 256 << 10);
        // The newest entries survive; nothing returns a wrong value.
        let mut found = 0;
        for i in 0..5000 {
            if let Some(v) = reader.get(&k(i)).unwrap() {
                assert_eq!(v, val(i));
                found += 1;
            }
        }
        assert!(found > 1000, "found {found}");
        assert_eq!(reader.get(&k(4999)).unwrap(), Some(val(4999)));
        assert!(idx.clear().unwrap());
        reader.refresh();
        assert_eq!(reader.get(&k(4999)).unwrap(), None);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn torn_tail_is_padded_and_never_served() {
        let d = tmpdir("torn");
        let idx = DiskIndex::open(&d, Options::default());
        idx.put(&k(1), b"one").unwrap();
        let path = idx.path().to_path_buf();
        let good = fs::metadata(&path).unwrap().len();
        // A dead writer's half record.
        let mut rec = Vec::new();
        encode_record(&mut rec, TYPE_PUT, 99, &k(2), b"two");
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&rec[..37], good).unwrap();
        let reader = DiskIndex::open(&d, Options::default());
        assert_eq!(reader.get(&k(2)).unwrap(), None);
        idx.put(&k(3), b"three").unwrap();
        assert_eq!(idx.stats().torn_tails_padded, 1);
        assert_eq!(reader.get(&k(3)).unwrap().as_deref(), Some(&b"three"[..]));
        assert_eq!(reader.get(&k(1)).unwrap().as_deref(), Some(&b"one"[..]));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn lock_timeout_keeps_the_write_in_memory() {
        let d = tmpdir("locktimeout");
        let opts = Options { lock_timeout: Duration::from_millis(50), ..Options::default() };
        let idx = DiskIndex::open(&d, opts);
        assert_eq!(idx.mode().0, Mode::ReadWrite);
        // Another open file description holding the lock (as another process would).
        let holder = File::open(d.join(LOCK_NAME)).unwrap();
        flock(&holder, FlockOperation::LockExclusive).unwrap();
        let out = idx.put(&k(1), b"one").unwrap();
        assert_eq!(out.memory_only, 1);
        assert_eq!(idx.stats().lock_timeouts, 1);
        assert_eq!(idx.take_warnings().len(), 1);
        assert_eq!(idx.get(&k(1)).unwrap().as_deref(), Some(&b"one"[..]));
        flock(&holder, FlockOperation::Unlock).unwrap();
        idx.put(&k(2), b"two").unwrap();
        assert_eq!(DiskIndex::open(&d, Options::default()).get(&k(2)).unwrap().as_deref(), Some(&b"two"[..]));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn memory_mode_is_bounded() {
        let opts = Options { access: Access::Memory, max_bytes: 1 << 16, ..Options::default() };
        let idx = DiskIndex::open(Path::new("/nonexistent"), opts);
        assert_eq!(idx.mode().0, Mode::Memory);
        for i in 0..10_000 {
            idx.put(&k(i), &[7; 100]).unwrap();
        }
        assert!(idx.len().unwrap() < 1000);
        assert_eq!(idx.get(&k(9_999)).unwrap().as_deref(), Some(&[7u8; 100][..]));
    }

    #[test]
    fn foreign_and_corrupt_files() {
        let d = tmpdir("foreign");
        fs::write(
            d.join(log_name()),
            b"\x89PNG\r\n\x1a\nnot an index at all, but long enough to be a header......",
        )
        .unwrap();
        let idx = DiskIndex::open(&d, Options::default());
        assert_eq!(idx.mode().0, Mode::Memory);
        assert_eq!(idx.take_warnings().len(), 1);
        idx.put(&k(1), b"x").unwrap();
        assert_eq!(idx.get(&k(1)).unwrap().as_deref(), Some(&b"x"[..]));
        assert!(fs::read(d.join(log_name())).unwrap().starts_with(b"\x89PNG"), "left untouched");
        // Our magic, damaged header: moved aside, fresh file.
        let mut h = Header::new(1, 1).encode().to_vec();
        h[30] ^= 0xff;
        fs::write(d.join(log_name()), &h).unwrap();
        let idx = DiskIndex::open(&d, Options::default());
        assert_eq!(idx.mode().0, Mode::ReadWrite);
        assert_eq!(idx.take_warnings().len(), 1);
        assert!(fs::read_dir(&d)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".corrupt-")));
        // Another format major (a newer jitkey): left untouched, memory-only.
        let mut h = Header::new(1, 1);
        h.major = FORMAT_MAJOR + 1;
        fs::write(d.join(log_name()), h.encode()).unwrap();
        let idx = DiskIndex::open(&d, Options::default());
        assert_eq!(idx.mode().0, Mode::Memory);
        assert!(idx.mode().1.contains("format major 2"), "{:?}", idx.mode());
        assert_eq!(fs::read(d.join(log_name())).unwrap(), h.encode());
        fs::remove_dir_all(&d).unwrap();
    }
}
