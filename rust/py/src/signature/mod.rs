//! `jitkey.Signature`: call arguments → key → cached value in one native call.
//!
//! A signature is built once per kernel from per-parameter rules (described in Python by
//! `jitkey.rules`, each rule object returning a plain spec tuple from `__jitkey_rule__()`),
//! compiled ([`compile`]) into a `jitkey_core::signature::Rule` plan plus a precomputed header
//! (plan description + `extra`). Per call, the plan walks the arguments ([`walk`]) and writes the
//! key into the thread-local encoder, hashes it and probes a `jitkey.LruCache`; a hit returns the
//! cached object without building any Python object.
//!
//! This module holds the `Signature` class itself: construction, the Python methods, and the
//! entry points the Triton launcher (`crate::launch`) calls per parameter.

mod compile;
mod walk;

use std::mem::MaybeUninit;

use jitkey_core::key::{Encoder, Value};
use jitkey_core::signature::{self as core_sig, Rule};
use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PySequence, PyString, PyTuple};

use crate::cpython::str_utf8;
use crate::errors::{ArgumentError, SignatureError};
use crate::keys::{encode_into, fast_hash_state, with_encoder};
use crate::lru::PyLruCache;
use crate::torch::CudaPointers;
use crate::written::{written, written_mut};
use compile::{compile_rule, dtype_align_only};
use walk::encode_rule;

// ---- a call's arguments bound to the parameters --------------------------------------------------

/// A call's arguments bound to a signature's parameters, in parameter order (what the Triton
/// launcher's binding and a DSL site's make, then key and launch or replay): borrowed pointers to
/// the call's arguments and the signature's defaults, alive for the call. Inline up to
/// [`ArgSlots::INLINE`] parameters: nothing is allocated per call below that.
pub(crate) struct ArgSlots {
    /// The first `n` are written (by `reset`) when `n <= INLINE`.
    stack: [MaybeUninit<*mut ffi::PyObject>; ArgSlots::INLINE],
    heap: Vec<*mut ffi::PyObject>,
    n: usize,
}

impl ArgSlots {
    pub(crate) const INLINE: usize = 64;

    pub(crate) fn new() -> Self {
        ArgSlots { stack: [MaybeUninit::uninit(); Self::INLINE], heap: Vec::new(), n: 0 }
    }

    /// `n` slots to bind into, in place of what was bound before: the positional arguments `pos`
    /// (at most `n`) first, the rest empty (null).
    pub(crate) fn reset(&mut self, pos: &[*mut ffi::PyObject], n: usize) -> &mut [*mut ffi::PyObject] {
        assert!(pos.len() <= n, "more positional arguments than slots");
        self.n = n;
        if n <= Self::INLINE {
            let slots = &mut self.stack[..n];
            let (given, rest) = slots.split_at_mut(pos.len());
            for (slot, &p) in given.iter_mut().zip(pos) {
                slot.write(p);
            }
            rest.fill(MaybeUninit::new(std::ptr::null_mut()));
            // SAFETY: all `n` were just written.
            unsafe { written_mut(slots) }
        } else {
            self.heap.clear();
            self.heap.extend_from_slice(pos);
            self.heap.resize(n, std::ptr::null_mut());
            &mut self.heap
        }
    }

    /// The bound arguments.
    pub(crate) fn get(&self) -> &[*mut ffi::PyObject] {
        if self.n <= Self::INLINE {
            // SAFETY: `reset` wrote the first `n` (and `new` set `n` to 0).
            unsafe { written(&self.stack[..self.n]) }
        } else {
            &self.heap
        }
    }
}

/// A signature's parameter names as the keyword names of a call are matched to them (the Triton
/// launcher's binding and a DSL site's): interned `str` objects, so that a keyword written at a call
/// site (the same interned object) is found by its address, and their hashes, so that any other
/// exact `str` is found by its cached hash and then its bytes; a `str` subclass by its value.
pub(crate) struct ParamNames {
    names: Vec<Py<PyString>>,
    hashes: Vec<ffi::Py_hash_t>,
}

