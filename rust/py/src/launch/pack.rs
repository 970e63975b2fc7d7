//! Packing one call's parameters as Triton's launcher packs them (its `Dialect`), or declining it.
//!
//! The plan only launches what it fully understands; everything else is *declined* before any side
//! effect, counted by reason, and the caller hands the call to Triton's launcher, which then packs,
//! checks and raises exactly as it always does. Understood means:
//! - pointers: `None` (null), an int in `[0, 2**64)` (passed as is, as Triton passes it), or a plain
//!   CUDA tensor on the current device, whose data pointer is read from its `TensorImpl`: valid by
//!   construction, so no `cuPointerGetAttribute` per pointer. Host memory, another device, tensor
//!   subclasses and `data_ptr()` objects are declined (Triton's launcher checks them).
//! - integers: ints (bools included) that Triton's launcher reads without an error, packed as it
//!   packs them (`Leaf::Int`): in 3.6 the type's own range (Triton raises for some values outside
//!   it and masks others: jitkey does not guess which), in 3.9 the range of the C type its extractor
//!   reads (`long`, `unsigned long`, ...), truncated to the parameter's width as C converts it.
//!   Everything else is declined.
//! - floats: floats, and exact ints of any size (converted as `float(x)` converts them; one too large
//!   for a double, where CPython raises, is declined). fp16 is packed as `PyFloat_Pack2` packs it; NaN,
//!   infinities and fp16 overflow are declined.
//! - constexpr and specialized-away arguments: skipped, as Triton skips them; tuples: flattened.

use std::ffi::{c_long, c_longlong, c_ulong, c_ulonglong, c_void};
use std::mem::MaybeUninit;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use crate::cpython::{int_i128, tuple_item};
use crate::cuda::Dialect;
use crate::torch::cuda_data_ptr;
use crate::written::{written, written_mut};

/// One scalar kernel parameter, by how it is packed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Leaf {
    /// A constexpr or specialized-away argument: not passed to the kernel.
    Skip,
    Ptr,
    /// An integer: claimed when it is an int in `min..=max` (what Triton's launcher reads without
    /// an error), passed as its low `bytes` bytes (two's complement, as C narrows it).
    Int {
        min: i128,
        max: i128,
        bytes: u8,
    },
    F16,
    BF16,
    F32,
    F64,
}

/// A `Leaf::Int` read as the C type `T` (its range), passed as `bytes` bytes.
macro_rules! int_as {
    ($t:ty, $bytes:expr) => {
        Leaf::Int { min: <$t>::MIN as i128, max: <$t>::MAX as i128, bytes: $bytes }
    };
}

