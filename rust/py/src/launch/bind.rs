//! Binding one call's arguments to the kernel's parameters: positional arguments, then keyword
//! arguments (a parameter by name, else a launch option), then defaults; the launch options sorted
//! by name (their UTF-8 bytes, as Rust `String`s compare).
//!
//! How a call's keyword names bind (which parameter each names, the options' sorted order, the
//! options' names as the key encodes them) depends only on the names: it is worked out once per
//! vectorcall `kwnames` tuple and kept (`KwPlan`), holding the tuple so its address names it. A call
//! site's `kwnames` is a constant of its code object, so a loop of `kernel[grid](..., BLOCK=64,
//! num_warps=4)` binds its keywords with one pointer compare; a call with a fresh tuple each time
//! (`**kwargs`) works its plan out again. Nothing here allocates per call below `STACK` parameters and
//! `OPTS` options, or copies a name.

use std::ptr::null_mut;
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

use jitkey_core::key::Encoder;

use super::{borrowed, Launcher};
use crate::keys::encode_into;

/// Parameters bound for one call: borrowed pointers into the call's args tuple, its kwargs dict
/// and the signature's defaults, all of which outlive the call.
const STACK: usize = 32;
/// Launch options kept inline (more spill to the heap).
const OPTS: usize = 8;

pub(super) type Opt = (*mut ffi::PyObject, *mut ffi::PyObject);

pub(super) struct BoundArgs {
    stack: [*mut ffi::PyObject; STACK],
    heap: Vec<*mut ffi::PyObject>,
    n: usize,
    /// Keyword arguments that are not parameters: `(name, value)`, sorted by name.
    pub(super) opts: Opts,
    /// How the keywords bound, when they did through a plan (its encoded option names).
    pub(super) plan: Option<Arc<KwPlan>>,
}

impl BoundArgs {
    pub(super) fn new() -> Self {
        BoundArgs { stack: [null_mut(); STACK], heap: Vec::new(), n: 0, opts: Opts::new(), plan: None }
    }

    pub(super) fn params(&self) -> &[*mut ffi::PyObject] {
        if self.n <= STACK {
            &self.stack[..self.n]
        } else {
            &self.heap
        }
    }
}

/// Launch options, kept inline up to `OPTS` (no allocation per call).
pub(super) struct Opts {
    stack: [Opt; OPTS],
    heap: Vec<Opt>,
    n: usize,
}

impl Opts {
    fn new() -> Self {
        Opts { stack: [(null_mut(), null_mut()); OPTS], heap: Vec::new(), n: 0 }
    }

    fn push(&mut self, o: Opt) {
        if self.n < OPTS {
            self.stack[self.n] = o;
        } else {
            if self.n == OPTS {
                self.heap.extend_from_slice(&self.stack);
            }
            self.heap.push(o);
        }
        self.n += 1;
    }

    pub(super) fn as_slice(&self) -> &[Opt] {
        if self.n <= OPTS {
            &self.stack[..self.n]
        } else {
            &self.heap
        }
    }
}

/// The UTF-8 bytes of a keyword name, as cached by the str object (no copy); empty for a name that
/// has none (not a str, lone surrogates), as the sort has always treated those.
fn name_utf8<'a>(p: *mut ffi::PyObject) -> &'a [u8] {
    // SAFETY: `p` is a live object kept alive by the call; PyUnicode_AsUTF8AndSize returns the
    // str's own cached UTF-8 buffer, valid while the str lives, or null with an error set, which is
    // cleared here.
    unsafe {
        if ffi::PyUnicode_Check(p) == 0 {
            return &[];
        }
        let mut size: ffi::Py_ssize_t = 0;
        let data = ffi::PyUnicode_AsUTF8AndSize(p, &mut size);
        if data.is_null() {
            ffi::PyErr_Clear();
            return &[];
        }
        std::slice::from_raw_parts(data.cast::<u8>(), size as usize)
    }
}

/// How one tuple of keyword names binds.
pub(super) struct KwPlan {
    /// The `kwnames` tuple this plan is for, kept alive so that no other tuple can have its address.
    kwnames: Option<Py<PyAny>>,
    /// Per keyword position: the parameter it names, or `None` (a launch option).
    slots: Box<[Option<usize>]>,
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

/// The last keyword plans made (one per call site alternating in a loop is the common case).
const PLANS: usize = 4;

/// The plans of the last `PLANS` keyword tuples seen (a loop over a few call sites keeps them all).
#[derive(Default)]
pub(super) struct KwPlans(Mutex<([Option<Arc<KwPlan>>; PLANS], usize)>);

impl KwPlans {
    fn find(&self, kwnames: *mut ffi::PyObject) -> Option<Arc<KwPlan>> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.0.iter().flatten().find(|p| p.kwnames.as_ref().is_some_and(|t| t.as_ptr() == kwnames)).cloned()
    }

