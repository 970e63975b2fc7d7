//! Property: the signature leaf writers and the decoder agree, and the leaves are injective.
//!
//! Random rules and random argument metadata (tensors, ints, floats, bools, None, tuples, lists and
//! named tuples under by-type rules) are written with `jitkey_core::signature`'s writers, as the
//! binding writes them; the key must decode to exactly the components the metadata predicts
//! (an independent statement of the leaf layout), and two calls must give equal bytes exactly
//! when every keyed component is equal.

use jitkey_core::key::{Encoder, Value};
use jitkey_core::signature::{
    components_value, decode, header, write_bool, write_float, write_int, write_namedtuple_header,
    write_sequence_header, write_tensor, ByType, Component, DeviceMode, IntMode, Rule, ShapeMode, StrideMode,
    TensorMeta, TensorRule,
};
use proptest::collection::vec;
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Tensor {
    dtype: &'static str,
    data_ptr: u64,
    shape: Vec<i64>,
    strides: Vec<i64>,
    contiguous: bool,
    device: (&'static str, i64),
    numel: i64,
}

#[derive(Debug, Clone)]
enum Arg {
    Tensor(Tensor),
    Int(i128),
    Float(f64),
    Bool(bool),
    None,
    Seq { list: bool, items: Vec<Arg> },
    Named { ty: (&'static str, &'static str), fields: Vec<&'static str>, items: Vec<Arg> },
}

// ---- strategies --------------------------------------------------------------------------------

fn tensor_rule() -> impl Strategy<Value = TensorRule> {
    let align = prop_oneof![Just(0u32), Just(1), Just(16), Just(64)];
    (any::<bool>(), align, 0..3usize, 0..3usize, 0..3usize, any::<bool>()).prop_map(
        |(dtype, align, s, st, d, numel_i64)| TensorRule {
            dtype,
            align,
            shape: [ShapeMode::Ignore, ShapeMode::Exact, ShapeMode::Bucket][s],
            strides: [StrideMode::Ignore, StrideMode::Exact, StrideMode::Contiguous][st],
            device: [DeviceMode::Ignore, DeviceMode::Type, DeviceMode::TypeIndex][d],
            numel_i64,
        },
    )
}

fn int_mode() -> impl Strategy<Value = IntMode> {
    prop_oneof![
        Just(IntMode::Value),
        Just(IntMode::Type),
        (any::<bool>(), any::<bool>()).prop_map(|(specialize, align)| IntMode::Triton { specialize, align }),
    ]
}

fn by_type_base() -> impl Strategy<Value = ByType> {
    (
        proptest::option::of(tensor_rule()),
        proptest::option::of(int_mode()),
        proptest::option::of(any::<bool>()),
        proptest::option::of(any::<bool>()),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(tensor, int, float, bool_, none, tuples, lists)| {
            // At least one scalar alternative, so every rule has arguments.
            let none = none || (tensor.is_none() && int.is_none() && float.is_none() && bool_.is_none());
            ByType {
                tensor,
                int,
                float,
                bool_,
                none,
                tuples,
                lists: lists && tuples,
                any: false,
                objects: false,
                items: None,
            }
        })
}

fn by_type() -> impl Strategy<Value = ByType> {
    (by_type_base(), proptest::option::of(by_type_base()))
        .prop_map(|(b, items)| ByType { items: items.map(Box::new), ..b })
}

fn rule() -> impl Strategy<Value = Rule> {
    prop_oneof![
        tensor_rule().prop_map(Rule::Tensor),
        int_mode().prop_map(Rule::Int),
        any::<bool>().prop_map(|value| Rule::Float { value }),
        any::<bool>().prop_map(|value| Rule::Bool { value }),
        Just(Rule::NoneValue),
        Just(Rule::Ignore),
        by_type().prop_map(|b| Rule::ByType(Box::new(b))),
    ]
}

/// Small domains, so that two random calls are often equal in some or all keyed fields.
fn tensor() -> impl Strategy<Value = Tensor> {
    let dims = vec((prop_oneof![0i64..4, Just(1 << 40)], prop_oneof![0i64..3, Just(-1)]), 0..4);
    (
        prop_oneof![Just("float16"), Just("float32"), Just("int8")],
        prop_oneof![Just(0u64), Just(16), Just(17), Just(64), Just(1 << 40)],
        dims,
        any::<bool>(),
        (prop_oneof![Just("cuda"), Just("cpu"), Just("meta")], -1i64..2),
        prop_oneof![Just(0i64), Just(i64::from(i32::MAX)), Just(i64::from(i32::MAX) + 1)],
    )
        .prop_map(|(dtype, data_ptr, dims, contiguous, device, numel)| Tensor {
            dtype,
            data_ptr,
            shape: dims.iter().map(|d| d.0).collect(),
            strides: dims.iter().map(|d| d.1).collect(),
            contiguous,
            device,
            numel,
        })
}

fn int_for(mode: IntMode) -> BoxedStrategy<i128> {
    let small = prop_oneof![Just(0i128), Just(1), Just(16), Just(-16), Just(1 << 31), Just(-(1 << 31) - 1)];
    match mode {
        IntMode::Triton { .. } => prop_oneof![small, -(1i128 << 63)..(1i128 << 64)].boxed(),
        _ => prop_oneof![small, any::<i64>().prop_map(i128::from), any::<i128>()].boxed(),
    }
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), Just(-0.0), Just(1.0), Just(f64::NAN), any::<f64>()]
}

