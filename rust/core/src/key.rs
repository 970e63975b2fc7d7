//! Canonical key encoding (format v2), its persistent digest and the in-memory fast hash.
//!
//! A key is a tree of leaves: `None`, `bool`, `int` (any size), `float` (bit-exact, one canonical
//! NaN), `str`, `bytes`, `tuple` (nested), the framework leaves `dtype` and `device`, and
//! `object` (a user type's `__jitkey__()` value, tagged with the type's module and qualified name).
//!
//! # Format v2
//!
//! Every leaf starts with a one-byte tag; payloads are fixed-width little-endian, and every
//! variable-length item carries a length prefix, so the encoding is prefix-free and therefore
//! injective: two trees encode equally if and only if they are the same tree (same types, same
//! values, same shape). `True`, `1`, `1.0`, `"1"`, `b"1"` and `(1,)` all encode differently.
//!
//! | tag | leaf | payload |
//! |---|---|---|
//! | `0x00` | None | – |
//! | `0x01` / `0x02` | False / True | – |
//! | `0x03` | int in i64 range | i64 LE (8 bytes) |
//! | `0x04` | int outside i64 | u32 LE n, then n bytes of minimal two's complement LE (n ≥ 9) |
//! | `0x05` | float | u64 LE of the IEEE-754 bits; every NaN is written as `0x7ff8000000000000`; `-0.0 ≠ 0.0` |
//! | `0x06` | str | u32 LE byte length, UTF-8 bytes |
//! | `0x07` | bytes | u32 LE length, bytes |
//! | `0x08` | tuple | u32 LE item count, then each item |
//! | `0x09` | dtype | u8 length, ASCII name without the `torch.` prefix (`float32`) |
//! | `0x0A` | device | u8 length, device type (`cuda`), then i64 LE index (−1 when none) |
//! | `0x0B` | object | u16 LE length + the type's `__module__` (UTF-8), u16 LE length + its `__qualname__`, then its `__jitkey__()` value |
//! | `0x0C` | layout | u8 length, ASCII name without the `torch.` prefix (`strided`) |
//! | `0x0D` | memory format | u8 length, ASCII name without the `torch.` prefix (`channels_last`) |
//!
//! Tags `0x10..=0x3F` are reserved for signature leaves (tensor metadata, Triton buckets); a
//! signature's encoding starts with its own header, so it never equals a plain value's encoding.
//!
//! The digest is blake2b with a 32-byte output (the parameter block's digest length, equal to
//! Python's `hashlib.blake2b(data, digest_size=32)`) over [`DIGEST_DOMAIN`] followed by the
//! encoding. Changing the format means a new domain string, so old persistent keys simply miss.
//! `tests/vectors/keys.json` pins the format: `cargo test` and pytest both fail when it drifts.
//!
//! # Versions
//!
//! * v1: an object's type was one field, `module.qualname` (`builtins` and, in `Signature`'s named
//!   tuples, `__main__` left out). Both parts may contain dots, so a class `K` in module `pkg.sub` and a
//!   class `sub.K` in module `pkg` shared a key.
//! * v2: module and qualname are two length-prefixed fields, always both written. The domain changed
//!   with it, so every v1 digest misses once (recomputed and stored under its v2 digest); no v1 key can
//!   equal a v2 key.
//! * v2 grew the `0x0C`/`0x0D` leaves (`torch.layout`, `torch.memory_format`) later: values that had
//!   no encoding before (keying them raised), so every earlier key keeps its encoding and digest.

use std::fmt;
use std::hash::BuildHasher;

/// Version of the canonical encoding. Bumped (with [`DIGEST_DOMAIN`]) on any format change.
pub const FORMAT_VERSION: u32 = 2;

/// Prefix hashed before every encoding in [`digest`]: separates jitkey's keys from any other
/// blake2b use and carries the format version.
pub const DIGEST_DOMAIN: &[u8] = b"jitkey/key/v2\0";

/// Deepest nesting of tuples and `__jitkey__` values accepted; deeper trees are rejected with
/// [`EncodeError::TooDeep`] instead of overflowing the stack.
pub const MAX_DEPTH: usize = 64;

