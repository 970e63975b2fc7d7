//! `_Site`: one DSL entry point (a Helion kernel, a FlagGems op) called through jitkey.
//!
//! Per call, natively: the site's checks (state under which no plan may run, e.g. an active torch
//! function mode), the key (the site's `Signature` over the positional arguments, then the DSL's
//! state), the cache probe, and then the cached value: a `_Plan` is replayed (while its guard
//! holds), anything else is the DSL's bound call for these arguments and is called with them. A miss
//! goes to the Python side (`miss(args)` runs the DSL's own path, recording it, and returns
//! `(result, value or None)`; the value is stored under the key computed here), and whatever this
//! path does not handle to `fallback(reason, args, kwargs)` (the DSL's own path, counted).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyString, PyTuple};

use super::plan::Plan;
use crate::cpython::tuple_item;
use crate::fastcall::{self, Args, Body, MethodDef};
use crate::keys::{encode_into, fast_hash_state, with_encoder};
use crate::launch::Leave;
use crate::lru::PyLruCache;
use crate::signature::{ArgSlots, ParamNames, Signature};
use crate::torch::{TorchCurrent, TorchModes};

#[pyclass(name = "_Site", module = "jitkey._core", frozen)]
pub(crate) struct Site {
    sig: Py<Signature>,
    cache: Py<PyLruCache>,
    miss: Py<PyAny>,
    fallback: Py<PyAny>,
    /// `(check, reason)`: a call for which `check()` is truthy goes to `fallback(reason, ...)`.
    checks: Vec<(Read, Py<PyString>)>,
    /// What is folded into every key: the DSL's settings and environment its decisions read, and
    /// torch's modes.
    state: Vec<Read>,
    /// torch's C shim for the current device (`Read::Device`), once proven (`use_current`).
    current: OnceLock<Py<TorchCurrent>>,
    /// The parameter names keyword arguments bind to, and how many parameters may be passed by position
    /// (the rest are keyword-only).
    params: ParamNames,
    npos: usize,
    replays: AtomicU64,
    bound_calls: AtomicU64,
    stale: AtomicU64,
}

/// A value a site reads on every call: a Python callable's result, one of torch's modes read
/// natively (`crate::torch::TorchModes`, once proven equal to the Python function it stands for), or
/// the current CUDA device, read through torch's C shim once the site has a proven one.
enum Read {
    Call(Py<PyAny>),
    /// Read `i` of the modes; the callable is the Python function it stands for.
    Mode(Py<TorchModes>, usize, Py<PyAny>),
    /// The current device: the site's `TorchCurrent` when set (and not failed), else the callable
    /// (`torch._C._cuda_getDevice`, whose answer the shim was proven to give).
    Device(Py<PyAny>),
}

impl Read {
    fn new(py: Python<'_>, f: Py<PyAny>, modes: Option<&Py<TorchModes>>, device: Option<&Py<PyAny>>) -> Self {
        if device.is_some_and(|d| d.is(&f)) {
            return Read::Device(f);
        }
        match modes.and_then(|m| m.get().which(f.bind(py)).map(|i| (m, i))) {
            Some((m, i)) => Read::Mode(m.clone_ref(py), i, f),
            None => Read::Call(f),
        }
    }

    #[inline]
    fn get<'py>(&self, py: Python<'py>, current: Option<&Py<TorchCurrent>>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Read::Call(f) => f.bind(py).call0(),
            Read::Mode(m, i, _) => m.get().read(py, *i),
            Read::Device(f) => match current.and_then(|c| c.get().device_index()) {
                Some(d) => Ok(d.into_pyobject(py)?.into_any()),
                None => f.bind(py).call0(),
            },
        }
    }

    fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Read::Call(f) | Read::Device(f) => visit.call(f),
            Read::Mode(m, _, f) => {
                visit.call(m)?;
                visit.call(f)
            }
        }
    }
}

