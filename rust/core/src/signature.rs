//! Signature plans: per-parameter rules, the signature header, the writers of the signature
//! leaves (tags `0x10..=0x3F`, from borrowed metadata such as [`TensorMeta`]) and a decoder that
//! turns a signature encoding back into named components (what `Signature.flatten` /
//! `Signature.explain` show). The binding only reads Python objects and calls the writers.
//!
//! # Encoding of a call under a signature
//!
//! ```text
//! header  = 0x10, u32 LE plan length, plan bytes, extra (a value in the key encoding)
//! key     = header, then for each parameter in order the leaf its rule writes
//! ```
//!
//! The plan bytes describe every rule (see [`Rule::describe`]), so two signatures with different
//! rules never share keys; `extra` is a prefix-free key encoding. Each rule writes a
//! self-delimiting leaf whose layout is fixed by the rule, and rules that dispatch on the
//! argument's type ([`Rule::ByType`]) start every alternative with a distinct tag. Together that
//! makes the encoding injective: equal bytes ⇔ same signature, same extra, same leaves.
//!
//! | tag | leaf | payload |
//! |---|---|---|
//! | `0x10` | signature header | see above |
//! | `0x11` | tensor | per [`TensorRule`]: dtype (u8 len + name), aligned (u8), shape (u8 ndim + i64 or u8 buckets), strides (i64s, or u8 contiguous), device (u8 len + type [+ i64 index]), needs-int64-indexing (u8) |
//! | `0x12` | Triton int bucket | u8: range class (0 i32, 1 i64, 2 u64) \| `==1` << 2 \| `%16==0` << 3 |
//! | `0x13` | int, keyed by type only | – |
//! | `0x14` | float, keyed by type only | – |
//! | `0x15` | list (by-type rules) | u32 LE item count, then each item |
//! | `0x16` | bool, keyed by type only | – |
//! | `0x18` | tuple subclass: named tuple, `torch.Size` (by-type rules) | the key encoding of `((module, qualname), field names)`, u32 LE item count, then each item |
//!
//! Rules keyed by value (int value, float value, bool, None, constexpr, any) write plain key-encoding leaves.

use crate::key::{tag as vtag, EncodeError, Encoder, Value};

/// Signature leaf tags (all inside the range `key::tag::SIGNATURE_FIRST..=SIGNATURE_LAST`).
pub mod tag {
    /// The signature header.
    pub const HEADER: u8 = 0x10;
    /// A tensor's metadata.
    pub const TENSOR: u8 = 0x11;
    /// A Triton int bucket.
    pub const TRITON_INT: u8 = 0x12;
    /// An int keyed by type only.
    pub const INT_TYPE: u8 = 0x13;
    /// A float keyed by type only.
    pub const FLOAT_TYPE: u8 = 0x14;
    /// A list (by-type rules with sequences).
    pub const LIST: u8 = 0x15;
    /// A bool keyed by type only.
    pub const BOOL_TYPE: u8 = 0x16;
    /// A tensor keyed by dtype (+ alignment) in a process-local form: the dtype's in-process index
    /// (u16 LE) and the alignment bit. Written only into in-memory keys (the Triton launcher's
    /// cache), never into a `Signature`'s encodings; never decoded or persisted.
    pub const TENSOR_IN_PROCESS: u8 = 0x17;
    /// A tuple subclass (a named tuple, `torch.Size`) under a by-type rule with tuples: the key
    /// encoding of `((module, qualname), field names)`, then the items as for a tuple.
    pub const NAMEDTUPLE: u8 = 0x18;
}

/// Version of the plan description written into every header.
pub const PLAN_VERSION: u8 = 1;

/// How a tensor's sizes are keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeMode {
    /// Not keyed.
    Ignore,
    /// Every size exactly.
    Exact,
    /// Every size bucketed to `min(size, 2)` (0, 1, many); the rank is keyed.
    Bucket,
}

/// How a tensor's strides are keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrideMode {
    /// Not keyed.
    Ignore,
    /// Every stride exactly.
    Exact,
    /// Only whether the tensor is contiguous.
    Contiguous,
}

/// How a tensor's device is keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMode {
    /// Not keyed.
    Ignore,
    /// The device type (`cuda`, `cpu`).
    Type,
    /// Type and index.
    TypeIndex,
}

/// What of a tensor goes into the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRule {
    /// Key the dtype.
    pub dtype: bool,
    /// Key whether `data_ptr() % align == 0`; 0 = not keyed. A power of two.
    pub align: u32,
    /// Sizes.
    pub shape: ShapeMode,
    /// Strides.
    pub strides: StrideMode,
    /// Device.
    pub device: DeviceMode,
    /// Key whether `numel() > 2**31 - 1` (Helion's int64-indexing flag).
    pub numel_i64: bool,
}

