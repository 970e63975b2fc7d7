//! `_Plan`: a DSL call's host work as it was recorded, replayed without the DSL's Python.
//!
//! A plan is a straight-line program over the call's arguments: each step calls what the DSL's own
//! path called (a torch function, a jitkey launcher, another DSL call site) with arguments that are
//! the call's arguments, results of earlier steps or constants (whatever the DSL computed in Python
//! from keyed metadata, folded at recording), and the result is built the same way. Which calls
//! may be folded, and which may not become a plan at all, is the recorder's business
//! (`jitkey/dsl.py`); this file only runs what it was given.
//!
//! **Kept intermediates.** A small tensor that a step allocates (`torch.empty` of fixed sizes, at
//! most `KEPT_MAX_ELEMENTS` elements) and that only the plan's compiled launches on its own device
//! see (not the result, not a Python call, not inside a built tuple) is an intermediate, such as the
//! partial sums of FlagGems' two-pass reductions. Where the spec gives a proven `_TorchCurrent`, the
//! plan keeps such a tensor after a replay and hands it to the next replay instead of allocating, on
//! the conditions under which torch's caching allocator would hand back the same block without a
//! synchronization: the same device and current stream at both ends of both replays (the launches
//! are ordered on it), no CUDA graph capture on that stream, no other holder of the tensor (its
//! reference count), no launch declined to the library's own path, and torch not set to fill new
//! memory (`torch.use_deterministic_algorithms`, when it is on, keeps nothing). Each such step keeps
//! at most one tensor, which `torch.cuda.memory_allocated()` counts while the plan lives.

use std::ptr::null_mut;
use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::cpython::tuple_fill;
use crate::launch::{launch_from_plan, CompiledLaunch, Launcher};
use crate::torch::{TorchAlloc, TorchCurrent};

/// The most elements an intermediate the plan keeps between replays may span (module docs).
const KEPT_MAX_ELEMENTS: i64 = 16384;

/// Where a step's argument (or the result) comes from.
pub(super) enum Src {
    /// The call's `i`-th argument.
    Arg(usize),
    /// An item inside the call's `i`-th argument (tuples and lists, by index path).
    ArgItem(usize, Box<[usize]>),
    /// The result of step `j`.
    Slot(usize),
    /// Item `k` of step `j`'s result (a tuple or list).
    SlotItem(usize, usize),
    /// A constant.
    Const(Py<PyAny>),
    /// A tuple (list) built from sources, fresh per replay.
    Tuple(Box<[Src]>),
    List(Box<[Src]>),
}

enum Target {
    /// Any callable, called with a tuple (and a dict of keyword arguments).
    Call(Py<PyAny>),
    /// A jitkey Triton launcher, run natively: `launch(grid, *args, **kw)`.
    Launch(Py<Launcher>),
    /// A compiled kernel as a library launches it from its cache: the first `nfast` arguments are the
    /// grid and the kernel's parameters; when the launch is declined, `fallback` is called with the
    /// rest (the library's own launch call for this step).
    Compiled { launch: Py<CompiledLaunch>, nfast: usize, fallback: Py<PyAny> },
    /// A new CUDA tensor of fixed sizes, strides, dtype and device, made natively (`_TorchAlloc`);
    /// `fallback` (torch's factory) is called with the step's arguments when the shim is not used.
    Empty {
        alloc: Py<TorchAlloc>,
        sizes: Box<[i64]>,
        strides: Box<[i64]>,
        dtype: i32,
        index: i32,
        fallback: Py<PyAny>,
        /// Where the result is an intermediate the plan keeps between replays (module docs).
        kept: Option<Box<Kept>>,
    },
    /// `torch.empty_like(args[0], **kw)` made natively for a plain dense CUDA tensor (of `dtype` where
    /// the recording named another), else `fallback(*args, **kw)`. The keyword arguments change nothing
    /// but the dtype (the recorder checks), so the native step does not read them.
    EmptyLike { alloc: Py<TorchAlloc>, dtype: Option<i32>, fallback: Py<PyAny> },
}

struct Step {
    target: Target,
    args: Box<[Src]>,
    /// Names of the last `kwnames.len()` sources in `args`.
    kwnames: Option<Py<PyTuple>>,
}