/// Whether an argument's identity may matter to a DSL's decisions: anything but the immutable
/// builtin scalars (whose identity CPython shares freely).
fn has_identity(p: *mut ffi::PyObject) -> bool {
    // SAFETY: p is a live object; the type checks read its type and the static singletons.
    unsafe {
        !(p == ffi::Py_None()
            || ffi::PyLong_CheckExact(p) != 0
            || ffi::PyFloat_CheckExact(p) != 0
            || ffi::PyUnicode_CheckExact(p) != 0
            || ffi::PyBool_Check(p) != 0)
    }
}

fn borrowed<'a, 'py>(py: Python<'py>, p: *mut ffi::PyObject) -> Borrowed<'a, 'py, PyAny> {
    // SAFETY: the pointers handed here are the call's live arguments.
    unsafe { Borrowed::from_ptr(py, p) }
}

impl Site {
    /// Binds positional and keyword arguments to the parameters (defaults applied); `Err` says why
    /// they do not bind (the DSL's own path then raises its error).
    fn bind(
        &self,
        args: &[*mut ffi::PyObject],
        kw: Option<(&[*mut ffi::PyObject], *mut ffi::PyObject)>,
        out: &mut ArgSlots,
    ) -> Result<(), String> {
        let sig = self.sig.get();
        let n = self.params.len();
        if args.len() > self.npos {
            return Err(format!("{} positional arguments where the site takes {}", args.len(), self.npos));
        }
        let slots = out.reset(args, n);
        if let Some((values, names)) = kw {
            for (i, &v) in values.iter().enumerate() {
                // SAFETY: `names` is the call's kwnames tuple, one str per value.
                let k = unsafe { tuple_item(names, i as ffi::Py_ssize_t) };
                match self.params.index(k) {
                    Some(j) if !slots[j].is_null() => {
                        return Err(format!("multiple values for argument '{}'", sig.param_names()[j]))
                    }
                    Some(j) => slots[j] = v,
                    None => return Err("an unexpected keyword argument".to_owned()),
                }
            }
        }
        sig.fill_defaults(slots, args.len())
    }

    /// Writes the key of a call whose arguments are bound to every parameter (`args`).
    fn encode(
        &self,
        py: Python<'_>,
        args: &[*mut ffi::PyObject],
        enc: &mut jitkey_core::key::Encoder,
    ) -> Result<(), Leave> {
        let sig = self.sig.get();
        sig.encode_header(enc);
        crate::torch::take_subclass_seen();
        for (i, &a) in args.iter().enumerate() {
            sig.encode_param(i, &borrowed(py, a), enc)
                .map_err(|e| Leave::Fallback(e.into_value(py).into_any()))?;
        }
        if crate::torch::take_subclass_seen() {
            // A subclass's __torch_function__ may change what the DSL does: its own path decides.
            return Err(Leave::Fallback(
                pyo3::intern!(py, "a tensor subclass argument").clone().into_any().unbind(),
            ));
        }
        enc.tuple_header(self.state.len()).map_err(|e| Leave::Raise(PyTypeError::new_err(e.to_string())))?;
        for state in &self.state {
            let s = state.get(py, self.current.get())?;
            encode_into(&s, enc).map_err(|e| {
                let err = crate::errors::ArgumentError::new_err("the DSL state is not keyable");
                err.set_cause(py, Some(e.into_pyerr(py, "state")));
                Leave::Fallback(err.into_value(py).into_any())
            })?;
        }
        // Which arguments are one object (a DSL may branch on `a is b`): the first earlier argument
        // each is identical to, for every argument of a type that has identity worth keying.
        let mut aliases: [(u8, u8); 8] = [(0, 0); 8];
        let mut n_alias = 0usize;
        for (i, &a) in args.iter().enumerate().skip(1) {
            if has_identity(a) {
                if let Some(j) = args[..i].iter().position(|&b| b == a) {
                    if n_alias == aliases.len() || i > usize::from(u8::MAX) {
                        let why = pyo3::intern!(py, "too many arguments passed more than once");
                        return Err(Leave::Fallback(why.clone().into_any().unbind()));
                    }
                    aliases[n_alias] = (i as u8, j as u8);
                    n_alias += 1;
                }
            }
        }
        enc.raw_u8(n_alias as u8);
        for &(i, j) in &aliases[..n_alias] {
            enc.raw(&[i, j]);
        }
        Ok(())
    }