/// Leaf tags of format v2.
pub mod tag {
    /// `None`.
    pub const NONE: u8 = 0x00;
    /// `False`.
    pub const FALSE: u8 = 0x01;
    /// `True`.
    pub const TRUE: u8 = 0x02;
    /// An int that fits in i64.
    pub const INT: u8 = 0x03;
    /// An int outside the i64 range.
    pub const BIGINT: u8 = 0x04;
    /// A float, by its bits.
    pub const FLOAT: u8 = 0x05;
    /// A str.
    pub const STR: u8 = 0x06;
    /// A bytes object.
    pub const BYTES: u8 = 0x07;
    /// A tuple.
    pub const TUPLE: u8 = 0x08;
    /// A `torch.dtype`.
    pub const DTYPE: u8 = 0x09;
    /// A `torch.device`.
    pub const DEVICE: u8 = 0x0A;
    /// A user object keyed through `__jitkey__()`.
    pub const OBJECT: u8 = 0x0B;
    /// A `torch.layout`.
    pub const LAYOUT: u8 = 0x0C;
    /// A `torch.memory_format`.
    pub const MEMORY_FORMAT: u8 = 0x0D;
    /// First tag reserved for signature leaves.
    pub const SIGNATURE_FIRST: u8 = 0x10;
    /// Last tag reserved for signature leaves.
    pub const SIGNATURE_LAST: u8 = 0x3F;
}

/// The canonical NaN written for every NaN payload.
pub const CANONICAL_NAN_BITS: u64 = 0x7ff8_0000_0000_0000;

/// Why a value could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// A str, bytes or tuple longer than its u32 length prefix can say.
    TooLong {
        /// What was too long (`"str"`, `"bytes"`, `"tuple"`).
        what: &'static str,
        /// Its length.
        len: usize,
    },
    /// Nesting deeper than [`MAX_DEPTH`].
    TooDeep {
        /// The limit that was exceeded.
        limit: usize,
    },
    /// A dtype or device name that is not short ASCII, or a type's module or qualname that is empty
    /// or over 65535 bytes.
    BadName {
        /// What kind of name.
        what: &'static str,
        /// The name as given.
        name: String,
    },
    /// A big-int payload that is empty or fits in i64 (whose one encoding is the i64 form).
    BadBigInt,
    /// Metadata a signature leaf cannot hold (more than 255 tensor dims, strides of another rank
    /// than the shape, an int outside the range Triton specializes); the text says which.
    BadLeaf(&'static str),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLong { what, len } => {
                write!(f, "{what} of length {len} is longer than a key can hold (2**32 - 1)")
            }
            EncodeError::TooDeep { limit } => {
                write!(f, "key is nested deeper than the limit of {limit} levels")
            }
            EncodeError::BadName { what, name } => write!(f, "invalid {what} name {name:?}"),
            EncodeError::BadBigInt => f.write_str("big int payload is empty or fits in i64"),
            EncodeError::BadLeaf(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Writes the canonical encoding into a reusable buffer.
///
/// ```
/// use jitkey_core::Encoder;
/// let mut e = Encoder::new();
/// e.tuple_header(2).unwrap();
/// e.int(1);
/// e.str("a").unwrap();
/// assert_eq!(e.as_bytes(), b"\x08\x02\x00\x00\x00\x03\x01\0\0\0\0\0\0\0\x06\x01\0\0\0a");
/// ```
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    buf: Vec<u8>,
}

#[inline]
fn len_u32(what: &'static str, len: usize) -> Result<u32, EncodeError> {
    u32::try_from(len).map_err(|_| EncodeError::TooLong { what, len })
}

impl Encoder {
    /// An empty encoder.
    #[must_use]
    pub fn new() -> Self {
        Self { buf: Vec::with_capacity(128) }
    }

    /// Wraps an existing buffer (cleared first), so callers can recycle allocations.
    #[must_use]
    pub fn from_vec(mut buf: Vec<u8>) -> Self {
        buf.clear();
        Self { buf }
    }

    /// Forgets everything written, keeping the allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// The bytes written so far.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Number of bytes written so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether nothing was written yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Cuts the buffer back to `len` bytes (to undo a partly written item after an error).
    pub fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    /// Gives the buffer back.
    #[must_use]
    pub fn into_vec(self) -> Vec<u8> {
        self.buf
    }

    /// Appends raw bytes. Only for callers that write their own reserved tags
    /// ([`tag::SIGNATURE_FIRST`]..=[`tag::SIGNATURE_LAST`]) followed by fixed-width payloads.
    #[inline]
    pub fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Appends one raw byte (see [`Encoder::raw`]).
    #[inline]
    pub fn raw_u8(&mut self, b: u8) {
        self.buf.push(b);
    }

