//! The CUDA driver, resolved at run time from `libcuda.so.1` as Triton's launcher resolves it.
//!
//! No CUDA toolkit at build time and no link-time dependency: the wheel imports on a machine
//! without a GPU, and `driver()` says why it cannot launch there. Only the entry points Triton's
//! launcher calls on a launch are resolved, and each call below mirrors what that launcher does
//! with it (`ensureCudaContext`, `_launch`, `getPointer`/`extractPointer`, `CUDA_CHECK`'s message),
//! in the `Dialect` of the installed Triton, so a launch through jitkey configures the driver
//! exactly as a launch through Triton does.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

/// `CUresult`.
pub(crate) type CuResult = c_int;
const CUDA_SUCCESS: CuResult = 0;
/// `CUDA_ERROR_INVALID_VALUE`: what `cuPointerGetAttribute` returns for host memory.
pub(crate) const CUDA_ERROR_INVALID_VALUE: CuResult = 1;

const CU_LAUNCH_ATTRIBUTE_COOPERATIVE: c_int = 2;
const CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION: c_int = 4;
const CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: c_int = 5;
const CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: c_int = 6;
/// Not in the `cuda.h` Triton 3.9 bundles: its `driver.c` defines it, and the mode below.
const CU_LAUNCH_ATTRIBUTE_SHARED_MEMORY_MODE: c_int = 18;
const CU_SHARED_MEMORY_MODE_ALLOW_OVERSIZED_SHARED_MEMORY: u8 = 3;
/// Above this much dynamic shared memory Triton 3.9 asks for oversized shared memory per launch.
const OVERSIZED_SHARED_MEMORY: i32 = 228 * 1024;
const CU_CLUSTER_SCHEDULING_POLICY_SPREAD: c_int = 1;
const CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: c_int = 14;
const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: c_int = 3;

/// Which Triton launcher a launch mirrors: the two differ in how parameters are read (`pack`), in
/// the launch attributes and in what a failed driver call stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Triton 3.6: a C launcher generated per signature (`make_launcher`): the arguments are parsed
    /// with `PyArg_ParseTuple` formats, and `CUDA_CHECK` records an error and carries on.
    Generated,
    /// Triton 3.9: one generic `launch` in the backend's `driver.c`: per-type extractors,
    /// oversized shared memory as a launch attribute, and `CUDA_CHECK` returns at the first error.
    Extractors,
}

impl Dialect {
    /// The dialect by the Triton version that introduced it: `"3.6"` or `"3.9"`.
    pub(crate) fn from_name(name: &str) -> Option<Dialect> {
        match name {
            "3.6" => Some(Dialect::Generated),
            "3.9" => Some(Dialect::Extractors),
            _ => None,
        }
    }

    /// Whether a failed `CUDA_CHECK` returns from the function it is in (3.9) or only records the
    /// error (3.6).
    fn check_returns(self) -> bool {
        self == Dialect::Extractors
    }
}

/// `CUlaunchAttribute`: the id, 4 bytes of padding, a 64-byte value union (8-byte aligned).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct LaunchAttribute {
    id: c_int,
    pad: [u8; 4],
    value: [u8; 64],
}

impl LaunchAttribute {
    const ZERO: Self = Self { id: 0, pad: [0; 4], value: [0; 64] };

    /// `{ .id = id, .value = v }`: the union's first member is `char pad[64]`, so Triton's
    /// initializer sets its first byte.
    fn first_byte(id: c_int, v: u8) -> Self {
        let mut a = Self { id, ..Self::ZERO };
        a.value[0] = v;
        a
    }

