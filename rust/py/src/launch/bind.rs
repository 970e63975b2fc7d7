//! Binding one call's arguments to the kernel's parameters: positional arguments, then keyword
//! arguments (a parameter by name, else a launch option), then defaults; the launch options sorted
//! by name (their UTF-8 bytes, as Rust `String`s compare).
//!
//! How a call's keyword names bind (which parameter each names, the options' sorted order, the
//! options' names as the key encodes them) depends only on the names: for a vectorcall `kwnames`
//! tuple seen twice in a row it is worked out once and kept (`KwPlan`), holding the tuple so that its
//! address names it. A call site's `kwnames` is a constant of its code object, so a loop of
//! `kernel[grid](x, y, BLOCK=64, num_warps=4)` binds its keywords with one pointer compare. A call
//! whose tuple is made afresh each time (`f(*args, **kwargs)`, keyword arguments after `*args`) binds
//! them directly, each name read once. Nothing here allocates per call below `ArgSlots::INLINE`
//! parameters and `OPTS` options, or copies a name.

use std::mem::MaybeUninit;
use std::ptr::null_mut;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

use jitkey_core::key::Encoder;

use super::{borrowed, Launcher};
use crate::cpython::str_utf8;
use crate::keys::encode_into;
use crate::signature::ArgSlots;
use crate::written::{written, written_mut};

/// Launch options kept inline (more spill to the heap).
const OPTS: usize = 8;
/// Keyword plans kept (a loop over a few call sites keeps them all).
const PLANS: usize = 4;

pub(super) type Opt = (*mut ffi::PyObject, *mut ffi::PyObject);

/// One call bound: its parameters (borrowed pointers into the call's arguments, its kwargs and the
/// signature's defaults, all of which outlive the call) and its launch options.
pub(super) struct BoundArgs {
    args: ArgSlots,
    /// Keyword arguments that are not parameters: `(name, value)`, sorted by name.
    pub(super) opts: Opts,
    /// How the keywords bound, when they did through a plan (its encoded option names).
    pub(super) plan: Option<Arc<KwPlan>>,
}

impl BoundArgs {
    pub(super) fn new() -> Self {
        BoundArgs { args: ArgSlots::new(), opts: Opts::new(), plan: None }
    }

    pub(super) fn params(&self) -> &[*mut ffi::PyObject] {
        self.args.get()
    }
}

/// Launch options, kept inline up to `OPTS` (no allocation per call).
pub(super) struct Opts {
    /// The first `n` are written (by `push`) while `n <= OPTS`; nothing is zeroed per call.
    stack: [MaybeUninit<Opt>; OPTS],
    heap: Vec<Opt>,
    n: usize,
}

impl Opts {
    fn new() -> Self {
        Opts { stack: [MaybeUninit::uninit(); OPTS], heap: Vec::new(), n: 0 }
    }

    fn push(&mut self, o: Opt) {
        if self.n < OPTS {
            self.stack[self.n].write(o);
        } else {
            if self.n == OPTS {
                self.heap = self.stack_mut().to_vec();
            }
            self.heap.push(o);
        }
        self.n += 1;
    }

    /// The inline options (the first `n`, all written while `n <= OPTS`).
    fn stack_mut(&mut self) -> &mut [Opt] {
        // SAFETY: `push` wrote the first `min(n, OPTS)`.
        unsafe { written_mut(&mut self.stack[..self.n.min(OPTS)]) }
    }

    pub(super) fn as_slice(&self) -> &[Opt] {
        if self.n <= OPTS {
            // SAFETY: `push` wrote the first `n`.
            unsafe { written(&self.stack[..self.n]) }
        } else {
            &self.heap
        }
    }

    /// Sorts by name, each name read once, without allocating below `OPTS` options; names are
    /// distinct (a call cannot repeat a keyword), so the order is total.
    fn sort(&mut self) {
        if self.n < 2 {
            return;
        }
        if self.n > OPTS {
            self.heap.sort_by_cached_key(|&(k, _)| str_utf8(k));
            return;
        }
        let n = self.n;
        let mut named: [(&[u8], Opt); OPTS] = [(&[], (null_mut(), null_mut())); OPTS];
        for (slot, &o) in named.iter_mut().zip(self.stack_mut().iter()) {
            *slot = (str_utf8(o.0), o);
        }
        let named = &mut named[..n];
        if !named.windows(2).all(|w| w[0].0 <= w[1].0) {
            named.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (slot, &(_, o)) in self.stack_mut().iter_mut().zip(named.iter()) {
                *slot = o;
            }
        }
    }
}