impl ParamNames {
    pub(crate) fn new(py: Python<'_>, sig: &Signature) -> PyResult<Self> {
        let names: Vec<_> = sig.param_names().iter().map(|n| PyString::intern(py, n).unbind()).collect();
        let hashes = names.iter().map(|n| n.bind(py).hash()).collect::<PyResult<_>>()?;
        Ok(Self { names, hashes })
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The interned names, in parameter order.
    pub(crate) fn objects(&self) -> &[Py<PyString>] {
        &self.names
    }

    /// The parameter whose interned name is the object `k` itself.
    #[inline]
    pub(crate) fn by_address(&self, k: *mut ffi::PyObject) -> Option<usize> {
        self.names.iter().position(|name| name.as_ptr() == k)
    }

    /// The parameter named `k` (a live object): by address, else by value.
    #[inline]
    pub(crate) fn index(&self, k: *mut ffi::PyObject) -> Option<usize> {
        self.by_address(k).or_else(|| self.by_value(k))
    }

    /// The parameter named `k` (a live object) when `k` is not one of the interned names: an exact
    /// `str` is compared by its cached hash first, so a name that is no parameter's costs no string
    /// comparison; a `str` subclass by its text; anything else (or a str without UTF-8) names none.
    pub(crate) fn by_value(&self, k: *mut ffi::PyObject) -> Option<usize> {
        let key = str_utf8(k);
        if key.is_empty() {
            return None; // not a str, or one without UTF-8: no parameter's name
        }
        let text = |name: &Py<PyString>| str_utf8(name.as_ptr());
        // SAFETY: `k` is a live object kept alive by the call.
        if unsafe { ffi::PyUnicode_CheckExact(k) } != 0 {
            // SAFETY: for an exact str PyObject_Hash runs no Python code, cannot fail and returns the
            // str's cached hash (computing it once).
            let h = unsafe { ffi::PyObject_Hash(k) };
            return self.hashes.iter().zip(&self.names).position(|(&nh, name)| nh == h && text(name) == key);
        }
        self.names.iter().position(|name| text(name) == key)
    }

    pub(crate) fn traverse(&self, visit: &pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.names.iter().try_for_each(|n| visit.call(n))
    }
}

// ---- the miss sentinel -------------------------------------------------------------------------

/// The type of `jitkey.MISS`, what `Signature.lookup` returns when the cache has no entry.
#[pyclass(name = "_Miss", module = "jitkey._core", frozen)]
pub(crate) struct Miss;

#[pymethods]
impl Miss {
    fn __repr__(&self) -> &'static str {
        "jitkey.MISS"
    }
    fn __bool__(&self) -> bool {
        false
    }
}

static MISS: PyOnceLock<Py<Miss>> = PyOnceLock::new();

pub(crate) fn miss(py: Python<'_>) -> &Py<Miss> {
    MISS.get_or_init(py, || Py::new(py, Miss).expect("allocating jitkey.MISS"))
}

// ---- the Signature class -----------------------------------------------------------------------

/// Call arguments → key, compiled once per kernel from per-parameter rules (see :mod:`jitkey.rules`).
///
/// ``params`` is a sequence of ``(name, rule)`` or ``(name, rule, default)`` tuples (parameters with
/// defaults come last and may be left out of a call). ``extra`` is any keyable value folded into
/// every key: the function's identity, device, options, knob state.
///
/// A call's key is a header (tag ``0x10``, the plan's description, then ``extra``'s encoding)
/// followed by one leaf per parameter; the encoding is injective, so equal keys mean equal
/// signatures, extras and per-parameter leaves.
///
/// Raises:
///     jitkey.errors.SignatureError: a malformed parameter or rule, a duplicate name, a required
///         parameter after a defaulted one, or an ``extra`` / default that cannot be keyed.
#[pyclass(name = "Signature", module = "jitkey._core", frozen)]
pub(crate) struct Signature {
    names: Vec<String>,
    rules: Vec<Rule>,
    defaults: Vec<Option<Py<PyAny>>>,
    /// Required positional parameters (those before the first default).
    required: usize,
    header: Box<[u8]>,
    extra: Py<PyAny>,
    /// Per parameter: `Some(align)` when its rule keys a tensor by dtype (+ `data_ptr() % align`,
    /// 0 = not keyed) and nothing else, so `encode_param_in_process` may use the short form.
    dtype_align_only: Vec<Option<u32>>,
}