/// How an int is keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntMode {
    /// The exact value.
    Value,
    /// Only that it is an int.
    Type,
    /// Triton's buckets: range class, and unless `specialize` is off, `==1` and (with `align`) `%16`.
    Triton {
        /// Value specialization (Triton's `do_not_specialize` turns it off).
        specialize: bool,
        /// The `%16` bucket (Triton's `do_not_specialize_on_alignment` turns it off).
        align: bool,
    },
}

/// A rule that dispatches on the argument's type; a type with no alternative is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByType {
    /// Tensors.
    pub tensor: Option<TensorRule>,
    /// Ints (never bools).
    pub int: Option<IntMode>,
    /// Floats: `Some(true)` keys the value, `Some(false)` the type.
    pub float: Option<bool>,
    /// Bools: `Some(true)` keys the value, `Some(false)` the type.
    pub bool_: Option<bool>,
    /// `None`.
    pub none: bool,
    /// Exact tuples (and lists) recursively, with this same rule.
    pub tuples: bool,
    /// Lists too (needs `tuples`).
    pub lists: bool,
    /// Any other keyable value (as `jitkey.encode` keys it).
    pub any: bool,
    /// Objects of non-builtin types that `jitkey.encode` keys (through `__jitkey__` or a
    /// registered key adapter, e.g. Triton's `constexpr` and `dtype`), as it keys them. Implied by
    /// `any`.
    pub objects: bool,
    /// The rule for tuple/list items; `None`: this same rule. (Triton specializes the members of
    /// a tuple fully even where the parameter itself is `do_not_specialize`.)
    pub items: Option<Box<ByType>>,
}

/// One parameter's rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// A tensor.
    Tensor(TensorRule),
    /// An int (never a bool).
    Int(IntMode),
    /// A float: `value` keys its bits, else only its type.
    Float {
        /// Key the value.
        value: bool,
    },
    /// A bool: `value` keys it, else only its type.
    Bool {
        /// Key the value.
        value: bool,
    },
    /// Must be `None`.
    NoneValue,
    /// A compile-time constant: any keyable value, tagged with its type.
    Constexpr,
    /// Any keyable value.
    Any,
    /// Not keyed at all.
    Ignore,
    /// By the argument's type.
    ByType(Box<ByType>),
}

impl TensorRule {
    fn describe(&self, out: &mut Vec<u8>) {
        out.push(u8::from(self.dtype));
        out.extend_from_slice(&self.align.to_le_bytes());
        out.push(match self.shape {
            ShapeMode::Ignore => 0,
            ShapeMode::Exact => 1,
            ShapeMode::Bucket => 2,
        });
        out.push(match self.strides {
            StrideMode::Ignore => 0,
            StrideMode::Exact => 1,
            StrideMode::Contiguous => 2,
        });
        out.push(match self.device {
            DeviceMode::Ignore => 0,
            DeviceMode::Type => 1,
            DeviceMode::TypeIndex => 2,
        });
        out.push(u8::from(self.numel_i64));
    }
}

impl IntMode {
    fn describe(self, out: &mut Vec<u8>) {
        match self {
            IntMode::Value => out.push(0),
            IntMode::Type => out.push(1),
            IntMode::Triton { specialize, align } => {
                out.extend_from_slice(&[2, u8::from(specialize), u8::from(align)]);
            }
        }
    }
}

impl Rule {
    /// Appends this rule's description (fixed layout per kind, so the description is prefix-free).
    pub fn describe(&self, out: &mut Vec<u8>) {
        match self {
            Rule::Tensor(t) => {
                out.push(1);
                t.describe(out);
            }
            Rule::Int(m) => {
                out.push(2);
                m.describe(out);
            }
            Rule::Float { value } => out.extend_from_slice(&[3, u8::from(*value)]),
            Rule::Bool { value } => out.extend_from_slice(&[4, u8::from(*value)]),
            Rule::NoneValue => out.push(5),
            Rule::Constexpr => out.push(6),
            Rule::Any => out.push(7),
            Rule::Ignore => out.push(8),
            Rule::ByType(b) => {
                out.push(9);
                b.describe(out);
            }
        }
    }
}

