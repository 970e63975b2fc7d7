//! `jitkey._core._LaunchPlan`: one compiled Triton kernel's launch, packed and sent to the driver
//! by jitkey itself.
//!
//! A plan is made once per compiled kernel (on a miss) from what Triton's launcher would be built
//! from: the launcher's `Dialect` (which Triton's launcher code it mirrors), the kernel's signature
//! types, `packed_metadata` (`num_warps`, `num_ctas`, shared memory), the cooperative-grid and PDL
//! flags and the scratch sizes. On a hit it fills the parameter buffer in Rust (per signature type,
//! as that launcher packs it) and calls `cuLaunchKernelEx` with the launch configuration that
//! launcher would use (`cuda::Driver::launch`).
//!
//! What a call must look like to be claimed, and how each type is packed: `pack`.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::pack::{grid_value, int_value, pack_param, Decline, Leaf, Param, Slots, DECLINES};
use crate::cuda::{self, Dialect, DriverError, Launch, CUDA_ERROR_INVALID_VALUE, TRITON_ATTRIBUTE_ROOM};
use crate::torch::CudaPointers;

/// The stream of a launch: as torch's C shim returned it (`crate::torch::TorchCurrent`), or the
/// object a Python getter returned (what Triton's launcher would be passed).
pub(crate) enum Stream<'py> {
    Raw(u64),
    Object(Bound<'py, PyAny>),
}

impl<'py> Stream<'py> {
    /// The stream as the launch configuration takes it, or `None` when the object is not an int in
    /// `[0, 2**64)` (the call is then declined).
    pub(crate) fn raw(&self) -> Option<u64> {
        match self {
            Stream::Raw(s) => Some(*s),
            Stream::Object(o) => match int_value(o.as_ptr()) {
                Some(s) if s >= 0 && s <= i128::from(u64::MAX) => Some(s as u64),
                _ => None,
            },
        }
    }

    /// The stream as a Python object (the int `_cuda_getCurrentRawStream` would return).
    pub(crate) fn object(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Stream::Raw(s) => Ok(s.into_pyobject(py)?.into_any()),
            Stream::Object(o) => Ok(o.clone()),
        }
    }
}

/// A scratch buffer the kernel needs: `allocator.get()(grid * num_ctas * size, align, stream)`.
struct Scratch {
    size: i64,
    align: i64,
    allocator: Py<PyAny>,
}

#[pyclass(name = "_LaunchPlan", module = "jitkey._core", frozen)]
pub(crate) struct LaunchPlan {
    drv: &'static cuda::Driver,
    dialect: Dialect,
    params: Vec<Param>,
    nslots: usize,
    function: u64,
    num_warps: i32,
    num_ctas: i32,
    shared: i32,
    cooperative: bool,
    pdl: bool,
    /// `CudaLauncher.num_ctas` (what sizes the scratch buffers).
    scratch_ctas: i64,
    global_scratch: Option<Scratch>,
    profile_scratch: Option<Scratch>,
    launched: AtomicU64,
    declined: [AtomicU64; DECLINES.len()],
}

impl LaunchPlan {
    /// Counts a call handed to Triton's launcher (the reason from `prepare`).
    pub(crate) fn count_decline(&self, why: usize) {
        self.declined[why].fetch_add(1, Ordering::Relaxed);
    }

