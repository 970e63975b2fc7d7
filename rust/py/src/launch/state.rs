//! What a warm launch reads from Triton's Python objects, read once and kept while nothing that
//! could change it has run (the *watched* state), or read on every call where that cannot be proven.
//!
//! Triton's `JITFunction.run` reads, per call: the kernel's `debug`, `pre_run_hooks`,
//! `device_caches` and `used_global_vals`; `knobs.runtime.debug` and every knob it folds into the
//! launch options (`knobs.<section>.<attr>`, found in its source by `jitkey/triton/_installed.py`);
//! `knobs.runtime.add_stages_inspection_hook` (3.7+); `knobs.runtime.launch_enter_hook` and
//! `launch_exit_hook`. A [`State`] is all of them as read at one moment.
//!
//! Watched (`jitkey/triton/_watch.py` made every Python path that can rebind them call
//! `_watch_bump()`: `TritonKernel.__setattr__`/`__delattr__`, the knob classes' `__setattr__` and
//! `__delattr__` (descriptors included, so the env knobs' setters too), the knobs' `scope()`, and
//! `HookChain.__setattr__`), a state is reused while
//! - [`VERSION`] is still the one it was read at;
//! - every `knobs.<section>` is still the object it was read from (a module attribute assignment,
//!   as Triton's own `fresh_knobs` test fixture makes, is checked per call: one dict lookup each);
//! - the C environment is still the one it was read with, when a knob value came from one of
//!   Triton's env descriptors (they read `getenv`): compared by the pointer array of `environ`.
//!
//! What is never kept, in either mode: the contents of the objects a state holds. Per call,
//! `pre_run_hooks` and each hook chain's `calls` are checked for emptiness, `device_caches` and the
//! kernel cache in it are looked up, and the globals check runs when `used_global_vals` is non-empty.
//!
//! Anything the watch cannot prove (watching off or not installed, a kernel whose class replaces the
//! watched `__setattr__`, a knob section of a class jitkey does not watch, a knob attribute that is
//! neither a plain value nor one of Triton's env descriptors, an env knob without glibc) makes the
//! state read on every call, as before this existed: counted, with the reason (`state_counts()`).

use std::ffi::c_char;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use super::Launcher;
use crate::errors::ArgumentError;
use crate::keys::{encode_into, with_encoder};

/// The watch version: bumped by every watched write path; a kept state is valid only at the
/// version it was read at.
static VERSION: AtomicU64 = AtomicU64::new(1);

/// `_watch_bump()`: something a launch reads from Python objects may have changed.
#[pyfunction]
pub(crate) fn _watch_bump() {
    VERSION.fetch_add(1, Ordering::AcqRel);
}

/// `_watch_version() -> int`: the current watch version (tests).
#[pyfunction]
fn _watch_version() -> u64 {
    watch_version()
}

/// The current watch version: what a kept read is valid at.
#[inline]
pub(super) fn watch_version() -> u64 {
    VERSION.load(Ordering::Acquire)
}

/// Why a state is read per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    /// Watching is off for this launcher (process-wide or this kernel's class: the launcher's `off`).
    Off,
    /// `knobs.<sections[i]>` is not the module's own attribute.
    Section(usize),
    /// `knobs.<section>.<attr>` (read `i`: `reads` order, see `Launcher::read_name`) is not a value
    /// the watch covers (the section's class, or the attribute's kind, is unknown to it).
    Knob(usize),
    /// An env knob was read and the C environment cannot be compared here.
    Env,
}

impl Why {
    fn code(self) -> u32 {
        match self {
            Why::Off => 1,
            Why::Env => 2,
            Why::Section(i) => 0x100 | i as u32,
            Why::Knob(i) => 0x1_0000 | i as u32,
        }
    }

    fn from_code(c: u32) -> Option<Why> {
        match c {
            0 => None,
            1 => Some(Why::Off),
            2 => Some(Why::Env),
            c if c & 0x1_0000 != 0 => Some(Why::Knob((c & 0xFFFF) as usize)),
            c => Some(Why::Section((c & 0xFF) as usize)),
        }
    }
}

/// Why a knob value makes the call fall back: an `ArgumentError` naming it, caused by the key's error.
fn unkeyable(py: Python<'_>, what: &str, e: crate::keys::WalkError) -> Py<PyAny> {
    let err = ArgumentError::new_err(format!("{what} is not keyable"));
    err.set_cause(py, Some(e.into_pyerr(py, what)));
    err.into_value(py).into_any()
}

