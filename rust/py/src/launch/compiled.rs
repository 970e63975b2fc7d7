//! `_CompiledLaunch`: one compiled kernel launched as a library with its own kernel cache launches
//! it (FlagGems' `LibEntry`: `ck[grid](*all_args)` on a hit), for the launch steps of DSL plans
//! (`crate::dsl`). The library chose `ck` for the 16-byte alignment of each pointer argument, so a
//! launch whose pointers are aligned otherwise is declined (the plan then asks the library again).
//!
//! Per launch, as `CompiledKernel.__getitem__`'s runner does, Triton reads `knobs.runtime` from the
//! `triton.knobs` module and its `launch_enter_hook` and `launch_exit_hook`. Where the watch covers
//! those reads (`jitkey/triton/_watch.py`: the knob class's attribute writes bump the watch version;
//! `watch` is that class), the two hooks read are kept while the version is unchanged and
//! `knobs.runtime` is still the object they were read from (one dict lookup per launch); a hook
//! chain's `calls` is still checked for emptiness on every launch. Otherwise they are read per launch.

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::{PyDict, PyTuple, PyType};
use std::sync::{Arc, Mutex, PoisonError};

use super::entry::Entry;
use super::pack::Slots;
use super::state::{watch_version, Hook};
use super::{borrowed, call_with, current_stream};
use crate::torch::TorchCurrent;

/// The launch hooks as read from one `knobs.runtime` object at one watch version.
struct Hooks<O> {
    version: u64,
    runtime: O,
    enter: Hook<O>,
    exit: Hook<O>,
}

impl<'py> Hooks<Bound<'py, PyAny>> {
    fn unbind(self) -> Hooks<Py<PyAny>> {
        Hooks {
            version: self.version,
            runtime: self.runtime.unbind(),
            enter: self.enter.unbind(),
            exit: self.exit.unbind(),
        }
    }
}

/// This launch's hooks: the kept ones, or read for this launch only.
enum Current<'py> {
    Kept(Arc<Hooks<Py<PyAny>>>),
    Read(Hooks<Bound<'py, PyAny>>),
}

#[pyclass(name = "_CompiledLaunch", module = "jitkey._core", frozen)]
pub(crate) struct CompiledLaunch {
    entry: Py<Entry>,
    get_stream: Py<PyAny>,
    /// torch's C shim for the stream, proven equal to `get_stream` (the runtime's `native`), if any.
    current: Option<Py<TorchCurrent>>,
    /// `triton.knobs` and its `__dict__` (where `knobs.runtime` is read from per launch).
    knobs: Py<PyAny>,
    knobs_dict: Py<PyDict>,
    hook_chain: Option<Py<PyAny>>,
    /// The knob class whose hook reads the watch covers (None: read per launch), and what was kept.
    watch: Option<Py<PyType>>,
    kept: Mutex<Option<Arc<Hooks<Py<PyAny>>>>>,
    /// The device the kernel was loaded on (where it was recorded), and its index (-1: not an int).
    device: Py<PyAny>,
    dev: i64,
    /// `(parameter, aligned)`: the pointers whose alignment the library keyed.
    aligned: Vec<(usize, bool)>,
}

/// A pointer argument's address: a CUDA tensor's `data_ptr` read directly where possible, else its
/// `data_ptr()` method (FlagGems' `StridedBuffer`).
fn data_ptr(py: Python<'_>, obj: *mut ffi::PyObject, device: i64) -> PyResult<Option<u64>> {
    if let Some(p) = crate::torch::cuda_data_ptr(obj, device) {
        return Ok(Some(p));
    }
    let o = borrowed(py, obj);
    match o.call_method0(intern!(py, "data_ptr")) {
        Ok(p) => Ok(p.extract::<u64>().ok()),
        Err(_) => Ok(None),
    }
}

