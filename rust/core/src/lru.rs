//! The in-memory cache: key encoding → value, bounded, safe to share between threads.
//!
//! INTERFACE STUB (foundation commit): a `Mutex<HashMap>` stand-in with the final API so that the
//! signature and binding layers can be written against it. The lock-free-hit implementation
//! replaces the body of this module (issue #3); the public API below is the contract.

use std::collections::HashMap;
use std::sync::Mutex;

/// Counters of a [`Cache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups that found their key.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Entries inserted (new keys and replacements).
    pub inserts: u64,
    /// Entries dropped to stay within capacity.
    pub evictions: u64,
    /// Entries held now.
    pub size: u64,
    /// Most entries held at once.
    pub capacity: u64,
}

/// A bounded concurrent map from a key's canonical encoding to `V`.
///
/// `hash` arguments are the caller's in-memory hash of `key` (`FastHashState::hash`); keys are
/// always compared by their full bytes, so a hash collision can never return another key's value.
pub struct Cache<V> {
    map: Mutex<HashMap<Box<[u8]>, V>>,
    capacity: usize,
    stats: Mutex<Stats>,
}

impl<V> Cache<V> {
    /// A cache holding at most `capacity` entries (`capacity >= 1`); `shards` is a hint.
    ///
    /// # Panics
    /// If `capacity` is 0.
    #[must_use]
    pub fn new(capacity: usize, _shards: Option<usize>) -> Self {
        assert!(capacity > 0, "capacity must be at least 1");
        Self {
            map: Mutex::new(HashMap::new()),
            capacity,
            stats: Mutex::new(Stats { capacity: capacity as u64, ..Stats::default() }),
        }
    }

    /// Calls `f` with the value stored under `key` (marking it recently used) and returns its
    /// result, or `None` on a miss.
    pub fn get_with<R>(&self, _hash: u64, key: &[u8], f: impl FnOnce(&V) -> R) -> Option<R> {
        let map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = map.get(key).map(f);
        let mut s = self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if out.is_some() {
            s.hits += 1;
        } else {
            s.misses += 1;
        }
        out
    }

    /// Whether `key` is present, without touching recency or counters.
    pub fn contains(&self, _hash: u64, key: &[u8]) -> bool {
        self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains_key(key)
    }

    /// Stores `value` under `key`. Returns the values this displaced (a replaced value and any
    /// evicted ones) so the caller drops them outside every lock.
    pub fn insert(&self, _hash: u64, key: &[u8], value: V) -> Vec<V> {
        let mut out = Vec::new();
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut s = self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(old) = map.insert(key.into(), value) {
            out.push(old);
        } else if map.len() > self.capacity {
            let victim = map.keys().find(|k| &***k != key).cloned();
            if let Some(v) = victim.and_then(|k| map.remove(&k)) {
                out.push(v);
                s.evictions += 1;
            }
        }
        s.inserts += 1;
        s.size = map.len() as u64;
        out
    }

    /// Removes and returns the value under `key`.
    pub fn remove(&self, _hash: u64, key: &[u8]) -> Option<V> {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = map.remove(key);
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner).size = map.len() as u64;
        out
    }

    /// Removes every entry, returning the values for the caller to drop outside every lock.
    pub fn clear(&self) -> Vec<V> {
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner).size = 0;
        map.drain().map(|(_, v)| v).collect()
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity given at construction.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
