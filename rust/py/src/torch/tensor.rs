//! A tensor's metadata under a `TensorRule`: read from the `TensorImpl` when its layout is
//! verified (`tensor_impl`), else through the Python attributes (interned names, the dtype and
//! device tables), each field only when the rule keys it, then written by
//! `jitkey_core::signature::write_tensor` (nothing copied or allocated).

use std::ffi::c_int;

use jitkey_core::key::Encoder;
use jitkey_core::signature::{
    self as core_sig, DeviceMode, Dims, ShapeMode, StrideMode, TensorMeta, TensorRule,
};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;

use super::tensor_impl::{direct, direct_with, Direct, Layout};
use super::{device_of, dtype_name, type_name, TorchError};

/// A size or stride as i64 (`ptr` is a live int); `None` when out of range (error cleared).
#[inline]
fn dim_i64(ptr: *mut ffi::PyObject) -> Option<i64> {
    let mut overflow: c_int = 0;
    // SAFETY: ptr is a live int (PyLong_Check passed); reading it runs no Python code.
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow) };
    // SAFETY: checking the thread's error indicator (the GIL is held).
    if overflow == 0 && !(v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() }) {
        Some(v)
    } else {
        // SAFETY: clearing the error indicator (the GIL is held); an out-of-range dim is refused.
        unsafe { ffi::PyErr_Clear() };
        None
    }
}

/// A `torch.Size` / stride tuple read through the attribute path, item by item as the writer
/// asks (no copy).
struct TupleDims<'py> {
    seq: Option<Bound<'py, PyAny>>,
    n: usize,
    what: &'static str,
}

impl<'py> TupleDims<'py> {
    const NONE: Self = Self { seq: None, n: 0, what: "" };

    /// Checks `seq` is a tuple (torch.Size and stride() results are tuples or tuple subclasses).
    fn new(seq: Bound<'py, PyAny>, what: &'static str) -> Result<Self, TorchError> {
        // SAFETY: seq is a live object.
        if unsafe { ffi::PyTuple_Check(seq.as_ptr()) } == 0 {
            return Err(TorchError::Msg(format!("tensor {what} is not a tuple ({})", type_name(&seq))));
        }
        // SAFETY: seq is a live tuple.
        let n = unsafe { ffi::PyTuple_Size(seq.as_ptr()) } as usize;
        Ok(Self { seq: Some(seq), n, what })
    }
}

impl TupleDims<'_> {
    /// Dim `i` of the tuple `seq` (`i` below its length).
    #[inline(always)]
    fn read(&self, seq: &Bound<'_, PyAny>, i: usize) -> Result<i64, TorchError> {
        // SAFETY: i < n = len of a tuple we hold; the item is borrowed from it.
        let it = unsafe { ffi::PyTuple_GetItem(seq.as_ptr(), i as ffi::Py_ssize_t) };
        // SAFETY: it is a live object (a tuple's item).
        if unsafe { ffi::PyLong_Check(it) } == 0 {
            return Err(self.non_int());
        }
        match dim_i64(it) {
            Some(v) => Ok(v),
            None => Err(self.out_of_range()),
        }
    }

    #[cold]
    fn non_int(&self) -> TorchError {
        TorchError::Msg(format!("tensor {} holds a non-int (symbolic sizes are not keyable)", self.what))
    }

    #[cold]
    fn out_of_range(&self) -> TorchError {
        TorchError::Msg(format!("tensor {} out of range", self.what))
    }
}

impl Dims for TupleDims<'_> {
    type Error = TorchError;
    #[inline]
    fn len(&self) -> usize {
        self.n
    }
    #[inline]
    fn get(&self, i: usize) -> Result<i64, TorchError> {
        self.read(self.seq.as_ref().expect("get only below len"), i)
    }
    /// One pass over the tuple, as the writer asks for every dim in order.
    #[inline(always)]
    fn for_each(&self, mut f: impl FnMut(i64)) -> Result<(), TorchError> {
        if let Some(seq) = &self.seq {
            for i in 0..self.n {
                f(self.read(seq, i)?);
            }
        }
        Ok(())
    }
}

#[inline]
pub(crate) fn encode_tensor(
    t: &TensorRule,
    obj: &Bound<'_, PyAny>,
    enc: &mut Encoder,
) -> Result<(), TorchError> {
    match direct(obj) {
        Some(f) => encode_tensor_direct(t, obj, &f, enc),
        None => encode_tensor_attrs(t, obj, enc),
    }
}

/// A plain tensor: its fields read straight from the `TensorImpl` (Python only for what the
/// layout does not cover: a non-plain storage's `data_ptr()`, `is_contiguous()`, a device type
/// not learnt yet).
#[inline]
fn encode_tensor_direct(
    t: &TensorRule,
    obj: &Bound<'_, PyAny>,
    f: &Direct,
    enc: &mut Encoder,
) -> Result<(), TorchError> {
    // Each field is read only when the rule keys it (the storage chase of `data_ptr` and the
    // device table are not free).
    let data_ptr = match t.align {
        0 => 0,
        _ => match f.data_ptr() {
            Some(p) => p,
            None => data_ptr_attr(obj)?,
        },
    };
    let (shape, strides) = if t.shape != ShapeMode::Ignore || t.strides == StrideMode::Exact {
        f.dims()
    } else {
        (&[][..], &[][..])
    };
    let contiguous = t.strides == StrideMode::Contiguous && is_contiguous(obj)?;
    let device = match t.device {
        DeviceMode::Ignore => ("", -1),
        _ => match f.device() {
            Some(d) => d,
            None => {
                let (ty, idx) = device_attr(obj)?;
                f.learn_device(ty, idx);
                (ty, idx)
            }
        },
    };
    let numel = if t.numel_i64 { f.numel() } else { 0 };
    let meta = TensorMeta { dtype: f.dtype, data_ptr, shape, strides, contiguous, device, numel };
    Ok(core_sig::write_tensor(enc, t, &meta)?)
}

