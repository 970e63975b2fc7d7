//! The committed test vectors (`tests/vectors/keys.json`) pin the key format: any accidental change
//! to the encoding or the digest fails here (and in pytest, which checks the same file).

use jitkey_core::key::{digest, Value, DIGEST_DOMAIN, FORMAT_VERSION};
use serde_json::Value as Json;

fn value_from(spec: &Json) -> Value {
    let t = spec["t"].as_str().expect("t");
    match t {
        "none" => Value::None,
        "bool" => Value::Bool(spec["v"].as_bool().expect("bool")),
        "int" => match spec.get("le") {
            Some(le) => Value::BigInt(hex::decode(le.as_str().unwrap()).unwrap()),
            None => Value::Int(spec["v"].as_str().unwrap().parse::<i128>().unwrap()),
        },
        "float" => {
            Value::Float(f64::from_bits(u64::from_str_radix(spec["bits"].as_str().unwrap(), 16).unwrap()))
        }
        "str" => Value::Str(spec["v"].as_str().unwrap().to_owned()),
        "bytes" => Value::Bytes(hex::decode(spec["hex"].as_str().unwrap()).unwrap()),
        "tuple" => Value::Tuple(spec["v"].as_array().unwrap().iter().map(value_from).collect()),
        "dtype" => Value::Dtype(spec["v"].as_str().unwrap().to_owned()),
        "device" => Value::Device(spec["type"].as_str().unwrap().to_owned(), spec["index"].as_i64()),
        "layout" => Value::Layout(spec["v"].as_str().unwrap().to_owned()),
        "memory_format" => Value::MemoryFormat(spec["v"].as_str().unwrap().to_owned()),
        "object" => Value::Object(
            spec["module"].as_str().unwrap().to_owned(),
            spec["qualname"].as_str().unwrap().to_owned(),
            Box::new(value_from(&spec["v"])),
        ),
        other => panic!("unknown vector type {other}"),
    }
}

#[test]
fn committed_vectors_match() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/keys.json");
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(doc["format_version"].as_u64(), Some(u64::from(FORMAT_VERSION)));
    assert_eq!(doc["domain"].as_str().unwrap(), hex::encode(DIGEST_DOMAIN));
    let vectors = doc["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 30);
    for v in vectors {
        let value = value_from(&v["value"]);
        let enc = value.encode().unwrap();
        assert_eq!(hex::encode(&enc), v["encoding"].as_str().unwrap(), "encoding of {value:?}");
        assert_eq!(hex::encode(digest(&enc)), v["digest"].as_str().unwrap(), "digest of {value:?}");
    }
}