    fn keep(&self, plan: Arc<KwPlan>) {
        let old = {
            let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let i = kept.1 % PLANS;
            kept.1 = kept.1.wrapping_add(1);
            kept.0[i].replace(plan)
        };
        drop(old); // after the lock: dropping a tuple may run Python code
    }

    pub(super) fn visit(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Ok(kept) = self.0.try_lock() {
            for t in kept.0.iter().flatten().filter_map(|p| p.kwnames.as_ref()) {
                visit.call(t)?;
            }
        }
        Ok(())
    }

    pub(super) fn clear(&self) {
        let _old = self.0.try_lock().ok().map(|mut kept| std::mem::take(&mut kept.0));
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
        let n = self.names.len();
        let nargs = pos.len();
        if nargs > self.npos {
            let npos = self.npos;
            return Err(format!("takes {npos} positional arguments but {nargs} were given"));
        }
        b.n = n;
        let slots: &mut [*mut ffi::PyObject] = if n <= STACK {
            &mut b.stack[..n]
        } else {
            b.heap.resize(n, null_mut());
            &mut b.heap
        };
        slots[..nargs].copy_from_slice(pos);
        if !kw_names.is_empty() {
            let plan = match (!kwnames.is_null()).then(|| self.kw_plans.find(kwnames)).flatten() {
                Some(p) => p,
                None => {
                    let p = Arc::new(self.kw_plan(py, kwnames, kw_names));
                    if p.kwnames.is_some() {
                        self.kw_plans.keep(p.clone());
                    }
                    p
                }
            };
            for (&j, &v) in plan.slots.iter().zip(kw_values) {
                let Some(j) = j else { continue };
                if j < nargs || !slots[j].is_null() {
                    return Err(format!("got multiple values for argument '{}'", sig.param_names()[j]));
                }
                slots[j] = v;
            }
            for &i in plan.order.iter() {
                b.opts.push((kw_names[i], kw_values[i]));
            }
            b.plan = Some(plan);
        }
        for (i, slot) in slots.iter_mut().enumerate().skip(nargs) {
            if slot.is_null() {
                match sig.default_of(i) {
                    Some(d) => *slot = d.as_ptr(),
                    None => return Err(format!("missing a required argument: '{}'", sig.param_names()[i])),
                }
            }
        }
        Ok(())
    }

    /// How `kw_names` bind (see `KwPlan`); kept for `kwnames` when it is the exact tuple they are.
    fn kw_plan(
        &self,
        py: Python<'_>,
        kwnames: *mut ffi::PyObject,
        kw_names: &[*mut ffi::PyObject],
    ) -> KwPlan {
        let slots: Box<[Option<usize>]> = kw_names
            .iter()
            .map(|&k| {
                self.names.iter().position(|name| name.as_ptr() == k).or_else(|| self.param_index(py, k))
            })
            .collect();
        let mut order: Vec<usize> = (0..kw_names.len()).filter(|&i| slots[i].is_none()).collect();
        // Names are distinct (a call cannot repeat a keyword), so the order is total.
        order.sort_unstable_by(|&a, &b| name_utf8(kw_names[a]).cmp(name_utf8(kw_names[b])));
        let mut enc = Encoder::from_vec(Vec::new());
        let mut ends = Vec::with_capacity(order.len());
        let mut names = Some(());
        for &i in &order {
            if encode_into(&borrowed(py, kw_names[i]), &mut enc).is_err() {
                names = None;
                break;
            }
            ends.push(enc.len());
        }
        // SAFETY: a non-null kwnames is a live object (the call's vectorcall tuple).
        let exact = !kwnames.is_null() && unsafe { ffi::PyTuple_CheckExact(kwnames) } != 0;
        KwPlan {
            kwnames: exact.then(|| borrowed(py, kwnames).to_owned().unbind()),
            slots,
            order: order.into_boxed_slice(),
            names: names.map(|()| (enc.into_vec(), ends.into_boxed_slice())),
        }
    }

    /// The parameter named `k` (a keyword name that is not one of the interned parameter names
    /// themselves): an exact str is compared by its cached hash first, so a launch option costs no
    /// string comparison per parameter.
    fn param_index(&self, py: Python<'_>, k: *mut ffi::PyObject) -> Option<usize> {
        let names = self.sig.get().param_names();
        // SAFETY: `k` is a live object kept alive by the call; for an exact str PyObject_Hash runs no
        // Python code, cannot fail and returns the str's cached hash (computing it once).
        let hash = unsafe { (ffi::PyUnicode_CheckExact(k) != 0).then(|| ffi::PyObject_Hash(k)) };
        if let Some(h) = hash {
            let key = name_utf8(k);
            return self
                .name_hashes
                .iter()
                .zip(names)
                .position(|(&nh, name)| nh == h && name.as_bytes() == key);
        }
        let key = borrowed(py, k);
        let key = key.cast::<PyString>().ok()?;
        let key = key.to_str().ok()?;
        names.iter().position(|name| name == key)
    }
}
