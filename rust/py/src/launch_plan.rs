//! `jitkey._core._LaunchPlan`: one compiled Triton kernel's launch, packed and sent to the driver
//! by jitkey itself.
//!
//! A plan is made once per compiled kernel (on a miss) from what Triton's launcher would be built
//! from: the kernel's signature types, `packed_metadata` (`num_warps`, `num_ctas`, shared memory),
//! the cooperative-grid and PDL flags and the scratch sizes. On a hit it fills the parameter buffer
//! in Rust (per signature type, as Triton 3.6's generated launcher packs it) and calls
//! `cuLaunchKernelEx` with the launch configuration that launcher would use (`cuda::Driver::launch`).
//!
//! The plan only launches what it fully understands; everything else is *declined* before any side
//! effect, counted by reason, and the caller hands the call to Triton's launcher, which then packs,
//! checks and raises exactly as it always does. Understood means:
//! - pointers: `None` (null), an int in `[0, 2**64)` (passed as is, as Triton passes it), or a plain
//!   CUDA tensor on the current device, whose data pointer is read from its `TensorImpl`: valid by
//!   construction, so no `cuPointerGetAttribute` per pointer. Host memory, another device, tensor
//!   subclasses and `data_ptr()` objects are declined (Triton's launcher checks them).
//! - integers: ints (bools included) inside the type's range. Out-of-range values are declined:
//!   Triton raises for some and truncates others, and jitkey does not guess which.
//! - floats: floats, and ints that fit in 64 bits (converted as `float(x)` converts them). fp16 is
//!   packed as `PyFloat_Pack2` packs it; NaN, infinities and fp16 overflow are declined.
//! - constexpr and specialized-away arguments: skipped, as Triton skips them; tuples: flattened.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};

use crate::cuda::{self, DriverError, Launch, CUDA_ERROR_INVALID_VALUE};
use crate::keys::tuple_item;
use crate::torch::cuda_data_ptr;

/// One scalar kernel parameter, by how it is packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leaf {
    /// A constexpr or specialized-away argument: not passed to the kernel.
    Skip,
    Ptr,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
}

impl Leaf {
    /// Triton 3.6's `ty_to_cpp` / `FLOAT_STORAGE_TYPE`, by type name.
    fn parse(ty: &str) -> Option<Leaf> {
        if ty.starts_with('*') {
            return Some(Leaf::Ptr);
        }
        Some(match ty {
            "constexpr" => Leaf::Skip,
            "i1" | "i8" => Leaf::I8,
            "i16" => Leaf::I16,
            "i32" => Leaf::I32,
            "i64" => Leaf::I64,
            "u1" | "u8" => Leaf::U8,
            "u16" => Leaf::U16,
            "u32" => Leaf::U32,
            "u64" => Leaf::U64,
            "fp16" => Leaf::F16,
            "bf16" => Leaf::BF16,
            "fp32" | "f32" => Leaf::F32,
            "fp64" => Leaf::F64,
            _ => return None,
        })
    }
}

/// A parameter of the kernel's Python signature: a leaf, or a tuple of parameters.
#[derive(Debug)]
enum Param {
    Leaf(Leaf),
    Tuple(Vec<Param>),
}

impl Param {
    fn from_py(ty: &Bound<'_, PyAny>) -> PyResult<Param> {
        if let Ok(t) = ty.cast::<PyTuple>() {
            return t.iter().map(|x| Param::from_py(&x)).collect::<PyResult<_>>().map(Param::Tuple);
        }
        let s = ty.cast::<PyString>().map_err(|_| PyTypeError::new_err(format!("signature type {ty}")))?;
        let s = s.to_str()?;
        Leaf::parse(s).map(Param::Leaf).ok_or_else(|| PyValueError::new_err(format!("signature type {s:?}")))
    }

    fn slots(&self) -> usize {
        match self {
            Param::Leaf(Leaf::Skip) => 0,
            Param::Leaf(_) => 1,
            Param::Tuple(items) => items.iter().map(Param::slots).sum(),
        }
    }
}

/// Why a call is handed to Triton's launcher instead (the counters' order).
#[derive(Clone, Copy)]
enum Decline {
    Grid,
    Stream,
    Pointer,
    Int,
    Float,
    Tuple,
    Arity,
}

