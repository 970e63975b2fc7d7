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

use rustix::fs::{flock, FlockOperation};

use super::format::{
    encode_pads, encode_record, pad_len_for, parse_record, record_len, Digest, Header, HeaderError,
    FORMAT_MAJOR, HEADER_LEN, MAGIC, MAX_RECORD, MAX_VALUE, TYPE_PUT, TYPE_TOMBSTONE,
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
    /// The sequence number of the first record this batch wrote (compaction never evicts it).
    pub first_seq: u64,
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
    /// Times this process found the file shorter than what it had validated (see
    /// [`DiskIndex::refresh`]); the view was rebuilt, and a writer rewrote the file.
    pub shrinks_seen: u64,
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
    map: Option<Arc<fault_guard::GuardedMap>>,
    /// End of the validated prefix of the file.
    end: u64,
    generation: u64,
    keydir: KeyDir,
    live_bytes: u64,
    max_seq: u64,
}

impl View {
    /// Copies the record at `loc` out of the mapping, re-validates the copy against `key` and
    /// calls `f(record bytes, value)` on it; `None` if the bytes changed. Validating the copy (not
    /// the mapping) means a foreign writer or a shrinking file can give a miss, never a value that
    /// differs from the one that was checksummed. A page lost to a shrink reads as zeros (see
    /// [`fault_guard`]), which fails validation.
    fn with_record<R>(&self, key: &Digest, loc: Loc, f: impl FnOnce(&[u8], &[u8]) -> R) -> Option<R> {
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

    /// Drops everything indexed: the next [`extend`](Self::extend) rescans from the header.
    fn forget_all(&mut self) {
        self.keydir.clear();
        self.live_bytes = 0;
        self.end = HEADER_LEN as u64;
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
        // bytes below the validated end are ever touched.
        let len = (self.end * 2).max(16 << 20).next_multiple_of(1 << 20);
        self.map = Some(Arc::new(fault_guard::GuardedMap::new(&self.file, len as usize)?));
        Ok(())
    }
}

/// Keeps a file that shrinks under a live mapping (a truncation, `cp` over the index, a tool)
/// from killing the process with SIGBUS. Every index mapping is registered here; a process-wide
/// SIGBUS handler, installed once and chained to the previous one, replaces a faulting page that
/// lies inside a registered mapping with a zero page and returns, so the read sees zeros, which
/// never validate (a miss). Faults anywhere else go to the previous handler unchanged.
mod fault_guard {
    use std::cell::UnsafeCell;
    use std::fs::File;
    use std::io;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

    use memmap2::{Mmap, MmapOptions};
    use std::sync::Once;

    const SLOTS: usize = 1024;
    static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static ENDS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
    static PAGE: AtomicUsize = AtomicUsize::new(4096);
    /// Pages replaced by the handler since the process started.
    pub static FAULTS: AtomicU64 = AtomicU64::new(0);
    static INSTALL: Once = Once::new();

    struct Prev(UnsafeCell<Option<libc::sigaction>>);
    // SAFETY: written once inside `INSTALL` before the handler is installed; only read after.
    unsafe impl Sync for Prev {}
    static PREV: Prev = Prev(UnsafeCell::new(None));

    fn install() {
        INSTALL.call_once(|| unsafe {
            let page = libc::sysconf(libc::_SC_PAGESIZE);
            if page > 0 {
                PAGE.store(page as usize, SeqCst);
            }
            let mut prev: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) != 0 {
                return;
            }
            *PREV.0.get() = Some(prev);
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
        });
    }

    fn inside(addr: usize) -> bool {
        (0..SLOTS).any(|i| {
            let s = STARTS[i].load(SeqCst);
            s != 0 && addr >= s && addr < ENDS[i].load(SeqCst)
        })
    }

    extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        // Async-signal-safe: atomics and mmap(2) only.
        unsafe {
            let addr = (*info).si_addr() as usize;
            if inside(addr) {
                let page = PAGE.load(SeqCst);
                let at = addr & !(page - 1);
                let r = libc::mmap(
                    at as *mut libc::c_void,
                    page,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                );
                if r != libc::MAP_FAILED {
                    FAULTS.fetch_add(1, SeqCst);
                    return;
                }
            }
            match *PREV.0.get() {
                Some(prev) if prev.sa_flags & libc::SA_SIGINFO != 0 && prev.sa_sigaction > 1 => {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(prev.sa_sigaction);
                    f(sig, info, ctx);
                }
                Some(prev) if prev.sa_sigaction > 1 => {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev.sa_sigaction);
                    f(sig);
                }
                _ => {
                    // The default action: die of SIGBUS as if we had never been installed.
                    let mut dfl: libc::sigaction = std::mem::zeroed();
                    dfl.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                    libc::raise(libc::SIGBUS);
                }
            }
        }
    }

    /// A read-only mapping of `len` bytes of a file, registered with the handler for its life.
    pub struct GuardedMap {
        map: Mmap,
        slot: usize,
    }

    impl GuardedMap {
        pub fn new(file: &File, len: usize) -> io::Result<Self> {
            install();
            // SAFETY: read-only; only bytes below the validated end are read, always copied out
            // and re-validated before use, and a page lost to a shrink reads as zeros.
            let map = unsafe { MmapOptions::new().len(len).map(file)? };
            let start = map.as_ptr() as usize;
            for slot in 0..SLOTS {
                if STARTS[slot].compare_exchange(0, usize::MAX, SeqCst, SeqCst).is_ok() {
                    ENDS[slot].store(start + map.len(), SeqCst);
                    STARTS[slot].store(start, SeqCst);
                    return Ok(Self { map, slot });
                }
            }
            Err(io::Error::other("too many disk index mappings in this process"))
        }

        pub fn len(&self) -> usize {
            self.map.len()
        }

        pub fn bytes(&self) -> &[u8] {
            &self.map
        }
    }

    impl Drop for GuardedMap {
        fn drop(&mut self) {
            // Deregister before `map` unmaps (fields drop after this body).
            ENDS[self.slot].store(0, SeqCst);
            STARTS[self.slot].store(0, SeqCst);
        }
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

/// Opens `path` the way every index file is opened: without following a symlink, without
/// blocking (a FIFO planted under our name), and accepted only if the descriptor is a regular
/// file owned by this user (checked on the opened descriptor, so nothing can be swapped in
/// between the check and the use).
fn open_trusted(path: &Path, write: bool, create: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    if create {
        o.create(true).truncate(false).mode(0o600);
    }
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    let f = o.open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::other(format!("{} is not a regular file; not trusting it", path.display())));
    }
    let euid = rustix::process::geteuid().as_raw();
    if m.uid() != euid {
        return Err(io::Error::other(format!(
            "{} is owned by uid {}, not by this user (uid {euid}); not trusting it",
            path.display(),
            m.uid()
        )));
    }
    Ok(f)
}

/// Whether the file has a hole (bytes never written) below `at`: a sign that it was cut while we
/// wrote past the cut. Filesystems without `SEEK_HOLE` report none.
fn hole_below(file: &File, at: u64) -> bool {
    matches!(rustix::fs::seek(file, rustix::fs::SeekFrom::Hole(HEADER_LEN as u64)), Ok(h) if h < at)
}

