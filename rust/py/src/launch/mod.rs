//! `jitkey._core._TritonLauncher`: the warm-launch path of `jitkey.triton` in one native call.
//!
//! Per call, with no Python frame of jitkey's own: the state Triton's objects hold (`state`: kept
//! while watched, else read), the pre-run-hook and stages-hook checks, the binding of positional and
//! keyword arguments to the kernel's parameters (defaults applied, the rest kept as launch options),
//! the current device (torch's C shim when proven, else its Python getter), the key (header, device,
//! knobs, sorted options, then every parameter by its Triton rule), the cache probe, the globals
//! check, the grid, the current stream, the launch hooks, and the launch itself.
//!
//! Everything that is not a plain hit goes back to Python: a miss to `miss(grid, args, kwargs)`
//! (Triton runs the call and returns `(result, entry or None)`; the entry is stored under the key
//! computed here; `(jitkey.MISS, entry)` means the kernel was found without a launch, from jitkey's
//! disk index, and is launched here as a hit), and anything this path does not handle to
//! `fallback(reason, grid, args, kwargs)` (Triton's own path, counted). The Python side (`jitkey/triton/_kernel.py`) owns the
//! policy: what is safe, what is counted, what an entry holds.
//!
//! Modules: `entry` (what a hit launches: `_TritonEntry`), `plan` and `pack` (jitkey's own launch of
//! a compiled kernel: `_LaunchPlan`), `state` (what a call reads from Triton's Python objects, kept
//! while watched), `vectorcall` (the C entry points `kernel[grid](...)` and `launch(grid, ...)`, and
//! `_KernelBase`), `compiled` (a compiled kernel launched as a library launches it from its own
//! cache: `_CompiledLaunch`, for DSL plans). This file is the launcher itself: bind, key, probe, hit.

mod bind;
mod compiled;
mod entry;
mod globals;
mod pack;
mod plan;
mod state;
mod vectorcall;

use std::ptr::null_mut;

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyString, PyTuple};

use jitkey_core::key::Encoder;

use crate::cpython::{tuple_fill, tuple_item};
use crate::errors::ArgumentError;
use crate::keys::{encode_into, fast_hash_state, with_encoder};
use crate::lru::PyLruCache;
use crate::signature::{ParamNames, Signature};
use crate::torch::{CudaPointers, TorchCurrent};
use bind::{BoundArgs, KwPlans};
use entry::Entry;
use globals::GlobalsCheck;
use pack::Slots;
use plan::Stream;
use state::{Current, Kept, Obj, State};
use vectorcall::{launch_def, KernelBase};

/// Why a call leaves the fast path (the Triton launcher's and a DSL site's, `crate::dsl`).
pub(crate) enum Leave {
    /// Triton's own path, counted with this reason (a str or an exception object).
    Fallback(Py<PyAny>),
    /// A real error to raise to the caller.
    Raise(PyErr),
}

impl From<PyErr> for Leave {
    fn from(e: PyErr) -> Self {
        Leave::Raise(e)
    }
}

impl Leave {
    /// What `key()` raises where the call itself would leave the fast path: the fallback's
    /// exception as it is, else an `ArgumentError` with its reason.
    #[cold]
    pub(crate) fn into_key_error(self, py: Python<'_>) -> PyErr {
        match self {
            Leave::Raise(e) => e,
            Leave::Fallback(reason) => {
                let r = reason.bind(py);
                match r.cast::<pyo3::exceptions::PyBaseException>() {
                    Ok(exc) => PyErr::from_value(exc.clone().into_any()),
                    Err(_) => ArgumentError::new_err(r.to_string()),
                }
            }
        }
    }
}

enum Probe<'py> {
    Hit(Bound<'py, PyAny>),
    Miss(u64, Vec<u8>),
}