fn arg_by_type(b: &ByType, depth: u32) -> BoxedStrategy<Arg> {
    let mut alts: Vec<BoxedStrategy<Arg>> = Vec::new();
    if b.tensor.is_some() {
        alts.push(tensor().prop_map(Arg::Tensor).boxed());
    }
    if let Some(m) = b.int {
        alts.push(int_for(m).prop_map(Arg::Int).boxed());
    }
    if b.float.is_some() {
        alts.push(float().prop_map(Arg::Float).boxed());
    }
    if b.bool_.is_some() {
        alts.push(any::<bool>().prop_map(Arg::Bool).boxed());
    }
    if b.none {
        alts.push(Just(Arg::None).boxed());
    }
    if b.tuples && depth < 2 {
        let items = vec(arg_by_type(b.items.as_deref().unwrap_or(b), depth + 1), 0..3);
        alts.push(items.clone().prop_map(|items| Arg::Seq { list: false, items }).boxed());
        if b.lists {
            alts.push(items.clone().prop_map(|items| Arg::Seq { list: true, items }).boxed());
        }
        // (module, qualname): one dotted name split two ways must key apart.
        let ty = prop_oneof![Just(("m", "a.B")), Just(("m.a", "B")), Just(("torch", "Size"))];
        let fields = vec(prop_oneof![Just("x"), Just("y")], 0..3);
        alts.push(
            (ty, fields, items).prop_map(|(ty, fields, items)| Arg::Named { ty, fields, items }).boxed(),
        );
    }
    proptest::strategy::Union::new(alts).boxed()
}

fn arg_for(rule: &Rule) -> BoxedStrategy<Arg> {
    match rule {
        Rule::Tensor(_) => tensor().prop_map(Arg::Tensor).boxed(),
        Rule::Int(m) => int_for(*m).prop_map(Arg::Int).boxed(),
        Rule::Float { .. } => float().prop_map(Arg::Float).boxed(),
        Rule::Bool { .. } => any::<bool>().prop_map(Arg::Bool).boxed(),
        Rule::ByType(b) => arg_by_type(b, 0),
        _ => Just(Arg::None).boxed(),
    }
}

fn args_for(rules: &[Rule]) -> BoxedStrategy<Vec<Arg>> {
    rules.iter().map(arg_for).collect::<Vec<_>>().boxed()
}

/// Rules, and two calls under them.
fn case() -> impl Strategy<Value = (Vec<Rule>, Vec<Arg>, Vec<Arg>)> {
    vec(rule(), 1..4).prop_flat_map(|rules| {
        let a = args_for(&rules);
        let b = args_for(&rules);
        (Just(rules), a, b)
    })
}

// ---- writing, as the binding writes -------------------------------------------------------------

fn write_tensor_arg(enc: &mut Encoder, t: &TensorRule, a: &Tensor) {
    let meta = TensorMeta {
        dtype: a.dtype,
        data_ptr: a.data_ptr,
        shape: a.shape.as_slice(),
        strides: a.strides.as_slice(),
        contiguous: a.contiguous,
        device: a.device,
        numel: a.numel,
    };
    write_tensor(enc, t, &meta).unwrap();
}