    /// `None`.
    #[inline]
    pub fn none(&mut self) {
        self.buf.push(tag::NONE);
    }

    /// A bool.
    #[inline]
    pub fn bool(&mut self, v: bool) {
        self.buf.push(if v { tag::TRUE } else { tag::FALSE });
    }

    /// An int in the i64 range.
    #[inline]
    pub fn int(&mut self, v: i64) {
        let mut b = [0u8; 9];
        b[0] = tag::INT;
        b[1..].copy_from_slice(&v.to_le_bytes());
        self.buf.extend_from_slice(&b);
    }

    /// An int outside the i64 range, as two's-complement little-endian bytes (for example
    /// Python's `n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)`). Redundant
    /// sign-extension bytes are trimmed, so every value has exactly one encoding.
    ///
    /// # Errors
    /// [`EncodeError::BadBigInt`] if the value fits in i64 (that value's only encoding is
    /// [`Encoder::int`]) or no bytes are given.
    pub fn bigint_le(&mut self, twos_complement_le: &[u8]) -> Result<(), EncodeError> {
        let mut n = twos_complement_le.len();
        while n > 1 {
            let top = twos_complement_le[n - 1];
            let below_sign = twos_complement_le[n - 2] & 0x80;
            if (top == 0x00 && below_sign == 0) || (top == 0xff && below_sign != 0) {
                n -= 1;
            } else {
                break;
            }
        }
        if n <= 8 {
            return Err(EncodeError::BadBigInt);
        }
        let bytes = &twos_complement_le[..n];
        let len = len_u32("int", n)?;
        self.buf.push(tag::BIGINT);
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// An int of any size given as i128 (picks the i64 or the big form).
    pub fn int128(&mut self, v: i128) {
        if let Ok(small) = i64::try_from(v) {
            self.int(small);
            return;
        }
        let bytes = v.to_le_bytes();
        self.bigint_le(&bytes).expect("i128 outside i64 is a valid big int");
    }

    /// A float, bit-exact, with every NaN folded into [`CANONICAL_NAN_BITS`].
    #[inline]
    pub fn float(&mut self, v: f64) {
        let bits = if v.is_nan() { CANONICAL_NAN_BITS } else { v.to_bits() };
        let mut b = [0u8; 9];
        b[0] = tag::FLOAT;
        b[1..].copy_from_slice(&bits.to_le_bytes());
        self.buf.extend_from_slice(&b);
    }

    /// A str (UTF-8).
    ///
    /// # Errors
    /// [`EncodeError::TooLong`] past 2**32 − 1 bytes.
    #[inline]
    pub fn str(&mut self, v: &str) -> Result<(), EncodeError> {
        self.prefixed(tag::STR, "str", v.as_bytes())
    }

    /// A bytes value.
    ///
    /// # Errors
    /// [`EncodeError::TooLong`] past 2**32 − 1 bytes.
    #[inline]
    pub fn bytes(&mut self, v: &[u8]) -> Result<(), EncodeError> {
        self.prefixed(tag::BYTES, "bytes", v)
    }

    #[inline]
    fn prefixed(&mut self, t: u8, what: &'static str, v: &[u8]) -> Result<(), EncodeError> {
        let len = len_u32(what, v.len())?;
        let l = len.to_le_bytes();
        self.buf.reserve(5 + v.len());
        self.buf.extend_from_slice(&[t, l[0], l[1], l[2], l[3]]);
        self.buf.extend_from_slice(v);
        Ok(())
    }

    /// Starts a tuple of `len` items; the caller then writes exactly `len` items.
    ///
    /// # Errors
    /// [`EncodeError::TooLong`] past 2**32 − 1 items.
    #[inline]
    pub fn tuple_header(&mut self, len: usize) -> Result<(), EncodeError> {
        let l = len_u32("tuple", len)?.to_le_bytes();
        self.buf.extend_from_slice(&[tag::TUPLE, l[0], l[1], l[2], l[3]]);
        Ok(())
    }

    /// A dtype by its short name (`float32`, not `torch.float32`).
    ///
    /// # Errors
    /// [`EncodeError::BadName`] unless the name is 1..=255 ASCII bytes.
    pub fn dtype(&mut self, name: &str) -> Result<(), EncodeError> {
        self.named(tag::DTYPE, "dtype", name)
    }

    /// A `torch.layout` by its short name (`strided`).
    ///
    /// # Errors
    /// [`EncodeError::BadName`] unless the name is 1..=255 ASCII bytes.
    pub fn layout(&mut self, name: &str) -> Result<(), EncodeError> {
        self.named(tag::LAYOUT, "layout", name)
    }

    /// A `torch.memory_format` by its short name (`channels_last`).
    ///
    /// # Errors
    /// [`EncodeError::BadName`] unless the name is 1..=255 ASCII bytes.
    pub fn memory_format(&mut self, name: &str) -> Result<(), EncodeError> {
        self.named(tag::MEMORY_FORMAT, "memory format", name)
    }

    /// A leaf `t` holding a short ASCII name (dtype, layout, memory format): u8 length, then the name.
    fn named(&mut self, t: u8, what: &'static str, name: &str) -> Result<(), EncodeError> {
        let len = short_name(what, name)?;
        self.buf.push(t);
        self.buf.push(len);
        self.buf.extend_from_slice(name.as_bytes());
        Ok(())
    }

    /// A device: its type (`cuda`, `cpu`, …) and index (`None` when the device has none).
    ///
    /// # Errors
    /// [`EncodeError::BadName`] unless the type is 1..=255 ASCII bytes.
    pub fn device(&mut self, device_type: &str, index: Option<i64>) -> Result<(), EncodeError> {
        let len = short_name("device", device_type)?;
        self.buf.push(tag::DEVICE);
        self.buf.push(len);
        self.buf.extend_from_slice(device_type.as_bytes());
        self.buf.extend_from_slice(&index.unwrap_or(-1).to_le_bytes());
        Ok(())
    }

    /// Starts a `__jitkey__` object whose type is `qualname` in `module` (each its own
    /// length-prefixed field, so no split of a dotted name is ambiguous); the caller then writes
    /// exactly one value, the object's key.
    ///
    /// # Errors
    /// [`EncodeError::BadName`] if either name is empty or longer than 65535 bytes.
    pub fn object_header(&mut self, module: &str, qualname: &str) -> Result<(), EncodeError> {
        let field = |what: &'static str, name: &str| {
            u16::try_from(name.len())
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| EncodeError::BadName { what, name: name.to_owned() })
        };
        let (m, q) = (field("type module", module)?, field("type qualname", qualname)?);
        self.buf.push(tag::OBJECT);
        self.buf.extend_from_slice(&m.to_le_bytes());
        self.buf.extend_from_slice(module.as_bytes());
        self.buf.extend_from_slice(&q.to_le_bytes());
        self.buf.extend_from_slice(qualname.as_bytes());
        Ok(())
    }

    /// The persistent digest of what was written so far (see [`digest`]).
    #[must_use]
    pub fn digest(&self) -> [u8; 32] {
        digest(&self.buf)
    }
}