#[pyclass(name = "_TritonLauncher", module = "jitkey._core", frozen)]
pub(crate) struct Launcher {
    sig: Py<Signature>,
    cache: Py<PyLruCache>,
    kernel_fn: Py<PyAny>,
    /// `triton.knobs` and its `__dict__`.
    knobs_module: Py<PyAny>,
    knobs_dict: Py<PyDict>,
    /// The knob sections read (`runtime` first), by name: looked up in `triton.knobs` as Triton's
    /// `knobs.<section>` does.
    sections: Vec<Py<PyString>>,
    /// The knobs `JITFunction.run` folds into the launch options: `(section index, attribute)`.
    knob_reads: Vec<(usize, Py<PyString>)>,
    check_stages: bool,
    get_device: Py<PyAny>,
    get_stream: Py<PyAny>,
    /// torch's C shim for the device and stream, once proven equal to `get_device`/`get_stream`.
    current: Option<Py<TorchCurrent>>,
    hook_chain: Option<Py<PyAny>>,
    miss: Py<PyAny>,
    fallback: Py<PyAny>,
    check_globals: Py<PyAny>,
    /// The parameter names keyword arguments bind to.
    params: ParamNames,
    /// How the keyword names of recent calls bind (`bind::KwPlan`).
    kw_plans: KwPlans,
    /// How many parameters may be passed positionally (the rest are keyword-only).
    npos: usize,
    /// What the watch covers (`{(knob class, attribute): "plain" | "env"}`): `Some` when this
    /// launcher may keep its state; `None` with why in `off`.
    watch: Option<Py<PyDict>>,
    off: Option<Py<PyString>>,
    kept: Kept,
    /// The names `JITFunction.run` takes for itself (`grid`, `warmup`; interned): a keyword argument
    /// so named is never bound here (Triton raises `TypeError` for it, or consumes it).
    run_keywords: Vec<Py<PyString>>,
    /// Triton's globals check, by a snapshot while it holds (`globals`).
    globals: GlobalsCheck,
}

fn borrowed<'a, 'py>(py: Python<'py>, p: *mut ffi::PyObject) -> Borrowed<'a, 'py, PyAny> {
    // SAFETY: every pointer handed here is a live object kept alive by the call (see `BoundArgs`).
    unsafe { Borrowed::from_ptr(py, p) }
}

/// `f(*parts[0], *parts[1], ...)`: the argument tuple is filled in place.
fn call_with<'py>(
    py: Python<'py>,
    f: &Bound<'py, PyAny>,
    parts: &[&[*mut ffi::PyObject]],
) -> PyResult<Bound<'py, PyAny>> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    // SAFETY: a new tuple of `len` slots owned by `t` from the start; each slot is filled exactly
    // once, in order, with a new reference to a live object before the call.
    unsafe {
        let t = ffi::PyTuple_New(len as ffi::Py_ssize_t);
        if t.is_null() {
            return Err(PyErr::fetch(py));
        }
        let t = Bound::from_owned_ptr(py, t);
        let mut at: ffi::Py_ssize_t = 0;
        for part in parts {
            for &p in *part {
                ffi::Py_INCREF(p);
                tuple_fill(t.as_ptr(), at, p);
                at += 1;
            }
        }
        Bound::from_owned_ptr_or_err(py, ffi::PyObject_Call(f.as_ptr(), t.as_ptr(), null_mut()))
    }
}

/// `f(arg)` with no argument tuple (`PyObject_CallFunctionObjArgs` passes its arguments on the
/// C stack where the callee takes vectorcall).
fn call_one<'py>(
    py: Python<'py>,
    f: &Bound<'py, PyAny>,
    arg: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: two live objects and the terminating null; the result is a new reference or null
    // with an error set.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyObject_CallFunctionObjArgs(f.as_ptr(), arg.as_ptr(), null_mut::<ffi::PyObject>()),
        )
    }
}

