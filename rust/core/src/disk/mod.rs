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
//! The index is composed of parts that each own exactly the state they may touch, so that the
//! first two rules are kept by types: the read path (`Reader`) holds only a read-only descriptor
//! and has no method that writes a file; padding and appending are methods of the `Locked` guard,
//! which only `Writer::lock` makes, once it holds the file lock; compaction is a `Compactor`,
//! which only a `Locked` guard makes. [`DiskIndex`] is the facade over them.
//!
//! Modules, in layers: each uses only modules of lower layers (`tests` uses anything), so the
//! module graph has no cycle.
//! 0. [`format`](mod@format): header and record framing (pure, no I/O). `sigbus`: the SIGBUS guard
//!    that turns a page lost to a shrinking file into a miss. `fault`: crash points for the crash
//!    tests (armed only with the `fault-injection` feature). `stats`: the counters and their
//!    [`Stats`] snapshot.
//! 1. `api` (format): the plain values of the public API ([`Options`], [`Mode`], [`DiskError`],
//!    [`Probe`], ...) and the file names.
//! 2. `trust` (api): the directory's owner, permission and filesystem checks that decide the
//!    [`Mode`], and how every index file is opened. `shared` (api, stats): `Shared`, the paths,
//!    options, counters, mode and warnings every part reads; the fork-resettable lock.
//! 3. `view` (format, sigbus, stats, api, trust, shared): the `View` of validated records and the
//!    `Reader`, the lock-free read path.
//! 4. `overlay` (format, stats, api, shared, view): memory-only entries. `verify` (format, api,
//!    trust, view): [`verify()`], every record of one consistent snapshot (`jitkey cache verify`).
//!    `append` (format, fault, api, trust, shared, view): the `Writer`, its `Locked` guard,
//!    padding and appends.
//! 5. `compact` (format, fault, api, trust, shared, view, append): the `Compactor`: compaction,
//!    eviction, and creating, quarantining or rewriting the log file.
//! 6. `index` (all of the above but sigbus and verify): [`DiskIndex`], opening, puts, compaction
//!    and `clear` as sequences over the parts.
//! 7. `tests`: unit tests of the whole.
//!
//! Unix only: the protocol relies on `flock(2)`, `pwrite(2)` and renaming over a mapped file.
#![warn(missing_docs)]
// Without the feature the crash points are not part of the API (what a release build gets);
// `cargo test -p jitkey-core` without features checks it with these two doctests.
#![cfg_attr(
    not(feature = "fault-injection"),
    doc = "\n\nWithout `fault-injection` there is no crash point to arm:\n```compile_fail,E0432\nuse jitkey_core::disk::Fault;\n```\n```compile_fail,E0599\nfn arm(ix: &jitkey_core::disk::DiskIndex) {\n    ix.arm_fault(todo!(), 0);\n}\n```"
)]

mod api;
mod append;
mod compact;
mod fault;
pub mod format;
mod index;
mod overlay;
mod shared;
mod sigbus;
mod stats;
#[cfg(test)]
mod tests;
mod trust;
mod verify;
mod view;

pub use api::{
    default_dir, log_name, Access, DiskError, Durability, Mode, Options, Probe, PutOutcome, WarningKind,
};
#[cfg(feature = "fault-injection")]
pub use fault::Fault;
pub use format::{Digest, MAX_VALUE};
pub use index::DiskIndex;
pub use stats::Stats;
pub use verify::{verify, Verified, VerifyError};
