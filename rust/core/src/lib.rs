//! jitkey-core: the pure-Rust half of jitkey.
//!
//! Nothing in this crate knows about Python; the PyO3 binding (`rust/py`) walks Python objects
//! and drives the types here. That keeps every invariant below testable with `cargo test` alone.
//!
//! * [`key`]: the canonical, injective, versioned key encoding, its blake2b-256 digest and the
//!   per-process seeded fast hash used by in-memory tables.
//! * [`disk`]: the mmap'd, append-only, crash-safe key index shared by processes (unix).
//! * [`lru`]: the bounded concurrent cache (key encoding → value) behind `jitkey.LruCache`.
//! * [`signature`]: signature plans (per-parameter rules), the writers of their leaves and a decoder
//!   for them.

#[cfg(unix)]
pub mod disk;
pub mod key;
pub mod lru;
pub mod signature;

pub use key::{digest, EncodeError, Encoder, FastHashState, Value};