fn write_by_type(enc: &mut Encoder, b: &ByType, arg: &Arg) {
    match arg {
        Arg::Tensor(a) => write_tensor_arg(enc, b.tensor.as_ref().unwrap(), a),
        Arg::Int(v) => write_int(enc, b.int.unwrap(), *v).unwrap(),
        Arg::Float(v) => write_float(enc, b.float.unwrap(), *v),
        Arg::Bool(v) => write_bool(enc, b.bool_.unwrap(), *v),
        Arg::None => enc.none(),
        Arg::Seq { list, items } => {
            write_sequence_header(enc, *list, items.len()).unwrap();
            for it in items {
                write_by_type(enc, b.items.as_deref().unwrap_or(b), it);
            }
        }
        Arg::Named { ty, fields, items } => {
            let names = fields.iter().map(|f| Ok::<_, jitkey_core::key::EncodeError>(*f));
            write_namedtuple_header(enc, ty.0, ty.1, names, items.len()).unwrap();
            for it in items {
                write_by_type(enc, b.items.as_deref().unwrap_or(b), it);
            }
        }
    }
}

fn write(enc: &mut Encoder, rule: &Rule, arg: &Arg) {
    match (rule, arg) {
        (Rule::Tensor(t), Arg::Tensor(a)) => write_tensor_arg(enc, t, a),
        (Rule::Int(m), Arg::Int(v)) => write_int(enc, *m, *v).unwrap(),
        (Rule::Float { value }, Arg::Float(v)) => write_float(enc, *value, *v),
        (Rule::Bool { value }, Arg::Bool(v)) => write_bool(enc, *value, *v),
        (Rule::NoneValue, Arg::None) => enc.none(),
        (Rule::Ignore, _) => {}
        (Rule::ByType(b), a) => write_by_type(enc, b, a),
        _ => unreachable!("arguments are generated for their rule"),
    }
}

fn key(rules: &[Rule], args: &[Arg]) -> (usize, Vec<u8>) {
    let mut extra = Encoder::new();
    extra.str("kernel").unwrap();
    let h = header(rules, extra.as_bytes()).unwrap();
    let mut enc = Encoder::new();
    enc.raw(&h);
    for (r, a) in rules.iter().zip(args) {
        write(&mut enc, r, a);
    }
    (h.len(), enc.into_vec())
}

// ---- the components each leaf must decode to (the layout, stated independently) ---------------

fn kind(k: &str) -> Component {
    ("kind", Value::Str(k.into()))
}

fn ints(v: impl Iterator<Item = i64>) -> Value {
    Value::Tuple(v.map(|x| Value::Int(x.into())).collect())
}

fn tensor_components(t: &TensorRule, a: &Tensor) -> Vec<Component> {
    let mut c = vec![kind("tensor")];
    if t.dtype {
        c.push(("dtype", Value::Dtype(a.dtype.into())));
    }
    if t.align != 0 {
        c.push(("aligned", Value::Bool(a.data_ptr % u64::from(t.align) == 0)));
    }
    match t.shape {
        ShapeMode::Ignore => {}
        ShapeMode::Exact => c.push(("shape", ints(a.shape.iter().copied()))),
        ShapeMode::Bucket => c.push(("shape_buckets", ints(a.shape.iter().map(|&d| d.clamp(0, 2))))),
    }
    match t.strides {
        StrideMode::Ignore => {}
        StrideMode::Exact => c.push(("strides", ints(a.strides.iter().copied()))),
        StrideMode::Contiguous => c.push(("contiguous", Value::Bool(a.contiguous))),
    }
    let (ty, idx) = a.device;
    match t.device {
        DeviceMode::Ignore => {}
        DeviceMode::Type => c.push(("device", Value::Device(ty.into(), None))),
        DeviceMode::TypeIndex => c.push(("device", Value::Device(ty.into(), (idx >= 0).then_some(idx)))),
    }
    if t.numel_i64 {
        c.push(("needs_int64", Value::Bool(a.numel > 2_147_483_647)));
    }
    c
}