impl Launcher {
    /// Writes the key: header, device, knob state, sorted launch options, parameters. `persistent`:
    /// every leaf as `jitkey.encode` writes it (stable across processes), not the in-process tensor
    /// leaf. `index`: the device's index when read natively (`device` is that int), written as
    /// `encode_into` writes the int.
    #[allow(clippy::too_many_arguments)]
    fn encode_key<O>(
        &self,
        py: Python<'_>,
        enc: &mut Encoder,
        device: &Bound<'_, PyAny>,
        index: Option<i32>,
        st: &State<O>,
        b: &BoundArgs,
        persistent: bool,
        ptrs: Option<&mut CudaPointers>,
    ) -> Result<(), Leave> {
        let sig = self.sig.get();
        sig.encode_header(enc);
        let unkeyable = |what: &str, e: crate::keys::WalkError| {
            let err = ArgumentError::new_err(format!("{what} is not keyable"));
            err.set_cause(py, Some(e.into_pyerr(py, what)));
            Leave::Fallback(err.into_value(py).into_any())
        };
        match index {
            Some(d) => enc.int(i64::from(d)),
            None => encode_into(device, enc).map_err(|e| unkeyable("the current device", e))?,
        }
        match &st.key {
            Ok(bytes) => enc.raw(bytes.as_slice()),
            Err(reason) => return Err(Leave::Fallback(reason.clone_ref(py))),
        }
        let opts = b.opts.as_slice();
        enc.tuple_header(opts.len()).map_err(|e| Leave::Raise(PyTypeError::new_err(e.to_string())))?;
        for (i, &(k, v)) in opts.iter().enumerate() {
            match b.plan.as_ref().and_then(|p| p.encoded_name(i)) {
                Some(name) => enc.raw(name), // the name as encode_into writes it, once per tuple of names
                None => {
                    encode_into(&borrowed(py, k), enc).map_err(|e| unkeyable("a launch option name", e))?
                }
            }
            encode_into(&borrowed(py, v), enc).map_err(|e| unkeyable("a launch option", e))?;
        }
        let params = if persistent {
            b.params().iter().enumerate().try_for_each(|(i, &p)| sig.encode_param(i, &borrowed(py, p), enc))
        } else {
            sig.encode_params_in_process(py, b.params(), enc, ptrs)
        };
        params.map_err(|e| Leave::Fallback(e.into_value(py).into_any()))?;
        Ok(())
    }

    /// Whether Triton still holds the entry's kernel where it was found (see `Entry::kcache`).
    fn entry_current<'py, O: Obj<'py>>(
        &self,
        py: Python<'py>,
        entry: &Bound<'py, PyAny>,
        device: &Bound<'py, PyAny>,
        st: &State<O>,
    ) -> PyResult<bool> {
        let Ok(entry) = entry.cast::<Entry>() else { return Ok(true) }; // launch_hit reports it
        let e = entry.get();
        let (Some(kcache), Some(tkey)) = (&e.kcache, &e.tkey) else { return Ok(true) };
        let Ok(caches) = st.device_caches.b(py).cast::<PyDict>() else { return Ok(false) };
        // PyDict_GetItem semantics: a defaultdict's factory is not called.
        let Some(per_device) = caches.get_item(device)? else { return Ok(false) };
        let Ok(per_device) = per_device.cast::<PyTuple>() else { return Ok(false) };
        if per_device.is_empty() || !per_device.get_item(0)?.is(kcache.bind(py)) {
            return Ok(false);
        }
        let Ok(kcache) = kcache.bind(py).cast::<PyDict>() else { return Ok(false) };
        Ok(kcache.get_item(tkey.bind(py))?.is_some_and(|ck| ck.is(e.ck.bind(py))))
    }