impl CompiledLaunch {
    /// `knobs.runtime` as Triton's runner reads it: the module's dict entry, else its getattr.
    fn runtime<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self.knobs_dict.bind(py).get_item(intern!(py, "runtime"))? {
            Some(r) => Ok(r),
            None => self.knobs.bind(py).getattr(intern!(py, "runtime")),
        }
    }

    /// This launch's hooks: kept while the watch version and the `knobs.runtime` object are the ones
    /// they were read at, else read now (and kept when the watch covers the object's class).
    fn hooks<'py>(&self, py: Python<'py>) -> PyResult<Current<'py>> {
        let runtime = self.runtime(py)?;
        let Some(watch) = &self.watch else { return Ok(Current::Read(self.read_hooks(py, runtime, 0)?)) };
        let version = watch_version();
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(k) = kept {
            if k.version == version && k.runtime.is(&runtime) {
                return Ok(Current::Kept(k));
            }
        }
        let watched = runtime.get_type().is(watch.bind(py));
        let h = self.read_hooks(py, runtime, version)?;
        if !watched {
            return Ok(Current::Read(h));
        }
        let h = Arc::new(h.unbind());
        // The replaced hooks are dropped after the lock is released (a drop may run Python code).
        let _old = self.kept.lock().unwrap_or_else(PoisonError::into_inner).replace(h.clone());
        Ok(Current::Kept(h))
    }

    fn read_hooks<'py>(
        &self,
        py: Python<'py>,
        runtime: Bound<'py, PyAny>,
        version: u64,
    ) -> PyResult<Hooks<Bound<'py, PyAny>>> {
        let chain = self.hook_chain.as_ref();
        let enter = Hook::read(py, runtime.getattr(intern!(py, "launch_enter_hook"))?, chain)?;
        let exit = Hook::read(py, runtime.getattr(intern!(py, "launch_exit_hook"))?, chain)?;
        Ok(Hooks { version, runtime, enter, exit })
    }

    /// The index of the device the kernel was loaded on (where it launches), -1 when not an int.
    pub(crate) fn device_index(&self) -> i64 {
        self.dev
    }

    /// `ck[grid](*params)`: `grid` is a tuple of three ints. `Ok(None)`: declined, because a
    /// pointer's alignment is not the one the kernel was chosen for.
    pub(crate) fn launch<'py>(
        &self,
        py: Python<'py>,
        grid: *mut ffi::PyObject,
        params: &[*mut ffi::PyObject],
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let dev = self.dev;
        for &(i, want) in &self.aligned {
            let Some(&p) = params.get(i) else { return Ok(None) };
            match data_ptr(py, p, dev)? {
                Some(ptr) if (ptr & 15 == 0) == want => {}
                _ => return Ok(None),
            }
        }
        let grid = borrowed(py, grid);
        let grid = grid
            .cast::<PyTuple>()
            .map_err(|_| PyTypeError::new_err("_CompiledLaunch: grid must be a tuple"))?;
        if grid.len() != 3 {
            return Err(PyTypeError::new_err("_CompiledLaunch: grid must have three items"));
        }
        let (g0, g1, g2) = (grid.get_item(0)?, grid.get_item(1)?, grid.get_item(2)?);
        let e = self.entry.get();
        let device = self.device.bind(py);
        let index = i32::try_from(dev).ok().filter(|&d| d >= 0);
        let stream = current_stream(py, self.current.as_ref(), &self.get_stream, device, index)?;
        let hooks = self.hooks(py)?;
        let (h_enter, h_exit) = match &hooks {
            Current::Kept(k) => (k.enter.is_empty(py)?, k.exit.is_empty(py)?),
            Current::Read(r) => (r.enter.is_empty(py)?, r.exit.is_empty(py)?),
        };
        let ck = e.ck.bind(py);
        let none = py.None().into_bound(py);
        let (md, enter, exit) = if h_enter && h_exit {
            (none.clone(), none.clone(), none)
        } else {
            let (enter, exit) = match &hooks {
                Current::Kept(k) => (k.enter.obj.bind(py).clone(), k.exit.obj.bind(py).clone()),
                Current::Read(r) => (r.enter.obj.clone(), r.exit.obj.clone()),
            };
            let md_fn = ck.getattr(intern!(py, "launch_metadata"))?;
            let s = stream.object(py)?;
            let md = call_with(py, &md_fn, &[&[grid.as_ptr(), s.as_ptr()], params])?;
            (md, enter, exit)
        };
        if let Some(plan) = &e.plan {
            let plan = plan.get();
            let mut slots = Slots::new();
            match plan.prepare([&g0, &g1, &g2], &stream, params, dev, None, &mut slots) {
                Ok(l) => {
                    let hooks =
                        if enter.is_none() && exit.is_none() { None } else { Some((&md, &enter, &exit)) };
                    plan.launch_packed(py, &mut slots, &l, &stream, hooks)?;
                    return Ok(Some(ck.clone()));
                }
                Err(why) => plan.count_decline(why),
            }
        }
        let stream = stream.object(py)?;
        e.call_target(py, [&g0, &g1, &g2], &stream, [&md, &enter, &exit], params)?;
        Ok(Some(ck.clone()))
    }
}