/// Opens a file as an index view: header check, then a validated scan of every record.
fn load_view(file: File) -> Result<View, Result<HeaderError, io::Error>> {
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
    shrinks_seen: AtomicU64,
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

impl Writer {
    fn new() -> Self {
        Self {
            pid: std::process::id(),
            lock: None,
            wfile: None,
            disabled_until: None,
            swept: false,
            fault: None,
        }
    }
}

/// A lock that can be replaced in a forked child. After `fork()` only the forking thread exists:
/// a lock another thread held at that moment stays held forever in the child. The child-side
/// fork hook ([`DiskIndex::after_fork_in_child`]) replaces such a lock (and the state it
/// guarded, which may be half-updated) with a fresh one; the old one is leaked, never dropped.
struct ForkReset<T>(std::cell::UnsafeCell<T>);

// SAFETY: shared access goes through `T` (a Sync lock); `reset` is only called in a forked child
// while it is single-threaded, with no borrow of the old value alive.
unsafe impl<T: Sync> Sync for ForkReset<T> {}
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

enum WriteFail {
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
    view: ForkReset<RwLock<Option<View>>>,
    writer: ForkReset<Mutex<Writer>>,
    overlay: ForkReset<RwLock<Overlay>>,
    overlay_used: AtomicBool,
    overlay_bytes: AtomicU64,
    mode: ForkReset<RwLock<(Mode, String)>>,
    counters: Counters,
    warned: AtomicU8,
    pending: AtomicBool,
    warnings: ForkReset<Mutex<Vec<String>>>,
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
        if meta.mode() & 0o022 != 0 && !self.opts.trust_sticky_dir {
            return Err(format!(
                "{} is group- or world-writable (mode {:o}, sticky): other users can plant files there; \
                 not trusting its contents (name the directory explicitly to use it)",
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
            match open_trusted(&self.path, false, false) {
                Ok(f) => match load_view(f) {
                    Ok(view) => {
                        if rw {
                            if let Err(e) = open_trusted(&self.path, true, false) {
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
            WriteFail::Closed => "closed while opening".to_owned(),
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
    fn reopen_view(&self) -> bool {
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
            w.lock = Some(open_trusted(&self.lock_path, true, true)?);
        }
        Ok(())
    }

    /// Runs `f` holding the in-process writer mutex and the exclusive file lock.
    fn locked<R>(&self, f: impl FnOnce(&mut Writer) -> Result<R, WriteFail>) -> Result<R, WriteFail> {
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

    fn tmp_path(&self) -> PathBuf {
        self.dir.join(format!("{}.tmp.{}.{:x}", log_name(), std::process::id(), now_unix_ns()))
    }

    /// Writes a header-only file under a temp name and renames it into place (under the lock).
    fn create_fresh(&self, generation: u64) -> io::Result<()> {
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

    fn create_if_missing(&self, _w: &mut Writer) -> Result<(), WriteFail> {
        match fs::metadata(&self.path) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(self.create_fresh(1)?),
            Err(e) => Err(e.into()),
        }
    }

    fn quarantine_and_create(&self, _w: &mut Writer) -> Result<(), WriteFail> {
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
    /// write fd on the same inode. A file that shrank below what we validated is rewritten to a
    /// new inode first, so that no append ever lands past a hole.
    fn sync_locked(&self, w: &mut Writer) -> Result<(), WriteFail> {
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
        self.write_ops(&ops)
    }

    /// Removes `key` (a tombstone record). Returns whether it was present.
    pub fn delete(&self, key: &Digest) -> Result<bool, IndexError> {
        let present = self.contains(key)?;
        if present {
            self.write_ops(&[(*key, None)])?;
        }
        Ok(present)
    }

    fn write_ops(&self, ops: &[(Digest, Option<&[u8]>)]) -> Result<PutOutcome, IndexError> {
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
            Err(WriteFail::Closed) => Err(IndexError::Closed),
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
        if matches!(w.fault, Some((Fault::SplitWrite, 0))) {
            // Not a multiple of 8, so the cut always lands inside a record.
            let half = buf.len() / 2 + 4;
            file.write_all_at(&buf[..half], at)?;
        }
        Self::hit_fault(w, Fault::SplitWrite);
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

    fn handle_write_failure(&self, fail: WriteFail) {
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

    /// `keep_from_seq`: records of the batch just written (seq >= it) are never evicted, so a put
    /// that returned is never undone by the compaction it triggered (0: no such batch).
    fn maybe_compact(&self, w: &mut Writer, keep_from_seq: u64) -> Result<(), WriteFail> {
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
            self.compact_locked(w, empty, 0)
        });
        match res {
            Ok(()) => Ok(true),
            Err(WriteFail::Closed) => Err(IndexError::Closed),
            Err(fail) => {
                self.handle_write_failure(fail);
                Ok(false)
            }
        }
    }

    fn compact_locked(&self, w: &mut Writer, empty: bool, keep_from_seq: u64) -> Result<(), WriteFail> {
        self.sweep_tmp();
        let tmp = self.tmp_path();
        let r = self.write_compacted(w, &tmp, empty, keep_from_seq);
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
            shrinks_seen: c.shrinks_seen.load(Relaxed),
            entries,
            file_bytes,
            live_bytes,
            generation,
        }
    }

    /// Drops the mapping and file descriptors; later calls return [`IndexError::Closed`].
    /// Safe against every concurrent operation: it waits for an in-flight write (which holds the
    /// writer mutex); operations that start later get [`IndexError::Closed`]; lock-free readers
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
        // SAFETY (all resets): single-threaded child, no borrow alive (the caller's contract).
        if matches!(self.writer.try_lock(), Err(WouldBlock)) {
            unsafe { self.writer.reset(Mutex::new(Writer::new())) };
        }
        if matches!(self.overlay.try_write(), Err(WouldBlock)) {
            unsafe { self.overlay.reset(RwLock::new(Overlay::default())) };
            self.overlay_bytes.store(0, Relaxed);
        }
        if matches!(self.mode.try_write(), Err(WouldBlock)) {
            unsafe { self.mode.reset(RwLock::new((Mode::ReadOnly, "reset after fork".to_owned()))) };
        }
        if matches!(self.warnings.try_lock(), Err(WouldBlock)) {
            unsafe { self.warnings.reset(Mutex::new(Vec::new())) };
        }
        if matches!(self.view.try_write(), Err(WouldBlock)) {
            unsafe { self.view.reset(RwLock::new(None)) };
            if !self.closed.load(Relaxed) && !self.reopen_view() {
                self.set_mode(Mode::Memory, "the index could not be reloaded after fork".to_owned());
            }
        }
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
    fn shrink_under_mapping_is_a_miss_and_the_next_put_rewrites() {
        let d = tmpdir("shrink");
        let idx = DiskIndex::open(&d, Options::default());
        for i in 0..300 {
            idx.put(&k(i), &[7u8; 200]).unwrap();
        }
        assert_eq!(idx.get(&k(299)).unwrap().as_deref(), Some(&[7u8; 200][..]));
        OpenOptions::new().write(true).open(idx.path()).unwrap().set_len(0).unwrap();
        // The mapped pages are gone: a miss, not a SIGBUS.
        assert_eq!(idx.get(&k(299)).unwrap(), None);
        assert_eq!(idx.put(&k(1000), b"x").unwrap().memory_only, 0);
        assert!(idx.stats().shrinks_seen >= 1);
        let fresh = DiskIndex::open(&d, Options::default());
        assert_eq!(fresh.mode().0, Mode::ReadWrite);
        assert_eq!(fresh.get(&k(1000)).unwrap().as_deref(), Some(&b"x"[..]));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn close_racing_writes_never_panics() {
        let d = tmpdir("closerace");
        for round in 0..20u32 {
            let idx = Arc::new(DiskIndex::open(&d, Options { max_bytes: 1 << 16, ..Options::default() }));
            let workers: Vec<_> = (0..2u32)
                .map(|t| {
                    let idx = Arc::clone(&idx);
                    std::thread::spawn(move || {
                        for i in 0..2000u32 {
                            let r = if i % 3 == 0 {
                                idx.compact().map(|_| ())
                            } else {
                                idx.put(&k(round * 100_000 + t * 10_000 + i), &[1u8; 3000]).map(|_| ())
                            };
                            if r == Err(IndexError::Closed) {
                                return;
                            }
                        }
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(2));
            idx.close();
            for w in workers {
                w.join().expect("no panic in a worker");
            }
        }
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