impl Signature {
    /// Writes the key of `args` into `enc` (header included).
    #[inline]
    fn encode_args(&self, args: &Bound<'_, PyTuple>, enc: &mut Encoder) -> PyResult<()> {
        let py = args.py();
        let n = args.len();
        if n < self.required || n > self.rules.len() {
            return Err(self.count_error(n));
        }
        enc.raw(&self.header);
        for (i, rule) in self.rules.iter().enumerate() {
            let r = if i < n {
                // SAFETY: i < len of a tuple we hold.
                let a = unsafe { args.get_borrowed_item_unchecked(i) };
                encode_rule(rule, &a, enc)
            } else {
                let d = self.defaults[i].as_ref().expect("positions past `required` have defaults");
                encode_rule(rule, d.bind(py), enc)
            };
            if let Err(e) = r {
                return Err(e.into_pyerr(py, &self.names[i]));
            }
        }
        Ok(())
    }

    /// Parameter names, in order (for bindings that map keyword arguments).
    pub(crate) fn param_names(&self) -> &[String] {
        &self.names
    }

    /// Fills every empty (null) slot from `from` on with its parameter's default (borrowed: the
    /// signature keeps it alive); `Err` names the first required parameter left without a value.
    pub(crate) fn fill_defaults(
        &self,
        slots: &mut [*mut pyo3::ffi::PyObject],
        from: usize,
    ) -> Result<(), String> {
        for (i, slot) in slots.iter_mut().enumerate().skip(from) {
            if slot.is_null() {
                match &self.defaults[i] {
                    Some(d) => *slot = d.as_ptr(),
                    None => return Err(format!("missing a required argument: '{}'", self.names[i])),
                }
            }
        }
        Ok(())
    }

    /// Writes the signature's header (plan description + `extra`).
    #[inline]
    pub(crate) fn encode_header(&self, enc: &mut Encoder) {
        enc.raw(&self.header);
    }

    /// Writes every parameter's part of the key, as `encode_param` would, except that an exact
    /// `torch.Tensor` read directly, under a rule that keys only its dtype and alignment, is written
    /// as a 4-byte process-local leaf (`tag::TENSOR_IN_PROCESS`, dtype index, aligned). For keys
    /// that never leave the process: equal buckets still give equal bytes (the same tensor always
    /// takes the same path), and the leaf's tag differs from every other leaf's, so distinct
    /// buckets never collide. `params[i]` are live objects; an error names the parameter. The data
    /// pointers of the tensors so keyed that are on `ptrs`' CUDA device are noted in `ptrs`, unless
    /// another parameter's keying may run Python code (then `ptrs` forgets them all).
    pub(crate) fn encode_params_in_process(
        &self,
        py: Python<'_>,
        params: &[*mut ffi::PyObject],
        enc: &mut Encoder,
        mut ptrs: Option<&mut CudaPointers>,
    ) -> PyResult<()> {
        let tensor_type = crate::torch::tensor_type();
        let layout = crate::torch::layout();
        for (i, (&p, &fast)) in params.iter().zip(&self.dtype_align_only).enumerate() {
            if let (Some(align), Some(l)) = (fast, layout) {
                if let Some((f, data)) = crate::torch::encode_in_process(p, align, tensor_type, l, enc) {
                    if let Some(ptrs) = ptrs.as_deref_mut() {
                        ptrs.note(i, &f, data);
                    }
                    continue;
                }
            }
            if let Some(ptrs) = ptrs.as_deref_mut() {
                // Keying anything but a scalar may run Python code (an attribute, an adapter, a GC pass
                // on an allocation), which could move the storage of a tensor noted before.
                if !crate::cpython::is_plain_scalar(p) {
                    ptrs.forget();
                }
            }
            // SAFETY: p is a live object (the caller's contract), borrowed for this call only.
            self.encode_param(i, &*unsafe { Borrowed::from_ptr(py, p) }, enc)?;
        }
        Ok(())
    }