    /// One call as Triton's launcher parses it: the grid and stream into the launch configuration,
    /// the parameters into `out`; `Err` is why the call goes to Triton's launcher instead.
    #[inline]
    pub(crate) fn prepare(
        &self,
        grid: [&Bound<'_, PyAny>; 3],
        stream: &Stream<'_>,
        params: &[*mut ffi::PyObject],
        device: i64,
        read: Option<&CudaPointers>,
        out: &mut Slots,
    ) -> Result<Launch, usize> {
        let g = |o: &Bound<'_, PyAny>| grid_value(o).ok_or(Decline::Grid as usize);
        let grid = [g(grid[0])?, g(grid[1])?, g(grid[2])?];
        let stream = stream.raw().ok_or(Decline::Stream as usize)?;
        if params.len() != self.params.len() {
            return Err(Decline::Arity as usize);
        }
        out.reserve(self.nslots);
        for (i, (p, &obj)) in self.params.iter().zip(params).enumerate() {
            // A tensor's pointer as read while the call was keyed (on this device), else read now.
            if let (Param::Leaf(Leaf::Ptr), Some(ptr)) = (p, read.and_then(|r| r.get(i))) {
                out.push(ptr);
                continue;
            }
            pack_param(p, obj, device, out).map_err(|d| d as usize)?;
        }
        Ok(Launch {
            dialect: self.dialect,
            grid,
            num_warps: self.num_warps,
            num_ctas: self.num_ctas,
            shared_memory: self.shared,
            cooperative: self.cooperative,
            pdl: self.pdl,
            stream,
            function: self.function,
        })
    }

    fn scratch<'py>(
        &self,
        py: Python<'py>,
        s: &Option<Scratch>,
        l: &Launch,
        stream: &Stream<'py>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(s) = s else { return Ok(None) };
        let grid: i128 = l.grid.iter().map(|&g| i128::from(g)).product();
        let size = grid * i128::from(self.scratch_ctas) * i128::from(s.size);
        let alloc_fn = s.allocator.bind(py).call_method0(pyo3::intern!(py, "get"))?;
        alloc_fn.call1((size, s.align, stream.object(py)?)).map(Some)
    }

    /// Launches a packed call as Triton's `CudaLauncher.__call__` and C `launch` would: scratch
    /// allocation, context check, enter hook, scratch pointers, the launch (GIL released), exit hook.
    pub(crate) fn launch_packed<'py>(
        &self,
        py: Python<'py>,
        slots: &mut Slots,
        l: &Launch,
        stream: &Stream<'py>,
        hooks: Option<(&Bound<'_, PyAny>, &Bound<'_, PyAny>, &Bound<'_, PyAny>)>,
    ) -> PyResult<()> {
        let drv = self.drv;
        let global = self.scratch(py, &self.global_scratch, l, stream)?;
        let profile = self.scratch(py, &self.profile_scratch, l, stream)?;
        let mut err: DriverError = None;
        drv.ensure_context(l.dialect, &mut err);
        if let Some((md, enter, _)) = hooks {
            if !enter.is_none() {
                enter.call1((md,))?;
            }
        }
        let mut scratch = [
            scratch_pointer(py, drv, l.dialect, global.as_ref())?,
            scratch_pointer(py, drv, l.dialect, profile.as_ref())?,
        ];
        launch_released(drv, l, slots, &mut scratch, &mut err);
        if let Some(msg) = err {
            return Err(PyRuntimeError::new_err(msg));
        }
        self.launched.fetch_add(1, Ordering::Relaxed);
        if let Some((md, _, exit)) = hooks {
            if !exit.is_none() {
                exit.call1((md,))?;
            }
        }
        Ok(())
    }
}

/// Triton's `getPointer` (3.6, index -1) or `extractPointer` (3.9) for a scratch buffer: None → 0,
/// an int as is, else `data_ptr()` checked with `cuPointerGetAttribute`.
fn scratch_pointer(
    py: Python<'_>,
    drv: &cuda::Driver,
    dialect: Dialect,
    obj: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    let Some(obj) = obj else { return Ok(0) };
    if obj.is_none() {
        return Ok(0);
    }
    if let Some(v) = int_value(obj.as_ptr()) {
        return u64::try_from(v).map_err(|_| pyo3::exceptions::PyOverflowError::new_err("scratch pointer"));
    }
    let ret = obj.call_method0(pyo3::intern!(py, "data_ptr")).map_err(|_| {
        PyTypeError::new_err("Pointer argument must be either uint64 or have data_ptr method")
    })?;
    let ptr = int_value(ret.as_ptr())
        .and_then(|v| u64::try_from(v).ok())
        .ok_or_else(|| PyTypeError::new_err("data_ptr method of Pointer object must return 64-bit int"))?;
    if ptr == 0 {
        return Ok(0);
    }
    match drv.device_pointer(ptr) {
        (0, dev) => Ok(dev),
        (CUDA_ERROR_INVALID_VALUE, _) => Err(PyValueError::new_err(match dialect {
            Dialect::Generated => "Pointer argument (at -1) cannot be accessed from Triton (cpu tensor?)",
            Dialect::Extractors => "Pointer argument cannot be accessed from Triton (cpu tensor?)",
        })),
        (rc, _) => Err(PyRuntimeError::new_err(format!("Triton Error [CUDA]: {}", drv.error_string(rc)))),
    }
}