fn short_name(what: &'static str, name: &str) -> Result<u8, EncodeError> {
    u8::try_from(name.len())
        .ok()
        .filter(|&n| n > 0 && name.is_ascii())
        .ok_or_else(|| EncodeError::BadName { what, name: name.to_owned() })
}

/// blake2b-256 of [`DIGEST_DOMAIN`] followed by `encoding`: the persistent, cross-process key.
///
/// Equal to Python's `hashlib.blake2b(DIGEST_DOMAIN + encoding, digest_size=32).digest()`.
#[must_use]
pub fn digest(encoding: &[u8]) -> [u8; 32] {
    let mut state = blake2b_simd::Params::new().hash_length(32).to_state();
    state.update(DIGEST_DOMAIN);
    state.update(encoding);
    let mut out = [0u8; 32];
    out.copy_from_slice(state.finalize().as_bytes());
    out
}

/// The in-memory hash: foldhash over the encoding with a per-process random seed.
///
/// Not stable across processes on purpose (no hash flooding through request-controlled shapes);
/// tables compare the full encoding on a hit, so a collision costs a probe, never a wrong value.
#[derive(Clone, Debug)]
pub struct FastHashState(foldhash::fast::RandomState);

impl Default for FastHashState {
    fn default() -> Self {
        Self::new()
    }
}

impl FastHashState {
    /// A freshly seeded state (random per process, and per call to `new`).
    #[must_use]
    pub fn new() -> Self {
        Self(foldhash::fast::RandomState::default())
    }

    /// Hash of an encoding.
    #[inline]
    #[must_use]
    pub fn hash(&self, encoding: &[u8]) -> u64 {
        self.0.hash_one(encoding)
    }
}