    /// An attribute whose value is the given native-endian `c_int`s, the rest zero.
    fn ints(id: c_int, ints: &[c_int]) -> Self {
        let mut a = Self { id, ..Self::ZERO };
        for (chunk, v) in a.value.chunks_exact_mut(4).zip(ints) {
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
        a
    }
}

/// `CUlaunchConfig`.
#[repr(C)]
struct LaunchConfig {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    stream: *mut c_void,
    attrs: *mut LaunchAttribute,
    num_attrs: c_uint,
}

type LaunchKernelEx =
    unsafe extern "C" fn(*const LaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;

/// The driver entry points a launch uses.
pub(crate) struct Driver {
    launch_kernel_ex: LaunchKernelEx,
    ctx_get_current: unsafe extern "C" fn(*mut *mut c_void) -> CuResult,
    device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    func_set_attribute: unsafe extern "C" fn(*mut c_void, c_int, c_int) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// `cuStreamIsCapturing`, where the driver has it.
    stream_is_capturing: Option<unsafe extern "C" fn(*mut c_void, *mut c_int) -> CuResult>,
}

/// One kernel launch, as Triton's `_launch` receives it.
#[derive(Clone)]
pub(crate) struct Launch {
    pub dialect: Dialect,
    pub grid: [i32; 3],
    pub num_warps: i32,
    pub num_ctas: i32,
    pub shared_memory: i32,
    pub cooperative: bool,
    pub pdl: bool,
    pub stream: u64,
    pub function: u64,
}

/// The first driver error of a launch, in Triton's words (`CUDA_CHECK` keeps the last one set).
pub(crate) type DriverError = Option<String>;

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The driver, loaded once per process; `Err` says why it is not usable here.
pub(crate) fn driver() -> Result<&'static Driver, &'static str> {
    DRIVER.get_or_init(load).as_ref().map_err(String::as_str)
}

#[cfg(not(unix))]
fn load() -> Result<Driver, String> {
    Err("jitkey launches CUDA kernels itself only on Linux".to_owned())
}

#[cfg(unix)]
fn load() -> Result<Driver, String> {
    // SAFETY: dlopen/dlsym with NUL-terminated names; the handle is never closed, so the
    // resolved function pointers stay valid for the life of the process.
    unsafe {
        let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY);
        if handle.is_null() {
            return Err("libcuda.so.1 cannot be opened".to_owned());
        }
        let sym = |name: &CStr| -> Result<*mut c_void, String> {
            let p = libc::dlsym(handle, name.as_ptr());
            if p.is_null() {
                Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()))
            } else {
                Ok(p)
            }
        };
        Ok(Driver {
            launch_kernel_ex: std::mem::transmute::<*mut c_void, LaunchKernelEx>(sym(c"cuLaunchKernelEx")?),
            ctx_get_current: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut *mut c_void) -> CuResult,
            >(sym(c"cuCtxGetCurrent")?),
            device_get: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_int, c_int) -> CuResult>(
                sym(c"cuDeviceGet")?,
            ),
            primary_ctx_retain: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
            >(sym(c"cuDevicePrimaryCtxRetain")?),
            ctx_set_current: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void) -> CuResult>(
                sym(c"cuCtxSetCurrent")?,
            ),
            func_set_attribute: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void, c_int, c_int) -> CuResult,
            >(sym(c"cuFuncSetAttribute")?),
            pointer_get_attribute: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void, c_int, u64) -> CuResult,
            >(sym(c"cuPointerGetAttribute")?),
            get_error_string: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
            >(sym(c"cuGetErrorString")?),
            stream_is_capturing: sym(c"cuStreamIsCapturing").ok().map(|p| {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, *mut c_int) -> CuResult>(
                    p,
                )
            }),
        })
    }
}

impl Driver {
    /// `CUDA_CHECK`: a failing call records `Triton Error [CUDA]: <cuGetErrorString>`.
    fn check(&self, code: CuResult, err: &mut DriverError) {
        if code == CUDA_SUCCESS {
            return;
        }
        *err = Some(format!("Triton Error [CUDA]: {}", self.error_string(code)));
    }

