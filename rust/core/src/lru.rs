//! The in-memory cache: key encoding → value, bounded, shared between threads, lock-free hits.
//!
//! # Shape
//!
//! * **Shards.** The caller's 64-bit hash picks a shard by its top bits. Each shard owns an
//!   open-addressing table (linear probing) of `AtomicPtr<Entry>` slots, a `Mutex` that
//!   serialises *writers* of that shard, and its own SIEVE queue. Capacity is split evenly
//!   among shards (eviction is per shard, so a cache may evict a little before it holds
//!   `capacity` entries when keys hash unevenly).
//! * **Hit path: no lock, no shared write.** A lookup enters a `seize` guard (a store to the
//!   thread's own reservation word), loads the shard's table pointer, probes slots with
//!   acquire loads, compares the stored 64-bit hash and then the *full key bytes* (a hash
//!   collision costs one more probe, never a wrong value), sets the entry's `visited` bit only
//!   if it is clear (a hot entry's cache line is read, not written), and bumps a hit counter in
//!   a stripe that the thread owns (a plain store, no locked instruction). Two threads hitting one
//!   hot key therefore share no written cache line.
//! * **Writes** (insert, replace, remove, clear: one per compile) lock one shard, never call
//!   back into user code while holding it, and publish with release stores. Removed slots
//!   become tombstones; when tombstones plus live entries pass 3/4 of the table, the shard
//!   rebuilds a fresh table (sized for its live entries, so a huge `capacity` costs nothing
//!   until used) and swaps it in; readers on the old table still find every live entry.
//!
//! # Eviction: SIEVE
//!
//! Exact LRU needs a list move on every hit, i.e. a lock or a shared write on the hot path,
//! which is what this cache exists to avoid. SIEVE (Zhang et al., NSDI'24) keeps one FIFO queue
//! per shard and a `visited` bit per entry: a hit sets the bit; on insert into a full shard a
//! hand sweeps from the oldest entry towards the newest, clearing set bits, and evicts the first
//! entry whose bit is clear. Survivors stay in place (no moves), new entries enter at the head.
//! It is simpler than S3-FIFO (no ghost queue to size), keeps hits to at most one relaxed store,
//! and matches or beats LRU's miss ratio on skewed traces. `examples/lru_bench.rs` measures
//! SIEVE against an exact LRU on the same traces (figures in docs/keys.md). The sweep is bounded
//! to two laps so readers that keep re-setting bits cannot stall an insert.
//!
//! # Reclamation and displaced values
//!
//! A removed entry may still be read by a concurrent lookup, so it cannot be freed at once.
//! Each write retires what it unlinked (entries, an old table) as one batch through `seize`
//! (epoch-style reclamation with reference-counted batches; well kept, used by `papaya`).
//! When the last reader that could see the batch leaves, seize's reclaimer does *not* drop the
//! values: it pushes the batch onto this cache's lock-free "graveyard" stack. Every write call
//! (`insert`, `remove`, `remove_with`, `clear`, `take_displaced`) drains the graveyard and
//! returns the values, so the **caller** drops them, outside every lock of this cache. For a
//! Python value that means decref'ing on a thread attached to the interpreter, so `__del__`
//! runs at a well-defined point and may re-enter the cache. With no concurrent reader, a write
//! returns the values it displaced itself; with readers active, the batch reaches the graveyard
//! when the last of them leaves, and the values come back from the next write or
//! [`Cache::take_displaced`] ([`Cache::has_displaced`] is one load, cheap enough for a hit
//! path). seize releases a batch to readers only if it has an object per active reader, so a
//! write pads its batch with empty placeholders up to CPUs + 1 objects: with more readers inside
//! a lookup at that very moment, release waits for this thread's next write. Dropping the cache
//! drops everything still held, on the dropping thread.
//!
//! # Why not a crate
//!
//! No Rust cache crate combines bounded size with lock-free reads: quick_cache and moka take a
//! shard lock (or queue) per read, papaya and scc's `HashIndex` are unbounded maps without an
//! eviction policy, and writing SIEVE on top of papaya would need a second structure updated on
//! every insert anyway. The table here is small (fixed layout, writers serialised per shard), and
//! the subtle part, safe memory reclamation, is delegated to `seize`.

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use seize::{Collector, Guard, LocalGuard};

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

