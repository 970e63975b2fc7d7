//! The per-call walk: each argument is read under its compiled [`Rule`] and its leaf written by
//! `jitkey_core::signature`'s writers. This module only reads Python objects (exact-type checks,
//! borrowed tuple items, tensor metadata through `crate::torch`); every byte layout lives in the
//! core, next to its decoder.

use std::ffi::c_int;
use std::ptr::addr_of_mut;

use jitkey_core::key::{EncodeError, Encoder, MAX_DEPTH};
use jitkey_core::signature::{
    self as core_sig, ByType, DeviceMode, Dims, IntMode, Rule, ShapeMode, StrideMode, TensorMeta, TensorRule,
};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::errors::ArgumentError;
use crate::keys::{encode_into, tuple_item};
use crate::torch::{self, device_of, dtype_name, is_tensor, type_name, Direct, TorchError};

// ---- failures ----------------------------------------------------------------------------------

/// Why an argument could not be keyed; turned into `ArgumentError` naming the parameter.
pub(crate) struct Fail {
    msg: String,
    cause: Option<PyErr>,
    /// Innermost first (tuple items).
    path: Vec<usize>,
}

impl Fail {
    #[cold]
    pub(super) fn msg(msg: String) -> Self {
        Self { msg, cause: None, path: Vec::new() }
    }
    #[cold]
    pub(super) fn py(err: PyErr) -> Self {
        Self { msg: String::new(), cause: Some(err), path: Vec::new() }
    }
    #[cold]
    fn wrong_type(obj: &Bound<'_, PyAny>, expected: &str) -> Self {
        Self::msg(format!("expected {expected}, got {}", type_name(obj)))
    }
    #[cold]
    fn at(mut self, i: usize) -> Self {
        self.path.push(i);
        self
    }
    #[cold]
    pub(super) fn into_pyerr(self, py: Python<'_>, param: &str) -> PyErr {
        // KeyboardInterrupt / SystemExit raised while reading an argument pass through unchanged.
        if let Some(c) =
            self.cause.as_ref().filter(|c| !c.is_instance_of::<pyo3::exceptions::PyException>(py))
        {
            return c.clone_ref(py);
        }
        let mut at = format!("'{param}'");
        for i in self.path.iter().rev() {
            at.push_str(&format!("[{i}]"));
        }
        let msg = match (&self.cause, self.msg.is_empty()) {
            (Some(c), true) => format!("parameter {at}: {}", c.value(py)),
            _ => format!("parameter {at}: {}", self.msg),
        };
        let err = ArgumentError::new_err(msg);
        if let Some(c) = self.cause {
            err.set_cause(py, Some(c));
        }
        err
    }
}

impl From<EncodeError> for Fail {
    #[cold]
    fn from(e: EncodeError) -> Self {
        Self::msg(e.to_string())
    }
}

impl From<TorchError> for Fail {
    #[cold]
    fn from(e: TorchError) -> Self {
        match e {
            TorchError::Msg(m) => Self::msg(m),
            TorchError::Py(e) => Self::py(e),
        }
    }
}

impl From<PyErr> for Fail {
    #[cold]
    fn from(e: PyErr) -> Self {
        Self::py(e)
    }
}

pub(super) type FResult = Result<(), Fail>;

// ---- ints --------------------------------------------------------------------------------------

/// Reads an exact-or-subclass int's value as i64 (no Python code runs for real ints). `None`: out
/// of range, or an error is set (the caller clears it).
#[inline]
fn long_i64(ptr: *mut ffi::PyObject) -> Option<i64> {
    let mut overflow: c_int = 0;
    // SAFETY: ptr is a live int (PyLong_Check passed); reading it runs no Python code.
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow) };
    // SAFETY: checking the thread's error indicator (the GIL is held).
    if overflow == 0 && !(v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() }) {
        Some(v)
    } else {
        None
    }
}

/// Any int's value as i128 when it fits in [-2**63, 2**64), else `None` (error state cleared).
fn long_i128(obj: &Bound<'_, PyAny>) -> Option<i128> {
    let ptr = obj.as_ptr();
    let mut overflow: c_int = 0;
    // SAFETY: ptr is a live int (PyLong_Check passed by the caller).
    let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(ptr, &mut overflow) };
    if overflow == 0 {
        // SAFETY: checking the thread's error indicator (the GIL is held).
        if v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() } {
            let _ = PyErr::take(obj.py());
            return None;
        }
        return Some(i128::from(v));
    }
    if overflow > 0 {
        // SAFETY: as above: a live int.
        let u = unsafe { ffi::PyLong_AsUnsignedLongLong(ptr) };
        // SAFETY: checking the thread's error indicator (the GIL is held).
        if u == u64::MAX && unsafe { !ffi::PyErr_Occurred().is_null() } {
            let _ = PyErr::take(obj.py());
            return None;
        }
        return Some(i128::from(u));
    }
    None
}

