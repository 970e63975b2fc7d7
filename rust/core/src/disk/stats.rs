//! The counters every index keeps, and the [`Stats`] snapshot `DiskIndex::stats` returns.
//!
//! Invariant: counters are observations, never decisions. They are relaxed atomics bumped next to
//! the event they count and read only by [`DiskIndex::stats`](super::DiskIndex::stats); no code
//! path branches on them.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of one index's counters (this process's view; what `jitkey.DiskIndex.stats()` and
/// `jitkey cache info` report).
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Lookups that found a value (file or memory).
    pub hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// Records this process appended to the file.
    pub appends: u64,
    /// Puts not written because the file already held the same value under the key.
    pub dedup_skips: u64,
    /// Dead writers' torn tails this process covered with PAD records (under the lock).
    pub torn_tails_padded: u64,
    /// Bytes those PAD records covered.
    pub invalid_bytes_padded: u64,
    /// Records indexed earlier that no longer validated when read (served as misses).
    pub corrupt_records_skipped: u64,
    /// Compactions (and clears) this process ran.
    pub compactions: u64,
    /// Entries evicted by compaction past `max_bytes`, or dropped from memory-only entries.
    pub evictions: u64,
    /// Times this process took the file lock.
    pub lock_acquisitions: u64,
    /// Writes that gave up waiting for the file lock (kept in memory).
    pub lock_timeouts: u64,
    /// The median wait for the file lock, in microseconds: the upper bound of its power-of-two bucket.
    pub lock_wait_us_p50: u64,
    /// The 99th percentile of the lock wait, bucketed as `lock_wait_us_p50`.
    pub lock_wait_us_p99: u64,
    /// Writes that failed with an I/O error.
    pub write_errors: u64,
    /// Puts and deletes kept in memory only (read-only or memory mode, failures).
    pub memory_only_puts: u64,
    /// Times the view checked the file for appends or a replacement.
    pub refreshes: u64,
    /// Times the view moved to a new file (another process's compaction, a replacement).
    pub reopens: u64,
    /// Times this process found the file shorter than what it had validated (see
    /// [`DiskIndex::refresh`](super::DiskIndex::refresh)); the view was rebuilt, and a writer
    /// rewrote the file.
    pub shrinks_seen: u64,
    /// Live keys in the file as this process sees it (memory-only entries excluded).
    pub entries: u64,
    /// The validated length of the file.
    pub file_bytes: u64,
    /// Bytes of the records that are still live (the rest is dead until compaction).
    pub live_bytes: u64,
    /// The file's generation (one more for every compaction).
    pub generation: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) appends: AtomicU64,
    pub(super) dedup_skips: AtomicU64,
    pub(super) torn_tails_padded: AtomicU64,
    pub(super) invalid_bytes_padded: AtomicU64,
    pub(super) corrupt_records_skipped: AtomicU64,
    pub(super) compactions: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) lock_acquisitions: AtomicU64,
    pub(super) lock_timeouts: AtomicU64,
    pub(super) write_errors: AtomicU64,
    pub(super) memory_only_puts: AtomicU64,
    pub(super) refreshes: AtomicU64,
    pub(super) reopens: AtomicU64,
    pub(super) shrinks_seen: AtomicU64,
    /// Power-of-two microsecond buckets of the time spent waiting for the file lock.
    pub(super) lock_wait: [AtomicU64; 32],
}

/// What the view contributes to a [`Stats`] snapshot (zeros without a view).
#[derive(Clone, Copy, Default)]
pub(super) struct ViewNumbers {
    pub(super) entries: u64,
    pub(super) file_bytes: u64,
    pub(super) live_bytes: u64,
    pub(super) generation: u64,
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

    /// A snapshot of the counters, with the view's numbers.
    pub(super) fn snapshot(&self, view: ViewNumbers) -> Stats {
        let c = self;
        let ViewNumbers { entries, file_bytes, live_bytes, generation } = view;
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
}
