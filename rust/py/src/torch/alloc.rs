//! Fresh CUDA tensors without torch's Python argument parser: `aoti_torch_empty_strided` (torch's
//! stable C shim, `libtorch_cpu`) makes the tensor, `THPVariable_Wrap(const at::TensorBase&)`
//! (`libtorch_python`, the function torch's own bindings return tensors through) its Python object.
//!
//! What a replayed plan (`crate::dsl`) uses for the `torch.empty(...)` / `torch.empty_like(x)` steps a
//! DSL's host code makes on every call: torch's Python path parses its arguments, which costs about
//! as much as the allocation itself. The shim's CUDA branch calls `at::empty_strided` through the
//! dispatcher, so what torch's CUDA factory does (the device guard, the caching allocator on the
//! current stream, the deterministic fill of uninitialized memory when that is switched on) happens
//! as it does for the Python call. Only CUDA tensors are made here (the shim's CPU branch skips the
//! dispatcher); callers fall back to torch's Python function for anything else, and whenever the
//! shim reports an error (after the first error it is not called again: each one makes torch log a
//! stack trace, and the Python call raises torch's own error instead).
//!
//! Resolved at run time as `current` resolves its functions; `jitkey._torch_alloc.prove` compares
//! what this makes with what torch makes before any plan uses it.

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use super::current::symbol;
use super::tensor_impl::{direct_with, layout, CUDA_DEVICE_CODE};

/// `AOTITorchError aoti_torch_empty_strided(int64_t ndim, const int64_t* sizes, const int64_t*
/// strides, int32_t dtype, int32_t device_type, int32_t device_index, AtenTensorHandle* ret)`.
type EmptyFn = unsafe extern "C" fn(i64, *const i64, *const i64, i32, i32, i32, *mut *mut c_void) -> i32;
/// `AOTITorchError aoti_torch_delete_tensor_object(AtenTensorHandle)`.
type DeleteFn = unsafe extern "C" fn(*mut c_void) -> i32;
/// `PyObject* THPVariable_Wrap(const at::TensorBase&)`: a new reference (the tensor is copied, so the
/// handle is still the caller's to delete). An `AtenTensorHandle` is an `at::Tensor*`, whose only
/// member is its `TensorBase`'s.
type WrapFn = unsafe extern "C" fn(*mut c_void) -> *mut ffi::PyObject;
/// `int32_t aoti_torch_dtype_<name>()` / `aoti_torch_device_type_cuda()`.
type CodeFn = unsafe extern "C" fn() -> i32;

/// `THPVariable_Wrap(const at::TensorBase&)`, Itanium-mangled.
const WRAP: &std::ffi::CStr = c"_Z16THPVariable_WrapRKN2at10TensorBaseE";

/// The dtypes the shim names (`aoti_torch_dtype_<name>`), by torch's short dtype name.
const DTYPES: [&str; 20] = [
    "float8_e5m2",
    "float8_e4m3fn",
    "float8_e5m2fnuz",
    "float8_e4m3fnuz",
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "int8",
    "int16",
    "int32",
    "int64",
    "bool",
    "complex32",
    "complex64",
    "complex128",
];

/// Whether `sizes`/`strides` describe a non-overlapping, dense tensor (torch's
/// `compute_non_overlapping_and_dense`): then `empty_like` keeps the strides.
fn non_overlapping_and_dense(sizes: &[i64], strides: &[i64]) -> bool {
    let n = sizes.len();
    if n == 1 {
        return sizes[0] < 2 || strides[0] == 1;
    }
    if n > 64 {
        return false;
    }
    let mut perm = [0usize; 64];
    for (i, p) in perm[..n].iter_mut().enumerate() {
        *p = i;
    }
    // Dimensions of size < 2 last; the others by increasing stride (torch's comparator, stable).
    perm[..n].sort_by(|&a, &b| {
        let (sa, sb) = (sizes[a] < 2, sizes[b] < 2);
        sa.cmp(&sb).then(if sa { std::cmp::Ordering::Equal } else { strides[a].cmp(&strides[b]) })
    });
    let mut require = 1i64;
    for &d in &perm[..n] {
        if sizes[d] < 2 {
            return true;
        }
        if strides[d] != require {
            return false;
        }
        require = require.saturating_mul(sizes[d]);
    }
    true
}