fn encode_int(mode: IntMode, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    if mode == IntMode::Type {
        enc.raw_u8(core_sig::tag::INT_TYPE);
        return Ok(());
    }
    match long_i64(obj.as_ptr()) {
        Some(v) => Ok(core_sig::write_int(enc, mode, i128::from(v))?),
        None => encode_wide_int(mode, obj, enc),
    }
}

/// An int outside i64 (or one whose read failed).
#[cold]
fn encode_wide_int(mode: IntMode, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    let _ = PyErr::take(obj.py());
    if mode == IntMode::Value {
        // Exact ints of any size go through the canonical walker; subclasses must fit i64.
        // SAFETY: obj is a live object.
        if unsafe { ffi::PyLong_CheckExact(obj.as_ptr()) } != 0 {
            return encode_keyable(obj, enc);
        }
        return Err(Fail::msg("int subclass value outside the i64 range".into()));
    }
    let v = long_i128(obj).ok_or_else(|| Fail::msg(core_sig::TRITON_RANGE_ERROR.into()))?;
    Ok(core_sig::write_int(enc, mode, v)?)
}

// ---- tensors -----------------------------------------------------------------------------------

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
    fn new(seq: Bound<'py, PyAny>, what: &'static str) -> Result<Self, Fail> {
        // SAFETY: seq is a live object.
        if unsafe { ffi::PyTuple_Check(seq.as_ptr()) } == 0 {
            return Err(Fail::msg(format!("tensor {what} is not a tuple ({})", type_name(&seq))));
        }
        // SAFETY: seq is a live tuple.
        let n = unsafe { ffi::PyTuple_Size(seq.as_ptr()) } as usize;
        Ok(Self { seq: Some(seq), n, what })
    }
}

impl TupleDims<'_> {
    /// Dim `i` of the tuple `seq` (`i` below its length).
    #[inline(always)]
    fn read(&self, seq: &Bound<'_, PyAny>, i: usize) -> Result<i64, Fail> {
        // SAFETY: i < n = len of a tuple we hold; the item is borrowed from it.
        let it = unsafe { ffi::PyTuple_GetItem(seq.as_ptr(), i as ffi::Py_ssize_t) };
        // SAFETY: it is a live object (a tuple's item).
        if unsafe { ffi::PyLong_Check(it) } == 0 {
            return Err(self.non_int());
        }
        match long_i64(it) {
            Some(v) => Ok(v),
            None => Err(self.out_of_range()),
        }
    }

    #[cold]
    fn non_int(&self) -> Fail {
        Fail::msg(format!("tensor {} holds a non-int (symbolic sizes are not keyable)", self.what))
    }

    #[cold]
    fn out_of_range(&self) -> Fail {
        Fail::msg(format!("tensor {} out of range", self.what))
    }
}

impl Dims for TupleDims<'_> {
    type Error = Fail;
    #[inline]
    fn len(&self) -> usize {
        self.n
    }
    #[inline]
    fn get(&self, i: usize) -> Result<i64, Fail> {
        self.read(self.seq.as_ref().expect("get only below len"), i)
    }
    /// One pass over the tuple, as the writer asks for every dim in order.
    #[inline(always)]
    fn for_each(&self, mut f: impl FnMut(i64)) -> Result<(), Fail> {
        if let Some(seq) = &self.seq {
            for i in 0..self.n {
                f(self.read(seq, i)?);
            }
        }
        Ok(())
    }
}

fn encode_tensor(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    match torch::direct(obj) {
        Some(f) => encode_tensor_direct(t, obj, &f, enc),
        None => encode_tensor_attrs(t, obj, enc),
    }
}