    /// The current device: torch's C shim when proven (`current`), else the Python getter (which
    /// also runs when the shim reports an error, and raises torch's own error).
    fn device<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Option<i32>)> {
        if let Some(c) = &self.current {
            if let Some(d) = c.get().device_index() {
                return Ok((d.into_pyobject(py)?.into_any(), Some(d)));
            }
        }
        Ok((self.get_device.bind(py).call0()?, None))
    }

    /// The current stream of `device`, as `device` above.
    fn stream<'py>(
        &self,
        py: Python<'py>,
        device: &Bound<'py, PyAny>,
        index: Option<i32>,
    ) -> PyResult<Stream<'py>> {
        current_stream(py, self.current.as_ref(), &self.get_stream, device, index)
    }

    fn leave<'py>(&self, py: Python<'py>, why: Leave, call: &Call<'_>) -> PyResult<Bound<'py, PyAny>> {
        match why {
            Leave::Raise(e) => Err(e),
            Leave::Fallback(reason) => {
                let (grid, args, kwargs) = call.to_python(py)?;
                self.fallback.bind(py).call1((reason, grid, args, kwargs))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_hit<'py, O: Obj<'py>>(
        &self,
        py: Python<'py>,
        entry: &Bound<'py, PyAny>,
        grid: &Borrowed<'_, 'py, PyAny>,
        device: &Bound<'py, PyAny>,
        index: Option<i32>,
        st: &State<O>,
        b: &BoundArgs,
        mut ptrs: Option<&CudaPointers>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let entry = entry.cast::<Entry>().map_err(|_| {
            PyTypeError::new_err(
                "jitkey.triton: the launcher's cache holds a value that is not a launch entry",
            )
        })?;
        let e = entry.get();
        // The pointers read while keying are packed as read only if no Python code runs before
        // the packing (it could free or move a tensor's storage): the globals check, a grid
        // function or sequence, the stream getter and the launch hooks' metadata may.
        let ugv = st.used_global_vals.b(py);
        if !ugv.is_exact_instance_of::<PyDict>() {
            ptrs = None;
        }
        if ugv.is_truthy()? {
            ptrs = None;
            self.globals.check(py, ugv, self.check_globals.bind(py))?;
        }
        let params = b.params();
        if !grid.is_exact_instance_of::<PyTuple>() {
            ptrs = None;
        }
        let grid = if grid.is_exact_instance_of::<PyTuple>() || !grid.is_callable() {
            (*grid).to_owned()
        } else {
            let d = PyDict::new(py);
            for (name, &p) in self.params.objects().iter().zip(params) {
                d.set_item(name.bind(py), borrowed(py, p))?;
            }
            grid.call1((d,))?
        };
        let one = 1i32.into_pyobject(py)?.into_any();
        let (g0, g1, g2) = if let Ok(t) = grid.cast_exact::<PyTuple>() {
            let n = t.len();
            (
                t.get_item(0)?,
                if n > 1 { t.get_item(1)? } else { one.clone() },
                if n > 2 { t.get_item(2)? } else { one.clone() },
            )
        } else {
            let n = grid.len()?;
            (
                grid.get_item(0)?,
                if n > 1 { grid.get_item(1)? } else { one.clone() },
                if n > 2 { grid.get_item(2)? } else { one.clone() },
            )
        };
        let stream = self.stream(py, device, index)?;
        if !matches!(stream, Stream::Raw(_)) {
            ptrs = None;
        }
        let ck = e.ck.bind(py);
        let none = py.None().into_bound(py);
        let (md, enter, exit) = if st.enter.is_empty(py)? && st.exit.is_empty(py)? {
            (none.clone(), none.clone(), none)
        } else {
            ptrs = None;
            let md_fn = ck.getattr(intern!(py, "launch_metadata"))?;
            let s = stream.object(py)?;
            let md = call_with(py, &md_fn, &[&[grid.as_ptr(), s.as_ptr()], params])?;
            (md, st.enter.obj.b(py).clone(), st.exit.obj.b(py).clone())
        };
        if let Some(plan) = &e.plan {
            // jitkey's own launch when the plan understands this call; else Triton's launcher below.
            let plan = plan.get();
            let mut slots = Slots::new();
            let dev = match index {
                Some(d) => i64::from(d),
                None => device.extract::<i64>().unwrap_or(-1),
            };
            match plan.prepare([&g0, &g1, &g2], &stream, params, dev, ptrs, &mut slots) {
                Ok(l) => {
                    let hooks =
                        if enter.is_none() && exit.is_none() { None } else { Some((&md, &enter, &exit)) };
                    plan.launch_packed(py, &mut slots, &l, &stream, hooks)?;
                    return Ok(ck.clone());
                }
                Err(why) => plan.count_decline(why),
            }
        }
        let stream = stream.object(py)?;
        e.call_target(py, [&g0, &g1, &g2], &stream, [&md, &enter, &exit], params)?;
        Ok(ck.clone())
    }
}

#[pymethods]
impl Launcher {
    /// `_TritonLauncher(kernel, sig, cache, info, runtime, npos, watch, /)`: data only. The
    /// callbacks are the kernel's own methods, found by name: `_jk_miss`, `_jk_native_fallback`,
    /// `_jk_check_globals`; `info` is the `TritonInfo` (`knobs`, `knob_reads`,
    /// `checks_stages_hook`, `HookChain`, `run_keywords`); `runtime` has `get_device()` and
    /// `get_stream(device)`, and optionally `native`: a `_TorchCurrent` proven equal to them (or
    /// None); `watch` has `problem` (why this launcher reads Triton's state on every call, or None)
    /// and `kinds` (see `Launcher::watch`).
    #[new]
    #[pyo3(signature = (kernel, sig, cache, info, runtime, npos, watch, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        kernel: &Bound<'_, PyAny>,
        sig: Py<Signature>,
        cache: Py<PyLruCache>,
        info: &Bound<'_, PyAny>,
        runtime: &Bound<'_, PyAny>,
        npos: usize,
        watch: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let params = ParamNames::new(py, sig.get())?;
        let npos = npos.min(params.len());
        let knobs_module = info.getattr("knobs")?;
        let knobs_dict = knobs_module.getattr("__dict__")?.cast_into::<PyDict>()?;
        let mut sections = vec![PyString::intern(py, "runtime").unbind()];
        let mut knob_reads = Vec::new();
        for read in info.getattr("knob_reads")?.try_iter()? {
            let (_name, section, attr): (String, String, String) = read?.extract()?;
            let i = match sections.iter().position(|s| s.bind(py).to_str().is_ok_and(|s| s == section)) {
                Some(i) => i,
                None => {
                    sections.push(PyString::intern(py, &section).unbind());
                    sections.len() - 1
                }
            };
            knob_reads.push((i, PyString::intern(py, &attr).unbind()));
        }
        let hook_chain = info.getattr("HookChain")?;
        let current = match runtime.getattr_opt("native")? {
            Some(c) if !c.is_none() => Some(c.cast_into::<TorchCurrent>()?.unbind()),
            _ => None,
        };
        let problem = watch.getattr("problem")?;
        let (watch, off) = if problem.is_none() {
            (Some(watch.getattr("kinds")?.cast_into::<PyDict>()?.unbind()), None)
        } else {
            (None, Some(problem.str()?.unbind()))
        };
        let mut run_keywords = Vec::new();
        for name in info.getattr("run_keywords")?.try_iter()? {
            let name: String = name?.extract()?;
            run_keywords.push(PyString::intern(py, &name).unbind());
        }
        Ok(Self {
            sig,
            cache,
            kernel_fn: kernel.clone().unbind(),
            knobs_module: knobs_module.unbind(),
            knobs_dict: knobs_dict.unbind(),
            sections,
            knob_reads,
            check_stages: info.getattr("checks_stages_hook")?.is_truthy()?,
            get_device: runtime.getattr("get_device")?.unbind(),
            get_stream: runtime.getattr("get_stream")?.unbind(),
            current,
            hook_chain: if hook_chain.is_none() { None } else { Some(hook_chain.unbind()) },
            miss: kernel.getattr("_jk_miss")?.unbind(),
            fallback: kernel.getattr("_jk_native_fallback")?.unbind(),
            check_globals: kernel.getattr("_jk_check_globals")?.unbind(),
            params,
            kw_plans: KwPlans::default(),
            npos,
            watch,
            off,
            kept: Kept::default(),
            run_keywords,
            globals: GlobalsCheck::default(),
        })
    }

    /// The launch function: `launch(grid, /, *args, **kwargs)` is `kernel[grid](*args, **kwargs)`.
    /// A builtin function bound to this launcher with the vectorcall (`METH_FASTCALL`) convention,
    /// so a call (and `functools.partial(launch, grid)(...)`) builds no argument tuple or dict.
    #[getter]
    fn launch<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        // SAFETY: a static method definition; the function object holds a reference to `slf`.
        unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyCFunction_NewEx(launch_def(), slf.as_ptr(), null_mut()))
        }
    }

    /// key(args, kwargs, device, /, *, persistent=False) -> bytes: the key `launch` would use on
    /// `device` (no lookup); `persistent`: the same key with every leaf stable across processes.
    #[pyo3(signature = (args, kwargs, device, /, *, persistent = false))]
    fn key<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
        device: &Bound<'py, PyAny>,
        persistent: bool,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let pos: Vec<*mut ffi::PyObject> = args.iter().map(|a| a.as_ptr()).collect();
        let kw: Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)> =
            kwargs.map(|d| d.iter().collect()).unwrap_or_default();
        let names: Vec<_> = kw.iter().map(|(k, _)| k.as_ptr()).collect();
        let values: Vec<_> = kw.iter().map(|(_, v)| v.as_ptr()).collect();
        let mut b = BoundArgs::new();
        self.bind_params(py, &pos, null_mut(), &names, &values, &mut b)
            .map_err(|m| ArgumentError::new_err(format!("arguments do not bind: {m}")))?;
        let st = self.state(py)?;
        let encoded = |enc: &mut Encoder| match &st {
            Current::Kept(s) => self.encode_key(py, enc, device, None, &**s, &b, persistent, None),
            Current::Read(s) => self.encode_key(py, enc, device, None, s, &b, persistent, None),
        };
        with_encoder(|enc| match encoded(enc) {
            Ok(()) => Ok(pyo3::types::PyBytes::new(py, enc.as_bytes())),
            Err(leave) => Err(leave.into_key_error(py)),
        })
    }

    /// The cache the launcher stores its entries in.
    #[getter]
    fn cache(&self, py: Python<'_>) -> Py<PyLruCache> {
        self.cache.clone_ref(py)
    }

    /// `state_counts() -> dict`: `watched` (calls served by the kept state of Triton's objects),
    /// `reads` (times that state was read from the objects: on every call when it cannot be
    /// watched), `unwatched` (why the last read was not kept, or None), `globals_native` (globals
    /// checks passed by the snapshot, no Python run) and `globals_full` (Triton's full check run).
    fn state_counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.state_counts_dict(py)
    }

    /// `native_current -> bool`: whether the device and stream are read through torch's C shim.
    #[getter]
    fn native_current(&self) -> bool {
        self.current.is_some()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.sig)?;
        visit.call(&self.cache)?;
        visit.call(&self.kernel_fn)?;
        visit.call(&self.knobs_module)?;
        visit.call(&self.knobs_dict)?;
        for n in &self.sections {
            visit.call(n)?;
        }
        for (_, a) in &self.knob_reads {
            visit.call(a)?;
        }
        visit.call(&self.get_device)?;
        visit.call(&self.get_stream)?;
        if let Some(c) = &self.current {
            visit.call(c)?;
        }
        if let Some(h) = &self.hook_chain {
            visit.call(h)?;
        }
        visit.call(&self.miss)?;
        visit.call(&self.fallback)?;
        visit.call(&self.check_globals)?;
        self.params.traverse(&visit)?;
        if let Some(w) = &self.watch {
            visit.call(w)?;
        }
        if let Some(o) = &self.off {
            visit.call(o)?;
        }
        self.kw_plans.visit(&visit)?;
        self.globals.visit(&visit)?;
        self.visit_kept(&visit)
    }

    fn __clear__(&self) {
        self.clear_kept();
        self.kw_plans.clear();
        self.globals.clear();
    }
}