impl ByType {
    /// Appends this rule's description (nested item rules included).
    pub fn describe(&self, out: &mut Vec<u8>) {
        let b = self;
        match &b.tensor {
            Some(t) => {
                out.push(1);
                t.describe(out);
            }
            None => out.push(0),
        }
        match b.int {
            Some(m) => {
                out.push(1);
                m.describe(out);
            }
            None => out.push(0),
        }
        out.push(match b.float {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        });
        out.push(match b.bool_ {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        });
        // `any` and `objects` share one byte (0 neither, 1 any, 2 objects only), so the
        // descriptions of rules without `objects` are what they were before it existed.
        let any = if b.any { 1 } else { 2 * u8::from(b.objects) };
        out.extend_from_slice(&[u8::from(b.none), u8::from(b.tuples), u8::from(b.lists), any]);
        match &b.items {
            Some(items) => {
                out.push(1);
                items.describe(out);
            }
            None => out.push(0),
        }
    }
}

/// The header every key of a signature starts with: tag, the plan's description, then `extra`
/// (a complete key encoding).
///
/// # Errors
/// [`EncodeError::TooLong`] if the plan description exceeds 2**32 − 1 bytes.
pub fn header(rules: &[Rule], extra_encoding: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut plan = vec![PLAN_VERSION];
    let n = u32::try_from(rules.len())
        .map_err(|_| EncodeError::TooLong { what: "signature", len: rules.len() })?;
    plan.extend_from_slice(&n.to_le_bytes());
    for r in rules {
        r.describe(&mut plan);
    }
    let len =
        u32::try_from(plan.len()).map_err(|_| EncodeError::TooLong { what: "signature", len: plan.len() })?;
    let mut out = Vec::with_capacity(5 + plan.len() + extra_encoding.len());
    out.push(tag::HEADER);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&plan);
    out.extend_from_slice(extra_encoding);
    Ok(out)
}

/// Triton's range class of an int: `Some(0)` i32, `Some(1)` i64, `Some(2)` u64, `None` outside
/// `[-2**63, 2**64)` (Triton raises for those).
#[must_use]
pub fn triton_int_class(v: i128) -> Option<u8> {
    if (-(1i128 << 31)..(1i128 << 31)).contains(&v) {
        Some(0)
    } else if (-(1i128 << 63)..(1i128 << 63)).contains(&v) {
        Some(1)
    } else if ((1i128 << 63)..(1i128 << 64)).contains(&v) {
        Some(2)
    } else {
        None
    }
}

/// The Triton int bucket byte (see the module table), or `None` if Triton cannot take `v`.
#[must_use]
pub fn triton_int_bucket(v: i128, specialize: bool, align: bool) -> Option<u8> {
    let class = triton_int_class(v)?;
    let mut b = class;
    if specialize {
        if v == 1 {
            b |= 1 << 2;
        }
        if align && v & 15 == 0 {
            b |= 1 << 3;
        }
    }
    Some(b)
}

/// Writes a Triton int leaf.
#[inline]
pub fn write_triton_int(enc: &mut Encoder, bucket: u8) {
    enc.raw(&[tag::TRITON_INT, bucket]);
}

/// `min(size, 2)` for a non-negative size.
#[inline]
#[must_use]
pub fn bucket_dim(size: i64) -> u8 {
    size.clamp(0, 2) as u8
}

// ---- leaf writers ------------------------------------------------------------------------------
//
// The binding reads Python objects and hands what it read to these writers, borrowed: every leaf's
// byte layout lives here, next to its decoder, and nothing is copied or allocated per call.

/// Why an int cannot be keyed under [`IntMode::Triton`]: what Triton itself does with it (its
/// specialization raises `OverflowError`; parameters annotated `fp*`/`bf*`/`u1`, whose ints Triton
/// converts, are keyed by [`IntMode::Type`] instead and never get here).
pub const TRITON_RANGE_ERROR: &str = "int outside [-2**63, 2**64), the range Triton specializes ints over \
     (Triton's specialization raises OverflowError for it)";

/// A tensor's sizes or strides, read as the writer goes (no copy): a slice for metadata already in
/// memory, or the binding's view of a Python tuple, whose reads may fail (`Error`).
pub trait Dims {
    /// What a failed read gives (and what the writer's own errors convert into).
    type Error: From<EncodeError>;
    /// The number of dims.
    fn len(&self) -> usize;
    /// Whether there are no dims (a 0-dim tensor).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Dim `i` (`i < len()`).
    ///
    /// # Errors
    /// Whatever reading the dim can fail with.
    fn get(&self, i: usize) -> Result<i64, Self::Error>;
    /// Calls `f` with every dim in order (a source may iterate faster than it indexes).
    ///
    /// # Errors
    /// The first failed read.
    #[inline(always)]
    fn for_each(&self, mut f: impl FnMut(i64)) -> Result<(), Self::Error> {
        for i in 0..self.len() {
            f(self.get(i)?);
        }
        Ok(())
    }
}

