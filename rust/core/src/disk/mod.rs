//! The on-disk key index: one append-only log per directory, shared by many processes.
//!
//! * [`format`]: header and record framing (pure).
//! * [`index`]: the [`DiskIndex`] (append protocol under `flock`, lock-free mmap readers,
//!   compaction/eviction by atomic rename, degraded modes, stats).
//!
//! Unix only: the protocol relies on `flock(2)`, `pwrite(2)` and renaming over a mapped file.

pub mod format;
mod index;

pub use format::{Digest, MAX_VALUE};
pub use index::{
    default_dir, Access, DiskIndex, Durability, Fault, IndexError, Mode, Options, Probe, PutOutcome, Stats,
    WarningKind,
};