fn scratch_from(spec: Option<(i64, i64, Py<PyAny>)>) -> Option<Scratch> {
    spec.filter(|(size, _, _)| *size > 0).map(|(size, align, allocator)| Scratch { size, align, allocator })
}

/// A launch as `_LaunchPlan.launch` and `_floor` take it from Python, `(gx, gy, gz, stream, device,
/// *params)`: `device` the current device index (tensors elsewhere are declined) or None (tensors are
/// declined, -1 here).
struct PyLaunch<'py> {
    grid: [Bound<'py, PyAny>; 3],
    stream: Stream<'py>,
    device: i64,
    params: Vec<*mut ffi::PyObject>,
}

impl<'py> PyLaunch<'py> {
    fn from_args(what: &str, call: &[Bound<'py, PyAny>]) -> PyResult<Self> {
        let [gx, gy, gz, stream, device, params @ ..] = call else {
            return Err(PyTypeError::new_err(format!(
                "{what}() takes gx, gy, gz, stream, device and the parameters ({} given)",
                call.len()
            )));
        };
        let device = if device.is_none() { -1 } else { device.extract::<i64>()? };
        Ok(Self {
            grid: [gx.clone(), gy.clone(), gz.clone()],
            stream: Stream::Object(stream.clone()),
            device,
            params: params.iter().map(Bound::as_ptr).collect(),
        })
    }

    fn prepare(&self, plan: &LaunchPlan, slots: &mut Slots) -> Result<Launch, usize> {
        let [gx, gy, gz] = &self.grid;
        plan.prepare([gx, gy, gz], &self.stream, &self.params, self.device, None, slots)
    }

    /// `prepare` for the benchmarks' entry points (`what`): a declined call raises `ValueError`.
    fn pack(&self, what: &str, plan: &LaunchPlan, slots: &mut Slots) -> PyResult<Launch> {
        self.prepare(plan, slots)
            .map_err(|why| PyValueError::new_err(format!("{what}: declined: {}", DECLINES[why])))
    }
}

impl LaunchPlan {
    /// The call of a benchmarks' entry point (`what`: `_floor`, `_packed`); `ValueError` for a
    /// kernel that needs scratch buffers (they are allocated per launch, which these do not do).
    fn bench_call<'py>(&self, what: &str, call: &[Bound<'py, PyAny>]) -> PyResult<PyLaunch<'py>> {
        if self.global_scratch.is_some() || self.profile_scratch.is_some() {
            return Err(PyValueError::new_err(format!("{what}: the kernel needs scratch buffers")));
        }
        PyLaunch::from_args(what, call)
    }
}

