//! Keeps a file that shrinks under a live mapping (a truncation, `cp` over the index, a tool)
//! from killing the process with SIGBUS.
//!
//! Invariant: the handler only ever touches addresses inside a registered index mapping. Every
//! index mapping is registered here for its whole life; a process-wide SIGBUS handler, installed
//! once and chained to the previous one, replaces a faulting page that lies inside a registered
//! mapping with a zero page and returns, so the read sees zeros, which never validate (a miss).
//! Faults anywhere else go to the previous handler unchanged (or kill the process as SIGBUS does
//! by default).

use std::cell::UnsafeCell;
use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

use memmap2::{Mmap, MmapOptions};
use std::sync::Once;

const SLOTS: usize = 1024;
static STARTS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static ENDS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static PAGE: AtomicUsize = AtomicUsize::new(4096);
/// Pages replaced by the handler since the process started.
pub static FAULTS: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

struct Prev(UnsafeCell<Option<libc::sigaction>>);
// SAFETY: written once inside `INSTALL` before the handler is installed; only read after.
unsafe impl Sync for Prev {}
static PREV: Prev = Prev(UnsafeCell::new(None));

fn install() {
    // SAFETY: plain libc calls on valid pointers to local, zero-initialised `sigaction`s (an
    // all-zero `sigaction` is a valid value); `PREV` is written here, inside `INSTALL`, before the
    // handler that reads it is installed, and never again.
    INSTALL.call_once(|| unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE);
        if page > 0 {
            PAGE.store(page as usize, SeqCst);
        }
        let mut prev: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut prev) != 0 {
            return;
        }
        *PREV.0.get() = Some(prev);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigbus as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
    });
}

fn inside(addr: usize) -> bool {
    (0..SLOTS).any(|i| {
        let s = STARTS[i].load(SeqCst);
        s != 0 && addr >= s && addr < ENDS[i].load(SeqCst)
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Async-signal-safe: atomics and mmap(2) only.
    // SAFETY: the kernel passes a valid `siginfo_t` to an SA_SIGINFO handler. The page replaced
    // with MAP_FIXED lies inside a registered index mapping, which nothing reads as memory Rust
    // owns (readers copy bytes out and validate them), so swapping it for a zero page breaks no
    // reference. `PREV` was written before this handler was installed and is only read here; the
    // previous handler is called with the signature its flags say it has.
    unsafe {
        let addr = (*info).si_addr() as usize;
        if inside(addr) {
            let page = PAGE.load(SeqCst);
            let at = addr & !(page - 1);
            let r = libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
            if r != libc::MAP_FAILED {
                FAULTS.fetch_add(1, SeqCst);
                return;
            }
        }
        match *PREV.0.get() {
            Some(prev) if prev.sa_flags & libc::SA_SIGINFO != 0 && prev.sa_sigaction > 1 => {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(prev.sa_sigaction);
                f(sig, info, ctx);
            }
            Some(prev) if prev.sa_sigaction > 1 => {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev.sa_sigaction);
                f(sig);
            }
            _ => {
                // The default action: die of SIGBUS as if we had never been installed.
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                libc::raise(libc::SIGBUS);
            }
        }
    }
}

/// A read-only mapping of `len` bytes of a file, registered with the handler for its life.
pub struct GuardedMap {
    map: Mmap,
    slot: usize,
}

impl GuardedMap {
    pub fn new(file: &File, len: usize) -> io::Result<Self> {
        install();
        // SAFETY: read-only; only bytes below the validated end are read, always copied out
        // and re-validated before use, and a page lost to a shrink reads as zeros.
        let map = unsafe { MmapOptions::new().len(len).map(file)? };
        let start = map.as_ptr() as usize;
        for slot in 0..SLOTS {
            if STARTS[slot].compare_exchange(0, usize::MAX, SeqCst, SeqCst).is_ok() {
                ENDS[slot].store(start + map.len(), SeqCst);
                STARTS[slot].store(start, SeqCst);
                return Ok(Self { map, slot });
            }
        }
        Err(io::Error::other("too many disk index mappings in this process"))
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // Deregister before `map` unmaps (fields drop after this body).
        ENDS[self.slot].store(0, SeqCst);
        STARTS[self.slot].store(0, SeqCst);
    }
}