/// An owned key tree, for tests, test vectors and Rust callers that build keys without Python.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// A bool.
    Bool(bool),
    /// An int of any size up to i128.
    Int(i128),
    /// An int of any size, as two's-complement little-endian bytes.
    BigInt(Vec<u8>),
    /// A float (compared bit-exactly by the encoding, NaNs folded).
    Float(f64),
    /// A str.
    Str(String),
    /// A bytes value.
    Bytes(Vec<u8>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A dtype short name.
    Dtype(String),
    /// A device type and index.
    Device(String, Option<i64>),
    /// A `torch.layout` short name.
    Layout(String),
    /// A `torch.memory_format` short name.
    MemoryFormat(String),
    /// A `__jitkey__` object: its type's module and qualname, and its key value.
    Object(String, String, Box<Value>),
}

impl Value {
    /// Writes this tree's canonical encoding.
    ///
    /// # Errors
    /// Any [`EncodeError`] the leaves raise, or [`EncodeError::TooDeep`].
    pub fn encode_into(&self, e: &mut Encoder) -> Result<(), EncodeError> {
        self.encode_depth(e, 0)
    }

    fn encode_depth(&self, e: &mut Encoder, depth: usize) -> Result<(), EncodeError> {
        if depth > MAX_DEPTH {
            return Err(EncodeError::TooDeep { limit: MAX_DEPTH });
        }
        match self {
            Value::None => e.none(),
            Value::Bool(b) => e.bool(*b),
            Value::Int(i) => e.int128(*i),
            Value::BigInt(b) => {
                if b.len() <= 8 {
                    let mut full = [if b.last().is_some_and(|x| x & 0x80 != 0) { 0xff } else { 0 }; 8];
                    full[..b.len()].copy_from_slice(b);
                    e.int(i64::from_le_bytes(full));
                } else if e.bigint_le(b).is_err() {
                    // Only reachable for over-long sign extension of an i64 value.
                    let mut full = [if b[b.len() - 1] & 0x80 != 0 { 0xff } else { 0 }; 8];
                    full.copy_from_slice(&b[..8]);
                    e.int(i64::from_le_bytes(full));
                }
            }
            Value::Float(f) => e.float(*f),
            Value::Str(s) => e.str(s)?,
            Value::Bytes(b) => e.bytes(b)?,
            Value::Tuple(items) => {
                e.tuple_header(items.len())?;
                for item in items {
                    item.encode_depth(e, depth + 1)?;
                }
            }
            Value::Dtype(d) => e.dtype(d)?,
            Value::Device(t, i) => e.device(t, *i)?,
            Value::Layout(n) => e.layout(n)?,
            Value::MemoryFormat(n) => e.memory_format(n)?,
            Value::Object(module, qualname, v) => {
                e.object_header(module, qualname)?;
                v.encode_depth(e, depth + 1)?;
            }
        }
        Ok(())
    }

