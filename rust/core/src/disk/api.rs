//! The plain values of the public API: what [`DiskIndex::open`](super::DiskIndex::open) takes,
//! what the index's methods return, and the names of its files. Behaviour lives in the parts that
//! use them; nothing here does I/O.

use std::path::PathBuf;
use std::time::Duration;

use super::format::FORMAT_MAJOR;

/// The lock file's name; the lock holder is the only process that writes the log.
pub(super) const LOCK_NAME: &str = "index.lock";

/// The live log's name (the format major is part of it: another major is another file).
pub fn log_name() -> String {
    format!("index.v{FORMAT_MAJOR}.jki")
}

/// How hard an append tries to survive power loss (a killed process loses at most the batch it
/// was writing in either mode). Compaction always fsyncs its temp file before the rename.
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
    /// Read and append (`rw`, the default).
    ReadWrite,
    /// Read the file, keep puts in this process's memory (`ro`).
    ReadOnly,
    /// Touch no file at all (`0`).
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
    /// The mode's name as `jitkey` reports it: `rw`, `ro` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::ReadWrite => "rw",
            Mode::ReadOnly => "ro",
            Mode::Memory => "memory",
        }
    }
}

/// How [`DiskIndex::open`](super::DiskIndex::open) sets up an index; [`Options::default`] is what
/// `jitkey.DiskIndex()` uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// Soft cap on the file size: compaction evicts the oldest entries down to 3/4 of it.
    pub max_bytes: u64,
    /// Whether appends are `fdatasync`ed (see [`Durability`]).
    pub durability: Durability,
    /// The access asked for; the environment may grant less (see
    /// [`DiskIndex::mode`](super::DiskIndex::mode)).
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

/// Kinds of environment trouble; each is reported once per index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarningKind {
    /// The index runs read-only or memory-only (the reason is in the message).
    Mode = 0,
    /// A write failed (disk full, I/O error); writes stay in memory for a while.
    WriteFailed = 1,
    /// The file lock was held longer than [`Options::lock_timeout`]; the write stayed in memory.
    LockTimeout = 2,
    /// The file was damaged (bad header, moved aside) or shrank under the process (rewritten).
    Corrupt = 3,
}

/// What a put did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PutOutcome {
    /// Records appended to the file.
    pub written: usize,
    /// Values skipped because the file already held the same value under the key.
    pub deduped: usize,
    /// Kept in this process's memory because the file could not take them.
    pub memory_only: usize,
    /// The sequence number of the first record this batch wrote (compaction never evicts it).
    pub first_seq: u64,
}

/// Why an operation could not run at all (the environment never causes one: see
/// [`DiskIndex`](super::DiskIndex)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskError {
    /// [`DiskIndex::close`](super::DiskIndex::close) ran before (or during) the operation.
    Closed,
    /// Value number `index` of the batch is `len` bytes, more than [`MAX_VALUE`](super::MAX_VALUE);
    /// nothing of the batch was written.
    ValueTooLarge {
        /// The position of the value in the batch.
        index: usize,
        /// Its length in bytes.
        len: usize,
    },
}

/// The result of a lookup that does no I/O.
#[derive(Debug)]
pub enum Probe<R> {
    /// Found: what the callback made of the value.
    Hit(R),
    /// Not there (or only a damaged copy, which is never served).
    Miss,
    /// Call [`DiskIndex::refresh`](super::DiskIndex::refresh) (I/O) and probe again with `final_probe`.
    Refresh,
}

/// `$JITKEY_CACHE_DIR`, else `$XDG_CACHE_HOME/jitkey`, else `~/.cache/jitkey`.
pub fn default_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("JITKEY_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|p| p.join("jitkey")))
        .or_else(|| var("HOME").map(|p| p.join(".cache").join("jitkey")))
}