/// One launch's arguments: the grid, the positional arguments, then one value per name in
/// `kwnames` (a tuple of str, or null).
pub(super) struct Call<'a> {
    grid: *mut ffi::PyObject,
    pos: &'a [*mut ffi::PyObject],
    kw_values: &'a [*mut ffi::PyObject],
    kwnames: *mut ffi::PyObject,
}

impl Call<'_> {
    /// `(grid, args tuple, kwargs dict)` for the Python side (misses and fallbacks only).
    fn to_python<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(Borrowed<'_, 'py, PyAny>, Bound<'py, PyTuple>, Bound<'py, PyDict>)> {
        let grid = borrowed(py, self.grid);
        let args = PyTuple::new(py, self.pos.iter().map(|&p| borrowed(py, p)))?;
        let kwargs = PyDict::new(py);
        if !self.kwnames.is_null() {
            let names = borrowed(py, self.kwnames);
            let names = names.cast::<PyTuple>()?;
            for (name, &v) in names.iter().zip(self.kw_values) {
                kwargs.set_item(name, borrowed(py, v))?;
            }
        }
        Ok((grid, args, kwargs))
    }
}

impl Launcher {
    pub(super) fn run<'py>(&self, py: Python<'py>, call: &Call<'_>) -> PyResult<Bound<'py, PyAny>> {
        match self.state(py)? {
            Current::Kept(st) => self.run_with(py, call, &*st),
            Current::Read(st) => self.run_with(py, call, &st),
        }
    }