const DECLINES: [&str; 7] = [
    "the grid is not three int32 values",
    "the stream is not an int",
    "a pointer argument is not a CUDA tensor on the current device, an int or None",
    "an integer argument is not an int in its type's range",
    "a float argument is not a finite float (or an int)",
    "a tuple argument does not match the signature",
    "the arguments do not match the kernel's signature",
];

/// The packed parameter values, one 8-byte slot each (a value sits in its slot's first bytes).
const INLINE: usize = 64;
pub(crate) struct Slots {
    inline: [u64; INLINE],
    heap: Vec<u64>,
    n: usize,
}

impl Slots {
    pub(crate) fn new() -> Self {
        Slots { inline: [0; INLINE], heap: Vec::new(), n: 0 }
    }

    #[inline]
    fn push(&mut self, v: u64) {
        if self.n < INLINE {
            self.inline[self.n] = v;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline);
            }
            self.heap.push(v);
        }
        self.n += 1;
    }

    fn values_mut(&mut self) -> &mut [u64] {
        if self.n <= INLINE {
            &mut self.inline[..self.n]
        } else {
            &mut self.heap
        }
    }
}

/// An int's value when it fits in `[-2**63, 2**64)`; `None` (no error left set) otherwise.
#[inline]
fn int_value(obj: *mut ffi::PyObject) -> Option<i128> {
    // SAFETY: obj is a live object; the C API calls below only read it, and any error they set
    // is cleared before returning.
    unsafe {
        if ffi::PyLong_Check(obj) == 0 {
            return None;
        }
        let mut overflow: c_int = 0;
        let v = ffi::PyLong_AsLongLongAndOverflow(obj, &mut overflow);
        if overflow == 0 {
            if v == -1 && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            return Some(i128::from(v));
        }
        if overflow < 0 {
            return None;
        }
        let u = ffi::PyLong_AsUnsignedLongLong(obj);
        if u == u64::MAX && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(i128::from(u))
    }
}

/// What `PyFloat_AsDouble` returns for a float, or an int that fits in 64 bits; `None` otherwise.
#[inline]
fn float_value(obj: *mut ffi::PyObject) -> Option<f64> {
    // SAFETY: obj is a live object; PyFloat_AsDouble cannot fail on a float.
    unsafe {
        if ffi::PyFloat_Check(obj) != 0 {
            return Some(ffi::PyFloat_AsDouble(obj));
        }
    }
    // int.__float__ rounds to nearest, ties to even, as `as f64` does.
    let v = int_value(obj)?;
    if let Ok(v) = i64::try_from(v) {
        Some(v as f64)
    } else {
        u64::try_from(v).ok().map(|v| v as f64)
    }
}

fn pow2(k: i32) -> f64 {
    f64::from_bits(((1023 + k) as u64) << 52)
}

/// `frexp` for a finite, positive `x`: `(m, e)` with `x = m * 2**e`, `m` in `[0.5, 1)`.
fn frexp(x: f64) -> (f64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        let (m, e) = frexp(x * pow2(64));
        return (m, e - 64);
    }
    (f64::from_bits((bits & !(0x7ff << 52)) | (1022 << 52)), exp - 1022)
}

/// `PyFloat_Pack2(x, le=1)` for finite `x`: the IEEE half bits; `None` where CPython raises
/// (overflow) or the value is not finite (NaN payloads differ between CPython versions).
pub(crate) fn pack_fp16(x: f64) -> Option<u16> {
    if x == 0.0 {
        return Some(u16::from(x.is_sign_negative()) << 15);
    }
    if !x.is_finite() {
        return None;
    }
    let sign = u16::from(x < 0.0);
    let (mut f, mut e) = frexp(x.abs());
    f *= 2.0;
    e -= 1;
    if e >= 16 {
        return None;
    } else if e < -25 {
        f = 0.0;
        e = 0;
    } else if e < -14 {
        f *= pow2(14 + e);
        e = 0;
    } else {
        e += 15;
        f -= 1.0;
    }
    f *= 1024.0;
    let mut bits = f as u16; // truncation, as CPython's cast
    let rest = f - f64::from(bits);
    if rest > 0.5 || (rest == 0.5 && bits % 2 == 1) {
        bits += 1;
        if bits == 1024 {
            bits = 0;
            e += 1;
            if e == 31 {
                return None;
            }
        }
    }
    Some(bits | ((e as u16) << 10) | (sign << 15))
}