impl Dims for &[i64] {
    type Error = EncodeError;
    #[inline]
    fn len(&self) -> usize {
        <[i64]>::len(self)
    }
    #[inline]
    fn get(&self, i: usize) -> Result<i64, EncodeError> {
        Ok(self[i])
    }
    #[inline(always)]
    fn for_each(&self, f: impl FnMut(i64)) -> Result<(), EncodeError> {
        self.iter().copied().for_each(f);
        Ok(())
    }
}

/// The metadata of one tensor, borrowed from wherever the caller read it. Only the fields its
/// [`TensorRule`] keys are read by [`write_tensor`]; the others may hold anything (empty dims, 0).
#[derive(Debug, Clone, Copy)]
pub struct TensorMeta<'a, D: Dims = &'a [i64]> {
    /// The dtype's short name (`float16`), at most 255 bytes.
    pub dtype: &'a str,
    /// `data_ptr()` (only its alignment is keyed).
    pub data_ptr: u64,
    /// Sizes.
    pub shape: D,
    /// Strides (same rank as `shape` when both are keyed).
    pub strides: D,
    /// `is_contiguous()`.
    pub contiguous: bool,
    /// Device type (at most 255 bytes) and index (−1 when it has none).
    pub device: (&'a str, i64),
    /// `numel()`.
    pub numel: i64,
}

/// A short name: u8 length, then the bytes.
#[inline(always)]
fn write_short(enc: &mut Encoder, what: &'static str, name: &str) -> Result<(), EncodeError> {
    let n = u8::try_from(name.len()).map_err(|_| EncodeError::BadName { what, name: name.to_owned() })?;
    enc.raw_u8(n);
    enc.raw(name.as_bytes());
    Ok(())
}

#[inline]
fn ndim_u8(n: usize) -> Result<u8, EncodeError> {
    u8::try_from(n).map_err(|_| EncodeError::BadLeaf("tensor has more than 255 dims"))
}

/// Writes a tensor leaf (tag [`tag::TENSOR`], then the fields `rule` keys, as in the module table).
///
/// # Errors
/// A name over 255 bytes, more than 255 dims, strides of another rank than the shape, or a failed
/// read of `m.shape` / `m.strides`; `enc` then holds a partial leaf.
#[inline(always)]
pub fn write_tensor<D: Dims>(
    enc: &mut Encoder,
    rule: &TensorRule,
    m: &TensorMeta<'_, D>,
) -> Result<(), D::Error> {
    enc.raw_u8(tag::TENSOR);
    if rule.dtype {
        write_short(enc, "dtype", m.dtype)?;
    }
    if rule.align != 0 {
        enc.raw_u8(u8::from(m.data_ptr & u64::from(rule.align - 1) == 0));
    }
    match rule.shape {
        ShapeMode::Ignore => {}
        ShapeMode::Exact => {
            enc.raw_u8(ndim_u8(m.shape.len())?);
            m.shape.for_each(|d| enc.raw(&d.to_le_bytes()))?;
        }
        ShapeMode::Bucket => {
            enc.raw_u8(ndim_u8(m.shape.len())?);
            m.shape.for_each(|d| enc.raw_u8(bucket_dim(d)))?;
        }
    }
    match rule.strides {
        StrideMode::Ignore => {}
        StrideMode::Exact => {
            let n = m.strides.len();
            if rule.shape == ShapeMode::Ignore {
                enc.raw_u8(ndim_u8(n)?);
            } else if n != m.shape.len() {
                return Err(EncodeError::BadLeaf("tensor stride rank differs from its shape").into());
            }
            m.strides.for_each(|d| enc.raw(&d.to_le_bytes()))?;
        }
        StrideMode::Contiguous => enc.raw_u8(u8::from(m.contiguous)),
    }
    if rule.device != DeviceMode::Ignore {
        write_short(enc, "device", m.device.0)?;
        if rule.device == DeviceMode::TypeIndex {
            enc.raw(&m.device.1.to_le_bytes());
        }
    }
    if rule.numel_i64 {
        enc.raw_u8(u8::from(m.numel > i64::from(i32::MAX)));
    }
    Ok(())
}

/// Writes the process-local tensor leaf ([`tag::TENSOR_IN_PROCESS`]): the dtype's in-process
/// index and whether the data pointer is aligned. Only for keys that never leave the process.
#[inline]
pub fn write_tensor_in_process(enc: &mut Encoder, dtype_index: u16, aligned: bool) {
    let [lo, hi] = dtype_index.to_le_bytes();
    enc.raw(&[tag::TENSOR_IN_PROCESS, lo, hi, u8::from(aligned)]);
}

/// Writes an int leaf under `mode` (a plain int for [`IntMode::Value`]).
///
/// # Errors
/// [`EncodeError::BadLeaf`] for an int outside the range Triton specializes under [`IntMode::Triton`].
#[inline]
pub fn write_int(enc: &mut Encoder, mode: IntMode, v: i128) -> Result<(), EncodeError> {
    match mode {
        IntMode::Value => enc.int128(v),
        IntMode::Type => enc.raw_u8(tag::INT_TYPE),
        IntMode::Triton { specialize, align } => {
            let b =
                triton_int_bucket(v, specialize, align).ok_or(EncodeError::BadLeaf(TRITON_RANGE_ERROR))?;
            write_triton_int(enc, b);
        }
    }
    Ok(())
}

/// Writes a float leaf: its key encoding when `value` is keyed, else the type-only tag.
#[inline]
pub fn write_float(enc: &mut Encoder, value: bool, v: f64) {
    write_value_or_type(enc, value, v, Encoder::float, tag::FLOAT_TYPE);
}

/// Writes a bool leaf: its key encoding when `value` is keyed, else the type-only tag.
#[inline]
pub fn write_bool(enc: &mut Encoder, value: bool, v: bool) {
    write_value_or_type(enc, value, v, Encoder::bool, tag::BOOL_TYPE);
}

/// A scalar leaf under a rule that keys by value or by type alone: `write(v)` when `value`,
/// else `type_tag`.
#[inline]
fn write_value_or_type<T>(enc: &mut Encoder, value: bool, v: T, write: fn(&mut Encoder, T), type_tag: u8) {
    if value {
        write(enc, v);
    } else {
        enc.raw_u8(type_tag);
    }
}

/// Starts a tuple (`list == false`: the tuple tag) or list ([`tag::LIST`]) of `len` items under
/// a by-type rule; the caller then writes exactly `len` items.
///
/// # Errors
/// [`EncodeError::TooLong`] past 2**32 − 1 items.
#[inline]
pub fn write_sequence_header(enc: &mut Encoder, list: bool, len: usize) -> Result<(), EncodeError> {
    let n = u32::try_from(len).map_err(|_| EncodeError::TooLong { what: "sequence", len })?;
    enc.raw_u8(if list { tag::LIST } else { vtag::TUPLE });
    enc.raw(&n.to_le_bytes());
    Ok(())
}

/// Starts a tuple subclass ([`tag::NAMEDTUPLE`]): the key encoding of `((module, qualname), fields)`
/// (the type's `__module__` and `__qualname__` as two strs, as a `__jitkey__` object's type is
/// written, and a tuple of strs), then `len` as for a tuple; the caller then writes exactly `len` items.
///
/// # Errors
/// A str or tuple too long for a key, or the first failed read of `fields`.
pub fn write_namedtuple_header<'f, E: From<EncodeError>>(
    enc: &mut Encoder,
    module: &str,
    qualname: &str,
    fields: impl ExactSizeIterator<Item = Result<&'f str, E>>,
    len: usize,
) -> Result<(), E> {
    enc.raw_u8(tag::NAMEDTUPLE);
    enc.tuple_header(2)?;
    enc.tuple_header(2)?;
    enc.str(module)?;
    enc.str(qualname)?;
    enc.tuple_header(fields.len())?;
    for f in fields {
        enc.str(f?)?;
    }
    let n = u32::try_from(len).map_err(|_| EncodeError::TooLong { what: "sequence", len })?;
    enc.raw(&n.to_le_bytes());
    Ok(())
}