/// Any other tensor: through its Python attributes (interned names, the dtype and device tables).
/// Never inlined: its two writer instances would grow the frame of the recursive by-type walk,
/// which every argument pays for; a call is nothing next to its attribute reads.
#[inline(never)]
fn encode_tensor_attrs(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> Result<(), TorchError> {
    let py = obj.py();
    let dtype = if t.dtype { dtype_name(&obj.getattr(intern!(py, "dtype"))?)? } else { "" };
    let data_ptr = if t.align != 0 { data_ptr_attr(obj)? } else { 0 };
    if t.shape == ShapeMode::Ignore && t.strides != StrideMode::Exact {
        // No dims keyed (Triton's rules): the same writer instance as the direct path.
        let (contiguous, device, numel) = tensor_rest_attrs(t, obj)?;
        let none: &[i64] = &[];
        let meta = TensorMeta { dtype, data_ptr, shape: none, strides: none, contiguous, device, numel };
        return Ok(core_sig::write_tensor(enc, t, &meta)?);
    }
    let shape = match t.shape {
        ShapeMode::Ignore => TupleDims::NONE,
        _ => TupleDims::new(obj.getattr(intern!(py, "shape"))?, "shape")?,
    };
    let strides = match t.strides {
        StrideMode::Exact => TupleDims::new(obj.call_method0(intern!(py, "stride"))?, "stride")?,
        _ => TupleDims::NONE,
    };
    let (contiguous, device, numel) = tensor_rest_attrs(t, obj)?;
    let meta = TensorMeta { dtype, data_ptr, shape, strides, contiguous, device, numel };
    core_sig::write_tensor(enc, t, &meta)
}

/// Contiguity, device and numel through the attribute path, each only when `t` keys it.
#[inline]
fn tensor_rest_attrs(
    t: &TensorRule,
    obj: &Bound<'_, PyAny>,
) -> Result<(bool, (&'static str, i64), i64), TorchError> {
    let contiguous = t.strides == StrideMode::Contiguous && is_contiguous(obj)?;
    let device = if t.device == DeviceMode::Ignore { ("", -1) } else { device_attr(obj)? };
    let numel = if t.numel_i64 { obj.call_method0(intern!(obj.py(), "numel"))?.extract()? } else { 0 };
    Ok((contiguous, device, numel))
}

/// `data_ptr()` through Python.
#[cold]
fn data_ptr_attr(obj: &Bound<'_, PyAny>) -> Result<u64, TorchError> {
    let py = obj.py();
    let p = obj.call_method0(intern!(py, "data_ptr"))?;
    // SAFETY: p is a live object.
    if unsafe { ffi::PyLong_Check(p.as_ptr()) } == 0 {
        return Err(TorchError::Msg("data_ptr() did not return an int".into()));
    }
    // SAFETY: p is a live int; reading it runs no Python code.
    let v = unsafe { ffi::PyLong_AsUnsignedLongLong(p.as_ptr()) };
    if v == u64::MAX && PyErr::occurred(py) {
        return Err(TorchError::Py(PyErr::fetch(py)));
    }
    Ok(v)
}

fn is_contiguous(obj: &Bound<'_, PyAny>) -> Result<bool, TorchError> {
    let c = obj.call_method0(intern!(obj.py(), "is_contiguous"))?;
    // SAFETY: Py_True is the static True singleton.
    Ok(c.as_ptr() == unsafe { ffi::Py_True() })
}

fn device_attr(obj: &Bound<'_, PyAny>) -> Result<(&'static str, i64), TorchError> {
    device_of(&obj.getattr(intern!(obj.py(), "device"))?)
}

/// The in-process short form of a plain tensor under a dtype(+alignment)-only rule, if `p` is
/// one: see `Signature::encode_params_in_process`. `p` is a live object. Returns the tensor's
/// direct view and its `data_ptr()` when it was read (for the alignment) once the leaf is written;
/// `None` (nothing written) for anything else.
#[inline(always)]
pub(crate) fn encode_in_process(
    p: *mut ffi::PyObject,
    align: u32,
    tensor_type: *mut ffi::PyTypeObject,
    layout: &'static Layout,
    enc: &mut Encoder,
) -> Option<(Direct, Option<u64>)> {
    // SAFETY: p is live (the caller's contract); `Py_TYPE` reads its type pointer.
    if unsafe { ffi::Py_TYPE(p) } != tensor_type {
        return None;
    }
    let f = direct_with(layout, p)?;
    let (aligned, data) = if align == 0 {
        (true, None)
    } else {
        let d = f.data_ptr()?;
        (d & u64::from(align - 1) == 0, Some(d))
    };
    core_sig::write_tensor_in_process(enc, f.idx, aligned);
    Some((f, data))
}
