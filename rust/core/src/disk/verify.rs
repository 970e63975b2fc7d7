//! `jitkey cache verify`: every record of one consistent snapshot of the log.
//!
//! Invariant: the snapshot is what was committed when the check started, never anything later.
//! * Its length is the file's size read while holding the writers' lock *shared* (every append
//!   and compaction holds it exclusively), so no write is in flight at that instant; the lock is
//!   released right after (writers wait microseconds).
//! * Its bytes are read through the descriptor opened under the lock, below that length. Bytes
//!   below a committed length never change for the life of an inode (see `append`), and a
//!   compaction renames a new inode over the path, leaving the snapshot's inode as it was.
//!
//! So appends and compactions by other processes during the check are not seen, and a healthy
//! index always verifies. What does not validate inside the snapshot is real: a damaged record,
//! or the torn tail of a writer that died mid-append (the next writer pads it). Without the lock
//! (no lock file yet, one that is not ours to trust, or a lock held past the wait), the length is
//! read unlocked: an append in flight at that instant may then show as a tail that does not
//! validate, and the report says the snapshot was unlocked.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use super::api::{log_name, LOCK_NAME};
use super::format::{Header, HeaderError, HEADER_LEN, TYPE_PUT, TYPE_TOMBSTONE};
use super::trust::open_trusted;
use super::view::{read_full_at, scan};

/// What [`verify`] found in the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The log file checked.
    pub path: PathBuf,
    /// Whether the snapshot's length was read under the writers' lock (else: unlocked, see the
    /// module doc).
    pub locked: bool,
    /// The snapshot's length: what was committed when the check started.
    pub snapshot_bytes: u64,
    /// The end of the validated prefix of the snapshot (`== snapshot_bytes` when healthy).
    pub valid_bytes: u64,
    /// Records that validated (puts, tombstones, padding).
    pub records: u64,
    /// Live keys in the snapshot.
    pub entries: u64,
    /// Bytes of the live records.
    pub live_bytes: u64,
    /// The file's generation (one more per compaction).
    pub generation: u64,
}

impl Verified {
    /// Bytes of the snapshot past its validated prefix: damage, or a dead writer's torn tail.
    #[must_use]
    pub fn unvalidated_bytes(&self) -> u64 {
        self.snapshot_bytes - self.valid_bytes
    }
}

/// Why [`verify`] could not check the directory.
#[derive(Debug)]
pub enum VerifyError {
    /// There is no log file in the directory (nothing was ever stored).
    Missing,
    /// The file is not a usable index: another program's, another format major, or a damaged
    /// header.
    Header(HeaderError),
    /// Opening or reading failed (permissions, I/O); the text says which.
    Io(io::Error),
}

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VerifyError::Missing => f.write_str("no index file"),
            VerifyError::Header(HeaderError::Foreign) => f.write_str("the file is not a jitkey index"),
            VerifyError::Header(HeaderError::Corrupt) => f.write_str("the index header is damaged"),
            VerifyError::Header(HeaderError::UnknownMajor(m)) => {
                write!(f, "the index is of format {m}, which this jitkey does not read")
            }
            VerifyError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for VerifyError {}

/// The writers' lock file, held shared until dropped; `None` when there is none to take (or it is
/// held past `wait`).
fn lock_shared(dir: &Path, wait: Duration) -> Option<File> {
    let lock = open_trusted(&dir.join(LOCK_NAME), false, false).ok()?;
    let start = Instant::now();
    let mut backoff = Duration::from_micros(50);
    loop {
        match flock(&lock, FlockOperation::NonBlockingLockShared) {
            Ok(()) => return Some(lock),
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::WOULDBLOCK) if start.elapsed() < wait => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(5));
            }
            Err(_) => return None,
        }
    }
}

/// Checks every record of the log in `dir` as committed when the call starts (see the module
/// doc). Creates nothing, writes nothing; holds the writers' lock (shared) only while it reads the
/// file's length, waiting at most `lock_wait` for it.
///
/// # Errors
/// [`VerifyError`] when there is no index, it is not a usable one, or it cannot be read.
pub fn verify(dir: &Path, lock_wait: Duration) -> Result<Verified, VerifyError> {
    let path = dir.join(log_name());
    let lock = lock_shared(dir, lock_wait);
    let opened = open_trusted(&path, false, false).and_then(|f| Ok((f.metadata()?.len(), f)));
    let locked = lock.is_some();
    drop(lock); // closing the descriptor releases the lock
    let (size, file) = match opened {
        Ok(v) => v,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(VerifyError::Missing),
        Err(e) => return Err(VerifyError::Io(e)),
    };
    let mut head = [0u8; HEADER_LEN];
    let n = read_full_at(&file, &mut head, 0).map_err(VerifyError::Io)?;
    let header = Header::decode(&head[..n.min(size as usize)]).map_err(VerifyError::Header)?;
    let mut live: HashMap<[u8; 32], u64> = HashMap::new();
    let (mut records, mut live_bytes) = (0u64, 0u64);
    let valid = scan(&file, HEADER_LEN as u64, size, |_, r| {
        records += 1;
        match r.ty {
            TYPE_PUT => {
                live_bytes += r.len as u64;
                if let Some(old) = live.insert(*r.key, r.len as u64) {
                    live_bytes -= old;
                }
            }
            TYPE_TOMBSTONE => {
                if let Some(old) = live.remove(r.key) {
                    live_bytes -= old;
                }
            }
            _ => {}
        }
    })
    .map_err(VerifyError::Io)?;
    Ok(Verified {
        path,
        locked,
        snapshot_bytes: size,
        valid_bytes: valid,
        records,
        entries: live.len() as u64,
        live_bytes,
        generation: header.generation,
    })
}