/// What reading a state found out so far: why it cannot be kept, whether an env knob was read.
struct Seen {
    why: Option<Why>,
    env: bool,
}

/// The knob state's key bytes: inline up to 64 (a few knobs: a handful of tagged bools and short
/// strings), else on the heap.
pub(super) enum KnobBytes {
    Inline(u8, [u8; 64]),
    Heap(Box<[u8]>),
}

impl KnobBytes {
    fn new(bytes: &[u8]) -> Self {
        if bytes.len() <= 64 {
            let mut b = [0u8; 64];
            b[..bytes.len()].copy_from_slice(bytes);
            KnobBytes::Inline(bytes.len() as u8, b)
        } else {
            KnobBytes::Heap(bytes.into())
        }
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        match self {
            KnobBytes::Inline(n, b) => &b[..usize::from(*n)],
            KnobBytes::Heap(b) => b,
        }
    }
}

/// A handle on a Python object a state holds: `Py` in a kept state, `Bound` in one read for a single
/// call (dropped without pyo3's check for an attached thread, and with no allocation to share it).
pub(super) trait Obj<'py> {
    fn b(&self, py: Python<'py>) -> &Bound<'py, PyAny>;
}

impl<'py> Obj<'py> for Py<PyAny> {
    #[inline]
    fn b(&self, py: Python<'py>) -> &Bound<'py, PyAny> {
        self.bind(py)
    }
}

impl<'py> Obj<'py> for Bound<'py, PyAny> {
    #[inline]
    fn b(&self, _py: Python<'py>) -> &Bound<'py, PyAny> {
        self
    }
}

/// A launch hook as read: the object Triton passes, and for a `HookChain` its `calls` (checked for
/// emptiness per call).
pub(super) struct Hook<O> {
    pub(super) obj: O,
    calls: Option<O>,
}

impl<'py> Hook<Bound<'py, PyAny>> {
    /// A launch hook as read from the knobs: for an object of exactly `hook_chain`'s class (Triton's
    /// `HookChain`), its `calls` too.
    pub(super) fn read(
        py: Python<'py>,
        obj: Bound<'py, PyAny>,
        hook_chain: Option<&Py<PyAny>>,
    ) -> PyResult<Self> {
        let calls = match hook_chain {
            Some(t) if obj.get_type().is(t.bind(py)) => Some(obj.getattr(intern!(py, "calls"))?),
            _ => None,
        };
        Ok(Hook { obj, calls })
    }

    pub(super) fn unbind(self) -> Hook<Py<PyAny>> {
        Hook { obj: self.obj.unbind(), calls: self.calls.map(Bound::unbind) }
    }
}

impl Hook<Py<PyAny>> {
    pub(super) fn visit(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.obj)?;
        if let Some(c) = &self.calls {
            visit.call(c)?;
        }
        Ok(())
    }
}

impl<O> Hook<O> {
    /// Whether calling the hook does nothing: `None`, or a `HookChain` (the exact class) whose
    /// `calls` is empty. Anything else is a hook.
    pub(super) fn is_empty<'py>(&self, py: Python<'py>) -> PyResult<bool>
    where
        O: Obj<'py>,
    {
        if self.obj.b(py).is_none() {
            return Ok(true);
        }
        match &self.calls {
            Some(c) => Ok(!c.b(py).is_truthy()?),
            None => Ok(false),
        }
    }
}

/// What a launch reads from Triton's Python objects, as read at one moment.
pub(super) struct State<O> {
    version: u64,
    why: Option<Why>,
    /// `environ`'s pointers when the state was read, if an env knob was read.
    env: Option<Box<[usize]>>,
    /// The `knobs.<section>` objects, in `Launcher::sections` order.
    sections: Vec<O>,
    pub(super) pre_run_hooks: O,
    pub(super) device_caches: O,
    pub(super) used_global_vals: O,
    /// The key bytes of `fn.debug`, `knobs.runtime.debug` and each knob read, or why the call
    /// falls back (a value the key cannot hold).
    pub(super) key: Result<KnobBytes, Py<PyAny>>,
    /// `knobs.runtime.add_stages_inspection_hook` is set (Triton >= 3.7 keys on it: fall back).
    pub(super) stages_hook: bool,
    pub(super) enter: Hook<O>,
    pub(super) exit: Hook<O>,
}