/// The tensor an intermediate step keeps between replays, with the stream it was last used on.
struct Kept {
    current: Py<TorchCurrent>,
    /// `torch._C._get_deterministic_algorithms`: while it is true torch may fill new memory, and
    /// nothing is kept.
    deterministic: Py<PyAny>,
    index: i32,
    tensor: Mutex<Option<(u64, Py<PyAny>)>>,
}

impl Kept {
    /// The current stream of the step's device, when an intermediate may be kept on it (no capture).
    fn stream(&self) -> Option<u64> {
        let s = self.current.get().stream_of(self.index)?;
        match crate::cuda::driver().ok()?.capturing(s)? {
            false => Some(s),
            true => None,
        }
    }

    /// `stream()`, where torch is not set to fill the memory it allocates.
    fn usable(&self, py: Python<'_>) -> Option<u64> {
        match self.deterministic.bind(py).call0() {
            Ok(v) if v.is(&*pyo3::types::PyBool::new(py, false)) => self.stream(),
            _ => None, // not False, or the check raised (the error is dropped): not kept
        }
    }

    /// The kept tensor, taken out, when it was last used on `stream` and nothing else holds it.
    fn take<'py>(&self, py: Python<'py>, stream: u64) -> Option<Bound<'py, PyAny>> {
        let mut g = self.tensor.lock().unwrap_or_else(PoisonError::into_inner);
        match g.as_ref() {
            // SAFETY: a live object of ours; reading its reference count.
            Some((s, t)) if *s == stream && unsafe { ffi::Py_REFCNT(t.as_ptr()) } == 1 => {
                g.take().map(|(_, t)| t.into_bound(py))
            }
            _ => None,
        }
    }

    /// Keep `t`, last used on `stream`, for the next replay.
    fn keep(&self, stream: u64, t: &Bound<'_, PyAny>) {
        let old =
            self.tensor.lock().unwrap_or_else(PoisonError::into_inner).replace((stream, t.clone().unbind()));
        drop(old); // released after the lock (a tensor's deallocation may run Python code)
    }
}

/// Whether `src` names step `j`'s result, or anything inside or built from it.
fn names(src: &Src, j: usize) -> bool {
    match src {
        Src::Slot(k) | Src::SlotItem(k, _) => *k == j,
        Src::Tuple(items) | Src::List(items) => items.iter().any(|s| names(s, j)),
        _ => false,
    }
}

/// The number of elements a tensor of `sizes` and `strides` spans in its storage (None: a negative
/// stride or an overflow).
fn extent(sizes: &[i64], strides: &[i64]) -> Option<i64> {
    if sizes.contains(&0) {
        return Some(0);
    }
    sizes.iter().zip(strides).try_fold(1i64, |acc, (&n, &st)| {
        if st < 0 || n < 0 {
            return None;
        }
        acc.checked_add((n - 1).checked_mul(st)?)
    })
}

/// Marks the allocations of `steps` that are intermediates the plan may keep (module docs).
fn mark_kept(py: Python<'_>, steps: &mut [Step], ret: &Src, current: &Py<TorchCurrent>, det: &Py<PyAny>) {
    for j in 0..steps.len() {
        let (later, this) = {
            let (head, tail) = steps.split_at_mut(j + 1);
            (&*tail, &mut head[j])
        };
        let Target::Empty { sizes, strides, index, kept, .. } = &mut this.target else { continue };
        if extent(sizes, strides).is_none_or(|n| n > KEPT_MAX_ELEMENTS) || names(ret, j) {
            continue;
        }
        let mut launches = 0;
        let only_launches = later.iter().all(|step| {
            step.args.iter().filter(|a| names(a, j)).all(|a| match (&step.target, a) {
                (Target::Compiled { launch, .. }, Src::Slot(_))
                    if launch.get().device_index() == i64::from(*index) =>
                {
                    launches += 1;
                    true
                }
                _ => false,
            })
        });
        if only_launches && launches > 0 {
            *kept = Some(Box::new(Kept {
                current: current.clone_ref(py),
                deterministic: det.clone_ref(py),
                index: *index,
                tensor: Mutex::new(None),
            }));
        }
    }
}