    /// The canonical encoding as a new vector.
    ///
    /// # Errors
    /// As [`Value::encode_into`].
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut e = Encoder::new();
        self.encode_into(&mut e)?;
        Ok(e.into_vec())
    }

    /// Type-aware structural equality: what "same key tree" means (floats by canonical bits).
    #[must_use]
    pub fn same_key(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Float(a), Value::Float(b)) => {
                let bits = |f: f64| if f.is_nan() { CANONICAL_NAN_BITS } else { f.to_bits() };
                bits(*a) == bits(*b)
            }
            (Value::Tuple(a), Value::Tuple(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_key(y))
            }
            (Value::Object(m1, q1, v1), Value::Object(m2, q2, v2)) => m1 == m2 && q1 == q2 && v1.same_key(v2),
            (Value::Int(_) | Value::BigInt(_), Value::Int(_) | Value::BigInt(_)) => {
                self.encode().ok() == other.encode().ok()
            }
            _ => self == other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_leaves_encode_differently() {
        let vals = [
            Value::Bool(true),
            Value::Int(1),
            Value::Float(1.0),
            Value::Str("1".into()),
            Value::Bytes(b"1".to_vec()),
            Value::Tuple(vec![Value::Int(1)]),
            Value::Dtype("float32".into()),
            Value::Str("float32".into()),
            Value::Layout("strided".into()),
            Value::MemoryFormat("strided".into()),
            Value::Dtype("strided".into()),
            Value::Object("torch".into(), "layout".into(), Box::new(Value::Str("strided".into()))),
            Value::None,
            Value::Bool(false),
            Value::Int(0),
        ];
        for (i, a) in vals.iter().enumerate() {
            for (j, b) in vals.iter().enumerate() {
                assert_eq!(i == j, a.encode().unwrap() == b.encode().unwrap(), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn bigint_boundaries() {
        for v in [
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            i128::from(i64::MAX) + 1,
            i128::from(i64::MIN) - 1,
            1i128 << 64,
            -(1i128 << 64),
            i128::MAX,
            i128::MIN,
        ] {
            let enc = Value::Int(v).encode().unwrap();
            if i64::try_from(v).is_ok() {
                assert_eq!(enc[0], tag::INT);
            } else {
                assert_eq!(enc[0], tag::BIGINT);
                let n = u32::from_le_bytes(enc[1..5].try_into().unwrap()) as usize;
                assert!(n >= 9);
                let mut full = [if v < 0 { 0xff } else { 0 }; 16];
                full[..n].copy_from_slice(&enc[5..5 + n]);
                assert_eq!(i128::from_le_bytes(full), v);
            }
        }
        assert_eq!(Encoder::new().bigint_le(&[0; 9]), Err(EncodeError::BadBigInt));
        assert_eq!(Encoder::new().bigint_le(&[1; 8]), Err(EncodeError::BadBigInt));
        assert_eq!(Encoder::new().bigint_le(&[]), Err(EncodeError::BadBigInt));
        // Non-minimal input is trimmed to the one canonical form.
        let mut a = Encoder::new();
        a.bigint_le(&[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]).unwrap();
        let mut b = Encoder::new();
        b.bigint_le(&[0, 0, 0, 0, 0, 0, 0, 0, 1]).unwrap();
        assert_eq!(a.as_bytes(), b.as_bytes());
    }

    #[test]
    fn nan_is_canonical_and_signed_zero_is_not_folded() {
        let a = Value::Float(f64::NAN).encode().unwrap();
        let b = Value::Float(f64::from_bits(0x7ff0_0000_dead_beef)).encode().unwrap();
        let c = Value::Float(-f64::NAN).encode().unwrap();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_ne!(Value::Float(0.0).encode().unwrap(), Value::Float(-0.0).encode().unwrap());
    }

    #[test]
    fn depth_limit() {
        let mut v = Value::Int(1);
        for _ in 0..MAX_DEPTH {
            v = Value::Tuple(vec![v]);
        }
        assert!(v.encode().is_ok());
        let v = Value::Tuple(vec![v]);
        assert_eq!(v.encode(), Err(EncodeError::TooDeep { limit: MAX_DEPTH }));
    }

    #[test]
    fn digest_matches_reference_blake2b() {
        // hashlib.blake2b(b"jitkey/key/v2\x00" + b"\x00", digest_size=32).hexdigest()
        let d = digest(&[tag::NONE]);
        assert_eq!(d.len(), 32);
        assert_ne!(d, digest(&[tag::FALSE]));
    }

    #[test]
    fn fast_hash_is_seeded_per_state() {
        let a = FastHashState::new();
        let b = FastHashState::new();
        let enc = Value::Int(7).encode().unwrap();
        assert_eq!(a.hash(&enc), a.hash(&enc));
        // Two independently seeded states disagree (probability of a clash is 2^-64).
        assert_ne!(a.hash(&enc), b.hash(&enc));
    }

    #[test]
    fn module_and_qualname_are_separate_fields() {
        // Format v1 wrote "pkg.sub.K" for both: a class K of pkg.sub and a class sub.K of pkg.
        let one = Value::Object("pkg.sub".into(), "K".into(), Box::new(Value::None));
        let two = Value::Object("pkg".into(), "sub.K".into(), Box::new(Value::None));
        assert_ne!(one.encode().unwrap(), two.encode().unwrap());
        assert!(!one.same_key(&two));
        let enc = one.encode().unwrap();
        assert_eq!(&enc[..3], &[tag::OBJECT, 7, 0]);
        assert_eq!(&enc[3..10], b"pkg.sub");
        assert_eq!(&enc[10..13], &[1, 0, b'K']);
    }

    #[test]
    fn names_are_validated() {
        assert!(Encoder::new().dtype("").is_err());
        assert!(Encoder::new().dtype("flöat").is_err());
        assert!(Encoder::new().device(&"x".repeat(256), None).is_err());
        assert!(Encoder::new().object_header("", "K").is_err());
        assert!(Encoder::new().object_header("m", "").is_err());
        assert!(Encoder::new().object_header(&"m".repeat(65536), "K").is_err());
    }
}