// ---- decoding (flatten / explain) --------------------------------------------------------------

/// Why bytes could not be decoded under a plan (only on a bug or foreign bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot decode signature key: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// One named component of a parameter's leaf (`("dtype", Str("float16"))`).
pub type Component = (&'static str, Value);

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| DecodeError(format!("truncated at byte {}", self.pos)))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    fn short_str(&mut self) -> Result<String, DecodeError> {
        let n = self.u8()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
    fn expect(&mut self, t: u8) -> Result<(), DecodeError> {
        let got = self.u8()?;
        if got == t {
            Ok(())
        } else {
            Err(DecodeError(format!("expected tag {t:#04x}, found {got:#04x} at byte {}", self.pos - 1)))
        }
    }
}

/// Decodes one value of the key encoding (the inverse of [`Value::encode`], up to NaN canonicalisation).
fn decode_value(r: &mut Reader<'_>) -> Result<Value, DecodeError> {
    let t = r.u8()?;
    Ok(match t {
        vtag::NONE => Value::None,
        vtag::FALSE => Value::Bool(false),
        vtag::TRUE => Value::Bool(true),
        vtag::INT => Value::Int(i128::from(r.i64()?)),
        vtag::BIGINT => {
            let n = r.u32()? as usize;
            let bytes = r.take(n)?;
            if n > 16 {
                Value::BigInt(bytes.to_vec())
            } else {
                let fill = if bytes[n - 1] & 0x80 != 0 { 0xff } else { 0 };
                let mut full = [fill; 16];
                full[..n].copy_from_slice(bytes);
                Value::Int(i128::from_le_bytes(full))
            }
        }
        vtag::FLOAT => Value::Float(f64::from_bits(r.i64()? as u64)),
        vtag::STR => {
            let n = r.u32()? as usize;
            Value::Str(String::from_utf8_lossy(r.take(n)?).into_owned())
        }
        vtag::BYTES => {
            let n = r.u32()? as usize;
            Value::Bytes(r.take(n)?.to_vec())
        }
        vtag::TUPLE | tag::LIST => {
            let n = r.u32()? as usize;
            let mut items = Vec::with_capacity(n.min(64));
            for _ in 0..n {
                items.push(decode_value(r)?);
            }
            Value::Tuple(items)
        }
        vtag::DTYPE => Value::Dtype(r.short_str()?),
        vtag::LAYOUT => Value::Layout(r.short_str()?),
        vtag::MEMORY_FORMAT => Value::MemoryFormat(r.short_str()?),
        vtag::DEVICE => {
            let ty = r.short_str()?;
            let idx = r.i64()?;
            Value::Device(ty, (idx >= 0).then_some(idx))
        }
        vtag::OBJECT => {
            let mut field = || -> Result<String, DecodeError> {
                let n = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes")) as usize;
                Ok(String::from_utf8_lossy(r.take(n)?).into_owned())
            };
            let (module, qualname) = (field()?, field()?);
            Value::Object(module, qualname, Box::new(decode_value(r)?))
        }
        other => return Err(DecodeError(format!("unknown value tag {other:#04x}"))),
    })
}