#[pymethods]
impl LaunchPlan {
    /// `_LaunchPlan(dialect, function, packed_metadata, signature, cooperative, pdl, num_ctas,
    /// global_scratch, profile_scratch, /)`: `dialect` is the Triton launcher code mirrored, `"3.6"`
    /// (the generated C launcher) or `"3.9"` (`driver.c`'s generic launch); `signature` is the
    /// kernel's Triton types in parameter order (tuples nested); a scratch is `(size, align,
    /// allocator)` or None. Raises `ValueError` for a dialect or type it does not know and for a
    /// launch whose attributes overflow Triton's own array, and `RuntimeError` when the CUDA driver
    /// cannot be loaded.
    #[new]
    #[pyo3(signature = (dialect, function, packed_metadata, signature, cooperative, pdl, num_ctas, global_scratch, profile_scratch, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dialect: &str,
        function: u64,
        packed_metadata: (i32, i32, i32),
        signature: &Bound<'_, PyTuple>,
        cooperative: bool,
        pdl: bool,
        num_ctas: i64,
        global_scratch: Option<(i64, i64, Py<PyAny>)>,
        profile_scratch: Option<(i64, i64, Py<PyAny>)>,
    ) -> PyResult<Self> {
        let dialect = Dialect::from_name(dialect)
            .ok_or_else(|| PyValueError::new_err(format!("launcher dialect {dialect:?}")))?;
        let params = signature.iter().map(|t| Param::from_py(dialect, &t)).collect::<PyResult<Vec<_>>>()?;
        let nslots = params.iter().map(Param::slots).sum();
        let (num_warps, ctas, shared) = packed_metadata;
        let attrs = Launch {
            dialect,
            grid: [1; 3],
            num_warps,
            num_ctas: ctas,
            shared_memory: shared,
            cooperative,
            pdl,
            stream: 0,
            function,
        }
        .attribute_count();
        if attrs > TRITON_ATTRIBUTE_ROOM {
            return Err(PyValueError::new_err(format!(
                "the launch sets {attrs} launch attributes and Triton's launcher has room for \
                 {TRITON_ATTRIBUTE_ROOM} (its launch is undefined)"
            )));
        }
        let drv = cuda::driver().map_err(PyRuntimeError::new_err)?;
        Ok(LaunchPlan {
            drv,
            dialect,
            params,
            nslots,
            function,
            num_warps,
            num_ctas: ctas,
            shared,
            cooperative,
            pdl,
            scratch_ctas: num_ctas,
            global_scratch: scratch_from(global_scratch),
            profile_scratch: scratch_from(profile_scratch),
            launched: AtomicU64::new(0),
            declined: Default::default(),
        })
    }

    /// `launch(gx, gy, gz, stream, device, *params) -> bool`: launches as a hit would (no hooks);
    /// False when the call is declined (nothing was launched; see `counts()`). `device`: the current
    /// device index (tensors elsewhere are declined), or None (tensors are declined).
    #[pyo3(signature = (*call), text_signature = "(self, gx, gy, gz, stream, device, *params)")]
    fn launch(&self, py: Python<'_>, call: Vec<Bound<'_, PyAny>>) -> PyResult<bool> {
        let call = PyLaunch::from_args("launch", &call)?;
        let mut slots = Slots::new();
        match call.prepare(self, &mut slots) {
            Ok(l) => self.launch_packed(py, &mut slots, &l, &call.stream, None).map(|()| true),
            Err(why) => {
                self.count_decline(why);
                Ok(false)
            }
        }
    }

    /// `_floor(n, gx, gy, gz, stream, device, *params, steps=0) -> float`: the driver floor, for
    /// benchmarks: packs once, then calls `cuLaunchKernelEx` `n` times in a native loop (GIL
    /// released); returns the seconds the loop took. Raises `ValueError` if the call would be
    /// declined. `steps` adds, per launch, what a hit does around the driver call, to see what each
    /// costs: 1 `ensure_context`, 2 releasing and taking back the GIL, 4 packing the parameters again.
    #[pyo3(
        signature = (n, *call, steps=0),
        text_signature = "(self, n, gx, gy, gz, stream, device, *params, steps=0)"
    )]
    fn _floor(&self, n: u64, call: Vec<Bound<'_, PyAny>>, steps: u32) -> PyResult<f64> {
        let drv = self.drv;
        let call = self.bench_call("_floor", &call)?;
        let pack = |slots: &mut Slots| call.pack("_floor", self, slots);
        let mut slots = Slots::new();
        let l = pack(&mut slots)?;
        let mut err: DriverError = None;
        drv.ensure_context(l.dialect, &mut err);
        let (context, gil, repack) = (steps & 1 != 0, steps & 2 != 0, steps & 4 != 0);
        let t0 = std::time::Instant::now();
        if !gil && !repack {
            slots.with_params(&mut [0, 0], |params| {
                // SAFETY: as in `launch_packed`: no Python object is touched while the GIL is released.
                unsafe {
                    let ts = ffi::PyEval_SaveThread();
                    for _ in 0..n {
                        if context {
                            drv.ensure_context(l.dialect, &mut err);
                        }
                        drv.launch(&l, params, &mut err);
                    }
                    ffi::PyEval_RestoreThread(ts);
                }
            });
        } else {
            for _ in 0..n {
                let mut fresh = Slots::new();
                let l = if repack { pack(&mut fresh)? } else { l.clone() };
                let slots = if repack { &mut fresh } else { &mut slots };
                if context {
                    drv.ensure_context(l.dialect, &mut err);
                }
                slots.with_params(&mut [0, 0], |params| {
                    // SAFETY: as in `launch_packed`.
                    unsafe {
                        let ts = gil.then(|| ffi::PyEval_SaveThread());
                        drv.launch(&l, params, &mut err);
                        if let Some(ts) = ts {
                            ffi::PyEval_RestoreThread(ts);
                        }
                    }
                });
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        match err {
            Some(msg) => Err(PyRuntimeError::new_err(msg)),
            None => Ok(dt),
        }
    }

    /// `_packed(gx, gy, gz, stream, device, *params) -> _PackedLaunch`: for benchmarks, the launch
    /// packed once, as `_floor` packs it; its `launch()` makes that one launch from Python. The
    /// arguments are kept alive with it. Raises `ValueError` as `_floor` does.
    #[pyo3(signature = (*call), text_signature = "(self, gx, gy, gz, stream, device, *params)")]
    fn _packed(&self, call: Vec<Bound<'_, PyAny>>) -> PyResult<PackedLaunch> {
        let keep = call.iter().map(|o| o.clone().unbind()).collect();
        let call = self.bench_call("_packed", &call)?;
        let mut slots = Slots::new();
        let launch = call.pack("_packed", self, &mut slots)?;
        Ok(PackedLaunch { drv: self.drv, launch, slots: std::cell::RefCell::new(slots), _keep: keep })
    }

    /// `{"launched": n, "declined": {reason: n}}` since the plan was made.
    fn counts<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("launched", self.launched.load(Ordering::Relaxed))?;
        let declined = PyDict::new(py);
        for (why, c) in DECLINES.iter().zip(&self.declined) {
            let c = c.load(Ordering::Relaxed);
            if c > 0 {
                declined.set_item(*why, c)?;
            }
        }
        d.set_item("declined", declined)?;
        Ok(d)
    }

    /// How many parameter slots a launch passes (scratch pointers not included).
    #[getter]
    fn nslots(&self) -> usize {
        self.nslots
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        for s in [&self.global_scratch, &self.profile_scratch].into_iter().flatten() {
            visit.call(&s.allocator)?;
        }
        Ok(())
    }
}