/// What a keyword argument names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kw {
    /// A parameter (its index).
    Param(usize),
    /// A launch option.
    Opt,
    /// One of `JITFunction.run`'s own keywords (`grid`, `warmup`): never bound (Triton's path
    /// raises or consumes it).
    Run,
}

/// How one tuple of keyword names binds.
pub(super) struct KwPlan {
    /// The `kwnames` tuple this plan is for, kept alive so that no other tuple can have its address.
    kwnames: Py<PyAny>,
    /// Per keyword position: what it names.
    slots: Box<[Kw]>,
    /// The options' keyword positions, sorted by name.
    order: Box<[usize]>,
    /// The options' names as the key encodes them, in `order` (each ends at its offset), or `None`
    /// when one cannot be encoded (the key then encodes them per call, and falls back as always).
    names: Option<(Vec<u8>, Box<[usize]>)>,
}

impl KwPlan {
    /// The encoded name of the `i`-th option in sorted order, when the plan has them.
    pub(super) fn encoded_name(&self, i: usize) -> Option<&[u8]> {
        let (bytes, ends) = self.names.as_ref()?;
        let start = if i == 0 { 0 } else { ends[i - 1] };
        Some(&bytes[start..ends[i]])
    }
}

/// The plans of the last `PLANS` keyword tuples seen twice in a row, and the last tuple seen once
/// (`candidate`): a tuple made afresh for each call never shows up twice, so it never costs a plan.
#[derive(Default)]
pub(super) struct KwPlans(Mutex<Plans>);

#[derive(Default)]
struct Plans {
    kept: [Option<Arc<KwPlan>>; PLANS],
    next: usize,
    candidate: Option<Py<PyAny>>,
}

/// What `KwPlans::find` answers for a tuple of keyword names.
enum Found {
    Plan(Arc<KwPlan>),
    /// The tuple of the call before this one: worth a plan.
    Again,
    /// Not seen lately (it is the candidate now).
    New,
}

impl KwPlans {
    fn find(&self, py: Python<'_>, kwnames: *mut ffi::PyObject) -> Found {
        let old;
        {
            let mut plans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = plans.kept.iter().flatten().find(|p| p.kwnames.as_ptr() == kwnames) {
                return Found::Plan(p.clone());
            }
            if plans.candidate.as_ref().is_some_and(|c| c.as_ptr() == kwnames) {
                return Found::Again;
            }
            old = plans.candidate.replace(borrowed(py, kwnames).to_owned().unbind());
        }
        drop(old); // after the lock: dropping a tuple may run Python code
        Found::New
    }

    fn keep(&self, plan: Arc<KwPlan>) {
        let old = {
            let mut plans = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let i = plans.next % PLANS;
            plans.next = plans.next.wrapping_add(1);
            plans.kept[i].replace(plan)
        };
        drop(old); // after the lock, as above
    }

    pub(super) fn visit(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(plans) = self.0.try_lock() {
            for t in plans.kept.iter().flatten().map(|p| &p.kwnames).chain(&plans.candidate) {
                visit.call(t)?;
            }
        }
        Ok(())
    }

    pub(super) fn clear(&self) {
        let _old = self.0.try_lock().ok().map(|mut plans| std::mem::take(&mut *plans));
    }
}

