//! `_Plan`: a DSL call's host work as it was recorded, replayed without the DSL's Python.
//!
//! A plan is a straight-line program over the call's arguments: each step calls what the DSL's own
//! path called (a torch function, a jitkey launcher, another DSL call site) with arguments that are
//! the call's arguments, results of earlier steps or constants (whatever the DSL computed in Python
//! from keyed metadata, folded at recording), and the result is built the same way. Which calls
//! may be folded, and which may not become a plan at all, is the recorder's business
//! (`jitkey/dsl.py`); this file only runs what it was given.

use std::ptr::null_mut;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::cpython::tuple_fill;
use crate::launch::{launch_from_plan, CompiledLaunch, Launcher};
use crate::torch::TorchAlloc;

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
                Target::Empty { alloc, sizes, strides, dtype, index, fallback } => {
                    match alloc.get().empty_cuda(py, sizes, strides, *dtype, *index) {
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
                        None => call(
                            py,
                            fallback.bind(py),
                            &ptrs[*nfast..npos],
                            step.kwnames.as_ref(),
                            &ptrs[npos..],
                        )?,
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
    #[pyo3(signature = (nargs, steps, ret, guard = None, bound = false))]
    fn new(
        py: Python<'_>,
        nargs: usize,
        steps: &Bound<'_, PyAny>,
        ret: &Bound<'_, PyAny>,
        guard: Option<(Py<PyAny>, Bound<'_, PyString>, Py<PyAny>)>,
        bound: bool,
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
                Target::Empty { alloc, fallback, .. } | Target::EmptyLike { alloc, fallback, .. } => {
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
