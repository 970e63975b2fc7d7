//! The DSL layer (`jitkey.dsl`): a DSL's per-call work keyed and replayed natively.
//!
//! * `site`: `_Site`, one DSL entry point: key, probe, replay or bound call, miss and fallback.
//! * `plan`: `_Plan`, a recorded call's steps, replayed.
//! * `method`: `_SiteMethod`, a DSL class's `__call__` that reaches an instance's site natively.
//! * this file: the launch recorder hook. While the Python side records a DSL call
//!   (`jitkey.dsl`), every jitkey Triton launch reports itself to the recorder before it runs, so
//!   the recording knows which launches the DSL made and with what. Outside a recording the check
//!   is one relaxed atomic load per launch.

mod method;
mod plan;
mod site;

use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

pub(crate) use plan::Plan;

/// Recordings in progress in this process (any thread).
static RECORDING: AtomicUsize = AtomicUsize::new(0);
/// `on_launch(launcher, grid, args, kwargs) -> end | None`, set once by `jitkey.dsl`.
static ON_LAUNCH: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// `on_site(site, args, kwargs) -> result`, set once by `jitkey.dsl`: a site called while a
/// recording is in progress (the recorder decides whether the call is a step of its recording).
static ON_SITE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether any recording is in progress (then launches call [`on_launch`]).
#[inline(always)]
pub(crate) fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed) != 0
}

/// Reports a launch to the recorder (only called while [`recording`]), with `(launcher, grid, args,
/// kwargs)`; returns what to call once the launch is over (`None`: nothing).
#[cold]
pub(crate) fn on_launch<'py>(
    py: Python<'py>,
    launch: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(f) = ON_LAUNCH.get(py) else { return Ok(None) };
    let end = f.bind(py).call1(launch)?;
    Ok((!end.is_none()).then_some(end))
}

/// Hands a site call made during a recording to the recorder, which runs it (`site._run`), with
/// `(site, args, kwargs)`.
#[cold]
pub(crate) fn on_site<'py>(
    py: Python<'py>,
    call: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(f) = ON_SITE.get(py) else { return Ok(None) };
    f.bind(py).call1(call).map(Some)
}

/// `_recording(delta, on_launch=None, on_site=None, /)`: a recording starts (+1) or ends (-1);
/// the first call sets the callbacks. Returns the number of recordings in progress.
#[pyfunction]
#[pyo3(signature = (delta, on_launch = None, on_site = None, /))]
fn _recording(
    py: Python<'_>,
    delta: isize,
    on_launch: Option<Py<PyAny>>,
    on_site: Option<Py<PyAny>>,
) -> PyResult<usize> {
    if let Some(f) = on_launch {
        let _ = ON_LAUNCH.set(py, f);
    }
    if let Some(f) = on_site {
        let _ = ON_SITE.set(py, f);
    }
    if ON_LAUNCH.get(py).is_none() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err("_recording: no launch callback set"));
    }
    Ok(if delta >= 0 {
        RECORDING.fetch_add(delta as usize, Ordering::Relaxed) + delta as usize
    } else {
        let d = delta.unsigned_abs();
        let prev =
            RECORDING.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(d)));
        prev.unwrap_or(0).saturating_sub(d)
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<site::Site>()?;
    m.add_class::<method::SiteMethod>()?;
    m.add_class::<Plan>()?;
    m.add_function(wrap_pyfunction!(_recording, m)?)?;
    Ok(())
}
