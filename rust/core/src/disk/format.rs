//! On-disk format of the index log (format major 1): a 64-byte header, then 8-byte aligned,
//! self-checksummed records. Pure functions over byte slices; no I/O.
//!
//! ```text
//! header (64 B, little-endian):
//!   0  magic "JITKIDX\0"    8  format_major u16   10 format_minor u16   12 header_len u32 (= 64)
//!   16 flags u32            20 reserved u32       24 generation u64     32 created_unix_ns u64
//!   40 writer version [16]  56 xxh3-64 of bytes 0..56
//! record (total_len bytes, a multiple of 8, 64 ..= MAX_RECORD):
//!   0  rec_magic u32        4  total_len u32      8  type u8            9  flags u8
//!   10 value_len u16        12 seq u64            20 key [32]           52 value [value_len]
//!   .. zero padding to total_len - 8              total_len-8: xxh3-64 of bytes 0..total_len-8
//! ```
//!
//! A record is accepted only if its magic, length bounds, type/length consistency and checksum
//! all hold and it lies entirely within the bytes given. Record types this version does not know
//! are skipped when their framing is valid (minor-version compatibility).

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A 32-byte key digest (blake2b-256 from [`crate::key::digest`]).
pub type Digest = [u8; 32];

/// The file's first 8 bytes.
pub const MAGIC: [u8; 8] = *b"JITKIDX\0";
/// The format major this version reads and writes; another major is never read or touched.
pub const FORMAT_MAJOR: u16 = 1;
/// The format minor written; readers skip record types of later minors.
pub const FORMAT_MINOR: u16 = 0;
/// The header's length; the first record starts here.
pub const HEADER_LEN: usize = 64;
/// `"JKR1"` little-endian: marks the start of every record.
pub const REC_MAGIC: u32 = u32::from_le_bytes(*b"JKR1");
/// Bytes before the value: magic, total_len, type, flags, value_len, seq, key.
pub const REC_HEAD: usize = 52;
/// The trailing xxh3-64 checksum of every record.
pub const CHECKSUM_LEN: usize = 8;
/// The shortest record.
pub const MIN_RECORD: usize = 64;
/// The longest record.
pub const MAX_RECORD: usize = 64 * 1024;
/// The largest value a record holds (`record_len(MAX_VALUE) == MAX_RECORD`).
pub const MAX_VALUE: usize = MAX_RECORD - REC_HEAD - 4 - CHECKSUM_LEN;

const HEADER_SEED: u64 = 0x6a69_746b_6579_6864; // "jitkeyhd"
const RECORD_SEED: u64 = 0x6a69_746b_6579_7263; // "jitkeyrc"

/// Record type: `key` now has `value`.
pub const TYPE_PUT: u8 = 1;
/// Record type: `key` was deleted.
pub const TYPE_TOMBSTONE: u8 = 2;
/// Record type: filler over a torn tail (no key, no value).
pub const TYPE_PAD: u8 = 3;

/// The parsed file header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Format major ([`FORMAT_MAJOR`] for every header that decodes).
    pub major: u16,
    /// Format minor of the writer.
    pub minor: u16,
    /// Reserved, 0.
    pub flags: u32,
    /// 1 for a new file, one more for every compaction.
    pub generation: u64,
    /// When the file was written (nanoseconds since the epoch).
    pub created_unix_ns: u64,
    /// `"jitkey <version>"` of the writer, NUL-padded (diagnostics only).
    pub writer_version: [u8; 16],
}

/// Why a header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// Shorter than a header or not our magic: some other program's file. Never touched.
    Foreign,
    /// Our magic but a bad checksum or impossible length: a damaged index.
    Corrupt,
    /// A format major this library cannot read (another jitkey version). Never touched.
    UnknownMajor(u16),
}

impl Header {
    /// A header for a new file of this format, written by this version.
    pub fn new(generation: u64, created_unix_ns: u64) -> Self {
        let mut writer_version = [0u8; 16];
        let v = concat!("jitkey ", env!("CARGO_PKG_VERSION")).as_bytes();
        let n = v.len().min(16);
        writer_version[..n].copy_from_slice(&v[..n]);
        Self {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            flags: 0,
            generation,
            created_unix_ns,
            writer_version,
        }
    }

    /// The 64 header bytes, checksum included.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.major.to_le_bytes());
        b[10..12].copy_from_slice(&self.minor.to_le_bytes());
        b[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        b[16..20].copy_from_slice(&self.flags.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.created_unix_ns.to_le_bytes());
        b[40..56].copy_from_slice(&self.writer_version);
        let sum = xxh3_64_with_seed(&b[..56], HEADER_SEED);
        b[56..64].copy_from_slice(&sum.to_le_bytes());
        b
    }