fn decode_tensor(r: &mut Reader<'_>, t: &TensorRule, out: &mut Vec<Component>) -> Result<(), DecodeError> {
    out.push(("kind", Value::Str("tensor".into())));
    if t.dtype {
        out.push(("dtype", Value::Dtype(r.short_str()?)));
    }
    if t.align != 0 {
        out.push(("aligned", Value::Bool(r.u8()? != 0)));
    }
    let mut ndim = None;
    match t.shape {
        ShapeMode::Ignore => {}
        ShapeMode::Exact => {
            let n = r.u8()? as usize;
            ndim = Some(n);
            let dims = (0..n).map(|_| r.i64().map(|v| Value::Int(v.into()))).collect::<Result<_, _>>()?;
            out.push(("shape", Value::Tuple(dims)));
        }
        ShapeMode::Bucket => {
            let n = r.u8()? as usize;
            ndim = Some(n);
            let dims = (0..n).map(|_| r.u8().map(|v| Value::Int(v.into()))).collect::<Result<_, _>>()?;
            out.push(("shape_buckets", Value::Tuple(dims)));
        }
    }
    match t.strides {
        StrideMode::Ignore => {}
        StrideMode::Exact => {
            let n = match ndim {
                Some(n) => n,
                None => r.u8()? as usize,
            };
            let s = (0..n).map(|_| r.i64().map(|v| Value::Int(v.into()))).collect::<Result<_, _>>()?;
            out.push(("strides", Value::Tuple(s)));
        }
        StrideMode::Contiguous => out.push(("contiguous", Value::Bool(r.u8()? != 0))),
    }
    match t.device {
        DeviceMode::Ignore => {}
        DeviceMode::Type => out.push(("device", Value::Device(r.short_str()?, None))),
        DeviceMode::TypeIndex => {
            let ty = r.short_str()?;
            let idx = r.i64()?;
            out.push(("device", Value::Device(ty, (idx >= 0).then_some(idx))));
        }
    }
    if t.numel_i64 {
        out.push(("needs_int64", Value::Bool(r.u8()? != 0)));
    }
    Ok(())
}