#[pymethods]
impl CompiledLaunch {
    /// `_CompiledLaunch(entry, runtime, knobs, hook_chain, watch, device, aligned, /)`: ``entry`` a
    /// `_TritonEntry` of the compiled kernel, ``runtime`` has ``get_stream(device)`` (and ``native``: a
    /// ``_TorchCurrent`` proven equal to it, or None; read through it when set), ``knobs`` is the
    /// ``triton.knobs`` module (``knobs.runtime``'s launch hooks), ``hook_chain`` Triton's
    /// ``HookChain`` type or None, ``watch`` the knob class whose hook reads are watched or None,
    /// ``device`` the device index it was loaded on, ``aligned`` ``(parameter, aligned)`` pairs.
    #[new]
    #[pyo3(signature = (entry, runtime, knobs, hook_chain, watch, device, aligned, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        entry: Py<Entry>,
        runtime: &Bound<'_, PyAny>,
        knobs: &Bound<'_, PyAny>,
        hook_chain: Option<Py<PyAny>>,
        watch: Option<Py<PyType>>,
        device: Py<PyAny>,
        aligned: Vec<(usize, bool)>,
    ) -> PyResult<Self> {
        let native = runtime.getattr("native").ok().filter(|n| !n.is_none());
        let current = native.map(|n| n.cast_into::<TorchCurrent>().map(Bound::unbind)).transpose()?;
        let dev = device.bind(runtime.py()).extract::<i64>().unwrap_or(-1);
        Ok(Self {
            entry,
            get_stream: runtime.getattr("get_stream")?.unbind(),
            current,
            knobs_dict: knobs.getattr("__dict__")?.cast_into::<PyDict>()?.unbind(),
            knobs: knobs.clone().unbind(),
            hook_chain,
            watch,
            kept: Mutex::new(None),
            device,
            dev,
            aligned,
        })
    }

    /// ``launch(grid, *params)``: as a plan's step launches (None: declined).
    #[pyo3(signature = (grid, *params))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        grid: &Bound<'py, PyAny>,
        params: &Bound<'py, PyTuple>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let ptrs: Vec<_> = params.iter().map(|p| p.as_ptr()).collect();
        self.launch(py, grid.as_ptr(), &ptrs)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.entry)?;
        visit.call(&self.get_stream)?;
        if let Some(c) = &self.current {
            visit.call(c)?;
        }
        visit.call(&self.knobs)?;
        visit.call(&self.knobs_dict)?;
        if let Some(h) = &self.hook_chain {
            visit.call(h)?;
        }
        if let Some(w) = &self.watch {
            visit.call(w)?;
        }
        if let Ok(kept) = self.kept.try_lock() {
            if let Some(k) = kept.as_ref() {
                visit.call(&k.runtime)?;
                k.enter.visit(&visit)?;
                k.exit.visit(&visit)?;
            }
        }
        visit.call(&self.device)
    }

    fn __clear__(&self) {
        let _old = self.kept.try_lock().ok().and_then(|mut k| k.take());
    }
}