    /// Parses and checks a header (magic, checksum, length, major).
    pub fn decode(b: &[u8]) -> Result<Self, HeaderError> {
        if b.len() < HEADER_LEN || b[0..8] != MAGIC {
            return Err(HeaderError::Foreign);
        }
        if xxh3_64_with_seed(&b[..56], HEADER_SEED) != u64_at(b, 56) || u32_at(b, 12) as usize != HEADER_LEN {
            return Err(HeaderError::Corrupt);
        }
        let major = u16::from_le_bytes([b[8], b[9]]);
        if major != FORMAT_MAJOR {
            return Err(HeaderError::UnknownMajor(major));
        }
        let mut writer_version = [0u8; 16];
        writer_version.copy_from_slice(&b[40..56]);
        Ok(Self {
            major,
            minor: u16::from_le_bytes([b[10], b[11]]),
            flags: u32_at(b, 16),
            generation: u64_at(b, 24),
            created_unix_ns: u64_at(b, 32),
            writer_version,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The total length of a PUT record holding `value_len` bytes.
pub const fn record_len(value_len: usize) -> usize {
    (REC_HEAD + value_len).div_ceil(8) * 8 + CHECKSUM_LEN
}

/// Appends one record to `out`. `value.len()` must be at most [`MAX_VALUE`].
pub fn encode_record(out: &mut Vec<u8>, ty: u8, seq: u64, key: &Digest, value: &[u8]) {
    assert!(value.len() <= MAX_VALUE, "value longer than MAX_VALUE");
    let total = record_len(value.len());
    let start = out.len();
    out.extend_from_slice(&REC_MAGIC.to_le_bytes());
    out.extend_from_slice(&(total as u32).to_le_bytes());
    out.push(ty);
    out.push(0);
    out.extend_from_slice(&(value.len() as u16).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out.resize(start + total - CHECKSUM_LEN, 0);
    let sum = xxh3_64_with_seed(&out[start..], RECORD_SEED);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// Appends PAD records covering exactly `len` bytes (`len` a multiple of 8, at least 64).
pub fn encode_pads(out: &mut Vec<u8>, mut len: usize) {
    assert!(len % 8 == 0 && len >= MIN_RECORD, "pad length must be a multiple of 8, >= 64");
    while len > 0 {
        let take = if len <= MAX_RECORD {
            len
        } else if len - MAX_RECORD < MIN_RECORD {
            MAX_RECORD - MIN_RECORD
        } else {
            MAX_RECORD
        };
        let start = out.len();
        out.extend_from_slice(&REC_MAGIC.to_le_bytes());
        out.extend_from_slice(&(take as u32).to_le_bytes());
        out.push(TYPE_PAD);
        out.resize(start + take - CHECKSUM_LEN, 0);
        let sum = xxh3_64_with_seed(&out[start..], RECORD_SEED);
        out.extend_from_slice(&sum.to_le_bytes());
        len -= take;
    }
}

/// The smallest pad covering a `gap`-byte invalid region (rounded up to 8, at least 64 bytes;
/// it may extend past the end of the file).
pub const fn pad_len_for(gap: usize) -> usize {
    let l = gap.div_ceil(8) * 8;
    if l < MIN_RECORD {
        MIN_RECORD
    } else {
        l
    }
}

/// A validated record borrowed from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// The record type ([`TYPE_PUT`], [`TYPE_TOMBSTONE`], ...).
    pub ty: u8,
    /// The writer's sequence number (orders records for eviction).
    pub seq: u64,
    /// The key.
    pub key: &'a Digest,
    /// The value (empty for a tombstone).
    pub value: &'a [u8],
    /// Total length in bytes (where the next record starts).
    pub len: usize,
}

/// Parses and validates the record at the start of `buf`; `None` if it is incomplete or invalid.
pub fn parse_record(buf: &[u8]) -> Option<RecordRef<'_>> {
    if buf.len() < MIN_RECORD || u32_at(buf, 0) != REC_MAGIC {
        return None;
    }
    let total = u32_at(buf, 4) as usize;
    if !(MIN_RECORD..=MAX_RECORD).contains(&total) || total % 8 != 0 || total > buf.len() {
        return None;
    }
    let ty = buf[8];
    let value_len = u16::from_le_bytes([buf[10], buf[11]]) as usize;
    let consistent = match ty {
        TYPE_PUT => record_len(value_len) == total,
        TYPE_TOMBSTONE => value_len == 0 && total == MIN_RECORD,
        TYPE_PAD => value_len == 0,
        // Unknown (newer minor) types: framing only; the value bound must still hold.
        _ => REC_HEAD + value_len + CHECKSUM_LEN <= total,
    };
    if !consistent || xxh3_64_with_seed(&buf[..total - CHECKSUM_LEN], RECORD_SEED) != u64_at(buf, total - 8) {
        return None;
    }
    let key: &Digest = buf[20..52].try_into().expect("32 bytes");
    Some(RecordRef { ty, seq: u64_at(buf, 12), key, value: &buf[REC_HEAD..REC_HEAD + value_len], len: total })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_roundtrip_and_damage() {
        let h = Header::new(7, 123);
        let b = h.encode();
        assert_eq!(Header::decode(&b), Ok(h));
        let mut bad = b;
        bad[30] ^= 1;
        assert_eq!(Header::decode(&bad), Err(HeaderError::Corrupt));
        assert_eq!(Header::decode(&b[..63]), Err(HeaderError::Foreign));
        assert_eq!(Header::decode(&[0u8; 64]), Err(HeaderError::Foreign));
        let mut other = Header::new(1, 1);
        other.major = 2;
        assert_eq!(Header::decode(&other.encode()), Err(HeaderError::UnknownMajor(2)));
    }

    #[test]
    fn record_roundtrip_and_limits() {
        assert_eq!(record_len(MAX_VALUE), MAX_RECORD);
        assert_eq!(record_len(0), MIN_RECORD);
        for n in [0usize, 1, 4, 5, 11, 12, 13, 100, MAX_VALUE] {
            let v: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let mut out = Vec::new();
            encode_record(&mut out, TYPE_PUT, 9, &[3; 32], &v);
            assert_eq!(out.len(), record_len(n));
            assert_eq!(out.len() % 8, 0);
            let r = parse_record(&out).unwrap();
            assert_eq!((r.ty, r.seq, r.key, r.value, r.len), (TYPE_PUT, 9, &[3; 32], &v[..], out.len()));
            assert!(parse_record(&out[..out.len() - 1]).is_none());
        }
    }

    #[test]
    fn pads_cover_exactly() {
        for len in [64usize, 72, 4096, MAX_RECORD, MAX_RECORD + 8, MAX_RECORD + 64, 3 * MAX_RECORD + 40] {
            let mut out = Vec::new();
            encode_pads(&mut out, len);
            assert_eq!(out.len(), len);
            let mut pos = 0;
            while pos < out.len() {
                let r = parse_record(&out[pos..]).unwrap();
                assert_eq!(r.ty, TYPE_PAD);
                pos += r.len;
            }
            assert_eq!(pos, len);
        }
        assert_eq!(pad_len_for(1), 64);
        assert_eq!(pad_len_for(65), 72);
    }

    #[test]
    fn unknown_type_with_valid_framing_is_skippable() {
        let mut out = Vec::new();
        encode_record(&mut out, 0x77, 1, &[1; 32], b"future");
        let r = parse_record(&out).unwrap();
        assert_eq!(r.ty, 0x77);
    }

    proptest! {
        // JITKEY_FUZZ_CASES=1000000 for the long run.
        #![proptest_config(ProptestConfig {
            cases: std::env::var("JITKEY_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000),
            .. ProptestConfig::default()
        })]

        /// Arbitrary bytes never panic the parser, and anything accepted is internally consistent.
        #[test]
        fn parser_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Some(r) = parse_record(&buf) {
                prop_assert!(r.len <= buf.len() && r.len % 8 == 0);
            }
            let _ = Header::decode(&buf);
        }

        /// Garbage behind a valid magic and plausible length/type fields never panics and is
        /// never accepted (its checksum cannot match except by a 2^-64 accident).
        #[test]
        fn framed_garbage_is_refused(
            total in 0u32..400, ty in 0u8..6, vlen in 0u16..400,
            rest in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let mut buf = Vec::new();
            buf.extend_from_slice(&REC_MAGIC.to_le_bytes());
            buf.extend_from_slice(&(total & !7).to_le_bytes());
            buf.push(ty);
            buf.push(0);
            buf.extend_from_slice(&vlen.to_le_bytes());
            buf.extend_from_slice(&rest);
            prop_assert!(parse_record(&buf).is_none());
        }

        /// Flipping any bits of a valid record makes it invalid or leaves it as it was: a
        /// damaged record is never accepted with a different key or value.
        #[test]
        fn damaged_records_are_refused(
            value in proptest::collection::vec(any::<u8>(), 0..200),
            flips in proptest::collection::vec((any::<usize>(), 1u8..=255), 1..8),
            cut in any::<usize>(),
        ) {
            let mut rec = Vec::new();
            encode_record(&mut rec, TYPE_PUT, 42, &[0xAB; 32], &value);
            let orig = rec.clone();
            for (at, x) in &flips {
                let i = at % rec.len();
                rec[i] ^= x;
            }
            if rec != orig {
                prop_assert!(parse_record(&rec).is_none());
            }
            let cut = cut % orig.len();
            prop_assert!(parse_record(&orig[..cut]).is_none());
        }
    }
}