    fn run_with<'py, O: Obj<'py>>(
        &self,
        py: Python<'py>,
        call: &Call<'_>,
        st: &State<O>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if st.pre_run_hooks.b(py).is_truthy()? {
            let why = Leave::Fallback(intern!(py, "pre_run_hooks").clone().into_any().unbind());
            return self.leave(py, why, call);
        }
        if st.stages_hook {
            let why =
                intern!(py, "knobs.runtime.add_stages_inspection_hook is set").clone().into_any().unbind();
            return self.leave(py, Leave::Fallback(why), call);
        }
        let mut names_stack = [null_mut(); 8];
        let mut names_heap = Vec::new();
        let nkw = call.kw_values.len();
        let kw_names: &mut [*mut ffi::PyObject] = if nkw <= names_stack.len() {
            &mut names_stack[..nkw]
        } else {
            names_heap.resize(nkw, null_mut());
            &mut names_heap
        };
        for (i, slot) in kw_names.iter_mut().enumerate() {
            // SAFETY: kwnames is a tuple of nkw str objects (vectorcall protocol).
            *slot = unsafe { tuple_item(call.kwnames, i as ffi::Py_ssize_t) };
        }
        let mut b = BoundArgs::new();
        match self.bind_params(py, call.pos, call.kwnames, kw_names, call.kw_values, &mut b) {
            Ok(()) => {}
            Err(msg) => {
                let why = PyString::new(py, &format!("arguments do not bind: {msg}")).into_any().unbind();
                return self.leave(py, Leave::Fallback(why), call);
            }
        };
        let (device, index) = self.device(py)?;
        let mut ptrs = index.map(|d| CudaPointers::new(i64::from(d)));
        let probe = with_encoder(|enc| -> Result<Probe<'py>, Leave> {
            self.encode_key(py, enc, &device, index, st, &b, false, ptrs.as_mut())?;
            let key = enc.as_bytes();
            let h = fast_hash_state().hash(key);
            Ok(match self.cache.get().get_encoded(py, h, key) {
                // An entry whose kernel Triton no longer holds (its cache was cleared or
                // replaced) is a miss: Triton is asked again, under the same key.
                Some(v) if self.entry_current(py, &v, &device, st)? => Probe::Hit(v),
                _ => Probe::Miss(h, key.to_vec()),
            })
        });
        let grid = borrowed(py, call.grid);
        match probe {
            Ok(Probe::Hit(entry)) => {
                self.launch_hit(py, &entry, &grid, &device, index, st, &b, ptrs.as_ref())
            }
            Ok(Probe::Miss(h, key)) => {
                let (grid_obj, args, kwargs) = call.to_python(py)?;
                let out = self.miss.bind(py).call1((grid_obj, args, kwargs))?;
                let (ret, entry): (Bound<'py, PyAny>, Bound<'py, PyAny>) = out.extract()?;
                if entry.is_none() {
                    return Ok(ret);
                }
                let entry = entry.cast_into::<Entry>().map_err(|_| {
                    PyTypeError::new_err("jitkey.triton: miss() must return (result, _TritonEntry | None)")
                })?;
                self.cache.get().insert_encoded(h, &key, entry.clone().into_any().unbind());
                // `(MISS, entry)`: the miss found the kernel without launching it (jitkey's disk index):
                // it is launched now, as a hit.
                if ret.is(crate::signature::miss(py).bind(py)) {
                    // Triton's state as it is now (the miss ran Python code: a compile may have set the
                    // kernel's used_global_vals, for one).
                    return match self.state(py)? {
                        Current::Kept(s) => {
                            self.launch_hit(py, entry.as_any(), &grid, &device, index, &*s, &b, None)
                        }
                        Current::Read(s) => {
                            self.launch_hit(py, entry.as_any(), &grid, &device, index, &s, &b, None)
                        }
                    };
                }
                Ok(ret)
            }
            Err(why) => self.leave(py, why, call),
        }
    }
}

