//! The current CUDA device and stream, read through torch's stable C shim instead of its Python
//! bindings: `aoti_torch_get_current_device_index` (in `libtorch_cpu`) and
//! `aoti_torch_get_current_cuda_stream(device_index, void**)` (in `libtorch_cuda`), both declared in
//! `torch/csrc/inductor/aoti_torch/c/shim.h` and exported by torch 2.11's libraries.
//!
//! Resolved at run time from the libraries torch has already loaded (as `crate::cuda` resolves
//! `libcuda`): no link-time dependency on torch, and a torch without the symbols simply keeps the
//! Python getters. The shim functions catch every C++ exception and return a non-zero
//! `AOTITorchError` instead (torch logs it with a stack trace); after the first error the shim is
//! not called again, and callers use the Python getters, which raise torch's own error. Whether
//! the shim agrees with the Python getters is proven once per process before a launcher or a DSL site uses it
//! (`jitkey/_torch_current.py`).

use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// `AOTITorchError aoti_torch_get_current_device_index(int32_t* ret_device_index)`.
type DeviceFn = unsafe extern "C" fn(*mut i32) -> i32;
/// `AOTITorchError aoti_torch_get_current_cuda_stream(int32_t device_index, void** ret_stream)`.
type StreamFn = unsafe extern "C" fn(i32, *mut *mut c_void) -> i32;

/// `_TorchCurrent(device_lib, stream_lib, /, *, loaded_only=True)`: the two shim functions, resolved
/// from `device_lib` and `stream_lib` (paths; with `loaded_only`, only from libraries already loaded
/// in this process).
#[pyclass(name = "_TorchCurrent", module = "jitkey._core", frozen)]
pub(crate) struct TorchCurrent {
    device_fn: DeviceFn,
    stream_fn: StreamFn,
    /// Set at the first error the shim reports: from then on `None` without calling it (each
    /// error makes torch log a stack trace; the Python getters raise torch's error instead).
    failed: AtomicBool,
}

impl TorchCurrent {
    /// The current device index, or `None` when the shim reports an error (or did before).
    #[inline]
    pub(crate) fn device_index(&self) -> Option<i32> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let mut out: i32 = -1;
        // SAFETY: the function was resolved by its declared C name and has the signature of
        // torch's shim.h; `out` is a valid out-pointer for the call.
        let rc = unsafe { (self.device_fn)(&mut out) };
        self.ok(rc).then_some(out)
    }

    /// The current stream of `device` as the integer torch's `_cuda_getCurrentRawStream` returns,
    /// or `None` when the shim reports an error (or did before).
    #[inline]
    pub(crate) fn stream_of(&self, device: i32) -> Option<u64> {
        if self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let mut out: *mut c_void = std::ptr::null_mut();
        // SAFETY: as in `device_index`: shim.h's signature, a valid out-pointer.
        let rc = unsafe { (self.stream_fn)(device, &mut out) };
        self.ok(rc).then_some(out as usize as u64)
    }

    fn ok(&self, rc: i32) -> bool {
        if rc != 0 {
            self.failed.store(true, Ordering::Relaxed);
        }
        rc == 0
    }
}

#[cfg(unix)]
pub(super) fn symbol(path: &str, name: &std::ffi::CStr, loaded_only: bool) -> Result<*mut c_void, String> {
    let c_path = CString::new(path).map_err(|_| format!("{path:?} contains a NUL byte"))?;
    let mut flags = libc::RTLD_LAZY | libc::RTLD_LOCAL;
    if loaded_only {
        flags |= libc::RTLD_NOLOAD;
    }
    // SAFETY: dlopen/dlsym with NUL-terminated strings; the handle is never closed, so a resolved
    // function stays valid for the life of the process.
    unsafe {
        let handle = libc::dlopen(c_path.as_ptr(), flags);
        if handle.is_null() {
            let why = if loaded_only { "is not loaded in this process" } else { "cannot be opened" };
            return Err(format!("{path} {why}"));
        }
        let p = libc::dlsym(handle, name.as_ptr());
        if p.is_null() {
            return Err(format!("{path} has no {}", name.to_string_lossy()));
        }
        Ok(p)
    }
}

#[cfg(not(unix))]
pub(super) fn symbol(_path: &str, _name: &std::ffi::CStr, _loaded_only: bool) -> Result<*mut c_void, String> {
    Err("torch's C shim is resolved only on Linux".to_owned())
}

#[pymethods]
impl TorchCurrent {
    #[new]
    #[pyo3(signature = (device_lib, stream_lib, /, *, loaded_only = true))]
    fn new(device_lib: &str, stream_lib: &str, loaded_only: bool) -> PyResult<Self> {
        let device = symbol(device_lib, c"aoti_torch_get_current_device_index", loaded_only)
            .map_err(PyOSError::new_err)?;
        let stream = symbol(stream_lib, c"aoti_torch_get_current_cuda_stream", loaded_only)
            .map_err(PyOSError::new_err)?;
        // SAFETY: both symbols are the functions shim.h declares with these C signatures.
        unsafe {
            Ok(Self {
                device_fn: std::mem::transmute::<*mut c_void, DeviceFn>(device),
                stream_fn: std::mem::transmute::<*mut c_void, StreamFn>(stream),
                failed: AtomicBool::new(false),
            })
        }
    }

    /// `device() -> int | None`: the current device index (None: the shim reported an error, now or
    /// before).
    fn device(&self) -> Option<i32> {
        self.device_index()
    }

    /// `stream(device, /) -> int | None`: the current stream of `device` (None: as `device()`).
    #[pyo3(signature = (device, /))]
    fn stream(&self, device: i32) -> Option<u64> {
        self.stream_of(device)
    }

    /// `failed -> bool`: whether the shim reported an error (it is not called again).
    #[getter]
    fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }
}