#[inline]
fn pack_leaf(leaf: Leaf, obj: *mut ffi::PyObject, device: i64, out: &mut Slots) -> Result<(), Decline> {
    let int_in = |lo: i128, hi: i128| -> Result<u64, Decline> {
        match int_value(obj) {
            Some(v) if (lo..=hi).contains(&v) => Ok(v as u64),
            _ => Err(Decline::Int),
        }
    };
    let v: u64 = match leaf {
        Leaf::Skip => return Ok(()),
        Leaf::Ptr => {
            // SAFETY: obj is live; Py_None is the None singleton.
            if obj == unsafe { ffi::Py_None() } {
                0
            } else if let Some(p) = cuda_data_ptr(obj, device) {
                p
            } else {
                match int_value(obj) {
                    Some(v) if v >= 0 => v as u64,
                    _ => return Err(Decline::Pointer),
                }
            }
        }
        // Triton 3.6 parses i1/i8 with "b": an unsigned char (0..=255).
        Leaf::I8 => int_in(0, 255)?,
        Leaf::I16 => int_in(i16::MIN.into(), i16::MAX.into())? & 0xffff,
        Leaf::I32 => int_in(i32::MIN.into(), i32::MAX.into())? & 0xffff_ffff,
        Leaf::I64 => int_in(i64::MIN.into(), i64::MAX.into())?,
        Leaf::U8 => int_in(0, u8::MAX.into())?,
        Leaf::U16 => int_in(0, u16::MAX.into())?,
        Leaf::U32 => int_in(0, u32::MAX.into())?,
        Leaf::U64 => int_in(0, u64::MAX.into())?,
        Leaf::F16 => u64::from(float_value(obj).and_then(pack_fp16).ok_or(Decline::Float)?),
        Leaf::BF16 => match float_value(obj) {
            Some(x) if !x.is_nan() => u64::from((x as f32).to_bits() >> 16),
            _ => return Err(Decline::Float),
        },
        Leaf::F32 => match float_value(obj) {
            Some(x) if !x.is_nan() => u64::from((x as f32).to_bits()),
            _ => return Err(Decline::Float),
        },
        Leaf::F64 => float_value(obj).ok_or(Decline::Float)?.to_bits(),
    };
    out.push(v);
    Ok(())
}

fn pack_param(p: &Param, obj: *mut ffi::PyObject, device: i64, out: &mut Slots) -> Result<(), Decline> {
    match p {
        Param::Leaf(leaf) => pack_leaf(*leaf, obj, device, out),
        Param::Tuple(items) => {
            // SAFETY: obj is live; a tuple (or subclass) has `len` readable items.
            unsafe {
                if ffi::PyTuple_Check(obj) == 0 || ffi::PyTuple_Size(obj) != items.len() as ffi::Py_ssize_t {
                    return Err(Decline::Tuple);
                }
                for (i, item) in items.iter().enumerate() {
                    pack_param(item, tuple_item(obj, i as ffi::Py_ssize_t), device, out)?;
                }
            }
            Ok(())
        }
    }
}

/// The grid value Triton's launcher parses with "i", when it is an int in range.
#[inline]
fn grid_value(obj: &Bound<'_, PyAny>) -> Option<i32> {
    int_value(obj.as_ptr()).and_then(|v| i32::try_from(v).ok())
}

/// A scratch buffer the kernel needs: `allocator.get()(grid * num_ctas * size, align, stream)`.
struct Scratch {
    size: i64,
    align: i64,
    allocator: Py<PyAny>,
}

#[pyclass(name = "_LaunchPlan", module = "jitkey._core", frozen)]
pub(crate) struct LaunchPlan {
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
    /// Packs one call's parameters; `Err` is why the call goes to Triton's launcher instead.
    #[inline]
    pub(crate) fn pack(
        &self,
        params: &[*mut ffi::PyObject],
        device: i64,
        out: &mut Slots,
    ) -> Result<(), usize> {
        if params.len() != self.params.len() {
            return Err(Decline::Arity as usize);
        }
        for (p, &obj) in self.params.iter().zip(params) {
            pack_param(p, obj, device, out).map_err(|d| d as usize)?;
        }
        Ok(())
    }

    /// Counts a call handed to Triton's launcher (the reason from `pack` or `launch_config`).
    pub(crate) fn count_decline(&self, why: usize) {
        self.declined[why].fetch_add(1, Ordering::Relaxed);
    }