/// The driver call of a packed launch (`slots` and the two scratch pointers), with the GIL released
/// around it as Triton's launcher releases it: a hit's last step and `_PackedLaunch.launch`.
fn launch_released(
    drv: &cuda::Driver,
    l: &Launch,
    slots: &mut Slots,
    scratch: &mut [u64; 2],
    err: &mut DriverError,
) {
    slots.with_params(scratch, |params| {
        // SAFETY: the GIL is released around a call that touches no Python object; `params`
        // points at the packed values and the scratch pointers, alive for the call; the function
        // handle came from Triton's loader.
        unsafe {
            let ts = ffi::PyEval_SaveThread();
            drv.launch(l, params, err);
            ffi::PyEval_RestoreThread(ts);
        }
    });
}

/// One launch packed once (`_LaunchPlan._packed`): `packed.launch()` calls `cuLaunchKernelEx` with it as a
/// hit's last step does (context check, GIL released around the driver call), and nothing else.
/// A Python loop calling it is the least a launch called from Python can cost: the benchmarks'
/// "floor from Python". It keeps the call's arguments alive, so that the pointers packed stay
/// allocated (a tensor changed in place afterwards is still launched with the values packed).
#[pyclass(name = "_PackedLaunch", module = "jitkey._core", unsendable)]
pub(crate) struct PackedLaunch {
    drv: &'static cuda::Driver,
    launch: Launch,
    slots: std::cell::RefCell<Slots>,
    _keep: Vec<Py<PyAny>>,
}

#[pymethods]
impl PackedLaunch {
    fn launch(&self) -> PyResult<()> {
        let mut err: DriverError = None;
        let (drv, l) = (self.drv, &self.launch);
        drv.ensure_context(l.dialect, &mut err);
        launch_released(drv, l, &mut self.slots.borrow_mut(), &mut [0, 0], &mut err);
        match err {
            Some(msg) => Err(PyRuntimeError::new_err(msg)),
            None => Ok(()),
        }
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self._keep.iter().try_for_each(|o| visit.call(o))
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LaunchPlan>()?;
    m.add_class::<PackedLaunch>()?;
    Ok(())
}