    /// Writes parameter `i`'s part of the key (the caller writes the header and every parameter
    /// in order); an unkeyable value gives `ArgumentError` naming the parameter.
    #[inline]
    pub(crate) fn encode_param(&self, i: usize, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> PyResult<()> {
        encode_rule(&self.rules[i], obj, enc).map_err(|e| e.into_pyerr(obj.py(), &self.names[i]))
    }

    #[cold]
    fn count_error(&self, n: usize) -> PyErr {
        let total = self.rules.len();
        let expect =
            if self.required == total { format!("{total}") } else { format!("{} to {total}", self.required) };
        let missing =
            if n < self.required { format!("; missing '{}'", self.names[n]) } else { String::new() };
        ArgumentError::new_err(format!("signature takes {expect} arguments, got {n}{missing}"))
    }

    fn decode(&self, bytes: &[u8]) -> PyResult<(Value, Vec<Vec<core_sig::Component>>)> {
        core_sig::decode(&self.rules, self.header.len(), bytes)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::None => py.None().into_bound(py),
        Value::Bool(b) => pyo3::types::PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::BigInt(b) => {
            let kwargs = pyo3::types::PyDict::new(py);
            kwargs.set_item("signed", true)?;
            py.get_type::<pyo3::types::PyInt>().call_method(
                "from_bytes",
                (PyBytes::new(py, b), "little"),
                Some(&kwargs),
            )?
        }
        Value::Float(f) => f.into_pyobject(py)?.into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        Value::Tuple(items) => {
            let v = items.iter().map(|x| value_to_py(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, v)?.into_any()
        }
        Value::Dtype(d) | Value::Layout(d) | Value::MemoryFormat(d) => PyString::new(py, d).into_any(),
        Value::Device(t, i) => match i {
            Some(i) => PyString::new(py, &format!("{t}:{i}")).into_any(),
            None => PyString::new(py, t).into_any(),
        },
        Value::Object(module, qualname, inner) => {
            let ty = PyTuple::new(py, [PyString::new(py, module), PyString::new(py, qualname)])?;
            PyTuple::new(py, [ty.into_any(), value_to_py(py, inner)?])?.into_any()
        }
    })
}

fn render(v: &Value) -> String {
    match v {
        Value::None => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::Int(i) => i.to_string(),
        Value::BigInt(b) => {
            let be: String = b.iter().rev().map(|x| format!("{x:02x}")).collect();
            format!("int.from_bytes(bytes.fromhex('{be}'), 'big', signed=True)")
        }
        Value::Float(f) => format!("{f:?}"),
        Value::Str(s) => format!("{s:?}"),
        Value::Bytes(b) => format!("<{} bytes>", b.len()),
        Value::Tuple(items) => {
            let inner: Vec<String> = items.iter().map(render).collect();
            if items.len() == 1 {
                format!("({},)", inner[0])
            } else {
                format!("({})", inner.join(", "))
            }
        }
        Value::Dtype(d) => d.clone(),
        Value::Layout(n) | Value::MemoryFormat(n) => format!("torch.{n}"),
        Value::Device(t, Some(i)) => format!("{t}:{i}"),
        Value::Device(t, None) => t.clone(),
        Value::Object(module, qualname, inner) => format!("{module}:{qualname}({})", render(inner)),
    }
}

#[pymethods]
impl Signature {
    #[new]
    #[pyo3(signature = (params, *, extra = None))]
    fn new(py: Python<'_>, params: &Bound<'_, PyAny>, extra: Option<Bound<'_, PyAny>>) -> PyResult<Self> {
        let extra = extra.unwrap_or_else(|| PyTuple::empty(py).into_any());
        let seq = params.cast::<PySequence>().map_err(|_| {
            SignatureError::new_err("params must be a sequence of (name, rule[, default]) tuples")
        })?;
        let mut names = Vec::new();
        let mut rules = Vec::new();
        let mut defaults = Vec::new();
        let mut required = None;
        for (i, p) in seq.try_iter()?.enumerate() {
            let p = p?;
            let t = p.cast::<PyTuple>().map_err(|_| {
                SignatureError::new_err(format!(
                    "params[{i}] must be a (name, rule[, default]) tuple, got {p}"
                ))
            })?;
            if !(2..=3).contains(&t.len()) {
                return Err(SignatureError::new_err(format!(
                    "params[{i}] must be a (name, rule[, default]) tuple, got {} items",
                    t.len()
                )));
            }
            let name: String = t
                .get_item(0)?
                .extract()
                .map_err(|_| SignatureError::new_err(format!("params[{i}]: the name must be a str")))?;
            if names.contains(&name) {
                return Err(SignatureError::new_err(format!("duplicate parameter name '{name}'")));
            }
            let rule = compile_rule(&t.get_item(1)?, &name)?;
            if t.len() == 3 {
                required.get_or_insert(i);
                defaults.push(Some(t.get_item(2)?.unbind()));
            } else {
                if required.is_some() {
                    return Err(SignatureError::new_err(format!(
                        "parameter '{name}' without a default follows a parameter with a default"
                    )));
                }
                defaults.push(None);
            }
            names.push(name);
            rules.push(rule);
        }
        let required = required.unwrap_or(rules.len());
        let header = with_encoder(|enc| {
            encode_into(&extra, enc).map_err(|e| {
                let err = SignatureError::new_err("extra is not keyable");
                err.set_cause(py, Some(e.into_pyerr(py, "extra")));
                err
            })?;
            core_sig::header(&rules, enc.as_bytes()).map_err(|e| SignatureError::new_err(e.to_string()))
        })?;
        let dtype_align_only = rules.iter().map(dtype_align_only).collect();
        let sig = Self {
            names,
            rules,
            defaults,
            required,
            header: header.into_boxed_slice(),
            extra: extra.unbind(),
            dtype_align_only,
        };
        // Defaults must be keyable by their rules: check now rather than on the first short call.
        for (i, d) in sig.defaults.iter().enumerate() {
            if let Some(d) = d {
                let r = with_encoder(|enc| encode_rule(&sig.rules[i], d.bind(py), enc));
                if let Err(e) = r {
                    let err = SignatureError::new_err(format!(
                        "default of parameter '{}' is not keyable by its rule",
                        sig.names[i]
                    ));
                    err.set_cause(py, Some(e.into_pyerr(py, &sig.names[i])));
                    return Err(err);
                }
            }
        }
        Ok(sig)
    }