/// A recorded call (see the module docs): built by `jitkey.dsl` from its recording, run by `_Site`.
#[pyclass(name = "_Plan", module = "jitkey._core", frozen)]
pub(crate) struct Plan {
    steps: Box<[Step]>,
    ret: Src,
    /// `(owner, name, value)`: the plan holds while `getattr(owner, name) is value` (the DSL's bound
    /// object it was recorded from is still the one the DSL would use).
    guard: Option<(Py<PyAny>, Py<PyString>, Py<PyAny>)>,
    nargs: usize,
    /// A single call of the DSL's bound call (no recording of its work), counted apart.
    bound: bool,
}

fn spec_err(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(format!("_Plan: {}", msg.into()))
}

fn parse_src(spec: &Bound<'_, PyAny>, nargs: usize, nsteps: usize) -> PyResult<Src> {
    let t = spec.cast::<PyTuple>().map_err(|_| spec_err("a source must be a tuple"))?;
    let tag: String = t.get_item(0)?.extract()?;
    let idx = |i: usize| -> PyResult<usize> { t.get_item(i)?.extract() };
    let many = |i: usize| -> PyResult<Box<[Src]>> {
        t.get_item(i)?.try_iter()?.map(|s| parse_src(&s?, nargs, nsteps)).collect()
    };
    Ok(match (tag.as_str(), t.len()) {
        ("a", 2) => {
            let i = idx(1)?;
            if i >= nargs {
                return Err(spec_err(format!("argument {i} of {nargs}")));
            }
            Src::Arg(i)
        }
        ("a", 3) => {
            let i = idx(1)?;
            if i >= nargs {
                return Err(spec_err(format!("argument {i} of {nargs}")));
            }
            let path: Vec<usize> = t.get_item(2)?.extract()?;
            Src::ArgItem(i, path.into_boxed_slice())
        }
        ("s", 2 | 3) => {
            let j = idx(1)?;
            if j >= nsteps {
                return Err(spec_err(format!("step {j} is not before this one")));
            }
            if t.len() == 3 {
                Src::SlotItem(j, idx(2)?)
            } else {
                Src::Slot(j)
            }
        }
        ("c", 2) => Src::Const(t.get_item(1)?.unbind()),
        ("t", 2) => Src::Tuple(many(1)?),
        ("l", 2) => Src::List(many(1)?),
        _ => return Err(spec_err(format!("unknown source {tag:?} of {} items", t.len()))),
    })
}

/// Objects a replay made and holds until its step has run (sequence items, built tuples and lists).
struct Held(Vec<*mut ffi::PyObject>);

impl Drop for Held {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: every pointer here is a new reference this replay owns.
            unsafe { ffi::Py_DECREF(p) };
        }
    }
}

/// A borrowed pointer to the object `src` names (`held` keeps anything made for it alive).
///
/// # Safety
/// `args` are live objects; `slots` holds the results of the steps run so far.
unsafe fn resolve(
    py: Python<'_>,
    src: &Src,
    args: &[*mut ffi::PyObject],
    slots: &[*mut ffi::PyObject],
    held: &mut Held,
) -> PyResult<*mut ffi::PyObject> {
    let item = |seq: *mut ffi::PyObject, i: usize, held: &mut Held| -> PyResult<*mut ffi::PyObject> {
        // SAFETY: seq is live; PySequence_GetItem returns a new reference or null with an error.
        let p = unsafe { ffi::PySequence_GetItem(seq, i as ffi::Py_ssize_t) };
        if p.is_null() {
            return Err(PyErr::fetch(py));
        }
        held.0.push(p);
        Ok(p)
    };
    Ok(match src {
        Src::Arg(i) => args[*i],
        Src::ArgItem(i, path) => {
            let mut cur = args[*i];
            for &k in path.iter() {
                cur = item(cur, k, held)?;
            }
            cur
        }
        Src::Slot(j) => slots[*j],
        Src::SlotItem(j, k) => item(slots[*j], *k, held)?,
        Src::Const(c) => c.as_ptr(),
        Src::Tuple(items) | Src::List(items) => {
            let n = items.len() as ffi::Py_ssize_t;
            let is_tuple = matches!(src, Src::Tuple(_));
            // SAFETY: a new container of n empty slots, owned by `held` from the start; each slot
            // is filled once with a new reference.
            unsafe {
                let c = if is_tuple { ffi::PyTuple_New(n) } else { ffi::PyList_New(n) };
                if c.is_null() {
                    return Err(PyErr::fetch(py));
                }
                held.0.push(c);
                for (k, s) in items.iter().enumerate() {
                    let p = resolve(py, s, args, slots, held)?;
                    ffi::Py_INCREF(p);
                    if is_tuple {
                        tuple_fill(c, k as ffi::Py_ssize_t, p);
                    } else {
                        ffi::PyList_SetItem(c, k as ffi::Py_ssize_t, p);
                    }
                }
                c
            }
        }
    })
}