impl Leaf {
    /// The leaf of a Triton type name in `dialect`: 3.6's `ty_to_cpp` / `FLOAT_STORAGE_TYPE` and
    /// its `PyArg_ParseTuple` formats, or 3.9's `extraction_map` (`driver.c`).
    fn parse(dialect: Dialect, ty: &str) -> Option<Leaf> {
        if ty.starts_with('*') {
            return Some(Leaf::Ptr);
        }
        let int = match dialect {
            // Parsed with "b" (i1, i8: an unsigned char), "h", "i", "L", and for the unsigned
            // types "B", "H", "I", "K" (which mask rather than raise: out of range is declined).
            Dialect::Generated => match ty {
                "i1" | "i8" => Some(int_as!(u8, 1)),
                "i16" => Some(int_as!(i16, 2)),
                "i32" => Some(int_as!(i32, 4)),
                "i64" => Some(int_as!(i64, 8)),
                "u1" | "u8" => Some(int_as!(u8, 1)),
                "u16" => Some(int_as!(u16, 2)),
                "u32" => Some(int_as!(u32, 4)),
                "u64" => Some(int_as!(u64, 8)),
                _ => None,
            },
            // extractI8/I16/I32 (i1 too: 4 bytes) read `PyLong_AsLong`, extractI64
            // `PyLong_AsLongLong`, extractU8/U16/U32 (u1 too: 4 bytes) `PyLong_AsUnsignedLong`,
            // extractU64 `PyLong_AsUnsignedLongLong`, then store into the narrower C type.
            Dialect::Extractors => match ty {
                "i8" => Some(int_as!(c_long, 1)),
                "i16" => Some(int_as!(c_long, 2)),
                "i1" | "i32" => Some(int_as!(c_long, 4)),
                "i64" => Some(int_as!(c_longlong, 8)),
                "u8" => Some(int_as!(c_ulong, 1)),
                "u16" => Some(int_as!(c_ulong, 2)),
                "u1" | "u32" => Some(int_as!(c_ulong, 4)),
                "u64" => Some(int_as!(c_ulonglong, 8)),
                _ => None,
            },
        };
        if int.is_some() {
            return int;
        }
        Some(match ty {
            "constexpr" => Leaf::Skip,
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
pub(super) enum Param {
    Leaf(Leaf),
    Tuple(Vec<Param>),
}

impl Param {
    pub(super) fn from_py(dialect: Dialect, ty: &Bound<'_, PyAny>) -> PyResult<Param> {
        if let Ok(t) = ty.cast::<PyTuple>() {
            return t.iter().map(|x| Param::from_py(dialect, &x)).collect::<PyResult<_>>().map(Param::Tuple);
        }
        let s = ty.cast::<PyString>().map_err(|_| PyTypeError::new_err(format!("signature type {ty}")))?;
        let s = s.to_str()?;
        Leaf::parse(dialect, s)
            .map(Param::Leaf)
            .ok_or_else(|| PyValueError::new_err(format!("signature type {s:?}")))
    }

    pub(super) fn slots(&self) -> usize {
        match self {
            Param::Leaf(Leaf::Skip) => 0,
            Param::Leaf(_) => 1,
            Param::Tuple(items) => items.iter().map(Param::slots).sum(),
        }
    }
}

/// Why a call is handed to Triton's launcher instead (the counters' order).
#[derive(Clone, Copy)]
pub(super) enum Decline {
    Grid,
    Stream,
    Pointer,
    Int,
    Float,
    Tuple,
    Arity,
    FloatType,
}

/// What each decline means; each says what happened and that Triton's launcher then packs the call
/// as it always does (converting, or raising where it raises).
pub(super) const DECLINES: [&str; 8] = [
    "the grid is not three int32 values",
    "the stream is not an int",
    "a pointer argument is not a CUDA tensor on the current device, an int or None",
    "an integer argument is not an int in its type's range",
    "a float argument is NaN, or too large for its float type (or an int too large for a double)",
    "a tuple argument does not match the signature",
    "the arguments do not match the kernel's signature",
    "a float argument is neither a float nor an exact int",
];

/// The packed parameter values, one 8-byte slot each (a value sits in its slot's first bytes):
/// inline up to `INLINE` (nothing is allocated or zeroed per call below that), else in a heap
/// vector of the plan's exact size.
const INLINE: usize = 64;
pub(crate) struct Slots {
    /// The first `n` are written (by `push`) when the values are inline.
    inline: [MaybeUninit<u64>; INLINE],
    heap: Vec<u64>,
    n: usize,
}

impl Slots {
    pub(crate) fn new() -> Self {
        Slots { inline: [MaybeUninit::uninit(); INLINE], heap: Vec::new(), n: 0 }
    }

    /// Makes room for `total` values before the first `push` (a plan knows its count): beyond
    /// `INLINE`, one allocation of the exact size.
    #[inline]
    pub(super) fn reserve(&mut self, total: usize) {
        if total > INLINE && self.n == 0 {
            self.heap.reserve_exact(total);
        }
    }

    /// Appends one value: inline while the values fit (a store and an increment, inlined into the
    /// packing loops), else `push_spilled`.
    #[inline(always)]
    pub(super) fn push(&mut self, v: u64) {
        if self.n < INLINE && self.heap.capacity() == 0 {
            self.inline[self.n].write(v);
            self.n += 1;
        } else {
            self.push_spilled(v);
        }
    }

    /// `push` past the inline values, or into the heap vector `reserve` made.
    #[cold]
    #[inline(never)]
    fn push_spilled(&mut self, v: u64) {
        if self.heap.is_empty() && self.n > 0 {
            // SAFETY: the first `n` inline values were written by `push`.
            self.heap.extend_from_slice(unsafe { written(&self.inline[..self.n]) });
        }
        self.heap.push(v);
        self.n += 1;
    }

    /// Triton's `void *params[]`: a pointer to each packed value, then to the global and the
    /// profile scratch pointer; `f` receives it while all of them are alive.
    pub(super) fn with_params<R>(
        &mut self,
        scratch: &mut [u64; 2],
        f: impl FnOnce(*mut *mut c_void) -> R,
    ) -> R {
        let values = self.values_mut();
        let nv = values.len();
        let n = nv + 2;
        let mut inline: [MaybeUninit<*mut c_void>; INLINE + 2] = [MaybeUninit::uninit(); INLINE + 2];
        let mut heap = Vec::new();
        let ptrs: *mut *mut c_void = if n <= inline.len() {
            // One address per value (a plain indexed loop: no iterator state per value).
            let base = values.as_mut_ptr();
            for (k, slot) in inline[..nv].iter_mut().enumerate() {
                slot.write(base.wrapping_add(k).cast());
            }
            inline[nv].write((&raw mut scratch[0]).cast());
            inline[nv + 1].write((&raw mut scratch[1]).cast());
            inline.as_mut_ptr().cast()
        } else {
            heap.extend(
                values.iter_mut().chain(scratch.iter_mut()).map(|v| (v as *mut u64).cast::<c_void>()),
            );
            heap.as_mut_ptr()
        };
        // `ptrs` holds `n` written pointers (the first `n` inline slots, or the heap vector).
        f(ptrs)
    }

    fn values_mut(&mut self) -> &mut [u64] {
        if self.heap.is_empty() {
            // SAFETY: the first `n` inline values were written by `push` (while the heap is empty,
            // every value is inline).
            unsafe { written_mut(&mut self.inline[..self.n]) }
        } else {
            &mut self.heap
        }
    }
}

/// An int's value when it fits in `[-2**63, 2**64)`; `None` for anything else (no error left set).
#[inline]
pub(super) fn int_value(obj: *mut ffi::PyObject) -> Option<i128> {
    // SAFETY: obj is a live object (`ob_type` is stable-ABI layout); it is read as an int only
    // once it is known to be one.
    unsafe {
        let exact = std::ptr::eq((*obj).ob_type, std::ptr::addr_of_mut!(ffi::PyLong_Type));
        (exact || ffi::PyLong_Check(obj) != 0).then(|| int_i128(obj)).flatten()
    }
}

/// What `PyFloat_AsDouble` (Triton's launchers' read of a float parameter) returns for a float or an
/// exact int of any size: `Ok(value)`; `Err(Decline::Float)` for an int too large for a double (where
/// CPython raises `OverflowError`), `Err(Decline::FloatType)` for anything else.
#[inline]
pub(super) fn float_value(obj: *mut ffi::PyObject) -> Result<f64, Decline> {
    // SAFETY: obj is a live object; PyFloat_AsDouble cannot fail on a float.
    unsafe {
        if ffi::PyFloat_Check(obj) != 0 {
            return Ok(ffi::PyFloat_AsDouble(obj));
        }
    }
    // Only an exact int is converted here: an int subclass may define __float__, which
    // PyFloat_AsDouble would call.
    // SAFETY: obj is a live object (`ob_type` is stable-ABI layout).
    if !std::ptr::eq(unsafe { (*obj).ob_type }, std::ptr::addr_of_mut!(ffi::PyLong_Type)) {
        return Err(Decline::FloatType);
    }
    // int.__float__ rounds to nearest, ties to even, as `as f64` does.
    if let Some(v) = int_value(obj) {
        if let Ok(v) = i64::try_from(v) {
            return Ok(v as f64);
        }
        if let Ok(v) = u64::try_from(v) {
            return Ok(v as f64);
        }
    }
    // An int beyond 64 bits: int.__float__ itself (PyLong_AsDouble, correctly rounded), as Triton's
    // launcher converts it.
    // SAFETY: obj is a live exact int; the error indicator is checked and cleared with the GIL held.
    unsafe {
        let v = ffi::PyLong_AsDouble(obj);
        if v == -1.0 && !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
            return Err(Decline::Float);
        }
        Ok(v)
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
        Leaf::Int { min, max, bytes } => match int_value(obj) {
            // Two's complement, then the low `bytes` bytes (the slot's first, little-endian).
            Some(v) if (min..=max).contains(&v) => (v as u64) & (u64::MAX >> (64 - 8 * u32::from(bytes))),
            _ => return Err(Decline::Int),
        },
        Leaf::F16 => u64::from(pack_fp16(float_value(obj)?).ok_or(Decline::Float)?),
        Leaf::BF16 => match float_value(obj)? {
            x if !x.is_nan() => u64::from((x as f32).to_bits() >> 16),
            _ => return Err(Decline::Float),
        },
        Leaf::F32 => match float_value(obj)? {
            x if !x.is_nan() => u64::from((x as f32).to_bits()),
            _ => return Err(Decline::Float),
        },
        Leaf::F64 => float_value(obj)?.to_bits(),
    };
    out.push(v);
    Ok(())
}

pub(super) fn pack_param(
    p: &Param,
    obj: *mut ffi::PyObject,
    device: i64,
    out: &mut Slots,
) -> Result<(), Decline> {
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
pub(super) fn grid_value(obj: &Bound<'_, PyAny>) -> Option<i32> {
    int_value(obj.as_ptr()).and_then(|v| i32::try_from(v).ok())
}
