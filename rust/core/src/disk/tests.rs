//! Unit tests of the disk index as a whole (one process, several instances); the multi-process,
//! crash and attack tests are in `tests/test_disk_*.py`.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::{flock, FlockOperation};

use super::api::{log_name, Access, DiskError, Mode, Options, LOCK_NAME};
use super::compact::now_unix_ns;
use super::format::{encode_record, Digest, Header, FORMAT_MAJOR, MAX_VALUE, TYPE_PUT};
use super::index::DiskIndex;

fn k(i: u32) -> Digest {
    crate::key::digest(&i.to_le_bytes())
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("jitkey-disk-{name}-{}-{}", std::process::id(), now_unix_ns()));
    fs::create_dir_all(&d).unwrap();
    fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    d
}

#[test]
fn put_get_reopen_delete_dedup() {
    let d = tmpdir("basic");
    let idx = DiskIndex::open(&d, Options::default());
    assert_eq!(idx.mode().0, Mode::ReadWrite, "{:?}", idx.mode());
    assert_eq!(idx.get(&k(1)).unwrap(), None);
    assert_eq!(idx.put(&k(1), b"one").unwrap().written, 1);
    assert_eq!(idx.put(&k(1), b"one").unwrap().deduped, 1);
    idx.put(&k(2), b"two").unwrap();
    idx.put(&k(2), b"TWO").unwrap();
    assert_eq!(idx.get(&k(2)).unwrap().as_deref(), Some(&b"TWO"[..]));
    let other = DiskIndex::open(&d, Options::default());
    assert_eq!(other.get(&k(1)).unwrap().as_deref(), Some(&b"one"[..]));
    assert_eq!(other.get(&k(2)).unwrap().as_deref(), Some(&b"TWO"[..]));
    assert!(other.delete(&k(1)).unwrap());
    // Hits see other processes' writes after a refresh (at most `refresh_interval` later).
    idx.refresh();
    assert_eq!(idx.get(&k(1)).unwrap(), None);
    assert_eq!(other.len().unwrap(), 1);
    assert!(matches!(idx.put(&k(3), &vec![0; MAX_VALUE + 1]), Err(DiskError::ValueTooLarge { .. })));
    idx.close();
    assert_eq!(idx.get(&k(2)), Err(DiskError::Closed));
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn compaction_and_eviction_keep_latest_values() {
    let d = tmpdir("compact");
    let opts = Options { max_bytes: 256 << 10, ..Options::default() };
    let idx = DiskIndex::open(&d, opts.clone());
    let reader = DiskIndex::open(&d, opts);
    let val = |i: u32| format!("value-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes();
    for i in 0..5000 {
        idx.put(&k(i), &val(i)).unwrap();
    }
    let s = idx.stats();
    assert!(s.compactions > 0 && s.evictions > 0, "{s:?}");
    assert!(s.file_bytes <= 256 << 10);
    // The newest entries survive; nothing returns a wrong value.
    let mut found = 0;
    for i in 0..5000 {
        if let Some(v) = reader.get(&k(i)).unwrap() {
            assert_eq!(v, val(i));
            found += 1;
        }
    }
    assert!(found > 1000, "found {found}");
    assert_eq!(reader.get(&k(4999)).unwrap(), Some(val(4999)));
    assert!(idx.clear().unwrap());
    reader.refresh();
    assert_eq!(reader.get(&k(4999)).unwrap(), None);
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn torn_tail_is_padded_and_never_served() {
    let d = tmpdir("torn");
    let idx = DiskIndex::open(&d, Options::default());
    idx.put(&k(1), b"one").unwrap();
    let path = idx.path().to_path_buf();
    let good = fs::metadata(&path).unwrap().len();
    // A dead writer's half record.
    let mut rec = Vec::new();
    encode_record(&mut rec, TYPE_PUT, 99, &k(2), b"two");
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&rec[..37], good).unwrap();
    let reader = DiskIndex::open(&d, Options::default());
    assert_eq!(reader.get(&k(2)).unwrap(), None);
    idx.put(&k(3), b"three").unwrap();
    assert_eq!(idx.stats().torn_tails_padded, 1);
    assert_eq!(reader.get(&k(3)).unwrap().as_deref(), Some(&b"three"[..]));
    assert_eq!(reader.get(&k(1)).unwrap().as_deref(), Some(&b"one"[..]));
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn lock_timeout_keeps_the_write_in_memory() {
    let d = tmpdir("locktimeout");
    let opts = Options { lock_timeout: Duration::from_millis(50), ..Options::default() };
    let idx = DiskIndex::open(&d, opts);
    assert_eq!(idx.mode().0, Mode::ReadWrite);
    // Another open file description holding the lock (as another process would).
    let holder = File::open(d.join(LOCK_NAME)).unwrap();
    flock(&holder, FlockOperation::LockExclusive).unwrap();
    let out = idx.put(&k(1), b"one").unwrap();
    assert_eq!(out.memory_only, 1);
    assert_eq!(idx.stats().lock_timeouts, 1);
    assert_eq!(idx.take_warnings().len(), 1);
    assert_eq!(idx.get(&k(1)).unwrap().as_deref(), Some(&b"one"[..]));
    flock(&holder, FlockOperation::Unlock).unwrap();
    idx.put(&k(2), b"two").unwrap();
    assert_eq!(DiskIndex::open(&d, Options::default()).get(&k(2)).unwrap().as_deref(), Some(&b"two"[..]));
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn shrink_under_mapping_is_a_miss_and_the_next_put_rewrites() {
    let d = tmpdir("shrink");
    let idx = DiskIndex::open(&d, Options::default());
    for i in 0..300 {
        idx.put(&k(i), &[7u8; 200]).unwrap();
    }
    assert_eq!(idx.get(&k(299)).unwrap().as_deref(), Some(&[7u8; 200][..]));
    OpenOptions::new().write(true).open(idx.path()).unwrap().set_len(0).unwrap();
    // The mapped pages are gone: a miss, not a SIGBUS.
    assert_eq!(idx.get(&k(299)).unwrap(), None);
    assert_eq!(idx.put(&k(1000), b"x").unwrap().memory_only, 0);
    assert!(idx.stats().shrinks_seen >= 1);
    let fresh = DiskIndex::open(&d, Options::default());
    assert_eq!(fresh.mode().0, Mode::ReadWrite);
    assert_eq!(fresh.get(&k(1000)).unwrap().as_deref(), Some(&b"x"[..]));
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn close_racing_writes_never_panics() {
    let d = tmpdir("closerace");
    for round in 0..20u32 {
        let idx = Arc::new(DiskIndex::open(&d, Options { max_bytes: 1 << 16, ..Options::default() }));
        let workers: Vec<_> = (0..2u32)
            .map(|t| {
                let idx = Arc::clone(&idx);
                std::thread::spawn(move || {
                    for i in 0..2000u32 {
                        let r = if i % 3 == 0 {
                            idx.compact().map(|_| ())
                        } else {
                            idx.put(&k(round * 100_000 + t * 10_000 + i), &[1u8; 3000]).map(|_| ())
                        };
                        if r == Err(DiskError::Closed) {
                            return;
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(2));
        idx.close();
        for w in workers {
            w.join().expect("no panic in a worker");
        }
    }
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn memory_mode_is_bounded() {
    let opts = Options { access: Access::Memory, max_bytes: 1 << 16, ..Options::default() };
    let idx = DiskIndex::open(Path::new("/nonexistent"), opts);
    assert_eq!(idx.mode().0, Mode::Memory);
    for i in 0..10_000 {
        idx.put(&k(i), &[7; 100]).unwrap();
    }
    assert!(idx.len().unwrap() < 1000);
    assert_eq!(idx.get(&k(9_999)).unwrap().as_deref(), Some(&[7u8; 100][..]));
}

#[test]
fn foreign_and_corrupt_files() {
    let d = tmpdir("foreign");
    fs::write(
        d.join(log_name()),
        b"\x89PNG\r\n\x1a\nnot an index at all, but long enough to be a header......",
    )
    .unwrap();
    let idx = DiskIndex::open(&d, Options::default());
    assert_eq!(idx.mode().0, Mode::Memory);
    assert_eq!(idx.take_warnings().len(), 1);
    idx.put(&k(1), b"x").unwrap();
    assert_eq!(idx.get(&k(1)).unwrap().as_deref(), Some(&b"x"[..]));
    assert!(fs::read(d.join(log_name())).unwrap().starts_with(b"\x89PNG"), "left untouched");
    // Our magic, damaged header: moved aside, fresh file.
    let mut h = Header::new(1, 1).encode().to_vec();
    h[30] ^= 0xff;
    fs::write(d.join(log_name()), &h).unwrap();
    let idx = DiskIndex::open(&d, Options::default());
    assert_eq!(idx.mode().0, Mode::ReadWrite);
    assert_eq!(idx.take_warnings().len(), 1);
    assert!(fs::read_dir(&d)
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains(".corrupt-")));
    // Another format major (a newer jitkey): left untouched, memory-only.
    let mut h = Header::new(1, 1);
    h.major = FORMAT_MAJOR + 1;
    fs::write(d.join(log_name()), h.encode()).unwrap();
    let idx = DiskIndex::open(&d, Options::default());
    assert_eq!(idx.mode().0, Mode::Memory);
    assert!(idx.mode().1.contains("format major 2"), "{:?}", idx.mode());
    assert_eq!(fs::read(d.join(log_name())).unwrap(), h.encode());
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn verify_reads_one_committed_snapshot_while_others_append() {
    use super::verify::{verify, VerifyError};
    let d = tmpdir("verify");
    assert!(matches!(verify(&d, Duration::from_secs(1)), Err(VerifyError::Missing)));
    let idx = DiskIndex::open(&d, Options::default());
    for i in 0..100 {
        idx.put(&k(i), &vec![i as u8; 300]).unwrap();
    }
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let d = d.clone();
            std::thread::spawn(move || {
                // Its own instance: another process, as far as the file and the lock go.
                let idx = DiskIndex::open(&d, Options::default());
                for i in (0..600).map(|i| 10_000 * (w + 1) + 2 * i) {
                    idx.put_many(&[(k(i), &[7u8; 900][..]), (k(i + 1), &[8u8; 40][..])]).unwrap();
                }
            })
        })
        .collect();
    let mut checks = 0;
    while checks == 0 || writers.iter().any(|w| !w.is_finished()) {
        let v = verify(&d, Duration::from_secs(5)).unwrap();
        assert!(v.locked);
        assert_eq!(v.unvalidated_bytes(), 0, "{v:?}");
        assert!(v.entries >= 100);
        checks += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    assert_eq!(verify(&d, Duration::from_secs(5)).unwrap().entries, 100 + 2 * 1200);
    fs::remove_dir_all(&d).unwrap();
}

#[test]
fn verify_reports_a_torn_tail_and_an_unlocked_snapshot() {
    use super::verify::verify;
    let d = tmpdir("verify-torn");
    let idx = DiskIndex::open(&d, Options::default());
    idx.put(&k(1), b"one").unwrap();
    let v = verify(&d, Duration::from_secs(1)).unwrap();
    assert_eq!((v.entries, v.records, v.unvalidated_bytes(), v.locked), (1, 1, 0, true));
    let path = idx.path().to_path_buf();
    let good = fs::metadata(&path).unwrap().len();
    let mut rec = Vec::new();
    encode_record(&mut rec, TYPE_PUT, 99, &k(2), b"two");
    OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&rec[..37], good).unwrap();
    let v = verify(&d, Duration::from_secs(1)).unwrap();
    assert_eq!((v.valid_bytes, v.unvalidated_bytes(), v.locked), (good, 37, true));
    // A writer holding the lock past the wait: the snapshot is taken unlocked, and says so.
    let holder = File::open(d.join(LOCK_NAME)).unwrap();
    flock(&holder, FlockOperation::LockExclusive).unwrap();
    let v = verify(&d, Duration::from_millis(20)).unwrap();
    assert!(!v.locked);
    fs::remove_dir_all(&d).unwrap();
}
