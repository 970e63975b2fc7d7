//! Rule compilation: a rule object's spec tuple (`__jitkey_rule__()`, see `jitkey.rules`) →
//! the `jitkey_core::signature::Rule` plan the walk follows. Runs once per signature, never per
//! call; every malformed spec is a `SignatureError` naming the parameter.

use jitkey_core::signature::{ByType, DeviceMode, IntMode, Rule, ShapeMode, StrideMode, TensorRule};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors::SignatureError;
use crate::torch::type_name;

pub(super) fn spec_err(param: &str, msg: impl std::fmt::Display) -> PyErr {
    SignatureError::new_err(format!("parameter '{param}': {msg}"))
}

fn item<'py>(spec: &Bound<'py, PyTuple>, i: usize, param: &str) -> PyResult<Bound<'py, PyAny>> {
    spec.get_item(i).map_err(|_| spec_err(param, format!("rule spec {spec} is too short")))
}

fn get_bool(spec: &Bound<'_, PyTuple>, i: usize, param: &str) -> PyResult<bool> {
    let v = item(spec, i, param)?;
    v.cast::<pyo3::types::PyBool>()
        .map(|b| b.is_true())
        .map_err(|_| spec_err(param, format!("rule spec item {i} must be a bool, got {v}")))
}

fn get_str(spec: &Bound<'_, PyTuple>, i: usize, param: &str) -> PyResult<String> {
    let v = item(spec, i, param)?;
    v.extract::<String>().map_err(|_| spec_err(param, format!("rule spec item {i} must be a str, got {v}")))
}

/// Item `i`, a str that names one of `choices`: its value. The error lists the names in
/// `choices`' order (`{what} must be a/b/c, got "d"`).
fn get_choice<T: Copy>(
    spec: &Bound<'_, PyTuple>,
    i: usize,
    param: &str,
    what: &str,
    choices: &[(&str, T)],
) -> PyResult<T> {
    let s = get_str(spec, i, param)?;
    choices.iter().find(|(name, _)| *name == s).map(|&(_, v)| v).ok_or_else(|| {
        let names: Vec<&str> = choices.iter().map(|&(name, _)| name).collect();
        spec_err(param, format!("{what} must be {}, got {s:?}", names.join("/")))
    })
}

// A tensor rule's shape, strides and device modes, by their names in the spec.
const SHAPE_MODES: &[(&str, ShapeMode)] =
    &[("exact", ShapeMode::Exact), ("bucket", ShapeMode::Bucket), ("ignore", ShapeMode::Ignore)];
const STRIDE_MODES: &[(&str, StrideMode)] =
    &[("exact", StrideMode::Exact), ("contiguous", StrideMode::Contiguous), ("ignore", StrideMode::Ignore)];
const DEVICE_MODES: &[(&str, DeviceMode)] =
    &[("type", DeviceMode::Type), ("type_index", DeviceMode::TypeIndex), ("ignore", DeviceMode::Ignore)];

fn parse_tensor(spec: &Bound<'_, PyTuple>, param: &str) -> PyResult<TensorRule> {
    // ("tensor", dtype: bool, align: int, shape: str, strides: str, device: str, numel_i64: bool)
    if spec.len() != 7 {
        return Err(spec_err(param, format!("tensor rule spec needs 7 items, got {spec}")));
    }
    let align: u32 = item(spec, 2, param)?
        .extract()
        .map_err(|_| spec_err(param, "tensor align must be an int in 0..=2**31"))?;
    if align != 0 && !align.is_power_of_two() {
        return Err(spec_err(param, format!("tensor align must be 0 or a power of two, got {align}")));
    }
    let shape = get_choice(spec, 3, param, "tensor shape", SHAPE_MODES)?;
    let strides = get_choice(spec, 4, param, "tensor strides", STRIDE_MODES)?;
    let device = get_choice(spec, 5, param, "tensor device", DEVICE_MODES)?;
    crate::torch::ensure_tensor_type(spec.py())?;
    Ok(TensorRule {
        dtype: get_bool(spec, 1, param)?,
        align,
        shape,
        strides,
        device,
        numel_i64: get_bool(spec, 6, param)?,
    })
}

fn parse_int(spec: &Bound<'_, PyTuple>, param: &str) -> PyResult<IntMode> {
    // ("int", mode: str, specialize: bool, align: bool)
    if spec.len() != 4 {
        return Err(spec_err(param, format!("int rule spec needs 4 items, got {spec}")));
    }
    Ok(match get_str(spec, 1, param)?.as_str() {
        "value" => IntMode::Value,
        "type" => IntMode::Type,
        "triton" => {
            IntMode::Triton { specialize: get_bool(spec, 2, param)?, align: get_bool(spec, 3, param)? }
        }
        other => return Err(spec_err(param, format!("int mode must be value/type/triton, got {other:?}"))),
    })
}