impl Plan {
    /// Whether the DSL would still use what this plan was recorded from.
    pub(super) fn holds(&self, py: Python<'_>) -> PyResult<bool> {
        match &self.guard {
            None => Ok(true),
            Some((owner, name, value)) => Ok(owner.bind(py).getattr(name.bind(py))?.is(value.bind(py))),
        }
    }

    pub(super) fn nargs(&self) -> usize {
        self.nargs
    }

    pub(super) fn is_bound(&self) -> bool {
        self.bound
    }

    /// Runs the steps over `args` (live objects, `nargs` of them) and returns the result.
    pub(super) fn replay<'py>(
        &self,
        py: Python<'py>,
        args: &[*mut ffi::PyObject],
    ) -> PyResult<Bound<'py, PyAny>> {
        if args.len() != self.nargs {
            return Err(PyTypeError::new_err(format!(
                "_Plan: recorded for {} arguments, got {}",
                self.nargs,
                args.len()
            )));
        }
        // Step results, as owned references (released when the replay ends).
        let mut results: Vec<Bound<'py, PyAny>> = Vec::with_capacity(self.steps.len());
        let mut slots: Vec<*mut ffi::PyObject> = Vec::with_capacity(self.steps.len());
        // The intermediates this replay may keep: (step, kept, stream), and whether a launch declined.
        let mut keeping: Vec<(usize, &Kept, u64)> = Vec::new();
        let mut declined = false;
        for step in self.steps.iter() {
            let mut held = Held(Vec::new());
            let mut ptrs: Vec<*mut ffi::PyObject> = Vec::with_capacity(step.args.len());
            for s in step.args.iter() {
                // SAFETY: args are live (the caller's), slots are results held in `results`.
                ptrs.push(unsafe { resolve(py, s, args, &slots, &mut held)? });
            }
            let nkw = step.kwnames.as_ref().map_or(0, |k| k.bind(py).len());
            let npos = ptrs.len() - nkw;
            let out = match &step.target {
                Target::Launch(l) => {
                    let kw = step.kwnames.as_ref().map_or(null_mut(), |k| k.as_ptr());
                    launch_from_plan(py, l.get(), ptrs[0], &ptrs[1..npos], &ptrs[npos..], kw)?
                }
                Target::Call(f) => call(py, f.bind(py), &ptrs[..npos], step.kwnames.as_ref(), &ptrs[npos..])?,
                Target::Empty { alloc, sizes, strides, dtype, index, fallback, kept } => {
                    let keep = kept.as_deref().and_then(|k| Some((k, k.usable(py)?)));
                    let reused = keep.and_then(|(k, s)| k.take(py, s));
                    if let Some((k, s)) = keep {
                        keeping.push((slots.len(), k, s));
                    }
                    match reused.or_else(|| alloc.get().empty_cuda(py, sizes, strides, *dtype, *index)) {
                        Some(t) => t,
                        None => {
                            call(py, fallback.bind(py), &ptrs[..npos], step.kwnames.as_ref(), &ptrs[npos..])?
                        }
                    }
                }
                Target::EmptyLike { alloc, dtype, fallback } => match alloc
                    .get()
                    .empty_like(py, ptrs[0], *dtype)
                {
                    Some(t) => t,
                    None => call(py, fallback.bind(py), &ptrs[..npos], step.kwnames.as_ref(), &ptrs[npos..])?,
                },
                Target::Compiled { launch, nfast, fallback } => {
                    match launch.get().launch(py, ptrs[0], &ptrs[1..*nfast])? {
                        Some(out) => out,
                        None => {
                            declined = true;
                            call(
                                py,
                                fallback.bind(py),
                                &ptrs[*nfast..npos],
                                step.kwnames.as_ref(),
                                &ptrs[npos..],
                            )?
                        }
                    }
                }
            };
            drop(held);
            slots.push(out.as_ptr());
            results.push(out);
        }
        let mut held = Held(Vec::new());
        // SAFETY: as above.
        let r = unsafe { resolve(py, &self.ret, args, &slots, &mut held)? };
        if !declined {
            for (j, k, s) in keeping {
                let t = &results[j];
                // SAFETY: a live result; reading its reference count (1: only this replay holds it).
                if unsafe { ffi::Py_REFCNT(t.as_ptr()) } == 1 && k.stream() == Some(s) {
                    k.keep(s, t);
                }
            }
        }
        // SAFETY: r is live (held, a result, an argument or a constant); a new reference for the caller.
        Ok(unsafe { Bound::from_borrowed_ptr(py, r) })
    }
}