/// A plain tensor: its fields read straight from the `TensorImpl` (Python only for what the
/// layout does not cover: a non-plain storage's `data_ptr()`, `is_contiguous()`, a device type
/// not learnt yet).
#[inline]
fn encode_tensor_direct(t: &TensorRule, obj: &Bound<'_, PyAny>, f: &Direct, enc: &mut Encoder) -> FResult {
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
fn encode_tensor_attrs(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
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
) -> Result<(bool, (&'static str, i64), i64), Fail> {
    let contiguous = t.strides == StrideMode::Contiguous && is_contiguous(obj)?;
    let device = if t.device == DeviceMode::Ignore { ("", -1) } else { device_attr(obj)? };
    let numel = if t.numel_i64 { obj.call_method0(intern!(obj.py(), "numel"))?.extract()? } else { 0 };
    Ok((contiguous, device, numel))
}

/// `data_ptr()` through Python.
#[cold]
fn data_ptr_attr(obj: &Bound<'_, PyAny>) -> Result<u64, Fail> {
    let py = obj.py();
    let p = obj.call_method0(intern!(py, "data_ptr"))?;
    // SAFETY: p is a live object.
    if unsafe { ffi::PyLong_Check(p.as_ptr()) } == 0 {
        return Err(Fail::msg("data_ptr() did not return an int".into()));
    }
    // SAFETY: p is a live int; reading it runs no Python code.
    let v = unsafe { ffi::PyLong_AsUnsignedLongLong(p.as_ptr()) };
    if v == u64::MAX && PyErr::occurred(py) {
        return Err(Fail::py(PyErr::fetch(py)));
    }
    Ok(v)
}

fn is_contiguous(obj: &Bound<'_, PyAny>) -> Result<bool, Fail> {
    let c = obj.call_method0(intern!(obj.py(), "is_contiguous"))?;
    // SAFETY: Py_True is the static True singleton.
    Ok(c.as_ptr() == unsafe { ffi::Py_True() })
}

fn device_attr(obj: &Bound<'_, PyAny>) -> Result<(&'static str, i64), Fail> {
    Ok(device_of(&obj.getattr(intern!(obj.py(), "device"))?)?)
}

// ---- rules -------------------------------------------------------------------------------------

fn encode_keyable(obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    encode_into(obj, enc).map_err(|e| Fail::py(e.into_pyerr(obj.py(), "value")))
}

/// Writes `obj`'s leaf under `rule`.
pub(super) fn encode_rule(rule: &Rule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    let ptr = obj.as_ptr();
    // SAFETY: ptr is a live object; `Py_TYPE` reads its type pointer.
    let tp = unsafe { ffi::Py_TYPE(ptr) };
    let is_bool = std::ptr::eq(tp, addr_of_mut!(ffi::PyBool_Type));
    match rule {
        Rule::Tensor(t) => {
            if !is_tensor(tp) {
                return Err(Fail::wrong_type(obj, "a torch.Tensor"));
            }
            encode_tensor(t, obj, enc)
        }
        Rule::Int(mode) => {
            // SAFETY: ptr is a live object.
            if is_bool || unsafe { ffi::PyLong_Check(ptr) } == 0 {
                return Err(Fail::wrong_type(obj, "an int (bool is not accepted as an int)"));
            }
            encode_int(*mode, obj, enc)
        }
        Rule::Float { value } => {
            // SAFETY: ptr is a live object.
            if unsafe { ffi::PyFloat_Check(ptr) } == 0 {
                return Err(Fail::wrong_type(obj, "a float"));
            }
            encode_float(*value, ptr, enc);
            Ok(())
        }
        Rule::Bool { value } => {
            if !is_bool {
                return Err(Fail::wrong_type(obj, "a bool"));
            }
            encode_bool(*value, ptr, enc);
            Ok(())
        }
        Rule::NoneValue => {
            if !obj.is_none() {
                return Err(Fail::wrong_type(obj, "None"));
            }
            enc.none();
            Ok(())
        }
        Rule::Constexpr | Rule::Any => encode_keyable(obj, enc),
        Rule::Ignore => Ok(()),
        Rule::ByType(b) => encode_by_type(b, obj, enc, 0),
    }
}

/// `ptr` is a live float (or float subclass).
fn encode_float(value: bool, ptr: *mut ffi::PyObject, enc: &mut Encoder) {
    // SAFETY: PyFloat_Check passed; PyFloat_AsDouble reads the value of a float (subclass)
    // without running Python code.
    let v = if value { unsafe { ffi::PyFloat_AsDouble(ptr) } } else { 0.0 };
    core_sig::write_float(enc, value, v);
}

#[inline]
fn encode_bool(value: bool, ptr: *mut ffi::PyObject, enc: &mut Encoder) {
    // SAFETY: comparing against the static True singleton.
    core_sig::write_bool(enc, value, ptr == unsafe { ffi::Py_True() });
}

fn encode_by_type(b: &ByType, obj: &Bound<'_, PyAny>, enc: &mut Encoder, depth: usize) -> FResult {
    let ptr = obj.as_ptr();
    // SAFETY: ptr is a live object; `Py_TYPE` reads its type pointer.
    let tp = unsafe { ffi::Py_TYPE(ptr) };
    // The exact Tensor type first: the common case of a kernel argument, and one pointer compare
    // (PyFloat_Check would otherwise walk a tensor's MRO before it is reached).
    if let Some(t) = &b.tensor {
        if tp == torch::tensor_type() {
            return encode_tensor(t, obj, enc);
        }
    }
    // SAFETY: ptr is a live object of type tp; the checks read its type and the type's flags
    // (lazily, in the order of the chain: an int never pays for the float check's MRO walk), and
    // the builtin type objects and singletons are static.
    unsafe {
        if std::ptr::eq(tp, addr_of_mut!(ffi::PyBool_Type)) {
            if let Some(v) = b.bool_ {
                encode_bool(v, ptr, enc);
                return Ok(());
            }
        } else if ffi::PyLong_Check(ptr) != 0 {
            if let Some(m) = b.int {
                return encode_int(m, obj, enc);
            }
        } else if ffi::PyFloat_Check(ptr) != 0 {
            if let Some(v) = b.float {
                encode_float(v, ptr, enc);
                return Ok(());
            }
        } else if ptr == ffi::Py_None() {
            if b.none {
                enc.none();
                return Ok(());
            }
        } else if let Some(t) = &b.tensor {
            if is_tensor(tp) {
                return encode_tensor(t, obj, enc);
            }
        }
    }
    if b.tuples {
        let is_tuple = std::ptr::eq(tp, addr_of_mut!(ffi::PyTuple_Type));
        let is_list = std::ptr::eq(tp, addr_of_mut!(ffi::PyList_Type));
        if is_tuple || (b.lists && is_list) {
            if depth >= MAX_DEPTH {
                return Err(Fail::msg("arguments nested too deeply".into()));
            }
            // Lists are snapshotted into a tuple first (their length may change under us otherwise).
            let items: Bound<'_, PyTuple> = if is_tuple {
                obj.cast::<PyTuple>().expect("exact tuple").clone()
            } else {
                obj.cast::<PyList>().expect("exact list").to_tuple()
            };
            core_sig::write_sequence_header(enc, is_list, items.len())?;
            return encode_items(b, &items, enc, depth);
        }
        // SAFETY: ptr is a live object.
        if unsafe { ffi::PyTuple_Check(ptr) } != 0 {
            if let Some(fields) = namedtuple_fields(obj) {
                return encode_namedtuple(b, obj, &fields, enc, depth);
            }
        }
    }
    if b.objects && !b.any && !is_builtin_value(tp) {
        // Every leaf the canonical walker writes for a non-builtin object (an object header, a
        // dtype, a device) starts with a tag no other alternative above writes.
        return encode_keyable(obj, enc);
    }
    if b.any {
        // Every alternative above writes a leaf whose first tag differs from what the canonical
        // walker writes for the same type, and a type handled above never reaches this line.
        return encode_keyable(obj, enc);
    }
    Err(Fail::wrong_type(obj, &expected_types(b)))
}

/// Whether `tp` is a builtin value type (or a subclass of one) that the by-type alternatives
/// either handle or refuse; such objects never reach the `objects` alternative.
fn is_builtin_value(tp: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: tp is a live type object; the flag checks read its tp_flags, and PyFloat_Type is
    // a static type object.
    unsafe {
        let flags = ffi::Py_TPFLAGS_LONG_SUBCLASS
            | ffi::Py_TPFLAGS_TUPLE_SUBCLASS
            | ffi::Py_TPFLAGS_LIST_SUBCLASS
            | ffi::Py_TPFLAGS_BYTES_SUBCLASS
            | ffi::Py_TPFLAGS_UNICODE_SUBCLASS
            | ffi::Py_TPFLAGS_DICT_SUBCLASS;
        ffi::PyType_GetFlags(tp) & flags != 0
            || ffi::PyType_IsSubtype(tp, addr_of_mut!(ffi::PyFloat_Type)) != 0
    }
}

/// The field names of a tuple subclass: a named tuple's `_fields` (an exact tuple of exact strs),
/// or none for a plain tuple subclass such as `torch.Size` (Triton binds both like tuples).
/// `None`: some other `_fields`, not keyed.
fn namedtuple_fields<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyTuple>> {
    let py = obj.py();
    let Ok(fields) = obj.get_type().getattr(intern!(py, "_fields")) else {
        return Some(PyTuple::empty(py));
    };
    let fields = fields.cast_into_exact::<PyTuple>().ok()?;
    fields.iter().all(|f| f.is_exact_instance_of::<PyString>()).then_some(fields)
}

/// Item `i` of an exact tuple of exact strs, borrowed for as long as the tuple is.
fn str_item<'t>(tuple: &'t Bound<'_, PyTuple>, i: usize) -> Result<&'t str, Fail> {
    let mut size: ffi::Py_ssize_t = 0;
    // SAFETY: `tuple` is a live exact tuple and i < its length; its items are exact strs (checked
    // by `namedtuple_fields`), whose UTF-8 form is cached in the str and lives as long as it,
    // which the tuple keeps alive for 't.
    unsafe {
        let s = tuple_item(tuple.as_ptr(), i as ffi::Py_ssize_t);
        let data = ffi::PyUnicode_AsUTF8AndSize(s, &mut size);
        if data.is_null() {
            return Err(Fail::py(PyErr::fetch(tuple.py())));
        }
        let bytes = std::slice::from_raw_parts(data.cast::<u8>(), size as usize);
        Ok(std::str::from_utf8_unchecked(bytes))
    }
}

/// A tuple subclass (a named tuple, `torch.Size`): its type's qualified name and field names, then
/// the items as for a tuple. Triton keys it like a tuple of its items; the type and the field
/// names make this finer.
fn encode_namedtuple(
    b: &ByType,
    obj: &Bound<'_, PyAny>,
    fields: &Bound<'_, PyTuple>,
    enc: &mut Encoder,
    depth: usize,
) -> FResult {
    if depth >= MAX_DEPTH {
        return Err(Fail::msg("arguments nested too deeply".into()));
    }
    let name = obj.get_type().fully_qualified_name()?;
    let items = obj.cast::<PyTuple>().expect("a tuple subclass");
    let names = (0..fields.len()).map(|i| str_item(fields, i));
    core_sig::write_namedtuple_header(enc, name.to_str()?, names, items.len())?;
    encode_items(b, items, enc, depth)
}

/// A sequence's items under a by-type rule (after its header): each item with `b.items` (or `b`
/// itself).
fn encode_items(b: &ByType, items: &Bound<'_, PyTuple>, enc: &mut Encoder, depth: usize) -> FResult {
    let item_rule = b.items.as_deref().unwrap_or(b);
    for (i, it) in items.iter().enumerate() {
        encode_by_type(item_rule, &it, enc, depth + 1).map_err(|e| e.at(i))?;
    }
    Ok(())
}

#[cold]
fn expected_types(b: &ByType) -> String {
    let mut v = Vec::new();
    if b.tensor.is_some() {
        v.push("torch.Tensor");
    }
    if b.int.is_some() {
        v.push("int");
    }
    if b.float.is_some() {
        v.push("float");
    }
    if b.bool_.is_some() {
        v.push("bool");
    }
    if b.none {
        v.push("None");
    }
    if b.tuples {
        v.push(if b.lists { "tuple/list of these" } else { "tuple of these" });
    }
    if b.any {
        v.push("a keyable value");
    }
    if v.is_empty() {
        "nothing (the rule accepts no type)".into()
    } else {
        v.join(", ")
    }
}

/// The in-process short form of a plain tensor under a dtype(+alignment)-only rule, if `p` is
/// one: see `Signature::encode_params_in_process`. `p` is a live object.
#[inline(always)]
pub(super) fn encode_in_process(
    p: *mut ffi::PyObject,
    align: u32,
    tensor_type: *mut ffi::PyTypeObject,
    layout: &'static torch::Layout,
    enc: &mut Encoder,
) -> bool {
    // SAFETY: p is live (the caller's contract); `Py_TYPE` reads its type pointer.
    if unsafe { ffi::Py_TYPE(p) } != tensor_type {
        return false;
    }
    let Some(f) = torch::direct_with(layout, p) else { return false };
    let aligned = if align == 0 { Some(true) } else { f.data_ptr().map(|d| d & u64::from(align - 1) == 0) };
    match aligned {
        Some(a) => {
            core_sig::write_tensor_in_process(enc, f.idx, a);
            true
        }
        None => false,
    }
}