/// Most shards a cache may have (the shard index comes from the hash's top 6 bits).
pub const MAX_SHARDS: usize = 64;
/// Fewest entries per shard the default shard count aims for.
const MIN_PER_SHARD: usize = 256;
/// Smallest table a shard allocates.
const MIN_SLOTS: usize = 8;
/// Hit/miss counter stripes, each owned by one thread at a time (plus one shared overflow).
const STRIPES: usize = 64;
const NIL: u32 = u32::MAX;

struct Entry<V> {
    hash: u64,
    visited: AtomicBool,
    /// Index of this entry's SIEVE node; read and written only under the shard lock.
    node: AtomicU32,
    key: Box<[u8]>,
    value: V,
}

struct Table<V> {
    mask: usize,
    slots: Box<[AtomicPtr<Entry<V>>]>,
}

impl<V> Table<V> {
    fn with_slots(n: usize) -> Box<Self> {
        debug_assert!(n.is_power_of_two());
        let slots = (0..n).map(|_| AtomicPtr::new(ptr::null_mut())).collect();
        Box::new(Self { mask: n - 1, slots })
    }
}

/// Marks a slot whose entry was removed; never a real allocation (it is the type's alignment).
#[inline]
fn tombstone<V>() -> *mut Entry<V> {
    NonNull::<Entry<V>>::dangling().as_ptr()
}

/// One entry of a shard's SIEVE queue (a doubly linked list in a slab, indices as links).
struct Node<V> {
    entry: *mut Entry<V>,
    /// Towards the oldest end.
    older: u32,
    /// Towards the newest end.
    newer: u32,
}

/// A shard's write-side state, only touched under the shard lock.
struct ShardState<V> {
    nodes: Vec<Node<V>>,
    free: Vec<u32>,
    newest: u32,
    oldest: u32,
    hand: u32,
    live: usize,
    tombs: usize,
}

impl<V> ShardState<V> {
    fn new() -> Self {
        Self { nodes: Vec::new(), free: Vec::new(), newest: NIL, oldest: NIL, hand: NIL, live: 0, tombs: 0 }
    }

    /// Appends `entry` at the newest end and returns its node index.
    fn push_newest(&mut self, entry: *mut Entry<V>) -> u32 {
        let node = Node { entry, older: self.newest, newer: NIL };
        let i = if let Some(i) = self.free.pop() {
            self.nodes[i as usize] = node;
            i
        } else {
            let i = u32::try_from(self.nodes.len()).expect("a shard holds fewer than 2^32 entries");
            self.nodes.push(node);
            i
        };
        if self.newest == NIL {
            self.oldest = i;
        } else {
            self.nodes[self.newest as usize].newer = i;
        }
        self.newest = i;
        i
    }

    /// Unlinks node `i` and returns its entry.
    fn unlink(&mut self, i: u32) -> *mut Entry<V> {
        let Node { entry, older, newer } = std::mem::replace(
            &mut self.nodes[i as usize],
            Node { entry: ptr::null_mut(), older: NIL, newer: NIL },
        );
        if older == NIL {
            self.oldest = newer;
        } else {
            self.nodes[older as usize].newer = newer;
        }
        if newer == NIL {
            self.newest = older;
        } else {
            self.nodes[newer as usize].older = older;
        }
        if self.hand == i {
            self.hand = newer;
        }
        self.free.push(i);
        entry
    }

