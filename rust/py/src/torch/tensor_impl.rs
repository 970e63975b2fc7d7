//! Direct reads of torch's C++ `TensorImpl` fields (dtype, `data_ptr()`, sizes, strides, numel,
//! device), installed only after `python/jitkey/_tensor_fields.py` proved a layout hypothesis for
//! the installed torch equal to the attribute path on probe tensors. Only exact `torch.Tensor` /
//! `nn.Parameter` objects whose `TensorImpl` and `StorageImpl` vtables are the plain ones qualify.

use std::mem::MaybeUninit;
use std::sync::OnceLock;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A verified layout of torch's tensor objects (see `_tensor_fields.py` for how it is proven).
pub(crate) struct Layout {
    /// `torch.Tensor`, `torch.nn.Parameter` (exact types only take the direct path).
    types: [usize; 2],
    impl_vtable: usize,
    storage_vtable: usize,
    /// TypeMeta index → (itemsize, the dtype's short name).
    dtypes: Vec<Option<(u64, &'static str)>>,
    pyobj_tensorimpl: usize,
    impl_storage: usize,
    storage_data: usize,
    impl_ndim: usize,
    impl_sizes: usize,
    impl_inline_strides: usize,
    max_inline_dims: usize,
    impl_storage_offset: usize,
    impl_numel: usize,
    impl_dtype: usize,
    impl_device: usize,
}

/// c10::DeviceType code → device type name: seeded by calibration (cpu, meta), then learned from
/// tensors whose device the attribute path resolved (the enum is fixed, so an entry never changes).
static DEVICE_CODES: [OnceLock<&'static str>; 64] = [const { OnceLock::new() }; 64];

static LAYOUT: OnceLock<Layout> = OnceLock::new();

/// The installed layout, if any (load it once for loops over many arguments).
#[inline(always)]
pub(crate) fn layout() -> Option<&'static Layout> {
    LAYOUT.get()
}

/// A tensor whose fields may be read directly: a plain `TensorImpl` of a known dtype.
pub(crate) struct Direct {
    imp: *const u8,
    /// The dtype's TypeMeta index (process-local).
    pub(crate) idx: u16,
    /// The dtype's short name.
    pub(crate) dtype: &'static str,
    itemsize: u64,
    l: &'static Layout,
}

/// Reads the word at `p + off`.
///
/// # Safety
/// `p + off .. p + off + 8` lies inside a live object whose layout the verified `Layout`
/// describes (the caller passes one of its offsets into the object it belongs to).
#[inline]
unsafe fn rd(p: *const u8, off: usize) -> usize {
    // SAFETY: in bounds of a live object per the contract; unaligned reads are allowed.
    unsafe { p.add(off).cast::<usize>().read_unaligned() }
}

/// The direct view of `obj`, or `None` (then the attribute path is used).
#[inline]
pub(crate) fn direct(obj: &Bound<'_, PyAny>) -> Option<Direct> {
    direct_with(LAYOUT.get()?, obj.as_ptr())
}

/// `direct` with the layout already loaded. `obj` must be a live object.
#[inline(always)]
pub(crate) fn direct_with(l: &'static Layout, obj: *mut ffi::PyObject) -> Option<Direct> {
    let p = obj.cast::<u8>().cast_const();
    // SAFETY: obj is live; its exact type is torch.Tensor/Parameter, whose C layout starts with
    // THPVariable (PyObject_HEAD, then the TensorImpl pointer); the TensorImpl is only read
    // further once its vtable proves it is a plain TensorImpl, whose field offsets were verified.
    unsafe {
        let tp = ffi::Py_TYPE(obj) as usize;
        if tp != l.types[0] && tp != l.types[1] {
            return None;
        }
        let imp = rd(p, l.pyobj_tensorimpl) as *const u8;
        if imp.is_null() || rd(imp, 0) != l.impl_vtable {
            return None;
        }
        let raw_idx = imp.add(l.impl_dtype).cast::<u16>().read_unaligned();
        let (itemsize, dtype) = (*l.dtypes.get(usize::from(raw_idx))?)?;
        Some(Direct { imp, idx: raw_idx, dtype, itemsize, l })
    }
}

impl Direct {
    /// `data_ptr()`, or `None` if the storage is not a plain `StorageImpl`.
    #[inline]
    pub(crate) fn data_ptr(&self) -> Option<u64> {
        // SAFETY: offsets verified for plain TensorImpl/StorageImpl; the storage is followed only
        // when non-null and its vtable is the calibrated plain StorageImpl one.
        unsafe {
            let sp = rd(self.imp, self.l.impl_storage) as *const u8;
            if sp.is_null() || rd(sp, 0) != self.l.storage_vtable {
                return None;
            }
            // torch's TensorImpl::data(): nullptr when numel == 0, else data + offset * itemsize
            // (even for a null data pointer, as meta tensors have).
            if rd(self.imp, self.l.impl_numel) == 0 {
                return Some(0);
            }
            let data = rd(sp, self.l.storage_data) as u64;
            let off = rd(self.imp, self.l.impl_storage_offset) as u64;
            Some(data.wrapping_add(off.wrapping_mul(self.itemsize)))
        }
    }