fn decode_triton_int(r: &mut Reader<'_>, out: &mut Vec<Component>) -> Result<(), DecodeError> {
    let b = r.u8()?;
    let class = ["i32", "i64", "u64"].get(usize::from(b & 3)).copied().unwrap_or("?");
    out.push(("kind", Value::Str("int".into())));
    out.push(("range", Value::Str(class.into())));
    out.push(("equals_1", Value::Bool(b & 4 != 0)));
    out.push(("divisible_by_16", Value::Bool(b & 8 != 0)));
    Ok(())
}

fn decode_rule(r: &mut Reader<'_>, rule: &Rule, out: &mut Vec<Component>) -> Result<(), DecodeError> {
    match rule {
        Rule::Tensor(t) => {
            r.expect(tag::TENSOR)?;
            decode_tensor(r, t, out)
        }
        Rule::Int(IntMode::Triton { .. }) => {
            r.expect(tag::TRITON_INT)?;
            decode_triton_int(r, out)
        }
        Rule::Int(IntMode::Type) => {
            r.expect(tag::INT_TYPE)?;
            out.push(("kind", Value::Str("int".into())));
            Ok(())
        }
        Rule::Float { value: false } => {
            r.expect(tag::FLOAT_TYPE)?;
            out.push(("kind", Value::Str("float".into())));
            Ok(())
        }
        Rule::Bool { value: false } => {
            r.expect(tag::BOOL_TYPE)?;
            out.push(("kind", Value::Str("bool".into())));
            Ok(())
        }
        Rule::Int(IntMode::Value)
        | Rule::Float { value: true }
        | Rule::Bool { value: true }
        | Rule::NoneValue
        | Rule::Constexpr
        | Rule::Any => {
            out.push(("value", decode_value(r)?));
            Ok(())
        }
        Rule::Ignore => Ok(()),
        Rule::ByType(b) => decode_by_type(r, b, out),
    }
}

fn decode_by_type(r: &mut Reader<'_>, b: &ByType, out: &mut Vec<Component>) -> Result<(), DecodeError> {
    let t = *r.b.get(r.pos).ok_or_else(|| DecodeError("truncated".into()))?;
    match t {
        tag::TENSOR => {
            r.pos += 1;
            let tr = b.tensor.as_ref().ok_or_else(|| DecodeError("tensor not in rule".into()))?;
            decode_tensor(r, tr, out)
        }
        tag::TRITON_INT => {
            r.pos += 1;
            decode_triton_int(r, out)
        }
        tag::INT_TYPE => {
            r.pos += 1;
            out.push(("kind", Value::Str("int".into())));
            Ok(())
        }
        tag::FLOAT_TYPE => {
            r.pos += 1;
            out.push(("kind", Value::Str("float".into())));
            Ok(())
        }
        tag::BOOL_TYPE => {
            r.pos += 1;
            out.push(("kind", Value::Str("bool".into())));
            Ok(())
        }
        vtag::TUPLE | tag::LIST | tag::NAMEDTUPLE if b.tuples => {
            r.pos += 1;
            if t == tag::NAMEDTUPLE {
                out.push(("kind", Value::Str("namedtuple".into())));
                out.push(("type", decode_value(r)?));
            } else {
                out.push(("kind", Value::Str(if t == tag::LIST { "list" } else { "tuple" }.into())));
            }
            let n = r.u32()? as usize;
            out.push(("len", Value::Int(n as i128)));
            for i in 0..n {
                let mut inner = Vec::new();
                decode_by_type(r, b.items.as_deref().unwrap_or(b), &mut inner)?;
                out.push(("item", Value::Tuple(vec![Value::Int(i as i128), components_value(&inner)])));
            }
            Ok(())
        }
        _ => {
            out.push(("value", decode_value(r)?));
            Ok(())
        }
    }
}

/// The components as a value tree: a tuple of `(name, value)` pairs.
#[must_use]
pub fn components_value(c: &[Component]) -> Value {
    Value::Tuple(c.iter().map(|(n, v)| Value::Tuple(vec![Value::Str((*n).into()), v.clone()])).collect())
}