fn parse_spec(spec: &Bound<'_, PyAny>, param: &str) -> PyResult<Rule> {
    let spec = spec
        .cast::<PyTuple>()
        .map_err(|_| spec_err(param, format!("rule spec must be a tuple, got {spec}")))?;
    let kind = get_str(spec, 0, param)?;
    let fixed = |n: usize, r: Rule| -> PyResult<Rule> {
        if spec.len() == n {
            Ok(r)
        } else {
            Err(spec_err(param, format!("{kind} rule spec needs {n} items, got {spec}")))
        }
    };
    match kind.as_str() {
        "tensor" => Ok(Rule::Tensor(parse_tensor(spec, param)?)),
        "int" => Ok(Rule::Int(parse_int(spec, param)?)),
        "float" => {
            if spec.len() != 2 {
                return Err(spec_err(param, format!("float rule spec needs 2 items, got {spec}")));
            }
            Ok(Rule::Float { value: get_bool(spec, 1, param)? })
        }
        "bool" => {
            if spec.len() != 2 {
                return Err(spec_err(param, format!("bool rule spec needs 2 items, got {spec}")));
            }
            Ok(Rule::Bool { value: get_bool(spec, 1, param)? })
        }
        "none" => fixed(1, Rule::NoneValue),
        "constexpr" => fixed(1, Rule::Constexpr),
        "any" => fixed(1, Rule::Any),
        "ignore" => fixed(1, Rule::Ignore),
        "by_type" => {
            // ("by_type", tensor|None, int|None, float|None, bool|None, none, tuples, lists, any
            //  [, items: by_type spec|None [, objects]])
            if !(9..=11).contains(&spec.len()) {
                return Err(spec_err(param, format!("by_type rule spec needs 9 to 11 items, got {spec}")));
            }
            let opt = |i: usize| -> PyResult<Option<Bound<'_, PyTuple>>> {
                let v = item(spec, i, param)?;
                if v.is_none() {
                    return Ok(None);
                }
                v.cast_into::<PyTuple>()
                    .map(Some)
                    .map_err(|_| spec_err(param, format!("by_type item {i} must be a rule spec or None")))
            };
            let tensor = opt(1)?.map(|t| parse_tensor(&t, param)).transpose()?;
            let int = opt(2)?.map(|t| parse_int(&t, param)).transpose()?;
            let float = match opt(3)? {
                None => None,
                Some(t) => match parse_spec(t.as_any(), param)? {
                    Rule::Float { value } => Some(value),
                    _ => return Err(spec_err(param, "by_type float alternative must be a float rule")),
                },
            };
            let bool_ = match opt(4)? {
                None => None,
                Some(t) => match parse_spec(t.as_any(), param)? {
                    Rule::Bool { value } => Some(value),
                    _ => return Err(spec_err(param, "by_type bool alternative must be a bool rule")),
                },
            };
            let b = ByType {
                tensor,
                int,
                float,
                bool_,
                none: get_bool(spec, 5, param)?,
                tuples: get_bool(spec, 6, param)?,
                lists: get_bool(spec, 7, param)?,
                any: get_bool(spec, 8, param)?,
                objects: spec.len() == 11 && get_bool(spec, 10, param)?,
                items: match if spec.len() >= 10 { opt(9)? } else { None } {
                    None => None,
                    Some(t) => match parse_spec(t.as_any(), param)? {
                        Rule::ByType(inner) => Some(inner),
                        _ => return Err(spec_err(param, "by_type items must be a by_type rule")),
                    },
                },
            };
            if b.lists && !b.tuples {
                return Err(spec_err(param, "by_type: lists need tuples"));
            }
            Ok(Rule::ByType(Box::new(b)))
        }
        other => Err(spec_err(param, format!("unknown rule kind {other:?}"))),
    }
}

/// A rule object (from `jitkey.rules`) or a raw spec tuple → the compiled rule.
pub(super) fn compile_rule(rule: &Bound<'_, PyAny>, param: &str) -> PyResult<Rule> {
    let py = rule.py();
    if rule.is_instance_of::<PyTuple>() {
        return parse_spec(rule, param);
    }
    let method = rule.getattr(intern!(py, "__jitkey_rule__")).map_err(|_| {
        spec_err(param, format!("{} is not a jitkey rule (see jitkey.rules)", type_name(rule)))
    })?;
    parse_spec(&method.call0()?, param)
}

/// `Some(align)` when `rule` keys a tensor by dtype (+ `data_ptr() % align`, 0 = not keyed) and
/// nothing else, so the in-process short form may stand for its tensor leaf.
pub(super) fn dtype_align_only(rule: &Rule) -> Option<u32> {
    let t = match rule {
        Rule::Tensor(t) => Some(t),
        Rule::ByType(b) => b.tensor.as_ref(),
        _ => None,
    }?;
    let plain = t.dtype
        && t.shape == ShapeMode::Ignore
        && t.strides == StrideMode::Ignore
        && t.device == DeviceMode::Ignore
        && !t.numel_i64;
    plain.then_some(t.align)
}