fn int_components(m: IntMode, v: i128) -> Vec<Component> {
    match m {
        IntMode::Value => vec![("value", Value::Int(v))],
        IntMode::Type => vec![kind("int")],
        IntMode::Triton { specialize, align } => {
            let range = if (-(1i128 << 31)..(1i128 << 31)).contains(&v) {
                "i32"
            } else if i64::try_from(v).is_ok() {
                "i64"
            } else {
                "u64"
            };
            vec![
                kind("int"),
                ("range", Value::Str(range.into())),
                ("equals_1", Value::Bool(specialize && v == 1)),
                ("divisible_by_16", Value::Bool(specialize && align && v.rem_euclid(16) == 0)),
            ]
        }
    }
}

fn scalar_components(value: bool, k: &str, v: Value) -> Vec<Component> {
    if value {
        vec![("value", v)]
    } else {
        vec![kind(k)]
    }
}

fn by_type_components(b: &ByType, arg: &Arg) -> Vec<Component> {
    let items_of = |items: &[Arg]| -> Vec<Component> {
        let inner = b.items.as_deref().unwrap_or(b);
        let mut c = vec![("len", Value::Int(items.len() as i128))];
        for (i, it) in items.iter().enumerate() {
            let v = components_value(&by_type_components(inner, it));
            c.push(("item", Value::Tuple(vec![Value::Int(i as i128), v])));
        }
        c
    };
    match arg {
        Arg::Tensor(a) => tensor_components(b.tensor.as_ref().unwrap(), a),
        Arg::Int(v) => int_components(b.int.unwrap(), *v),
        Arg::Float(v) => scalar_components(b.float.unwrap(), "float", Value::Float(*v)),
        Arg::Bool(v) => scalar_components(b.bool_.unwrap(), "bool", Value::Bool(*v)),
        Arg::None => vec![("value", Value::None)],
        Arg::Seq { list, items } => {
            let mut c = vec![kind(if *list { "list" } else { "tuple" })];
            c.extend(items_of(items));
            c
        }
        Arg::Named { ty, fields, items } => {
            let names = Value::Tuple(fields.iter().map(|f| Value::Str((*f).into())).collect());
            let ty = Value::Tuple(vec![Value::Str(ty.0.into()), Value::Str(ty.1.into())]);
            let mut c = vec![kind("namedtuple"), ("type", Value::Tuple(vec![ty, names]))];
            c.extend(items_of(items));
            c
        }
    }
}

fn components(rule: &Rule, arg: &Arg) -> Vec<Component> {
    match (rule, arg) {
        (Rule::Tensor(t), Arg::Tensor(a)) => tensor_components(t, a),
        (Rule::Int(m), Arg::Int(v)) => int_components(*m, *v),
        (Rule::Float { value }, Arg::Float(v)) => scalar_components(*value, "float", Value::Float(*v)),
        (Rule::Bool { value }, Arg::Bool(v)) => scalar_components(*value, "bool", Value::Bool(*v)),
        (Rule::NoneValue, Arg::None) => vec![("value", Value::None)],
        (Rule::Ignore, _) => vec![],
        (Rule::ByType(b), a) => by_type_components(b, a),
        _ => unreachable!("arguments are generated for their rule"),
    }
}

fn expected(rules: &[Rule], args: &[Arg]) -> Value {
    Value::Tuple(rules.iter().zip(args).map(|(r, a)| components_value(&components(r, a))).collect())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn leaves_decode_to_their_metadata((rules, a, _b) in case()) {
        let (header_len, bytes) = key(&rules, &a);
        let (extra, params) = decode(&rules, header_len, &bytes).unwrap();
        prop_assert_eq!(extra, Value::Str("kernel".into()));
        let got = Value::Tuple(params.iter().map(|c| components_value(c)).collect());
        prop_assert!(got.same_key(&expected(&rules, &a)), "{:?}\n{:?}", got, expected(&rules, &a));
    }

    #[test]
    fn equal_bytes_iff_equal_keyed_metadata((rules, a, b) in case()) {
        let (_, ka) = key(&rules, &a);
        let (_, kb) = key(&rules, &b);
        prop_assert_eq!(ka == kb, expected(&rules, &a).same_key(&expected(&rules, &b)), "{:?} vs {:?}", a, b);
    }
}

#[test]
fn in_process_leaf_layout() {
    let mut e = Encoder::new();
    jitkey_core::signature::write_tensor_in_process(&mut e, 0x0102, true);
    assert_eq!(e.as_bytes(), [jitkey_core::signature::tag::TENSOR_IN_PROCESS, 0x02, 0x01, 1]);
}
