//! `_CompiledLaunch`: one compiled kernel launched as a library with its own kernel cache launches
//! it (FlagGems' `LibEntry`: `ck[grid](*all_args)` on a hit), for the launch steps of DSL plans
//! (`crate::dsl`). The library chose `ck` for the 16-byte alignment of each pointer argument, so a
//! launch whose pointers are aligned otherwise is declined (the plan then asks the library again).

use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pyclass::{PyTraverseError, PyVisit};
use pyo3::types::PyTuple;

use super::entry::Entry;
use super::pack::Slots;
use super::{borrowed, call_with, current_stream};
use crate::torch::TorchCurrent;

#[pyclass(name = "_CompiledLaunch", module = "jitkey._core", frozen)]
pub(crate) struct CompiledLaunch {
    entry: Py<Entry>,
    get_stream: Py<PyAny>,
    /// torch's C shim for the stream, proven equal to `get_stream` (the runtime's `native`), if any.
    current: Option<Py<TorchCurrent>>,
    runtime: Py<PyAny>,
    hook_chain: Option<Py<PyAny>>,
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
    fn is_empty_hook(&self, py: Python<'_>, h: &Bound<'_, PyAny>) -> PyResult<bool> {
        if h.is_none() {
            return Ok(true);
        }
        match &self.hook_chain {
            Some(t) if h.get_type().is(t.bind(py)) => Ok(!h.getattr(intern!(py, "calls"))?.is_truthy()?),
            _ => Ok(false),
        }
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
        let rt = self.runtime.bind(py);
        let enter = rt.getattr(intern!(py, "launch_enter_hook"))?;
        let exit = rt.getattr(intern!(py, "launch_exit_hook"))?;
        let ck = e.ck.bind(py);
        let none = py.None().into_bound(py);
        let (md, enter, exit) = if self.is_empty_hook(py, &enter)? && self.is_empty_hook(py, &exit)? {
            (none.clone(), none.clone(), none)
        } else {
            let md_fn = ck.getattr(intern!(py, "launch_metadata"))?;
            let s = stream.object(py)?;
            let md = call_with(py, &md_fn, &[&[grid.as_ptr(), s.as_ptr()], params])?;
            (md, enter, exit)
        };
        if let Some(plan) = &e.plan {
            let plan = plan.get();
            let mut slots = Slots::new();
            match plan.prepare([&g0, &g1, &g2], &stream, params, dev, &mut slots) {
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
    /// `_CompiledLaunch(entry, runtime, knobs_runtime, hook_chain, device, aligned, /)`: ``entry`` a
    /// `_TritonEntry` of the compiled kernel, ``runtime`` has ``get_stream(device)`` (and ``native``: a
    /// ``_TorchCurrent`` proven equal to it, or None; read through it when set), ``knobs_runtime``
    /// is ``triton.knobs.runtime`` (the launch hooks), ``hook_chain`` Triton's ``HookChain`` type or
    /// None, ``device`` the device index it was loaded on, ``aligned`` ``(parameter, aligned)`` pairs.
    #[new]
    #[pyo3(signature = (entry, runtime, knobs_runtime, hook_chain, device, aligned, /))]
    fn new(
        entry: Py<Entry>,
        runtime: &Bound<'_, PyAny>,
        knobs_runtime: Py<PyAny>,
        hook_chain: Option<Py<PyAny>>,
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
            runtime: knobs_runtime,
            hook_chain,
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
        visit.call(&self.runtime)?;
        if let Some(h) = &self.hook_chain {
            visit.call(h)?;
        }
        visit.call(&self.device)
    }
}