    /// `(code, index, has_value)` of the tensor's device.
    #[inline]
    pub(crate) fn device_raw(&self) -> (i8, i8, u8) {
        // SAFETY: verified offset of device_opt_ (three bytes) in a plain TensorImpl.
        unsafe {
            let p = self.imp.add(self.l.impl_device);
            (p.cast::<i8>().read(), p.add(1).cast::<i8>().read(), p.add(2).read())
        }
    }

    /// The device as `(type, index)` if its type code is known.
    #[inline]
    pub(crate) fn device(&self) -> Option<(&'static str, i64)> {
        let (code, index, has) = self.device_raw();
        if has != 1 {
            return None;
        }
        let name = DEVICE_CODES.get(usize::try_from(code).ok()?)?.get()?;
        Some((name, i64::from(index)))
    }

    /// Learns the name of this tensor's device type code from `(ty, idx)`, the device the
    /// attribute path resolved for this same tensor.
    #[cold]
    pub(crate) fn learn_device(&self, ty: &'static str, idx: i64) {
        let (code, index, has) = self.device_raw();
        if has == 1 && i64::from(index) == idx {
            if let Some(slot) = usize::try_from(code).ok().and_then(|c| DEVICE_CODES.get(c)) {
                let _ = slot.set(ty);
            }
        }
    }

    /// The sizes and strides, borrowed from the live `TensorImpl`.
    #[inline]
    pub(crate) fn dims(&self) -> (&[i64], &[i64]) {
        // SAFETY: verified SizesAndStrides layout: `ndim` sizes and `ndim` strides, inline up to
        // `max_inline_dims`, else a heap array of sizes followed by strides; they live as long as
        // the tensor, which the caller holds for as long as it borrows `self`.
        unsafe {
            let n = rd(self.imp, self.l.impl_ndim);
            let (sizes, strides) = if n <= self.l.max_inline_dims {
                (
                    self.imp.add(self.l.impl_sizes).cast::<i64>(),
                    self.imp.add(self.l.impl_inline_strides).cast::<i64>(),
                )
            } else {
                let heap = rd(self.imp, self.l.impl_sizes) as *const i64;
                (heap, heap.add(n))
            };
            (std::slice::from_raw_parts(sizes, n), std::slice::from_raw_parts(strides, n))
        }
    }

    /// `numel()`.
    #[inline]
    pub(crate) fn numel(&self) -> i64 {
        // SAFETY: verified offset of numel_ in a plain TensorImpl.
        unsafe { rd(self.imp, self.l.impl_numel) as i64 }
    }
}

/// c10::DeviceType::CUDA (a fixed enum value of c10).
pub(crate) const CUDA_DEVICE_CODE: i8 = 1;

/// The data pointer of a plain CUDA tensor on device `index`, read from its `TensorImpl`; `None`
/// for anything else (another device, host memory, a subclass, an unverified layout). What
/// `jitkey._core._LaunchPlan` passes for a pointer parameter without asking the driver.
#[inline]
pub(crate) fn cuda_data_ptr(obj: *mut ffi::PyObject, index: i64) -> Option<u64> {
    direct_with(LAYOUT.get()?, obj)?.cuda_data_ptr(index)
}

impl Direct {
    /// `data_ptr()` when the tensor is a CUDA tensor on device `index` (what `cuda_data_ptr`
    /// returns for it).
    #[inline(always)]
    pub(crate) fn cuda_data_ptr(&self, index: i64) -> Option<u64> {
        self.on_cuda(index).then(|| self.data_ptr()).flatten()
    }

    /// Whether the tensor is on CUDA device `index`.
    #[inline(always)]
    fn on_cuda(&self, index: i64) -> bool {
        let (code, idx, has) = self.device_raw();
        has == 1 && code == CUDA_DEVICE_CODE && i64::from(idx) == index
    }
}

/// The data pointers of plain CUDA tensors on one device, by parameter index (the first
/// [`CudaPointers::MAX`]), as read while a call was keyed: its launch packs them without reading
/// the tensors again. Valid only while no Python code has run since they were read (the caller's
/// duty: see `Launcher::launch_hit`).
pub(crate) struct CudaPointers {
    device: i64,
    /// Bit `i`: `ptrs[i]` holds parameter `i`'s pointer.
    valid: u64,
    ptrs: [MaybeUninit<u64>; CudaPointers::MAX],
}

impl CudaPointers {
    pub(crate) const MAX: usize = 64;