impl Launcher {
    /// Binds positional arguments and keyword arguments (`kw_names[i]` = `kw_values[i]`; `kwnames`
    /// the vectorcall tuple they come from, or null) to the parameters; `Err` is why the call cannot
    /// bind (Triton's own path then raises it).
    pub(super) fn bind_params(
        &self,
        py: Python<'_>,
        pos: &[*mut ffi::PyObject],
        kwnames: *mut ffi::PyObject,
        kw_names: &[*mut ffi::PyObject],
        kw_values: &[*mut ffi::PyObject],
        b: &mut BoundArgs,
    ) -> Result<(), String> {
        let sig = self.sig.get();
        let n = self.params.len();
        let nargs = pos.len();
        if nargs > self.npos {
            let npos = self.npos;
            return Err(format!("takes {npos} positional arguments but {nargs} were given"));
        }
        let slots = b.args.reset(pos, n);
        let twice = |j: usize| format!("got multiple values for argument '{}'", sig.param_names()[j]);
        if !kw_names.is_empty() {
            // SAFETY: a non-null kwnames is a live object (the call's vectorcall tuple).
            let tuple = !kwnames.is_null() && unsafe { ffi::PyTuple_CheckExact(kwnames) } != 0;
            let plan = match if tuple { self.kw_plans.find(py, kwnames) } else { Found::New } {
                Found::Plan(p) => Some(p),
                Found::Again => {
                    let p = Arc::new(self.kw_plan(py, kwnames, kw_names));
                    self.kw_plans.keep(p.clone());
                    Some(p)
                }
                Found::New => None,
            };
            let run = |k: *mut ffi::PyObject| {
                let name = borrowed(py, k).to_string();
                format!("'{name}' is a keyword argument of JITFunction.run itself, never a kernel argument")
            };
            if let Some(plan) = plan {
                for ((&kw, &v), &k) in plan.slots.iter().zip(kw_values).zip(kw_names) {
                    match kw {
                        Kw::Run => return Err(run(k)),
                        Kw::Param(j) if j < nargs || !slots[j].is_null() => return Err(twice(j)),
                        Kw::Param(j) => slots[j] = v,
                        Kw::Opt => {}
                    }
                }
                for &i in plan.order.iter() {
                    b.opts.push((kw_names[i], kw_values[i]));
                }
                b.plan = Some(plan);
            } else {
                for (&k, &v) in kw_names.iter().zip(kw_values) {
                    match self.keyword(py, k) {
                        Kw::Run => return Err(run(k)),
                        Kw::Param(j) if j < nargs || !slots[j].is_null() => return Err(twice(j)),
                        Kw::Param(j) => slots[j] = v,
                        Kw::Opt => b.opts.push((k, v)),
                    }
                }
                b.opts.sort();
            }
        }
        sig.fill_defaults(slots, nargs)
    }

    /// How `kw_names`, the items of the tuple `kwnames`, bind (see `KwPlan`): as `bind_params` binds
    /// them without a plan.
    fn kw_plan(
        &self,
        py: Python<'_>,
        kwnames: *mut ffi::PyObject,
        kw_names: &[*mut ffi::PyObject],
    ) -> KwPlan {
        let slots: Box<[Kw]> = kw_names.iter().map(|&k| self.keyword(py, k)).collect();
        let mut order: Vec<usize> = (0..kw_names.len()).filter(|&i| slots[i] == Kw::Opt).collect();
        order.sort_unstable_by(|&a, &b| str_utf8(kw_names[a]).cmp(str_utf8(kw_names[b])));
        let mut enc = Encoder::from_vec(Vec::new());
        let mut ends = Vec::with_capacity(order.len());
        let mut encoded = true;
        for &i in &order {
            if encode_into(&borrowed(py, kw_names[i]), &mut enc).is_err() {
                encoded = false;
                break;
            }
            ends.push(enc.len());
        }
        KwPlan {
            kwnames: borrowed(py, kwnames).to_owned().unbind(),
            slots,
            order: order.into_boxed_slice(),
            names: encoded.then(|| (enc.into_vec(), ends.into_boxed_slice())),
        }
    }

    /// What keyword `k` names.
    fn keyword(&self, py: Python<'_>, k: *mut ffi::PyObject) -> Kw {
        let by_ptr = self.params.by_address(k);
        // An interned name equal to a run keyword is that keyword's object; any other spelling of it is
        // compared by value (off the usual path: names at a call site are interned).
        if self.run_keywords.iter().any(|r| r.as_ptr() == k)
            || (by_ptr.is_none() && self.is_run_keyword(py, k))
        {
            return Kw::Run;
        }
        match by_ptr.or_else(|| self.params.by_value(k)) {
            Some(j) => Kw::Param(j),
            None => Kw::Opt,
        }
    }

    /// Whether keyword `k` (not interned, or not a parameter's name) spells a run keyword.
    #[cold]
    fn is_run_keyword(&self, py: Python<'_>, k: *mut ffi::PyObject) -> bool {
        let key = borrowed(py, k);
        let Ok(key) = key.cast::<PyString>() else { return false };
        let Ok(key) = key.to_str() else { return false };
        self.run_keywords.iter().any(|r| r.bind(py).to_str().is_ok_and(|r| r == key))
    }
}
