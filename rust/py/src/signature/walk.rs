//! The per-call walk: each argument is read under its compiled [`Rule`] and its leaf written by
//! `jitkey_core::signature`'s writers. This module only reads Python objects (exact-type checks,
//! ints, floats, sequences, named tuples); tensors are read by `crate::torch`, and every byte
//! layout lives in the core, next to its decoder.

use std::ptr::addr_of_mut;

use jitkey_core::key::{EncodeError, Encoder, MAX_DEPTH};
use jitkey_core::signature::{self as core_sig, ByType, IntMode, Rule, TensorRule};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString, PyTuple};

use crate::cpython::{int_i128, int_i64, tuple_item};
use crate::errors::ArgumentError;
use crate::keys::{encode_into, type_identity};
use crate::torch::{self, encode_tensor, is_tensor, type_name, TorchError};

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

fn encode_int(mode: IntMode, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    if mode == IntMode::Type {
        enc.raw_u8(core_sig::tag::INT_TYPE);
        return Ok(());
    }
    // SAFETY: obj is a live int (the caller's `PyLong_Check`).
    match unsafe { int_i64(obj.as_ptr()) } {
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
    // SAFETY: `obj` is an int (the caller's `PyLong_Check`).
    let v =
        unsafe { int_i128(obj.as_ptr()) }.ok_or_else(|| Fail::msg(core_sig::TRITON_RANGE_ERROR.into()))?;
    Ok(core_sig::write_int(enc, mode, v)?)
}

// ---- rules -------------------------------------------------------------------------------------

fn encode_keyable(obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    encode_into(obj, enc).map_err(|e| Fail::py(e.into_pyerr(obj.py(), "value")))
}

/// A tensor's leaf (read by `crate::torch`). Out of line, so the by-type walk tail-calls it and
/// its frame holds no error conversion.
#[inline(never)]
fn tensor_leaf(t: &TensorRule, obj: &Bound<'_, PyAny>, enc: &mut Encoder) -> FResult {
    // SAFETY: obj is live; `Py_TYPE` reads its type pointer.
    torch::note_tensor_type(unsafe { ffi::Py_TYPE(obj.as_ptr()) });
    Ok(encode_tensor(t, obj, enc)?)
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
            tensor_leaf(t, obj, enc)
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
            return tensor_leaf(t, obj, enc);
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
                return tensor_leaf(t, obj, enc);
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

/// A tuple subclass (a named tuple, `torch.Size`): its type's module and qualname (named exactly as
/// `jitkey.encode` names a type, `crate::keys::type_identity`) and field names, then the items as for
/// a tuple. Triton keys it like a tuple of its items; the type and the field
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
    let (module, qualname) =
        type_identity(&obj.get_type()).map_err(|e| Fail::py(e.into_pyerr(obj.py(), "value")))?;
    let items = obj.cast::<PyTuple>().expect("a tuple subclass");
    let names = (0..fields.len()).map(|i| str_item(fields, i));
    core_sig::write_namedtuple_header(enc, &module, &qualname, names, items.len())?;
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
