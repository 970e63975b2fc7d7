//! jitkey._core: the PyO3 binding of jitkey-core. Wiring only; each concept has its own module.
//!
//! * `cpython`: access to CPython objects (tuple items, ints, str hashes and UTF-8, exact types,
//!   direct reads where proven), shared by the key walks, the launch path and DSL sites.
//! * `keys`: Python value → canonical encoding (`jitkey.encode`), and the structural hash of
//!   `jitkey.LruCache` keys.
//! * `torch`: the only module that knows torch: the tensor type, direct `TensorImpl` reads, a
//!   tensor's metadata under a rule, the dtype and device tables both key walks share, and torch's
//!   C shim (the current device and stream, native allocation).
//! * `signature`: `jitkey.Signature` (rule compilation, the per-call walk, the class).
//! * `lru`, `disk`: `jitkey.LruCache`, `jitkey.DiskIndex`.
//! * `launch`: the Triton warm-launch path (`_TritonLauncher`, `_TritonEntry`, `_KernelBase`) and
//!   jitkey's own launch of a compiled kernel (`_LaunchPlan`: packing, launch configuration).
//! * `dsl`: the DSL layer (`_Site`, `_Plan`): a DSL call keyed natively and its recorded host work
//!   and launches replayed (`jitkey.dsl`).
//! * `cuda`: the CUDA driver entry points, resolved from `libcuda.so.1` at run time.

use pyo3::prelude::*;

mod cpython;
mod cuda;
#[cfg(unix)]
mod disk;
mod dsl;
mod errors;
mod fastcall;
mod keys;
mod launch;
mod lru;
mod signature;
mod torch;
mod written;

#[pymodule(gil_used = false)]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("FORMAT_VERSION", jitkey_core::key::FORMAT_VERSION)?;
    m.add("MAX_DEPTH", jitkey_core::key::MAX_DEPTH)?;
    m.add("DIGEST_DOMAIN", pyo3::types::PyBytes::new(m.py(), jitkey_core::key::DIGEST_DOMAIN))?;
    keys::register(m)?;
    lru::register(m)?;
    #[cfg(unix)]
    disk::register(m)?;
    torch::register(m)?;
    signature::register(m)?;
    launch::register(m)?;
    dsl::register(m)?;
    Ok(())
}