    /// SIEVE: picks and unlinks the victim. The shard must be non-empty.
    fn evict(&mut self) -> *mut Entry<V> {
        debug_assert!(self.oldest != NIL);
        let mut i = if self.hand == NIL { self.oldest } else { self.hand };
        // Readers may set bits again behind the hand; after two laps take whatever is there.
        for _ in 0..2 * self.live {
            // SAFETY: nodes in the list point at live entries owned by this shard.
            let e = unsafe { &*self.nodes[i as usize].entry };
            if !e.visited.load(Ordering::Relaxed) {
                break;
            }
            e.visited.store(false, Ordering::Relaxed);
            i = self.nodes[i as usize].newer;
            if i == NIL {
                i = self.oldest;
            }
        }
        self.hand = self.nodes[i as usize].newer;
        self.unlink(i)
    }

    /// The live entries, oldest first.
    fn entries(&self) -> impl Iterator<Item = *mut Entry<V>> + '_ {
        let mut i = self.oldest;
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let n = &self.nodes[i as usize];
            i = n.newer;
            Some(n.entry)
        })
    }
}

#[repr(align(128))]
struct Shard<V> {
    table: AtomicPtr<Table<V>>,
    state: Mutex<ShardState<V>>,
    cap: usize,
    len: AtomicUsize,
    inserts: AtomicU64,
    evictions: AtomicU64,
}