/// `_TorchAlloc(cpu_lib, python_lib, /, *, loaded_only=True)`: the shim's allocation and torch's
/// tensor wrapper, resolved from those libraries (paths).
#[pyclass(name = "_TorchAlloc", module = "jitkey._core", frozen)]
pub(crate) struct TorchAlloc {
    empty: EmptyFn,
    delete: DeleteFn,
    wrap: WrapFn,
    cuda: i32,
    /// `(short name, code)` of every dtype the shim names.
    codes: Vec<(&'static str, i32)>,
    /// The shim code by the `TensorImpl` dtype index (`Direct::idx`): -1 not looked up yet, -2 none.
    by_idx: [AtomicI32; 64],
    failed: AtomicBool,
}

impl TorchAlloc {
    /// A new CUDA tensor (`torch.empty_strided(sizes, strides, dtype=, device=cuda:index)`), or `None`
    /// when the shim is not to be used (it failed, now or before).
    pub(crate) fn empty_cuda<'py>(
        &self,
        py: Python<'py>,
        sizes: &[i64],
        strides: &[i64],
        dtype: i32,
        index: i32,
    ) -> Option<Bound<'py, PyAny>> {
        if self.failed.load(Ordering::Relaxed) || sizes.len() != strides.len() {
            return None;
        }
        let mut handle: *mut c_void = std::ptr::null_mut();
        // SAFETY: the shim function shim.h declares, with `ndim` sizes and strides; it catches every
        // C++ exception (a non-zero return). The GIL is held, as torch's own bindings hold it.
        let rc = unsafe {
            (self.empty)(
                sizes.len() as i64,
                sizes.as_ptr(),
                strides.as_ptr(),
                dtype,
                self.cuda,
                index,
                &mut handle,
            )
        };
        if rc != 0 || handle.is_null() {
            self.failed.store(true, Ordering::Relaxed);
            return None;
        }
        // SAFETY: `handle` is a live `at::Tensor*` (a new reference of ours); the wrapper copies it
        // into a new Python object, then our reference is released.
        let obj = unsafe {
            let obj = (self.wrap)(handle);
            (self.delete)(handle);
            obj
        };
        if obj.is_null() {
            drop(PyErr::take(py));
            self.failed.store(true, Ordering::Relaxed);
            return None;
        }
        // SAFETY: a new reference.
        Some(unsafe { Bound::from_owned_ptr(py, obj) })
    }

    /// `torch.empty_like(x)` for a plain, non-overlapping and dense CUDA tensor `x` (same sizes,
    /// strides, dtype and device), or `torch.empty_like(x, dtype=...)` with `dtype` the shim's code of
    /// another dtype; `None`: the caller calls torch.
    pub(crate) fn empty_like<'py>(
        &self,
        py: Python<'py>,
        x: *mut ffi::PyObject,
        dtype: Option<i32>,
    ) -> Option<Bound<'py, PyAny>> {
        let d = direct_with(layout()?, x)?;
        // The device by c10's fixed CUDA code (`device()` names only the device types a keyed tensor has
        // shown it, and a process may allocate before it keys any CUDA tensor).
        let (code, index, has) = d.device_raw();
        if has != 1 || code != CUDA_DEVICE_CODE || index < 0 {
            return None;
        }
        let slot = self.by_idx.get(usize::from(d.idx))?;
        let mut code = slot.load(Ordering::Relaxed);
        if code == -1 {
            code = self.dtype_code(d.dtype).unwrap_or(-2);
            slot.store(code, Ordering::Relaxed);
        }
        if code < 0 {
            return None;
        }
        let (sizes, strides) = d.dims();
        if !non_overlapping_and_dense(sizes, strides) {
            return None;
        }
        self.empty_cuda(py, sizes, strides, dtype.unwrap_or(code), i32::from(index))
    }

    /// The shim's code for `dtype` (a short name such as `"float32"`), if the shim names it.
    pub(crate) fn dtype_code(&self, dtype: &str) -> Option<i32> {
        self.codes.iter().find(|(n, _)| *n == dtype).map(|&(_, c)| c)
    }

    /// As `dtype_code`, for a dtype a Python caller named: a `ValueError` when the shim names none.
    fn named_code(&self, dtype: &str) -> PyResult<i32> {
        self.dtype_code(dtype)
            .ok_or_else(|| PyValueError::new_err(format!("torch's C shim names no dtype {dtype:?}")))
    }
}