    fn args_tuple<'py>(py: Python<'py>, args: &[*mut ffi::PyObject]) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, args.iter().map(|&p| borrowed(py, p)))
    }

    fn leave<'py>(
        &self,
        py: Python<'py>,
        why: Leave,
        args: &[*mut ffi::PyObject],
        kw: Option<(&[*mut ffi::PyObject], *mut ffi::PyObject)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match why {
            Leave::Raise(e) => Err(e),
            Leave::Fallback(reason) => {
                let t = Self::args_tuple(py, args)?;
                let d = PyDict::new(py);
                if let Some((values, names)) = kw {
                    let names = borrowed(py, names);
                    for (name, &v) in names.cast::<PyTuple>()?.iter().zip(values) {
                        d.set_item(name, borrowed(py, v))?;
                    }
                }
                self.fallback.bind(py).call1((reason, t, d))
            }
        }
    }

    /// One call: `args` are the positional arguments, `kw` the keyword values and their names.
    /// `slf` is this site's object when a recording in progress must learn of the call.
    pub(super) fn run<'py>(
        &self,
        py: Python<'py>,
        slf: Option<&Bound<'py, PyAny>>,
        args: &[*mut ffi::PyObject],
        kw: Option<(&[*mut ffi::PyObject], *mut ffi::PyObject)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(slf) = slf.filter(|_| super::recording()) {
            let t = Self::args_tuple(py, args)?;
            let d = PyDict::new(py);
            if let Some((values, names)) = kw {
                for (name, &v) in borrowed(py, names).cast::<PyTuple>()?.iter().zip(values) {
                    d.set_item(name, borrowed(py, v))?;
                }
            }
            if let Some(out) = super::on_site(py, (slf, &t, &d))? {
                return Ok(out);
            }
        }
        for (check, reason) in &self.checks {
            if check.get(py, self.current.get())?.is_truthy()? {
                return self.leave(py, Leave::Fallback(reason.clone_ref(py).into_any()), args, kw);
            }
        }
        let mut slots = ArgSlots::new();
        if let Err(msg) = self.bind(args, kw, &mut slots) {
            let why = PyString::new(py, &format!("arguments do not bind: {msg}")).into_any().unbind();
            return self.leave(py, Leave::Fallback(why), args, kw);
        }
        let full = slots.get();
        let probe = with_encoder(|enc| -> Result<_, Leave> {
            self.encode(py, full, enc)?;
            let key = enc.as_bytes();
            let h = fast_hash_state().hash(key);
            Ok(match self.cache.get().get_encoded(py, h, key) {
                Some(v) => Ok(v),
                None => Err((h, key.to_vec())),
            })
        });
        let (h, key) = match probe {
            Err(why) => return self.leave(py, why, args, kw),
            Ok(Ok(v)) => {
                if let Ok(plan) = v.cast::<Plan>() {
                    let plan = plan.get();
                    if plan.nargs() == full.len() && plan.holds(py)? {
                        let n = if plan.is_bound() { &self.bound_calls } else { &self.replays };
                        n.fetch_add(1, Ordering::Relaxed);
                        return plan.replay(py, full);
                    }
                    self.stale.fetch_add(1, Ordering::Relaxed);
                    // Recorded from what the DSL no longer uses: the DSL's path again, re-recorded.
                    let key =
                        with_encoder(|enc| self.encode(py, full, enc).map(|()| enc.as_bytes().to_vec()));
                    let key = match key {
                        Ok(k) => k,
                        Err(why) => return self.leave(py, why, args, kw),
                    };
                    (fast_hash_state().hash(&key), key)
                } else {
                    return super::plan::call(py, &v, full, None, &[]);
                }
            }
            Ok(Err(miss)) => miss,
        };
        let out = self.miss.bind(py).call1((Self::args_tuple(py, full)?,))?;
        let (ret, value): (Bound<'py, PyAny>, Bound<'py, PyAny>) = out.extract()?;
        if !value.is_none() {
            self.cache.get().insert_encoded(h, &key, value.unbind());
        }
        Ok(ret)
    }
}