    /// `cuGetErrorString(code)`, or a fallback when the driver does not know the code.
    pub(crate) fn error_string(&self, code: CuResult) -> String {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: `s` is a valid out-pointer; on success it points at a static NUL-terminated string.
        let rc = unsafe { (self.get_error_string)(code, &mut s) };
        if rc != CUDA_SUCCESS || s.is_null() {
            return format!("unknown error {code}");
        }
        // SAFETY: see above: a static C string owned by the driver.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    /// Triton's `ensureCudaContext`: no current context → device 0's primary context is made current.
    /// In 3.9 the first failed call ends it; in 3.6 every call is made and the last error is kept.
    pub(crate) fn ensure_context(&self, dialect: Dialect, err: &mut DriverError) {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let stop = |err: &DriverError| dialect.check_returns() && err.is_some();
        // SAFETY: valid out-pointers; the calls take no other memory.
        unsafe {
            self.check((self.ctx_get_current)(&mut ctx), err);
            if stop(err) || !ctx.is_null() {
                return;
            }
            let mut device: c_int = 0;
            self.check((self.device_get)(&mut device, 0), err);
            if stop(err) {
                return;
            }
            self.check((self.primary_ctx_retain)(&mut ctx, device), err);
            if stop(err) {
                return;
            }
            self.check((self.ctx_set_current)(ctx), err);
        }
    }

    /// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`: any status but
    /// `CU_STREAM_CAPTURE_STATUS_NONE`), or `None` when the driver cannot say.
    pub(crate) fn capturing(&self, stream: u64) -> Option<bool> {
        let f = self.stream_is_capturing?;
        let mut status: c_int = -1;
        // SAFETY: `status` is a valid out-pointer; the stream is a handle torch gave (0: the legacy
        // default stream), which the call only reads.
        let rc = unsafe { f(stream as usize as *mut c_void, &mut status) };
        (rc == CUDA_SUCCESS).then_some(status != 0)
    }

    /// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ptr)`: `(status, device pointer)`.
    pub(crate) fn device_pointer(&self, ptr: u64) -> (CuResult, u64) {
        let mut out: u64 = 0;
        // SAFETY: the attribute is a 64-bit device pointer written to `out`.
        let rc = unsafe {
            (self.pointer_get_attribute)((&raw mut out).cast(), CU_POINTER_ATTRIBUTE_DEVICE_POINTER, ptr)
        };
        (rc, out)
    }

    /// Triton's `_launch`: the launch configuration and attributes, then `cuLaunchKernelEx`.
    ///
    /// A 3.9 launch is not made while an error is pending (from `ensure_context`): Triton 3.9
    /// leaves it set, and its integer and float extractors then fail on it before `_launch`. (For a
    /// kernel whose parameters are all pointers Triton 3.9 launches anyway, then raises; jitkey
    /// does not launch on a context it could not make current, and raises the same error.)
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter (the two scratch pointers included), each to
    /// a value of the parameter's size, all alive for the call; `l.function` is a loaded `CUfunction`.
    pub(crate) unsafe fn launch(&self, l: &Launch, params: *mut *mut c_void, err: &mut DriverError) {
        if l.dialect.check_returns() && err.is_some() {
            return;
        }
        let [gx, gy, gz] = l.grid;
        // C int arithmetic as in Triton's launcher (wrapping where C would overflow).
        if gx.wrapping_mul(gy).wrapping_mul(gz) <= 0 {
            return;
        }
        let mut attrs = [LaunchAttribute::ZERO; MAX_ATTRIBUTES];
        let n = l.attributes(&mut attrs);
        let config = LaunchConfig {
            grid: [gx.wrapping_mul(l.num_ctas) as c_uint, gy as c_uint, gz as c_uint],
            block: [32i32.wrapping_mul(l.num_warps) as c_uint, 1, 1],
            shared_mem_bytes: l.shared_memory as c_uint,
            stream: l.stream as usize as *mut c_void,
            attrs: attrs.as_mut_ptr(),
            num_attrs: n as c_uint,
        };
        let function = l.function as usize as *mut c_void;
        // SAFETY: the caller's contract; `config` and `attrs` live across the call.
        unsafe {
            if l.num_ctas == 16 {
                self.check(
                    (self.func_set_attribute)(
                        function,
                        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                        1,
                    ),
                    err,
                );
                if l.dialect.check_returns() && err.is_some() {
                    return;
                }
            }
            self.check((self.launch_kernel_ex)(&config, function, params, std::ptr::null_mut()), err);
        }
    }
}

/// The most launch attributes a launch sets (one more than Triton's `_launch` has room for: see
/// `Launch::attribute_count`).
const MAX_ATTRIBUTES: usize = 5;

/// The most launch attributes Triton's `_launch` has room for (`CUlaunchAttribute launchAttr[4]`).
pub(crate) const TRITON_ATTRIBUTE_ROOM: usize = 4;

impl Launch {
    /// The launch attributes Triton's `_launch` sets, in its order, into `attrs`; returns how many.
    fn attributes(&self, attrs: &mut [LaunchAttribute; MAX_ATTRIBUTES]) -> usize {
        let mut n = 0;
        let mut push = |a: LaunchAttribute| {
            attrs[n] = a;
            n += 1;
        };
        if self.dialect == Dialect::Extractors && self.shared_memory > OVERSIZED_SHARED_MEMORY {
            push(LaunchAttribute::first_byte(
                CU_LAUNCH_ATTRIBUTE_SHARED_MEMORY_MODE,
                CU_SHARED_MEMORY_MODE_ALLOW_OVERSIZED_SHARED_MEMORY,
            ));
        }
        if self.pdl {
            push(LaunchAttribute::first_byte(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 1));
        }
        if self.cooperative {
            push(LaunchAttribute::first_byte(CU_LAUNCH_ATTRIBUTE_COOPERATIVE, 1));
        }
        if self.num_ctas != 1 {
            push(LaunchAttribute::ints(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, &[self.num_ctas, 1, 1]));
            push(LaunchAttribute::ints(
                CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE,
                &[CU_CLUSTER_SCHEDULING_POLICY_SPREAD],
            ));
        }
        n
    }

    /// How many launch attributes this launch sets. More than `TRITON_ATTRIBUTE_ROOM` (3.9: oversized
    /// shared memory with PDL, a cooperative grid and a cluster) overflows Triton's own array.
    pub(crate) fn attribute_count(&self) -> usize {
        self.attributes(&mut [LaunchAttribute::ZERO; MAX_ATTRIBUTES])
    }
}
