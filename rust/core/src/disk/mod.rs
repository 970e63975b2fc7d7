//! The on-disk key index: one append-only log per directory, shared by many processes.
//!
//! Three rules hold the design together; each module owns one of them and states it in its doc:
//! * Readers never repair. Every process reads the log lock-free through an mmap and accepts only
//!   records that validated; an invalid tail means "not yet" (`view`, `sigbus`).
//! * Only the lock holder writes: it appends at the validated end under `flock` and is the only
//!   one that pads a dead writer's torn tail (`append`). Bytes below a process's validated end
//!   never change for the life of an inode.
//! * Compaction is a rename: a new file is written aside, fsynced and renamed over the live one;
//!   the live file is never rewritten in place (`compact`).
//!
//! Modules:
//! * [`format`](mod@format): header and record framing (pure, no I/O).
//! * `index`: the public API ([`DiskIndex`], [`Options`], [`Mode`], [`DiskError`], ...).
//! * `trust`: what decides the [`Mode`]: owner and permission checks of the directory (sticky
//!   shared directories), network filesystems, and how every index file is opened.
//! * `view`: the reader's index of validated records and the lock-free read path.
//! * `sigbus`: the SIGBUS guard that turns a page lost to a shrinking file into a miss.
//! * `append`: the file lock, padding, appends and their fallbacks.
//! * `compact`: compaction, eviction, `clear`, and creating or quarantining the log file.
//! * `stats`: the counters and their [`Stats`] snapshot.
//! * `verify`: [`verify()`], every record of one consistent snapshot (`jitkey cache verify`).
//! * `fault`: crash points for the crash tests (only with the `fault-injection` feature).
//! * `tests`: unit tests of the whole.
//!
//! Unix only: the protocol relies on `flock(2)`, `pwrite(2)` and renaming over a mapped file.
#![warn(missing_docs)]
// Without the feature the crash points are not part of the API (what a release build gets);
// `cargo test -p jitkey-core` without features checks it with these two doctests.
#![cfg_attr(
    not(feature = "fault-injection"),
    doc = "\n\nWithout `fault-injection` there is no crash point to arm:\n```compile_fail,E0432\nuse jitkey_core::disk::Fault;\n```\n```compile_fail,E0599\nfn arm(ix: &jitkey_core::disk::DiskIndex) {\n    ix.arm_fault(todo!(), 0);\n}\n```"
)]

mod append;
mod compact;
mod fault;
pub mod format;
mod index;
mod sigbus;
mod stats;
#[cfg(test)]
mod tests;
mod trust;
mod verify;
mod view;

#[cfg(feature = "fault-injection")]
pub use fault::Fault;
pub use format::{Digest, MAX_VALUE};
pub use index::{
    default_dir, log_name, Access, DiskError, DiskIndex, Durability, Mode, Options, Probe, PutOutcome,
    WarningKind,
};
pub use stats::Stats;
pub use verify::{verify, Verified, VerifyError};