    /// The grid and stream as Triton's launcher parses them; `Err` is a decline reason.
    #[inline]
    pub(crate) fn launch_config(
        &self,
        grid: [&Bound<'_, PyAny>; 3],
        stream: &Bound<'_, PyAny>,
    ) -> Result<Launch, usize> {
        let g = |o: &Bound<'_, PyAny>| grid_value(o).ok_or(Decline::Grid as usize);
        let grid = [g(grid[0])?, g(grid[1])?, g(grid[2])?];
        let stream = match int_value(stream.as_ptr()) {
            Some(s) if s >= 0 && s <= i128::from(u64::MAX) => s as u64,
            _ => return Err(Decline::Stream as usize),
        };
        Ok(Launch {
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
        stream: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(s) = s else { return Ok(None) };
        let grid: i128 = l.grid.iter().map(|&g| i128::from(g)).product();
        let size = grid * i128::from(self.scratch_ctas) * i128::from(s.size);
        let alloc_fn = s.allocator.bind(py).call_method0(pyo3::intern!(py, "get"))?;
        alloc_fn.call1((size, s.align, stream)).map(Some)
    }

    /// Launches a packed call as Triton's `CudaLauncher.__call__` and C `launch` would: scratch
    /// allocation, context check, enter hook, scratch pointers, the launch (GIL released), exit hook.
    pub(crate) fn launch_packed(
        &self,
        py: Python<'_>,
        slots: &mut Slots,
        l: &Launch,
        stream: &Bound<'_, PyAny>,
        hooks: Option<(&Bound<'_, PyAny>, &Bound<'_, PyAny>, &Bound<'_, PyAny>)>,
    ) -> PyResult<()> {
        let drv = cuda::driver().map_err(PyRuntimeError::new_err)?;
        let global = self.scratch(py, &self.global_scratch, l, stream)?;
        let profile = self.scratch(py, &self.profile_scratch, l, stream)?;
        let mut err: DriverError = None;
        drv.ensure_context(&mut err);
        if let Some((md, enter, _)) = hooks {
            if !enter.is_none() {
                enter.call1((md,))?;
            }
        }
        let mut g = scratch_pointer(py, drv, global.as_ref())?;
        let mut p = scratch_pointer(py, drv, profile.as_ref())?;
        let values = slots.values_mut();
        let mut ptrs_inline: [*mut c_void; INLINE + 2] = [null_mut(); INLINE + 2];
        let mut ptrs_heap = Vec::new();
        let ptrs: &mut [*mut c_void] = if values.len() <= INLINE {
            &mut ptrs_inline[..values.len() + 2]
        } else {
            ptrs_heap.resize(values.len() + 2, null_mut());
            &mut ptrs_heap
        };
        for (slot, v) in ptrs.iter_mut().zip(values.iter_mut()) {
            *slot = (v as *mut u64).cast();
        }
        let n = ptrs.len();
        ptrs[n - 2] = (&raw mut g).cast();
        ptrs[n - 1] = (&raw mut p).cast();
        // SAFETY: the GIL is released around a call that touches no Python object; `ptrs` points at
        // `values`, `g` and `p`, which outlive the call; the function handle came from Triton's loader.
        unsafe {
            let ts = ffi::PyEval_SaveThread();
            drv.launch(l, ptrs.as_mut_ptr(), &mut err);
            ffi::PyEval_RestoreThread(ts);
        }
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

/// Triton's `getPointer` for a scratch buffer (index -1), exactly: None → 0, an int as is, else
/// `data_ptr()` checked with `cuPointerGetAttribute`.
fn scratch_pointer(py: Python<'_>, drv: &cuda::Driver, obj: Option<&Bound<'_, PyAny>>) -> PyResult<u64> {
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
        (CUDA_ERROR_INVALID_VALUE, _) => Err(PyValueError::new_err(
            "Pointer argument (at -1) cannot be accessed from Triton (cpu tensor?)",
        )),
        (rc, _) => Err(PyRuntimeError::new_err(format!("Triton Error [CUDA]: {}", drv.error_string(rc)))),
    }
}

fn scratch_from(spec: Option<(i64, i64, Py<PyAny>)>) -> Option<Scratch> {
    spec.filter(|(size, _, _)| *size > 0).map(|(size, align, allocator)| Scratch { size, align, allocator })
}

fn device_index(device: Option<i64>) -> i64 {
    device.unwrap_or(-1)
}

#[pymethods]
impl LaunchPlan {
    /// `_LaunchPlan(function, packed_metadata, signature, cooperative, pdl, num_ctas, global_scratch,
    /// profile_scratch, /)`: `signature` is the kernel's Triton types in parameter order (tuples
    /// nested); a scratch is `(size, align, allocator)` or None. Raises `ValueError` for a type it
    /// does not pack and `RuntimeError` when the CUDA driver cannot be loaded.
    #[new]
    #[pyo3(signature = (function, packed_metadata, signature, cooperative, pdl, num_ctas, global_scratch, profile_scratch, /))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        function: u64,
        packed_metadata: (i32, i32, i32),
        signature: &Bound<'_, PyTuple>,
        cooperative: bool,
        pdl: bool,
        num_ctas: i64,
        global_scratch: Option<(i64, i64, Py<PyAny>)>,
        profile_scratch: Option<(i64, i64, Py<PyAny>)>,
    ) -> PyResult<Self> {
        cuda::driver().map_err(PyRuntimeError::new_err)?;
        let params = signature.iter().map(|t| Param::from_py(&t)).collect::<PyResult<Vec<_>>>()?;
        let nslots = params.iter().map(Param::slots).sum();
        let (num_warps, ctas, shared) = packed_metadata;
        Ok(LaunchPlan {
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
    #[pyo3(signature = (gx, gy, gz, stream, device, *params))]
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        py: Python<'_>,
        gx: &Bound<'_, PyAny>,
        gy: &Bound<'_, PyAny>,
        gz: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyAny>,
        device: Option<i64>,
        params: &Bound<'_, PyTuple>,
    ) -> PyResult<bool> {
        let objs: Vec<_> = params.iter().map(|p| p.as_ptr()).collect();
        let mut slots = Slots::new();
        let packed = self
            .launch_config([gx, gy, gz], stream)
            .and_then(|l| self.pack(&objs, device_index(device), &mut slots).map(|()| l));
        match packed {
            Ok(l) => self.launch_packed(py, &mut slots, &l, stream, None).map(|()| true),
            Err(why) => {
                self.count_decline(why);
                Ok(false)
            }
        }
    }

    /// `_floor(n, gx, gy, gz, stream, device, *params) -> float`: the driver floor, for benchmarks:
    /// packs once, then calls `cuLaunchKernelEx` `n` times in a native loop (GIL released); returns
    /// the seconds the loop took. Raises `ValueError` if the call would be declined.
    #[pyo3(signature = (n, gx, gy, gz, stream, device, *params))]
    #[allow(clippy::too_many_arguments)]
    fn _floor(
        &self,
        _py: Python<'_>,
        n: u64,
        gx: &Bound<'_, PyAny>,
        gy: &Bound<'_, PyAny>,
        gz: &Bound<'_, PyAny>,
        stream: &Bound<'_, PyAny>,
        device: Option<i64>,
        params: &Bound<'_, PyTuple>,
    ) -> PyResult<f64> {
        if self.global_scratch.is_some() || self.profile_scratch.is_some() {
            return Err(PyValueError::new_err("_floor: the kernel needs scratch buffers"));
        }
        let drv = cuda::driver().map_err(PyRuntimeError::new_err)?;
        let objs: Vec<_> = params.iter().map(|p| p.as_ptr()).collect();
        let mut slots = Slots::new();
        let l = self
            .launch_config([gx, gy, gz], stream)
            .and_then(|l| self.pack(&objs, device_index(device), &mut slots).map(|()| l))
            .map_err(|why| PyValueError::new_err(format!("_floor: declined: {}", DECLINES[why])))?;
        let values = slots.values_mut();
        let mut scratch = [0u64; 2];
        let mut ptrs: Vec<*mut c_void> = values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
        ptrs.push((&raw mut scratch[0]).cast());
        ptrs.push((&raw mut scratch[1]).cast());
        let mut err: DriverError = None;
        drv.ensure_context(&mut err);
        let t0 = std::time::Instant::now();
        // SAFETY: as in `launch_packed`: no Python object is touched while the GIL is released.
        unsafe {
            let ts = ffi::PyEval_SaveThread();
            for _ in 0..n {
                drv.launch(&l, ptrs.as_mut_ptr(), &mut err);
            }
            ffi::PyEval_RestoreThread(ts);
        }
        let dt = t0.elapsed().as_secs_f64();
        match err {
            Some(msg) => Err(PyRuntimeError::new_err(msg)),
            None => Ok(dt),
        }
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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LaunchPlan>()?;
    Ok(())
}