/// `f(*pos, **dict(zip(kwnames, kw)))` (`f(*pos)` without `kwnames`), the argument tuple filled in place.
pub(super) fn call<'py>(
    py: Python<'py>,
    f: &Bound<'py, PyAny>,
    pos: &[*mut ffi::PyObject],
    kwnames: Option<&Py<PyTuple>>,
    kw: &[*mut ffi::PyObject],
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: a new tuple filled once per slot with new references; the call's result is a new
    // reference or null with an error set.
    unsafe {
        let t = ffi::PyTuple_New(pos.len() as ffi::Py_ssize_t);
        if t.is_null() {
            return Err(PyErr::fetch(py));
        }
        let t = Bound::from_owned_ptr(py, t);
        for (i, &p) in pos.iter().enumerate() {
            ffi::Py_INCREF(p);
            tuple_fill(t.as_ptr(), i as ffi::Py_ssize_t, p);
        }
        let d = match kwnames {
            Some(names) if !kw.is_empty() => {
                let d = PyDict::new(py);
                for (name, &v) in names.bind(py).iter().zip(kw) {
                    d.set_item(name, Bound::from_borrowed_ptr(py, v))?;
                }
                Some(d)
            }
            _ => None,
        };
        let dp = d.as_ref().map_or(null_mut(), |d| d.as_ptr());
        Bound::from_owned_ptr_or_err(py, ffi::PyObject_Call(f.as_ptr(), t.as_ptr(), dp))
    }
}