impl<'py> State<Bound<'py, PyAny>> {
    fn unbind(self) -> State<Py<PyAny>> {
        State {
            version: self.version,
            why: self.why,
            env: self.env,
            sections: self.sections.into_iter().map(Bound::unbind).collect(),
            pre_run_hooks: self.pre_run_hooks.unbind(),
            device_caches: self.device_caches.unbind(),
            used_global_vals: self.used_global_vals.unbind(),
            key: self.key,
            stages_hook: self.stages_hook,
            enter: self.enter.unbind(),
            exit: self.exit.unbind(),
        }
    }
}

/// This call's state: the kept one, or one read for this call only.
pub(super) enum Current<'py> {
    Kept(Arc<State<Py<PyAny>>>),
    Read(State<Bound<'py, PyAny>>),
}

/// How a launcher keeps its state, and what it counted.
#[derive(Default)]
pub(super) struct Kept {
    state: Mutex<Option<Arc<State<Py<PyAny>>>>>,
    /// Calls served by the kept state.
    watched: AtomicU64,
    /// States read from the objects (every call when unwatched).
    reads: AtomicU64,
    /// The reason of the last state read per call (`Why::code`; 0: the last read was kept).
    last_why: AtomicU32,
}

impl Launcher {
    /// This call's state: the kept one while it is valid, else read now (and kept when watched).
    pub(super) fn state<'py>(&self, py: Python<'py>) -> PyResult<Current<'py>> {
        if self.watch.is_some() {
            let kept = self.kept.state.lock().unwrap_or_else(PoisonError::into_inner).clone();
            if let Some(s) = kept {
                if self.still_valid(py, &s) {
                    // A statistic: exact while the GIL serialises calls, approximate without it (no
                    // locked instruction per launch for it).
                    let n = self.kept.watched.load(Ordering::Relaxed);
                    self.kept.watched.store(n + 1, Ordering::Relaxed);
                    return Ok(Current::Kept(s));
                }
            }
        }
        let s = self.read_state(py)?;
        self.kept.reads.fetch_add(1, Ordering::Relaxed);
        self.kept.last_why.store(s.why.map_or(0, Why::code), Ordering::Relaxed);
        if s.why.is_some() {
            return Ok(Current::Read(s));
        }
        let s = Arc::new(s.unbind());
        // The state replaced is dropped after the lock is released (a drop may run Python code that
        // launches this kernel again).
        let _old = self.kept.state.lock().unwrap_or_else(PoisonError::into_inner).replace(s.clone());
        Ok(Current::Kept(s))
    }

    fn still_valid(&self, py: Python<'_>, s: &State<Py<PyAny>>) -> bool {
        if s.version != VERSION.load(Ordering::Acquire) {
            return false;
        }
        let dict = self.knobs_dict.bind(py);
        for (name, obj) in self.sections.iter().zip(&s.sections) {
            // SAFETY: a dict and an exact str, both alive: the lookup runs no Python code and cannot
            // fail (no error is set); it returns a borrowed reference or null.
            let cur = unsafe { ffi::PyDict_GetItemWithError(dict.as_ptr(), name.as_ptr()) };
            if cur != obj.as_ptr() {
                return false;
            }
        }
        s.env.as_deref().is_none_or(env::same)
    }

    /// Reads everything a launch reads from Triton's objects (Python attribute reads, as Triton
    /// makes them) and whether the result may be kept.
    fn read_state<'py>(&self, py: Python<'py>) -> PyResult<State<Bound<'py, PyAny>>> {
        let version = VERSION.load(Ordering::Acquire); // before any read: a bump during it invalidates
        let environ = if self.watch.is_some() { env::snapshot() } else { None };
        let mut why = if self.watch.is_some() { None } else { Some(Why::Off) };
        let kfn = self.kernel_fn.bind(py);
        let pre_run_hooks = kfn.getattr(intern!(py, "pre_run_hooks"))?;
        let fn_debug = kfn.getattr(intern!(py, "debug"))?;
        let device_caches = kfn.getattr(intern!(py, "device_caches"))?;
        let used_global_vals = kfn.getattr(intern!(py, "used_global_vals"))?;
        let module = self.knobs_module.bind(py);
        let plain_module = module.get_type().is(py.get_type::<PyModule>());
        let dict = self.knobs_dict.bind(py);
        let mut sections = Vec::with_capacity(self.sections.len());
        for (i, name) in self.sections.iter().enumerate() {
            // `knobs.<section>` as Triton reads it: for a plain module, its dict entry when it has one
            // (what the module's getattr returns then), else the module's getattr itself.
            let (obj, from_dict) = match dict.get_item(name.bind(py))? {
                Some(o) if plain_module => (o, true),
                _ => (module.getattr(name.bind(py))?, false),
            };
            if why.is_none() && !from_dict {
                why = Some(Why::Section(i));
            }
            sections.push(obj);
        }
        let mut seen = Seen { why, env: false };
        let runtime = &sections[0];
        let debug_name = intern!(py, "debug");
        let debug = runtime.getattr(debug_name)?;
        self.classify(py, &mut seen, runtime, debug_name, 0)?;
        let mut stages_hook = false;
        if self.check_stages {
            let name = intern!(py, "add_stages_inspection_hook");
            stages_hook = !runtime.getattr(name)?.is_none();
            self.classify(py, &mut seen, runtime, name, 1)?;
        }
        let mut hooks = [None, None];
        for (slot, (name, read)) in hooks
            .iter_mut()
            .zip([(intern!(py, "launch_enter_hook"), 2), (intern!(py, "launch_exit_hook"), 3)])
        {
            let obj = runtime.getattr(name)?;
            self.classify(py, &mut seen, runtime, name, read)?;
            *slot = Some(Hook::read(py, obj, self.hook_chain.as_ref())?);
        }
        // The knob state's key bytes, written through the thread-local encoder (no allocation).
        let key = with_encoder(|enc| -> PyResult<Result<KnobBytes, Py<PyAny>>> {
            let mut failed = None;
            let mut put = |v: &Bound<'_, PyAny>, what: &dyn Fn() -> String| {
                if failed.is_none() {
                    if let Err(e) = encode_into(v, enc) {
                        failed = Some(unkeyable(py, &what(), e));
                    }
                }
            };
            put(&fn_debug, &|| "fn.debug".to_owned());
            put(&debug, &|| "knobs.runtime.debug".to_owned());
            for (i, (section, attr)) in self.knob_reads.iter().enumerate() {
                let s = &sections[*section];
                let v = s.getattr(attr.bind(py))?;
                self.classify(py, &mut seen, s, attr.bind(py), 4 + i)?;
                put(&v, &|| format!("the knob {}", attr.bind(py)));
            }
            Ok(match failed {
                Some(reason) => Err(reason),
                None => Ok(KnobBytes::new(enc.as_bytes())),
            })
        })?;
        let mut why = seen.why;
        if seen.env && why.is_none() && environ.is_none() {
            why = Some(Why::Env);
        }
        let [enter, exit] = hooks.map(|h| h.expect("both hooks read"));
        Ok(State {
            version,
            why,
            env: if seen.env { environ } else { None },
            sections,
            pre_run_hooks,
            device_caches,
            used_global_vals,
            key,
            stages_hook,
            enter,
            exit,
        })
    }

    /// Notes how read `read` (`section.attr`) is watched: nothing to do once the state is known to be
    /// read per call; else its kind (`Launcher::watch`), or why it is not watched.
    #[inline]
    fn classify(
        &self,
        py: Python<'_>,
        seen: &mut Seen,
        section: &Bound<'_, PyAny>,
        attr: &Bound<'_, PyString>,
        read: usize,
    ) -> PyResult<()> {
        let (Some(kinds), None) = (&self.watch, seen.why) else { return Ok(()) };
        let k = PyTuple::new(py, [section.get_type().into_any(), attr.clone().into_any()])?;
        match kinds.bind(py).get_item(k)? {
            Some(kind) if kind.is(intern!(py, "plain")) => {}
            Some(kind) if kind.is(intern!(py, "env")) => seen.env = true,
            _ => seen.why = Some(Why::Knob(read)),
        }
        Ok(())
    }

    /// The name of knob read `i` as `State::why` numbers them.
    fn read_name(&self, py: Python<'_>, i: usize) -> String {
        let runtime = self.sections[0].bind(py);
        match i {
            0 => format!("knobs.{runtime}.debug"),
            1 => format!("knobs.{runtime}.add_stages_inspection_hook"),
            2 => format!("knobs.{runtime}.launch_enter_hook"),
            3 => format!("knobs.{runtime}.launch_exit_hook"),
            i => match self.knob_reads.get(i - 4) {
                Some((s, attr)) => format!("knobs.{}.{}", self.sections[*s].bind(py), attr.bind(py)),
                None => "a knob".to_owned(),
            },
        }
    }

    /// Why the last state read was not kept, in words (`None`: it was kept, or none was read).
    pub(super) fn unwatched_reason(&self, py: Python<'_>) -> Option<String> {
        let why = Why::from_code(self.kept.last_why.load(Ordering::Relaxed))?;
        Some(match why {
            Why::Off => {
                self.off.as_ref().map_or_else(|| "watching is off".to_owned(), |s| s.bind(py).to_string())
            }
            Why::Env => {
                "an env knob was read and the C environment cannot be compared here (glibc only)".to_owned()
            }
            Why::Section(i) => {
                format!("knobs.{} is not the triton.knobs module's own attribute", self.sections[i].bind(py))
            }
            Why::Knob(i) => format!(
                "{} is read through an object or attribute jitkey does not watch",
                self.read_name(py, i)
            ),
        })
    }

    /// `{"watched": calls served by the kept state, "reads": states read from the objects,
    /// "unwatched": why the last read was not kept, or None}`.
    pub(super) fn state_counts_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("watched", self.kept.watched.load(Ordering::Relaxed))?;
        d.set_item("reads", self.kept.reads.load(Ordering::Relaxed))?;
        d.set_item("unwatched", self.unwatched_reason(py))?;
        d.set_item("globals_native", self.globals.native.load(Ordering::Relaxed))?;
        d.set_item("globals_full", self.globals.full.load(Ordering::Relaxed))?;
        Ok(d)
    }

    /// Drops the kept state (the launcher's objects for the GC: see `Launcher::__clear__`).
    pub(super) fn visit_kept(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(kept) = self.kept.state.try_lock() {
            if let Some(s) = kept.as_ref() {
                for o in &s.sections {
                    visit.call(o)?;
                }
                for o in [&s.pre_run_hooks, &s.device_caches, &s.used_global_vals] {
                    visit.call(o)?;
                }
                s.enter.visit(visit)?;
                s.exit.visit(visit)?;
                if let Err(reason) = &s.key {
                    visit.call(reason)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn clear_kept(&self) {
        let _old = self.kept.state.try_lock().ok().and_then(|mut s| s.take());
    }
}

/// The C environment as `getenv` sees it: compared by the pointer array of `environ`.
///
/// glibc's `setenv`/`putenv` replace the pointer of a variable they change and shift the array on
/// `unsetenv`; the strings `setenv` allocates are never freed (it keeps them for reuse), so an
/// unchanged pointer array means unchanged contents. Python's `os.environ`, `os.putenv` and
/// `os.unsetenv` all go through `setenv`/`unsetenv`; so do the env knobs' setters. (A C caller
/// rewriting a buffer it gave `putenv` in place is not seen.) Elsewhere than glibc there is no
/// snapshot, and a state that read an env knob is read per call.
mod env {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    extern "C" {
        static environ: *const *const super::c_char;
    }

    /// `environ`'s pointers (the array's address first), or `None` where they cannot be compared.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub(super) fn snapshot() -> Option<Box<[usize]>> {
        let mut out = Vec::with_capacity(64);
        each(|p| out.push(p));
        Some(out.into_boxed_slice())
    }

    /// Whether the environment is still the one `snapshot` took.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub(super) fn same(snap: &[usize]) -> bool {
        let mut i = 0;
        let mut same = true;
        each(|p| {
            same &= snap.get(i) == Some(&p);
            i += 1;
        });
        same && i == snap.len()
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn each(mut f: impl FnMut(usize)) {
        // SAFETY: `environ` is libc's null-terminated array of pointers; it is read as `getenv` reads
        // it (with the same exposure to a concurrent `setenv` from a thread not holding the GIL);
        // volatile reads so that no load is assumed stable.
        unsafe {
            let arr = std::ptr::read_volatile(&raw const environ);
            f(arr as usize);
            if arr.is_null() {
                return;
            }
            let mut i = 0;
            loop {
                let p = std::ptr::read_volatile(arr.add(i));
                if p.is_null() {
                    break;
                }
                f(p as usize);
                i += 1;
            }
        }
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub(super) fn snapshot() -> Option<Box<[usize]>> {
        None
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub(super) fn same(_snap: &[usize]) -> bool {
        false
    }
}

/// `_environ_fingerprint() -> tuple[int, ...] | None`: the C environment as the watch compares it
/// (tests).
#[pyfunction]
fn _environ_fingerprint() -> Option<Vec<usize>> {
    env::snapshot().map(Vec::from)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_watch_bump, m)?)?;
    m.add_function(wrap_pyfunction!(_watch_version, m)?)?;
    m.add_function(wrap_pyfunction!(_environ_fingerprint, m)?)?;
    Ok(())
}