    /// Parameter names, in order.
    #[getter]
    fn names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.names)
    }

    /// The value folded into every key (``()`` when ``extra`` was omitted or ``None``).
    #[getter]
    fn extra<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        self.extra.bind(py).clone()
    }

    /// The bytes every key of this signature starts with.
    #[getter]
    fn header<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.header)
    }

    fn __len__(&self) -> usize {
        self.rules.len()
    }

    fn __repr__(&self) -> String {
        format!("Signature({})", self.names.join(", "))
    }

    /// Return the key of a call (positional arguments as a tuple).
    ///
    /// Raises:
    ///     jitkey.errors.ArgumentError: wrong argument count, or an argument its rule cannot key
    ///         (the message names the parameter, e.g. ``parameter 'n': expected an int``).
    #[pyo3(signature = (args, /))]
    fn encode<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyBytes>> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            Ok(PyBytes::new(args.py(), enc.as_bytes()))
        })
    }

    /// Return the 32-byte persistent key of a call: blake2b-256 over ``DIGEST_DOMAIN + encode(args)``.
    #[pyo3(signature = (args, /))]
    fn digest<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyBytes>> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            Ok(PyBytes::new(args.py(), &jitkey_core::key::digest(enc.as_bytes())))
        })
    }

    /// Return the in-memory 64-bit hash of a call's key (seeded per process).
    #[pyo3(signature = (args, /))]
    fn fast_hash(&self, args: &Bound<'_, PyTuple>) -> PyResult<u64> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            Ok(fast_hash_state().hash(enc.as_bytes()))
        })
    }

    /// The hot path: key the call and probe ``cache`` in one native call.
    ///
    /// Returns the cached value, or :data:`MISS`. Builds no Python object on a hit.
    /// Raises like :meth:`encode`.
    #[pyo3(signature = (cache, args, /))]
    fn lookup<'py>(
        &self,
        cache: &Bound<'py, PyLruCache>,
        args: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = args.py();
        let hit = with_encoder(|enc| {
            self.encode_args(args, enc)?;
            let b = enc.as_bytes();
            Ok::<_, PyErr>(cache.get().get_encoded(py, fast_hash_state().hash(b), b))
        })?;
        Ok(hit.unwrap_or_else(|| miss(py).bind(py).clone().into_any()))
    }

    /// Store ``value`` in ``cache`` under the call's key.
    #[pyo3(signature = (cache, args, value, /))]
    fn insert(
        &self,
        cache: &Bound<'_, PyLruCache>,
        args: &Bound<'_, PyTuple>,
        value: Py<PyAny>,
    ) -> PyResult<()> {
        with_encoder(|enc| {
            self.encode_args(args, enc)?;
            let b = enc.as_bytes();
            cache.get().insert_encoded(fast_hash_state().hash(b), b, value);
            Ok(())
        })
    }

    /// Return the cached value for the call, or call ``factory()``, store and return its result.
    ///
    /// The factory runs with no lock held; an exception from it propagates and stores nothing.
    /// Single-flight: concurrent misses on one call key run ``factory`` once and share its result
    /// (or its exception).
    #[pyo3(signature = (cache, args, factory, /))]
    fn get_or_insert<'py>(
        &self,
        cache: &Bound<'py, PyLruCache>,
        args: &Bound<'py, PyTuple>,
        factory: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = args.py();
        let (hash, key, hit) = with_encoder(|enc| {
            self.encode_args(args, enc)?;
            let b = enc.as_bytes();
            let h = fast_hash_state().hash(b);
            match cache.get().get_encoded(py, h, b) {
                Some(v) => Ok::<_, PyErr>((h, Vec::new(), Some(v))),
                None => Ok((h, b.to_vec(), None)),
            }
        })?;
        if let Some(v) = hit {
            return Ok(v);
        }
        cache.get().fill_miss(py, hash, &key, None, |_| factory.call0())
    }

    /// The key as a tuple: ``(extra, leaf_0, leaf_1, ...)``, one tuple of components per parameter.
    ///
    /// Holds the same information as :meth:`encode` (tensor dtypes and devices shown as strings).
    #[pyo3(signature = (args, /))]
    fn flatten<'py>(&self, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
        let py = args.py();
        let bytes = with_encoder(|enc| self.encode_args(args, enc).map(|()| enc.as_bytes().to_vec()))?;
        let (extra, params) = self.decode(&bytes)?;
        let mut out = vec![value_to_py(py, &extra)?];
        for comps in &params {
            let vals = comps.iter().map(|(_, v)| value_to_py(py, v)).collect::<PyResult<Vec<_>>>()?;
            out.push(PyTuple::new(py, vals)?.into_any());
        }
        PyTuple::new(py, out)
    }

    /// Name the parameters and buckets that make two calls key differently.
    ///
    /// E.g. ``["x.aligned: True != False", "n.equals_1: False != True"]``; ``[]`` when the keys are equal.
    #[pyo3(signature = (args_a, args_b, /))]
    fn explain(&self, args_a: &Bound<'_, PyTuple>, args_b: &Bound<'_, PyTuple>) -> PyResult<Vec<String>> {
        let a = with_encoder(|enc| self.encode_args(args_a, enc).map(|()| enc.as_bytes().to_vec()))?;
        let b = with_encoder(|enc| self.encode_args(args_b, enc).map(|()| enc.as_bytes().to_vec()))?;
        let (_, pa) = self.decode(&a)?;
        let (_, pb) = self.decode(&b)?;
        let mut out = Vec::new();
        for (i, (ca, cb)) in pa.iter().zip(&pb).enumerate() {
            if ca == cb {
                continue;
            }
            let name = &self.names[i];
            let names_a: Vec<&str> = ca.iter().map(|(n, _)| *n).collect();
            let names_b: Vec<&str> = cb.iter().map(|(n, _)| *n).collect();
            if names_a != names_b || ca.len() != cb.len() {
                out.push(format!(
                    "{name}: {} != {}",
                    render(&core_sig::components_value(ca)),
                    render(&core_sig::components_value(cb))
                ));
                continue;
            }
            for ((n, va), (_, vb)) in ca.iter().zip(cb) {
                if !va.same_key(vb) {
                    out.push(format!("{name}.{n}: {} != {}", render(va), render(vb)));
                }
            }
        }
        Ok(out)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Signature>()?;
    m.add_class::<Miss>()?;
    m.add("MISS", miss(m.py()).clone_ref(m.py()))?;
    Ok(())
}