/// Decodes a key written under `rules` (header included) into `extra` and the per-parameter
/// components.
///
/// # Errors
/// [`DecodeError`] if `bytes` was not written by a signature with exactly these rules.
pub fn decode(
    rules: &[Rule],
    header_len: usize,
    bytes: &[u8],
) -> Result<(Value, Vec<Vec<Component>>), DecodeError> {
    let mut r = Reader { b: bytes, pos: 0 };
    r.expect(tag::HEADER)?;
    let plan_len = r.u32()? as usize;
    r.take(plan_len)?;
    let extra = decode_value(&mut r)?;
    if r.pos != header_len {
        return Err(DecodeError("header length mismatch".into()));
    }
    let mut params = Vec::with_capacity(rules.len());
    for rule in rules {
        let mut c = Vec::new();
        decode_rule(&mut r, rule, &mut c)?;
        params.push(c);
    }
    if r.pos != bytes.len() {
        return Err(DecodeError(format!("{} trailing bytes", bytes.len() - r.pos)));
    }
    Ok((extra, params))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_int_buckets_match_triton_3_6() {
        // (value, specialize, align) -> Triton's (type, attr) as native_specialize_impl reports it.
        let cases: &[(i128, bool, bool, u8, bool, bool)] = &[
            (1, true, true, 0, true, false),
            (16, true, true, 0, false, true),
            (15, true, true, 0, false, false),
            (0, true, true, 0, false, true),
            ((1 << 31) - 1, true, true, 0, false, false),
            (1 << 31, true, true, 1, false, true),
            (-(1 << 31), true, true, 0, false, true),
            (-(1 << 31) - 1, true, true, 1, false, false),
            ((1 << 63) - 1, true, true, 1, false, false),
            (1 << 63, true, true, 2, false, true),
            ((1 << 64) - 1, true, true, 2, false, false),
            (-16, true, true, 0, false, true),
            (16, true, false, 0, false, false),
            (1, false, true, 0, false, false),
            (16, false, true, 0, false, false),
        ];
        for &(v, s, a, class, one, d) in cases {
            let b = triton_int_bucket(v, s, a).unwrap();
            assert_eq!(b & 3, class, "{v}");
            assert_eq!(b & 4 != 0, one, "{v}");
            assert_eq!(b & 8 != 0, d, "{v}");
        }
        assert_eq!(triton_int_bucket(1 << 64, true, true), None);
        assert_eq!(triton_int_bucket(-(1 << 63) - 1, true, true), None);
    }

    #[test]
    fn headers_differ_by_rule_and_extra() {
        let a = header(&[Rule::Int(IntMode::Value)], &[vtag::NONE]).unwrap();
        let b = header(&[Rule::Int(IntMode::Type)], &[vtag::NONE]).unwrap();
        let c = header(&[Rule::Int(IntMode::Value)], &[vtag::TRUE]).unwrap();
        let d = header(&[Rule::Int(IntMode::Value), Rule::Ignore], &[vtag::NONE]).unwrap();
        assert!(a != b && a != c && a != d && b != c);
        assert_eq!(a[0], tag::HEADER);
    }

    #[test]
    fn decode_roundtrip() {
        let tr = TensorRule {
            dtype: true,
            align: 16,
            shape: ShapeMode::Bucket,
            strides: StrideMode::Contiguous,
            device: DeviceMode::TypeIndex,
            numel_i64: true,
        };
        let rules = vec![
            Rule::Tensor(tr),
            Rule::Int(IntMode::Triton { specialize: true, align: true }),
            Rule::Constexpr,
        ];
        let mut extra = Encoder::new();
        extra.str("k").unwrap();
        let h = header(&rules, extra.as_bytes()).unwrap();
        let mut e = Encoder::new();
        e.raw(&h);
        e.raw_u8(tag::TENSOR);
        e.raw(&[7]);
        e.raw(b"float16");
        e.raw(&[1, 2, 2, 1, 1, 4]);
        e.raw(b"cuda");
        e.raw(&0i64.to_le_bytes());
        e.raw(&[0]);
        write_triton_int(&mut e, triton_int_bucket(16, true, true).unwrap());
        e.int(5);
        let (x, params) = decode(&rules, h.len(), e.as_bytes()).unwrap();
        assert_eq!(x, Value::Str("k".into()));
        assert_eq!(params[0][1], ("dtype", Value::Dtype("float16".into())));
        assert_eq!(params[0][3], ("shape_buckets", Value::Tuple(vec![Value::Int(2), Value::Int(1)])));
        assert_eq!(params[1][3], ("divisible_by_16", Value::Bool(true)));
        assert_eq!(params[2][0], ("value", Value::Int(5)));
        // Trailing or missing bytes are refused.
        assert!(decode(&rules, h.len(), &e.as_bytes()[..e.len() - 1]).is_err());
    }

    #[test]
    fn bucket_dims() {
        assert_eq!([bucket_dim(0), bucket_dim(1), bucket_dim(2), bucket_dim(1 << 40)], [0, 1, 2, 2]);
    }
}
