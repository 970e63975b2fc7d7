//! Property: the encoding is injective — equal encodings if and only if equal key trees.

use jitkey_core::key::Value;
use proptest::prelude::*;

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![any::<i64>().prop_map(i128::from), any::<i128>(), -3i128..20].prop_map(Value::Int),
        prop_oneof![any::<f64>(), Just(f64::NAN), Just(-0.0), Just(0.0), Just(1.0)].prop_map(Value::Float),
        prop_oneof!["[a-c1]{0,3}", "\\PC{0,4}"].prop_map(Value::Str),
        proptest::collection::vec(any::<u8>(), 0..4).prop_map(Value::Bytes),
        prop_oneof![Just("float32"), Just("float16"), Just("int32")].prop_map(|s| Value::Dtype(s.into())),
        (prop_oneof![Just("cuda"), Just("cpu")], proptest::option::of(0i64..3))
            .prop_map(|(t, i)| Value::Device(t.into(), i)),
    ]
}

fn tree() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Tuple),
            // Dotted modules and qualnames that split one dotted name two ways ("m.a.B").
            (prop_oneof![Just("m"), Just("m.a")], prop_oneof![Just("B"), Just("a.B"), Just("A")], inner)
                .prop_map(|(m, q, v)| Value::Object(m.into(), q.into(), Box::new(v))),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn equal_encodings_iff_same_tree(a in tree(), b in tree()) {
        let (ea, eb) = (a.encode().unwrap(), b.encode().unwrap());
        prop_assert_eq!(ea == eb, a.same_key(&b), "{:?} vs {:?}", a, b);
    }

    #[test]
    fn encoding_is_deterministic_and_prefix_free(a in tree(), b in tree()) {
        let ea = a.encode().unwrap();
        prop_assert_eq!(&ea, &a.encode().unwrap());
        // Prefix-freeness: a tuple of two trees decodes unambiguously, so (a, b) == (c, d)
        // implies a == c; checked through injectivity of the pair.
        let pair = Value::Tuple(vec![a.clone(), b.clone()]).encode().unwrap();
        let swapped = Value::Tuple(vec![b.clone(), a.clone()]).encode().unwrap();
        prop_assert_eq!(pair == swapped, a.same_key(&b));
    }
}