/// A launch step of a DSL plan (`crate::dsl`): `launch(grid, *pos, **dict(zip(kwnames, kw)))` on
/// `launcher`, exactly as `kernel[grid](...)` runs it. `kwnames` is a tuple of str or null.
/// The current stream of `device` (whose index is `index`, when known): through torch's C shim
/// `current` (proven equal to `get_stream`) while it answers, else `get_stream(device)`.
pub(super) fn current_stream<'py>(
    py: Python<'py>,
    current: Option<&Py<TorchCurrent>>,
    get_stream: &Py<PyAny>,
    device: &Bound<'py, PyAny>,
    index: Option<i32>,
) -> PyResult<Stream<'py>> {
    if let Some(s) = current.zip(index).and_then(|(c, d)| c.get().stream_of(d)) {
        return Ok(Stream::Raw(s));
    }
    Ok(Stream::Object(call_one(py, get_stream.bind(py), device)?))
}

pub(crate) fn launch_from_plan<'py>(
    py: Python<'py>,
    launcher: &Launcher,
    grid: *mut ffi::PyObject,
    pos: &[*mut ffi::PyObject],
    kw: &[*mut ffi::PyObject],
    kwnames: *mut ffi::PyObject,
) -> PyResult<Bound<'py, PyAny>> {
    launcher.run(py, &Call { grid, pos, kw_values: kw, kwnames })
}

pub(crate) use compiled::CompiledLaunch;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Entry>()?;
    m.add_class::<CompiledLaunch>()?;
    m.add_class::<Launcher>()?;
    m.add_class::<KernelBase>()?;
    state::register(m)?;
    plan::register(m)
}