fn call_def() -> *mut ffi::PyMethodDef {
    static DEF: OnceLock<MethodDef> = OnceLock::new();
    MethodDef::get(
        &DEF,
        c"call",
        fastcall::entry::<Site>,
        c"call(*args, **kwargs): the DSL call through jitkey (jitkey.dsl)",
    )
}

/// `site.call(*args, **kwargs)`: `slf` is the site.
impl Body for Site {
    const PANICKED: &'static str = "jitkey.dsl: a site panicked";

    #[inline(always)]
    unsafe fn call(py: Python<'_>, a: Args<'_>) -> PyResult<*mut ffi::PyObject> {
        // SAFETY: `Site::call` binds this builtin to a live `_Site` (the contract).
        let site = unsafe { Borrowed::from_ptr(py, a.slf).cast_unchecked::<Site>() };
        site.get().run(py, Some(site.as_any()), a.positional(), a.keywords()).map(Bound::into_ptr)
    }
}

#[pymethods]
impl Site {
    /// `_Site(sig, cache, miss, fallback, checks, state, npos, modes=None, device=None, /)`: see the
    /// module docs. ``checks`` is a sequence of ``(callable, reason)``; ``state`` a sequence of
    /// callables; ``npos`` how many of the signature's parameters may be passed by position (the rest
    /// are keyword-only). ``modes``: a proven ``_TorchModes``; a check or state callable that is one of
    /// its Python functions is read through it instead of called. ``device``: the Python function of
    /// the current CUDA device (``torch._C._cuda_getDevice``); a check or state callable that is it is
    /// read through torch's C shim once ``use_current`` has given the site a proven one. A call binds
    /// its arguments to every parameter (defaults applied) before it is keyed; ``miss`` and plans get
    /// the bound arguments, in parameter order.
    #[new]
    #[pyo3(signature = (sig, cache, miss, fallback, checks, state, npos, modes = None, device = None, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        sig: Py<Signature>,
        cache: Py<PyLruCache>,
        miss: Py<PyAny>,
        fallback: Py<PyAny>,
        checks: &Bound<'_, PyAny>,
        state: &Bound<'_, PyAny>,
        npos: usize,
        modes: Option<Py<TorchModes>>,
        device: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let params = ParamNames::new(py, sig.get())?;
        let npos = npos.min(params.len());
        let mut st = Vec::new();
        for f in state.try_iter()? {
            let f = f?;
            if !f.is_callable() {
                return Err(PyTypeError::new_err("_Site: a state entry must be callable"));
            }
            st.push(Read::new(py, f.unbind(), modes.as_ref(), device.as_ref()));
        }
        let mut cs = Vec::new();
        for c in checks.try_iter()? {
            let (f, reason): (Py<PyAny>, String) = c?.extract()?;
            if !f.bind(py).is_callable() {
                return Err(PyTypeError::new_err("_Site: a check must be callable"));
            }
            cs.push((
                Read::new(py, f, modes.as_ref(), device.as_ref()),
                PyString::intern(py, &reason).unbind(),
            ));
        }
        Ok(Self {
            sig,
            cache,
            miss,
            fallback,
            checks: cs,
            state: st,
            current: OnceLock::new(),
            params,
            npos,
            replays: AtomicU64::new(0),
            bound_calls: AtomicU64::new(0),
            stale: AtomicU64::new(0),
        })
    }

    /// The call function: ``call(*args, **kwargs)``, a builtin bound to this site with the
    /// vectorcall convention (no argument tuple or dict is built for a call).
    #[getter]
    fn call<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: a static method definition; the function object holds a reference to `slf`.
        unsafe {
            Bound::from_owned_ptr_or_err(
                slf.py(),
                ffi::PyCFunction_NewEx(call_def(), slf.as_ptr(), null_mut()),
            )
        }
    }

    /// ``_run(args, kwargs, /)``: one call, as ``call`` makes it but without telling a recording in
    /// progress (the recorder calls this for a site call it has taken note of).
    #[pyo3(signature = (args, kwargs, /))]
    fn _run<'py>(
        &self,
        args: &Bound<'py, PyTuple>,
        kwargs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = args.py();
        let mut all: Vec<*mut ffi::PyObject> = args.iter().map(|a| a.as_ptr()).collect();
        if kwargs.is_empty() {
            return self.run(py, None, &all, None);
        }
        let names = PyTuple::new(py, kwargs.keys())?;
        all.extend(kwargs.values().iter().map(|v| v.as_ptr()));
        let n = args.len();
        // The dict's values are held by `kwargs` for the call.
        self.run(py, None, &all[..n], Some((&all[n..], names.as_ptr())))
    }

    /// ``key(args, kwargs=None, /) -> bytes``: the key a call with ``args`` (and ``kwargs``) uses (raises
    /// where such a call falls back).
    #[pyo3(signature = (args, kwargs = None, /))]
    fn key<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let pos: Vec<_> = args.iter().map(|a| a.as_ptr()).collect();
        let names = kwargs.map(|d| PyTuple::new(py, d.keys())).transpose()?;
        let values: Vec<_> =
            kwargs.map(|d| d.values().iter().map(|v| v.as_ptr()).collect()).unwrap_or_default();
        let kw = names.as_ref().filter(|n| !n.is_empty()).map(|n| (&values[..], n.as_ptr()));
        let mut slots = ArgSlots::new();
        self.bind(&pos, kw, &mut slots)
            .map_err(|m| crate::errors::ArgumentError::new_err(format!("arguments do not bind: {m}")))?;
        with_encoder(|enc| match self.encode(py, slots.get(), enc) {
            Ok(()) => Ok(pyo3::types::PyBytes::new(py, enc.as_bytes())),
            Err(leave) => Err(leave.into_key_error(py)),
        })
    }

    /// ``lookup(args, kwargs=None, /)``: the plan cached for such a call (None: none), without running it.
    #[pyo3(signature = (args, kwargs = None, /))]
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let key = self.key(py, args, kwargs)?;
        let key = key.as_bytes();
        Ok(self.cache.get().get_encoded(py, fast_hash_state().hash(key), key))
    }

    /// ``use_current(shim, /)``: read the current device through ``shim`` (a ``_TorchCurrent`` proven
    /// equal to ``torch._C._cuda_getDevice``) from now on; a site takes the first one it is given.
    #[pyo3(signature = (shim, /))]
    fn use_current(&self, shim: Py<TorchCurrent>) {
        let _ = self.current.set(shim);
    }

    /// Whether a check or state read is the current device (read through torch's C shim once
    /// ``use_current`` has given the site one).
    #[getter]
    fn reads_device(&self) -> bool {
        self.checks.iter().map(|(c, _)| c).chain(&self.state).any(|r| matches!(r, Read::Device(..)))
    }

    /// How many of the checks and state reads go through torch's C++ functions (``_TorchModes``, and
    /// the device through ``_TorchCurrent`` once the site has one).
    #[getter]
    fn native_reads(&self) -> usize {
        let has_current = self.current.get().is_some();
        self.checks
            .iter()
            .map(|(c, _)| c)
            .chain(&self.state)
            .filter(|r| matches!(r, Read::Mode(..)) || (has_current && matches!(r, Read::Device(..))))
            .count()
    }

    /// The cache of plans and bound calls.
    #[getter]
    fn cache(&self, py: Python<'_>) -> Py<PyLruCache> {
        self.cache.clone_ref(py)
    }

    /// ``{"replays": n, "bound_calls": n, "stale": n}``: hits that replayed a recorded plan, hits that
    /// called the DSL's bound call (a one-step plan), and plans found stale (the DSL's path again).
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("replays", self.replays.load(Ordering::Relaxed))?;
        d.set_item("bound_calls", self.bound_calls.load(Ordering::Relaxed))?;
        d.set_item("stale", self.stale.load(Ordering::Relaxed))?;
        Ok(d)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.sig)?;
        visit.call(&self.cache)?;
        visit.call(&self.miss)?;
        visit.call(&self.fallback)?;
        for (c, r) in &self.checks {
            c.traverse(&visit)?;
            visit.call(r)?;
        }
        for s in &self.state {
            s.traverse(&visit)?;
        }
        if let Some(c) = self.current.get() {
            visit.call(c)?;
        }
        self.params.traverse(&visit)?;
        Ok(())
    }
}