#[pymethods]
impl Plan {
    /// `_Plan(nargs, steps, ret, guard=None, /)`: ``steps`` is a sequence of ``(kind, target, args,
    /// kwnames)`` with ``kind`` ``"call"`` (``target(*args, **kw)``), ``"launch"`` (``target`` a
    /// ``_TritonLauncher``, ``args[0]`` the grid) or ``"compiled"`` (``target`` is ``(launch, nfast,
    /// fallback)``: a ``_CompiledLaunch`` run with ``args[0]`` the grid and ``args[1:nfast]`` the
    /// parameters, or ``fallback(*args[nfast:], **kw)`` when it declines), ``"empty"`` (``target`` is
    /// ``(alloc, fallback, sizes, strides, dtype, index)``: a new CUDA tensor made by the ``_TorchAlloc``,
    /// or ``fallback(*args, **kw)`` when it is not used) or ``"empty_like"`` (``target`` is ``(alloc,
    /// fallback[, dtype])``, ``args`` one tensor and keyword arguments that change nothing but the dtype,
    /// which is ``dtype``, a short name, if given); ``args`` and ``ret`` are sources: ``("a", i)``,
    /// ``("a", i, path)``, ``("s", j)``, ``("s", j, k)``, ``("c", value)``, ``("t", srcs)``,
    /// ``("l", srcs)``; ``kwnames`` names the last arguments (or is None). ``guard`` is
    /// ``(owner, name, value)``. ``bound``: the plan is one call of the DSL's bound call (counted
    /// as such, not as a replay).
    #[new]
    #[pyo3(signature = (nargs, steps, ret, guard = None, bound = false, keep = None))]
    fn new(
        py: Python<'_>,
        nargs: usize,
        steps: &Bound<'_, PyAny>,
        ret: &Bound<'_, PyAny>,
        guard: Option<(Py<PyAny>, Bound<'_, PyString>, Py<PyAny>)>,
        bound: bool,
        keep: Option<(Py<TorchCurrent>, Py<PyAny>)>,
    ) -> PyResult<Self> {
        let mut out = Vec::new();
        for (j, s) in steps.try_iter()?.enumerate() {
            let s = s?;
            let (kind, target, args, kwnames): (
                String,
                Bound<'_, PyAny>,
                Bound<'_, PyAny>,
                Option<Bound<'_, PyTuple>>,
            ) = s.extract()?;
            let args: Box<[Src]> =
                args.try_iter()?.map(|a| parse_src(&a?, nargs, j)).collect::<PyResult<_>>()?;
            let nkw = kwnames.as_ref().map_or(0, |k| k.len());
            if nkw > args.len() {
                return Err(spec_err("more keyword names than arguments"));
            }
            let target = match kind.as_str() {
                "call" => Target::Call(target.unbind()),
                "launch" => {
                    if args.len() == nkw {
                        return Err(spec_err("a launch step needs the grid as its first argument"));
                    }
                    Target::Launch(
                        target
                            .cast_into::<Launcher>()
                            .map_err(|_| spec_err("a launch target is a _TritonLauncher"))?
                            .unbind(),
                    )
                }
                "compiled" => {
                    let (launch, nfast, fallback): (Bound<'_, PyAny>, usize, Py<PyAny>) = target.extract()?;
                    if nfast == 0 || nfast + nkw > args.len() {
                        return Err(spec_err("a compiled step needs the grid and its parameters first"));
                    }
                    let launch = launch
                        .cast_into::<CompiledLaunch>()
                        .map_err(|_| spec_err("a compiled step launches a _CompiledLaunch"))?
                        .unbind();
                    Target::Compiled { launch, nfast, fallback }
                }
                "empty" => {
                    let (alloc, fallback, sizes, strides, dtype, index): (
                        Bound<'_, PyAny>,
                        Py<PyAny>,
                        Vec<i64>,
                        Vec<i64>,
                        String,
                        i32,
                    ) = target.extract()?;
                    let alloc = alloc
                        .cast_into::<TorchAlloc>()
                        .map_err(|_| spec_err("an empty step allocates through a _TorchAlloc"))?
                        .unbind();
                    if sizes.len() != strides.len() {
                        return Err(spec_err("an empty step's sizes and strides differ in length"));
                    }
                    match alloc.get().dtype_code(&dtype) {
                        Some(dtype) => Target::Empty {
                            alloc,
                            sizes: sizes.into_boxed_slice(),
                            strides: strides.into_boxed_slice(),
                            dtype,
                            index,
                            fallback,
                            kept: None,
                        },
                        None => Target::Call(fallback), // a dtype the shim does not name: torch's call
                    }
                }
                "empty_like" => {
                    let (alloc, fallback, dtype): (Bound<'_, PyAny>, Py<PyAny>, Option<String>) =
                        match target.extract() {
                            Ok((a, f)) => (a, f, None),
                            Err(_) => {
                                let (a, f, d): (Bound<'_, PyAny>, Py<PyAny>, String) = target.extract()?;
                                (a, f, Some(d))
                            }
                        };
                    if args.len() != nkw + 1 {
                        return Err(spec_err("an empty_like step takes one tensor"));
                    }
                    let alloc = alloc
                        .cast_into::<TorchAlloc>()
                        .map_err(|_| spec_err("an empty_like step allocates through a _TorchAlloc"))?
                        .unbind();
                    match dtype.map(|d| alloc.get().dtype_code(&d)) {
                        None => Target::EmptyLike { alloc, dtype: None, fallback },
                        Some(Some(code)) => Target::EmptyLike { alloc, dtype: Some(code), fallback },
                        Some(None) => Target::Call(fallback), // a dtype the shim does not name: torch's call
                    }
                }
                other => return Err(spec_err(format!("unknown step kind {other:?}"))),
            };
            out.push(Step { target, args, kwnames: kwnames.filter(|k| !k.is_empty()).map(Bound::unbind) });
        }
        let nsteps = out.len();
        let ret = parse_src(ret, nargs, nsteps)?;
        if let Some((current, det)) = &keep {
            mark_kept(py, &mut out, &ret, current, det);
        }
        let guard =
            guard.map(|(o, n, v)| (o, PyString::intern(py, n.to_str().unwrap_or_default()).unbind(), v));
        Ok(Self { steps: out.into_boxed_slice(), ret, guard, nargs, bound })
    }

    /// Run the plan over ``args`` (a tuple) and return the result, as the recorded call would.
    #[pyo3(signature = (*args))]
    fn __call__<'py>(&self, py: Python<'py>, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyAny>> {
        let ptrs: Vec<*mut ffi::PyObject> = args.iter().map(|a| a.as_ptr()).collect();
        self.replay(py, &ptrs)
    }

    /// The number of steps.
    fn __len__(&self) -> usize {
        self.steps.len()
    }

    /// The steps as ``(kind, target)`` pairs (``"call"`` or ``"launch"``), for inspection.
    #[getter]
    fn steps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let out = pyo3::types::PyList::empty(py);
        for s in self.steps.iter() {
            let (kind, target) = match &s.target {
                Target::Call(f) => ("call", f.bind(py).clone()),
                Target::Launch(l) => ("launch", l.bind(py).clone().into_any()),
                Target::Compiled { launch, .. } => ("compiled", launch.bind(py).clone().into_any()),
                Target::Empty { fallback, .. } => ("empty", fallback.bind(py).clone()),
                Target::EmptyLike { fallback, .. } => ("empty_like", fallback.bind(py).clone()),
            };
            out.append((kind, target))?;
        }
        Ok(out)
    }

    /// Per step, the intermediate it keeps between replays (module docs): the tensor now kept,
    /// ``None`` where none is kept yet, ``False`` for a step that keeps nothing.
    #[getter]
    fn kept<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
        let out = pyo3::types::PyList::empty(py);
        for s in self.steps.iter() {
            match &s.target {
                Target::Empty { kept: Some(k), .. } => {
                    let t = k
                        .tensor
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .as_ref()
                        .map(|(_, t)| t.clone_ref(py));
                    out.append(t)?;
                }
                _ => out.append(false)?,
            }
        }
        Ok(out)
    }

    /// Whether the plan is one call of the DSL's bound call.
    #[getter]
    fn bound(&self) -> bool {
        self.bound
    }

    /// Whether the plan still holds (its guard).
    #[getter]
    fn valid(&self, py: Python<'_>) -> PyResult<bool> {
        self.holds(py)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        fn src(visit: &PyVisit<'_>, s: &Src) -> Result<(), PyTraverseError> {
            match s {
                Src::Const(c) => visit.call(c),
                Src::Tuple(items) | Src::List(items) => items.iter().try_for_each(|s| src(visit, s)),
                _ => Ok(()),
            }
        }
        for step in self.steps.iter() {
            match &step.target {
                Target::Call(f) => visit.call(f)?,
                Target::Launch(l) => visit.call(l)?,
                Target::Compiled { launch, fallback, .. } => {
                    visit.call(launch)?;
                    visit.call(fallback)?;
                }
                Target::Empty { alloc, fallback, kept, .. } => {
                    visit.call(alloc)?;
                    visit.call(fallback)?;
                    if let Some(k) = kept {
                        visit.call(&k.current)?;
                        visit.call(&k.deterministic)?;
                    }
                }
                Target::EmptyLike { alloc, fallback, .. } => {
                    visit.call(alloc)?;
                    visit.call(fallback)?;
                }
            }
            if let Some(k) = &step.kwnames {
                visit.call(k)?;
            }
            step.args.iter().try_for_each(|s| src(&visit, s))?;
        }
        src(&visit, &self.ret)?;
        if let Some((o, n, v)) = &self.guard {
            visit.call(o)?;
            visit.call(n)?;
            visit.call(v)?;
        }
        Ok(())
    }
}