    /// None read yet, for tensors on CUDA device `device`.
    pub(crate) fn new(device: i64) -> Self {
        CudaPointers { device, valid: 0, ptrs: [MaybeUninit::uninit(); Self::MAX] }
    }

    /// Notes parameter `i`'s tensor `d` (whose `data_ptr()` is `data`, when already read) if it is
    /// a CUDA tensor on the device.
    #[inline(always)]
    pub(crate) fn note(&mut self, i: usize, d: &Direct, data: Option<u64>) {
        if i >= Self::MAX || !d.on_cuda(self.device) {
            return;
        }
        if let Some(p) = data.or_else(|| d.data_ptr()) {
            self.ptrs[i].write(p);
            self.valid |= 1 << i;
        }
    }

    /// Forgets every pointer noted, and notes none from now on (Python code may run before the
    /// packing).
    #[cold]
    pub(crate) fn forget(&mut self) {
        self.valid = 0;
        self.device = i64::MIN; // no tensor's device index
    }

    /// Parameter `i`'s pointer, if noted.
    #[inline(always)]
    pub(crate) fn get(&self, i: usize) -> Option<u64> {
        if i < Self::MAX && self.valid & (1 << i) != 0 {
            // SAFETY: bit `i` is set only after `ptrs[i]` was written.
            Some(unsafe { self.ptrs[i].assume_init() })
        } else {
            None
        }
    }
}

/// `_install_tensor_layout(layout, /)`: called once by `jitkey._tensor_fields.install()`.
#[pyfunction]
#[pyo3(signature = (layout, /))]
pub(super) fn _install_tensor_layout(layout: &Bound<'_, PyDict>) -> PyResult<bool> {
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        layout.get_item(k)?.ok_or_else(|| PyValueError::new_err(format!("layout lacks {k}")))
    };
    let types = get("tensor_types")?;
    let t0 = types.get_item(0)?;
    let t1 = types.get_item(1)?;
    let offs = get("offsets")?;
    let off = |k: &str| -> PyResult<usize> { offs.get_item(k)?.extract() };
    let mut dtypes: Vec<Option<(u64, &'static str)>> = Vec::new();
    for entry in get("dtypes")?.try_iter()? {
        let (idx, name, size): (usize, String, u64) = entry?.extract()?;
        if idx > u16::MAX as usize {
            return Err(PyValueError::new_err("dtype index out of range"));
        }
        if dtypes.len() <= idx {
            dtypes.resize(idx + 1, None);
        }
        if name.len() > 255 {
            return Err(PyValueError::new_err("dtype name longer than 255 bytes"));
        }
        dtypes[idx] = Some((size, Box::leak(name.into_boxed_str())));
    }
    let l = Layout {
        types: [t0.as_ptr() as usize, t1.as_ptr() as usize],
        impl_vtable: get("impl_vtable")?.extract()?,
        storage_vtable: get("storage_vtable")?.extract()?,
        dtypes,
        pyobj_tensorimpl: off("pyobj_tensorimpl")?,
        impl_storage: off("impl_storage")?,
        storage_data: off("storage_data")?,
        impl_ndim: off("impl_ndim")?,
        impl_sizes: off("impl_sizes")?,
        impl_inline_strides: off("impl_inline_strides")?,
        max_inline_dims: off("max_inline_dims")?,
        impl_storage_offset: off("impl_storage_offset")?,
        impl_numel: off("impl_numel")?,
        impl_dtype: off("impl_dtype")?,
        impl_device: off("impl_device")?,
    };
    for entry in get("devices")?.try_iter()? {
        let (code, name): (usize, String) = entry?.extract()?;
        if let Some(slot) = DEVICE_CODES.get(code) {
            let _ = slot.set(Box::leak(name.into_boxed_str()));
        }
    }
    // The type objects must outlive the cached pointers.
    std::mem::forget(t0.unbind());
    std::mem::forget(t1.unbind());
    Ok(LAYOUT.set(l).is_ok())
}

/// `_tensor_layout_installed()`: whether tensor fields are read directly.
#[pyfunction]
pub(super) fn _tensor_layout_installed() -> bool {
    LAYOUT.get().is_some()
}