fn resolve<T>(path: &str, name: &std::ffi::CStr, loaded_only: bool) -> PyResult<T> {
    let p = symbol(path, name, loaded_only).map_err(PyOSError::new_err)?;
    // SAFETY: only called with function pointer types `T` matching the symbol's C signature.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

#[pymethods]
impl TorchAlloc {
    #[new]
    #[pyo3(signature = (cpu_lib, python_lib, /, *, loaded_only = true))]
    fn new(cpu_lib: &str, python_lib: &str, loaded_only: bool) -> PyResult<Self> {
        let empty: EmptyFn = resolve(cpu_lib, c"aoti_torch_empty_strided", loaded_only)?;
        let delete: DeleteFn = resolve(cpu_lib, c"aoti_torch_delete_tensor_object", loaded_only)?;
        let wrap: WrapFn = resolve(python_lib, WRAP, loaded_only)?;
        let cuda: CodeFn = resolve(cpu_lib, c"aoti_torch_device_type_cuda", loaded_only)?;
        let mut codes = Vec::new();
        for name in DTYPES {
            let sym = CString::new(format!("aoti_torch_dtype_{name}")).expect("no NUL in a dtype name");
            if let Ok(f) = resolve::<CodeFn>(cpu_lib, &sym, loaded_only) {
                // SAFETY: a shim function without arguments returning the dtype's code.
                codes.push((name, unsafe { f() }));
            }
        }
        Ok(Self {
            empty,
            delete,
            wrap,
            // SAFETY: as above.
            cuda: unsafe { cuda() },
            codes,
            by_idx: [const { AtomicI32::new(-1) }; 64],
            failed: AtomicBool::new(false),
        })
    }

    /// `empty_strided(sizes, strides, dtype, index, /) -> Tensor | None`: a new CUDA tensor on device
    /// `index` (`dtype` a short name such as ``"float32"``), or None (the shim failed, now or before).
    #[pyo3(name = "empty_strided", signature = (sizes, strides, dtype, index, /))]
    fn py_empty_strided<'py>(
        &self,
        py: Python<'py>,
        sizes: Vec<i64>,
        strides: Vec<i64>,
        dtype: &str,
        index: i32,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if sizes.len() != strides.len() {
            return Err(PyValueError::new_err("sizes and strides differ in length"));
        }
        Ok(self.empty_cuda(py, &sizes, &strides, self.named_code(dtype)?, index))
    }

    /// `empty_like(x, dtype=None, /) -> Tensor | None`: as ``torch.empty_like(x, dtype=dtype)`` (a
    /// short name such as ``"float16"``) for a plain, dense CUDA tensor, else None.
    #[pyo3(name = "empty_like", signature = (x, dtype = None, /))]
    fn py_empty_like<'py>(
        &self,
        x: &Bound<'py, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let code = dtype.map(|d| self.named_code(d)).transpose()?;
        Ok(self.empty_like(x.py(), x.as_ptr(), code))
    }

    /// `failed -> bool`: whether the shim reported an error (it is not called again).
    #[getter]
    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::non_overlapping_and_dense as d;

    #[test]
    fn dense_layouts_are_recognised_as_torch_does() {
        assert!(d(&[4, 8], &[8, 1]));
        assert!(d(&[4, 8], &[1, 4])); // transposed, still dense
        assert!(!d(&[4, 8], &[16, 1])); // a slice of a wider tensor
        assert!(!d(&[4, 8], &[0, 1])); // expanded
        assert!(d(&[1, 8], &[100, 1])); // size-1 dimensions' strides do not matter
        assert!(d(&[5], &[1]));
        assert!(!d(&[5], &[2]));
        assert!(d(&[0, 3], &[3, 1]));
        assert!(d(&[], &[]));
    }
}