impl<V> Shard<V> {
    fn lock(&self) -> MutexGuard<'_, ShardState<V>> {
        // The critical sections never run user code, so a poisoned lock only means a panic
        // (allocation failure) between consistent states; keep going.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// 128 bytes: on x86 the adjacent-line prefetcher pairs 64-byte lines (as crossbeam's CachePadded).
#[repr(align(128))]
#[derive(Default)]
struct Stripe {
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Stripe {
    /// Adds one. A claimed stripe has a single writer thread, so a plain load + store is exact
    /// (and avoids a locked read-modify-write on every hit); the overflow stripe is shared.
    #[inline]
    fn bump(counter: &AtomicU64, exclusive: bool) {
        if exclusive {
            counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Stripe slots claimed by live threads, process-wide (the same index serves every cache).
static CLAIMED: [AtomicBool; STRIPES] = [const { AtomicBool::new(false) }; STRIPES];

/// A thread's claim on one counter stripe, released when the thread exits.
struct StripeClaim(usize);

impl StripeClaim {
    fn new() -> Self {
        for (i, slot) in CLAIMED.iter().enumerate() {
            if !slot.load(Ordering::Relaxed) && !slot.swap(true, Ordering::Acquire) {
                return Self(i);
            }
        }
        Self(STRIPES)
    }
}

impl Drop for StripeClaim {
    fn drop(&mut self) {
        if let Some(slot) = CLAIMED.get(self.0) {
            // Release: this thread's counts happen-before the next owner's.
            slot.store(false, Ordering::Release);
        }
    }
}

/// The current thread's stripe: its own (exclusive) while fewer than `STRIPES` threads use
/// caches, else the shared overflow stripe `STRIPES`.
#[inline]
fn stripe_index() -> usize {
    thread_local! {
        static STRIPE: StripeClaim = StripeClaim::new();
    }
    STRIPE.try_with(|s| s.0).unwrap_or(STRIPES)
}

/// The CPUs this process may use, read once: `available_parallelism` reads the cgroup files on
/// Linux (about 25 µs), and a JIT makes a cache per kernel.
fn cpus() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Objects retired per write (see `Cache::retire`): one more than the CPUs, so that a batch can
/// be handed to every reader that is likely to be active at once.
fn retire_batch() -> usize {
    cpus().min(256) + 1
}

/// What one write unlinked, retired through seize as a single object.
struct Retired<V> {
    entries: Vec<*mut Entry<V>>,
    table: *mut Table<V>,
    next: *mut Retired<V>,
    graveyard: *const AtomicPtr<Retired<V>>,
}

/// seize's reclaimer: no reader can reach the batch any more; hand it to the graveyard.
unsafe fn to_graveyard<V>(batch: *mut Retired<V>, _: &Collector) {
    // SAFETY: `batch` came from `Box::into_raw` in `Cache::retire`; the graveyard is boxed by
    // its cache, which outlives its collector (see `Drop for Cache`).
    let graveyard = unsafe { &*(*batch).graveyard };
    let mut head = graveyard.load(Ordering::Relaxed);
    loop {
        // SAFETY: we own `batch` until the CAS publishes it.
        unsafe { (*batch).next = head };
        match graveyard.compare_exchange_weak(head, batch, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}

/// A bounded concurrent map from a key's canonical encoding to `V`.
///
/// `hash` arguments are the caller's in-memory hash of `key` (`FastHashState::hash`, seeded per
/// process); keys are always compared by their full bytes, so a hash collision can never return
/// another key's value. See the module documentation for the design.
pub struct Cache<V> {
    shards: Box<[Shard<V>]>,
    shard_mask: usize,
    capacity: usize,
    stripes: Box<[Stripe]>,
    collector: Collector,
    graveyard: Box<AtomicPtr<Retired<V>>>,
}

// SAFETY: entries are shared between threads through atomics (values are read as `&V` by any
// thread, and moved to whichever thread drains the graveyard), hence `V: Send + Sync`.
unsafe impl<V: Send + Sync> Send for Cache<V> {}
// SAFETY: as above; all shared mutation goes through atomics or the shard mutex.
unsafe impl<V: Send + Sync> Sync for Cache<V> {}

enum Probe<V> {
    Found(usize, *mut Entry<V>),
    Vacant,
}

impl<V> Cache<V> {
    /// A cache holding at most `capacity` entries (`capacity >= 1`).
    ///
    /// `shards` is a hint, rounded up to a power of two and clamped to `1..=min(64, capacity)`.
    /// By default it is the available parallelism rounded down to a power of two, but no more
    /// than leaves 256 entries per shard: hits never take a lock, so shards only spread *writers*.
    ///
    /// # Panics
    /// If `capacity` is 0.
    #[must_use]
    pub fn new(capacity: usize, shards: Option<usize>) -> Self {
        assert!(capacity > 0, "capacity must be at least 1");
        let limit = capacity.min(MAX_SHARDS);
        let n = match shards {
            Some(s) => s.clamp(1, MAX_SHARDS).next_power_of_two(),
            None => {
                let n = cpus().min(capacity / MIN_PER_SHARD).max(1);
                1 << n.ilog2()
            }
        };
        // Largest power of two <= limit, if `n` exceeds it.
        let n = if n > limit { 1 << limit.ilog2() } else { n };
        let shards = (0..n)
            .map(|i| Shard {
                table: AtomicPtr::new(Box::into_raw(Table::with_slots(MIN_SLOTS))),
                state: Mutex::new(ShardState::new()),
                cap: capacity / n + usize::from(i < capacity % n),
                len: AtomicUsize::new(0),
                inserts: AtomicU64::new(0),
                evictions: AtomicU64::new(0),
            })
            .collect();
        Self {
            shards,
            shard_mask: n - 1,
            capacity,
            stripes: (0..=STRIPES).map(|_| Stripe::default()).collect(),
            collector: Collector::new().batch_size(retire_batch()),
            graveyard: Box::new(AtomicPtr::new(ptr::null_mut())),
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<V> {
        &self.shards[(hash >> 58) as usize & self.shard_mask]
    }

    /// Finds `key` in a shard's current table.
    #[inline]
    fn find<'g>(guard: &'g LocalGuard<'_>, shard: &Shard<V>, hash: u64, key: &[u8]) -> Option<&'g Entry<V>> {
        Self::find_by(guard, shard, hash, |k, _| k == key)
    }

    /// Finds the entry with `hash` for which `is_key(stored key bytes, stored value)` holds.
    #[inline]
    fn find_by<'g>(
        guard: &'g LocalGuard<'_>,
        shard: &Shard<V>,
        hash: u64,
        mut is_key: impl FnMut(&[u8], &V) -> bool,
    ) -> Option<&'g Entry<V>> {
        // SAFETY: tables and entries loaded under `guard` stay allocated until it is dropped
        // (they are retired through the same collector only after being unlinked).
        let table = unsafe { &*guard.protect(&shard.table, Ordering::Acquire) };
        let mut i = hash as usize & table.mask;
        for _ in 0..=table.mask {
            let p = guard.protect(&table.slots[i], Ordering::Acquire);
            if p.is_null() {
                return None;
            }
            if p != tombstone() {
                // SAFETY: as above.
                let e = unsafe { &*p };
                if e.hash == hash && is_key(&e.key, &e.value) {
                    return Some(e);
                }
            }
            i = (i + 1) & table.mask;
        }
        None
    }

    /// Calls `f` with the value stored under `key` (marking it recently used) and returns its
    /// result, or `None` on a miss. Takes no lock. `f` runs while the entry is protected from
    /// reclamation; it should be short (e.g. clone a handle) and must not block on this cache.
    #[inline]
    pub fn get_with<R>(&self, hash: u64, key: &[u8], f: impl FnOnce(&V) -> R) -> Option<R> {
        self.get_with_eq(hash, |k, _| k == key, f)
    }

    /// Like [`Cache::get_with`], but the caller decides which stored entry with `hash` is its
    /// key: `is_key(stored key bytes, stored value)`. For callers that can compare a probe with
    /// what they stored more cheaply than by re-encoding it (e.g. structurally). `is_key` must
    /// agree with byte equality of the stored keys: it may be true for at most one entry.
    #[inline]
    pub fn get_with_eq<R>(
        &self,
        hash: u64,
        is_key: impl FnMut(&[u8], &V) -> bool,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let shard = self.shard(hash);
        let guard = self.collector.enter();
        let out = Self::find_by(&guard, shard, hash, is_key).map(|e| {
            if !e.visited.load(Ordering::Relaxed) {
                e.visited.store(true, Ordering::Relaxed);
            }
            f(&e.value)
        });
        drop(guard);
        let i = stripe_index();
        let stripe = &self.stripes[i];
        Stripe::bump(if out.is_some() { &stripe.hits } else { &stripe.misses }, i < STRIPES);
        out
    }

    /// [`Cache::get_with_eq`] for a caller that serialises every use of this cache, e.g. by holding
    /// a global interpreter lock across each call: no reclamation guard is entered, and the hit or
    /// miss is counted in the shared overflow stripe with a plain load and store. On the hit path
    /// that saves the guard's thread-local lookup and its atomic swap on leaving, and the counter
    /// stripe's thread-local lookup. With `count_miss` false a miss is not counted (for a caller
    /// that goes on to a counted lookup of the same key).
    ///
    /// # Safety
    /// While this call runs (`is_key` and `f` included), no other thread may call any method of
    /// this cache. Then no write can unlink and reclaim what the probe reads, and the overflow
    /// stripe has one writer.
    #[inline]
    pub unsafe fn get_with_eq_serialized<R>(
        &self,
        hash: u64,
        count_miss: bool,
        mut is_key: impl FnMut(&[u8], &V) -> bool,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        let shard = self.shard(hash);
        // SAFETY: per the contract no write runs concurrently, so the current table and every
        // entry it links stay allocated until this call returns (writes retire them only after
        // unlinking, and free them only inside a write call).
        let table = unsafe { &*shard.table.load(Ordering::Acquire) };
        let mut i = hash as usize & table.mask;
        let mut found = None;
        for _ in 0..=table.mask {
            let p = table.slots[i].load(Ordering::Acquire);
            if p.is_null() {
                break;
            }
            if p != tombstone() {
                // SAFETY: as above: a linked entry is live while no write runs.
                let e = unsafe { &*p };
                if e.hash == hash && is_key(&e.key, &e.value) {
                    found = Some(e);
                    break;
                }
            }
            i = (i + 1) & table.mask;
        }
        let out = found.map(|e| {
            if !e.visited.load(Ordering::Relaxed) {
                e.visited.store(true, Ordering::Relaxed);
            }
            f(&e.value)
        });
        // The overflow stripe, exclusively: the contract makes this thread its only writer now.
        let stripe = &self.stripes[STRIPES];
        if out.is_some() {
            Stripe::bump(&stripe.hits, true);
        } else if count_miss {
            Stripe::bump(&stripe.misses, true);
        }
        out
    }

    /// Like [`Cache::get_with`] but without touching recency or counters. Takes no lock.
    pub fn peek_with<R>(&self, hash: u64, key: &[u8], f: impl FnOnce(&V) -> R) -> Option<R> {
        let guard = self.collector.enter();
        Self::find(&guard, self.shard(hash), hash, key).map(|e| f(&e.value))
    }

    /// Whether `key` is present, without touching recency or counters. Takes no lock.
    pub fn contains(&self, hash: u64, key: &[u8]) -> bool {
        let guard = self.collector.enter();
        Self::find(&guard, self.shard(hash), hash, key).is_some()
    }

    /// Probes under the shard lock (the table cannot change under us).
    fn probe_locked(table: &Table<V>, hash: u64, key: &[u8]) -> Probe<V> {
        let mut i = hash as usize & table.mask;
        for _ in 0..=table.mask {
            let p = table.slots[i].load(Ordering::Relaxed);
            if p.is_null() {
                return Probe::Vacant;
            }
            if p != tombstone() {
                // SAFETY: under the shard lock every entry in the table is live.
                let e = unsafe { &*p };
                if e.hash == hash && *e.key == *key {
                    return Probe::Found(i, p);
                }
            }
            i = (i + 1) & table.mask;
        }
        Probe::Vacant
    }

    /// Index of the slot holding exactly `entry` (which must be in the table).
    fn slot_of(table: &Table<V>, entry: *mut Entry<V>) -> usize {
        // SAFETY: `entry` is live (caller holds the shard lock and just unlinked it).
        let mut i = unsafe { (*entry).hash } as usize & table.mask;
        while table.slots[i].load(Ordering::Relaxed) != entry {
            i = (i + 1) & table.mask;
        }
        i
    }

    /// Stores `value` under `key`, evicting (SIEVE) if the key's shard is full.
    ///
    /// Returns displaced values whose readers are done (see the module documentation): usually
    /// the replaced or evicted value itself; drop them outside every lock.
    pub fn insert(&self, hash: u64, key: &[u8], value: V) -> Vec<V> {
        let shard = self.shard(hash);
        let new = Box::into_raw(Box::new(Entry {
            hash,
            visited: AtomicBool::new(false),
            node: AtomicU32::new(NIL),
            key: key.into(),
            value,
        }));
        let mut retired = Vec::new();
        let mut old_table = ptr::null_mut();
        {
            let mut st = shard.lock();
            // SAFETY: the current table is only replaced under this lock.
            let table = unsafe { &*shard.table.load(Ordering::Relaxed) };
            match Self::probe_locked(table, hash, key) {
                Probe::Found(i, old) => {
                    // SAFETY: `old` is live under the lock; `new` is ours until published.
                    let (node, visited) = unsafe {
                        ((*old).node.load(Ordering::Relaxed), (*old).visited.load(Ordering::Relaxed))
                    };
                    // SAFETY: `new` came from `Box::into_raw` above and is not published yet: this
                    // thread has the only pointer to it.
                    unsafe {
                        (*new).node.store(node, Ordering::Relaxed);
                        (*new).visited.store(visited, Ordering::Relaxed);
                    }
                    st.nodes[node as usize].entry = new;
                    table.slots[i].store(new, Ordering::Release);
                    retired.push(old);
                }
                Probe::Vacant => {
                    if st.live >= shard.cap {
                        let victim = st.evict();
                        let j = Self::slot_of(table, victim);
                        table.slots[j].store(tombstone(), Ordering::Release);
                        st.live -= 1;
                        st.tombs += 1;
                        retired.push(victim);
                        shard.evictions.fetch_add(1, Ordering::Relaxed);
                    }
                    let node = st.push_newest(new);
                    // SAFETY: `new` is ours until published.
                    unsafe { (*new).node.store(node, Ordering::Relaxed) };
                    st.live += 1;
                    if (st.live + st.tombs) * 4 > table.slots.len() * 3 {
                        old_table = Self::rebuild(shard, &st);
                        st.tombs = 0;
                    } else {
                        let mut i = hash as usize & table.mask;
                        loop {
                            let p = table.slots[i].load(Ordering::Relaxed);
                            if p.is_null() || p == tombstone() {
                                if !p.is_null() {
                                    st.tombs -= 1;
                                }
                                table.slots[i].store(new, Ordering::Release);
                                break;
                            }
                            i = (i + 1) & table.mask;
                        }
                    }
                }
            }
            shard.inserts.fetch_add(1, Ordering::Relaxed);
            shard.len.store(st.live, Ordering::Relaxed);
        }
        self.retire(retired, old_table);
        self.take_displaced()
    }

    /// Publishes a fresh table holding the shard's live entries; returns the old one to retire.
    fn rebuild(shard: &Shard<V>, st: &ShardState<V>) -> *mut Table<V> {
        let table = Table::with_slots((st.live * 2).next_power_of_two().max(MIN_SLOTS));
        for e in st.entries() {
            // SAFETY: entries in the queue are live.
            let mut i = unsafe { (*e).hash } as usize & table.mask;
            while !table.slots[i].load(Ordering::Relaxed).is_null() {
                i = (i + 1) & table.mask;
            }
            table.slots[i].store(e, Ordering::Relaxed);
        }
        shard.table.swap(Box::into_raw(table), Ordering::AcqRel)
    }

    /// Retires what a write unlinked (after its lock was released).
    fn retire(&self, entries: Vec<*mut Entry<V>>, table: *mut Table<V>) {
        if entries.is_empty() && table.is_null() {
            return;
        }
        // seize hands a batch to the readers active at retirement only if it holds at least one
        // object per active reader; otherwise it keeps it in this thread's local batch until this
        // thread retires more. So every write retires its batch plus empty placeholders up to
        // the collector's batch size, and the batch is released as soon as its readers leave.
        let graveyard: *const AtomicPtr<Retired<V>> = &*self.graveyard;
        let mut first = Some((entries, table));
        for _ in 0..retire_batch() {
            let (entries, table) = first.take().unwrap_or((Vec::new(), ptr::null_mut()));
            let batch = Box::into_raw(Box::new(Retired { entries, table, next: ptr::null_mut(), graveyard }));
            // SAFETY: everything in `batch` is unreachable for threads that enter from now on
            // (unlinked under the shard lock), and the batch is a `Box` as `to_graveyard` expects.
            unsafe { self.collector.retire(batch, to_graveyard::<V>) };
        }
    }

    /// Whether displaced values are waiting to be handed back (one relaxed load).
    #[inline]
    pub fn has_displaced(&self) -> bool {
        !self.graveyard.load(Ordering::Relaxed).is_null()
    }

    /// Removes `key`; `f` sees its value (e.g. to clone a handle) before it is retired.
    /// Returns `f`'s result (or `None` if absent) and the displaced values ready to drop.
    pub fn remove_with<R>(&self, hash: u64, key: &[u8], f: impl FnOnce(&V) -> R) -> (Option<R>, Vec<V>) {
        let shard = self.shard(hash);
        let removed = {
            let mut st = shard.lock();
            // SAFETY: the current table is only replaced under this lock.
            let table = unsafe { &*shard.table.load(Ordering::Relaxed) };
            match Self::probe_locked(table, hash, key) {
                Probe::Vacant => None,
                Probe::Found(i, e) => {
                    table.slots[i].store(tombstone(), Ordering::Release);
                    // SAFETY: `e` is live under the lock.
                    let node = unsafe { (*e).node.load(Ordering::Relaxed) };
                    st.unlink(node);
                    st.live -= 1;
                    st.tombs += 1;
                    shard.len.store(st.live, Ordering::Relaxed);
                    Some(e)
                }
            }
        };
        let Some(e) = removed else {
            return (None, self.take_displaced());
        };
        // SAFETY: unlinked but not yet retired, so still allocated; `f` runs outside the lock.
        let out = f(unsafe { &(*e).value });
        self.retire(vec![e], ptr::null_mut());
        (Some(out), self.take_displaced())
    }

    /// Removes `key`; returns whether it was present and the displaced values ready to drop.
    pub fn remove(&self, hash: u64, key: &[u8]) -> (bool, Vec<V>) {
        let (found, displaced) = self.remove_with(hash, key, |_| ());
        (found.is_some(), displaced)
    }

    /// Removes every entry; returns the displaced values ready to drop.
    pub fn clear(&self) -> Vec<V> {
        for shard in &*self.shards {
            let (entries, old) = {
                let mut st = shard.lock();
                let entries: Vec<_> = st.entries().collect();
                *st = ShardState::new();
                shard.len.store(0, Ordering::Relaxed);
                let fresh = Box::into_raw(Table::with_slots(MIN_SLOTS));
                (entries, shard.table.swap(fresh, Ordering::AcqRel))
            };
            self.retire(entries, old);
        }
        self.take_displaced()
    }

    /// Values displaced earlier whose readers have all finished (see the module docs).
    pub fn take_displaced(&self) -> Vec<V> {
        let mut out = Vec::new();
        let mut p = self.graveyard.swap(ptr::null_mut(), Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: the graveyard holds boxed batches nobody else can reach any more.
            let batch = unsafe { Box::from_raw(p) };
            p = batch.next;
            if !batch.table.is_null() {
                // SAFETY: an old table, boxed, unreachable.
                drop(unsafe { Box::from_raw(batch.table) });
            }
            for e in batch.entries {
                // SAFETY: a boxed entry, unreachable.
                let Entry { value, .. } = *unsafe { Box::from_raw(e) };
                out.push(value);
            }
        }
        out
    }

    /// Calls `f` on every value held now (a lock-free snapshot; concurrent writes may or may
    /// not be seen). For garbage-collector traversal.
    pub fn for_each_value(&self, mut f: impl FnMut(&V)) {
        let guard = self.collector.enter();
        for shard in &*self.shards {
            // SAFETY: protected by `guard` as in `find`.
            let table = unsafe { &*guard.protect(&shard.table, Ordering::Acquire) };
            for slot in &*table.slots {
                let p = guard.protect(slot, Ordering::Acquire);
                if !p.is_null() && p != tombstone() {
                    // SAFETY: as above.
                    f(unsafe { &(*p).value });
                }
            }
        }
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len.load(Ordering::Relaxed)).sum()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The capacity given at construction.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let mut s = Stats { capacity: self.capacity as u64, size: self.len() as u64, ..Stats::default() };
        for st in &*self.stripes {
            s.hits += st.hits.load(Ordering::Relaxed);
            s.misses += st.misses.load(Ordering::Relaxed);
        }
        for sh in &*self.shards {
            s.inserts += sh.inserts.load(Ordering::Relaxed);
            s.evictions += sh.evictions.load(Ordering::Relaxed);
        }
        s
    }
}

impl<V> Drop for Cache<V> {
    fn drop(&mut self) {
        for shard in &mut *self.shards {
            let st = shard.state.get_mut().unwrap_or_else(PoisonError::into_inner);
            for e in st.entries() {
                // SAFETY: `&mut self`: no reader exists; every live entry is boxed and owned here.
                drop(unsafe { Box::from_raw(e) });
            }
            // SAFETY: as above, for the current table.
            drop(unsafe { Box::from_raw(*shard.table.get_mut()) });
        }
        // SAFETY: `&mut self`: no thread can access the collector or a retired batch. This moves
        // every pending batch to the graveyard, which is still alive.
        unsafe { self.collector.reclaim_all() };
        drop(self.take_displaced());
    }
}

impl<V> std::fmt::Debug for Cache<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("capacity", &self.capacity)
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
