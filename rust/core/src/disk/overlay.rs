//! Memory-only entries: the puts and deletes the file could not take (read-only or memory mode, a
//! lock timeout, a write failure), served from this process's memory.
//!
//! Invariant: an entry here shadows the file for its key (a value or a deletion) until a write of
//! that key reaches the file, and the whole set is bounded by `max_bytes` (record-sized
//! accounting); past it, it is dropped wholesale, which never gives a wrong value. While nothing
//! was ever put here, a lookup costs one relaxed load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockWriteGuard};

use super::api::Probe;
use super::format::{record_len, Digest};
use super::shared::ForkReset;
use super::stats::Counters;
use super::view::DigestHash;

type Map = HashMap<Digest, Option<Arc<[u8]>>, DigestHash>;

pub(super) struct Overlay {
    map: ForkReset<RwLock<Map>>,
    used: AtomicBool,
    bytes: AtomicU64,
}

impl Overlay {
    pub(super) fn new() -> Self {
        Self {
            map: ForkReset::new(RwLock::new(Map::default())),
            used: AtomicBool::new(false),
            bytes: AtomicU64::new(0),
        }
    }

    fn map_mut(&self) -> RwLockWriteGuard<'_, Map> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks `key` up: a hit or a deletion here is final (and counted); `Err(f)` hands `f` back
    /// when the key has no entry here.
    #[inline]
    pub(super) fn probe<R, F: FnOnce(&[u8]) -> R>(
        &self,
        key: &Digest,
        counters: &Counters,
        f: F,
    ) -> Result<Probe<R>, F> {
        if !self.used.load(Relaxed) {
            return Err(f);
        }
        let ov = self.map.read().unwrap_or_else(|p| p.into_inner());
        match ov.get(key) {
            Some(Some(v)) => {
                counters.hits.fetch_add(1, Relaxed);
                Ok(Probe::Hit(f(v)))
            }
            Some(None) => {
                counters.misses.fetch_add(1, Relaxed);
                Ok(Probe::Miss)
            }
            None => Err(f),
        }
    }

    /// Keeps `value` (`None`: a deletion) for `key` in memory, within `max_bytes`.
    pub(super) fn put(&self, key: &Digest, value: Option<&[u8]>, max_bytes: u64, counters: &Counters) {
        let mut ov = self.map_mut();
        // Memory-only entries are bounded by `max_bytes` too (record-sized accounting); past it
        // they are dropped wholesale: this is a cache, and dropping never gives a wrong value.
        let add = record_len(value.map_or(0, <[u8]>::len)) as u64;
        if self.bytes.load(Relaxed) + add > max_bytes {
            counters.evictions.fetch_add(ov.len() as u64, Relaxed);
            ov.clear();
            self.bytes.store(0, Relaxed);
        }
        self.bytes.fetch_add(add, Relaxed);
        ov.insert(*key, value.map(Arc::from));
        self.used.store(true, Relaxed);
        counters.memory_only_puts.fetch_add(1, Relaxed);
    }

    /// Drops the entries of `keys` (their writes reached the file).
    pub(super) fn forget(&self, keys: impl Iterator<Item = Digest>) {
        if self.used.load(Relaxed) {
            let mut ov = self.map_mut();
            for k in keys {
                ov.remove(&k);
            }
        }
    }

    /// Drops every entry.
    pub(super) fn clear(&self) {
        let mut ov = self.map_mut();
        ov.clear();
        self.bytes.store(0, Relaxed);
    }

    /// The number of live keys given `base` live keys in the file, `on_disk` telling which keys
    /// those are.
    pub(super) fn len(&self, base: usize, on_disk: impl Fn(&Digest) -> bool) -> usize {
        if !self.used.load(Relaxed) {
            return base;
        }
        let ov = self.map.read().unwrap_or_else(|p| p.into_inner());
        let mut n = base as isize;
        for (k, v) in ov.iter() {
            match (v.is_some(), on_disk(k)) {
                (true, false) => n += 1,
                (false, true) => n -= 1,
                _ => {}
            }
        }
        n.max(0) as usize
    }

    /// Replaces the map's lock if a vanished thread of the parent held it (its entries are lost).
    ///
    /// # Safety
    /// The contract of [`DiskIndex::after_fork_in_child`](super::DiskIndex::after_fork_in_child):
    /// a single-threaded child, called from outside every method of this index.
    pub(super) unsafe fn after_fork_in_child(&self) {
        use std::sync::TryLockError::WouldBlock;
        if matches!(self.map.try_write(), Err(WouldBlock)) {
            // SAFETY: the contract above; the overlay lock was held by a vanished thread.
            unsafe { self.map.reset(RwLock::new(Map::default())) };
            self.bytes.store(0, Relaxed);
        }
    }
}
