//! What decides the mode an index runs in (the checks of the directory and its filesystem, which
//! the index runs when it opens), and how every index file is opened.
//!
//! Invariant: nothing another user could have planted is trusted. The directory must be this
//! user's own and not writable by others (a sticky shared one such as `/tmp` only when the caller
//! named it, and then every file in it must still be ours); every index file is opened without
//! following a symlink or blocking on a FIFO, and checked on its descriptor (regular file, owned by
//! this user), so nothing can be swapped in between the check and the use; a filesystem where
//! `flock` and mmap are not coherent between hosts (NFS, SMB, FUSE, ...) is read-only. Any doubt
//! picks a weaker mode with a reason ([`Mode::ReadOnly`](super::Mode::ReadOnly),
//! [`Mode::Memory`](super::Mode::Memory)), never an error.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::api::{Access, Options};

/// Opens `path` the way every index file is opened: without following a symlink, without
/// blocking (a FIFO planted under our name), and accepted only if the descriptor is a regular
/// file owned by this user (checked on the opened descriptor, so nothing can be swapped in
/// between the check and the use).
pub(super) fn open_trusted(path: &Path, write: bool, create: bool) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(write);
    if create {
        o.create(true).truncate(false).mode(0o600);
    }
    o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    let f = o.open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(io::Error::other(format!("{} is not a regular file; not trusting it", path.display())));
    }
    let euid = rustix::process::geteuid().as_raw();
    if m.uid() != euid {
        return Err(io::Error::other(format!(
            "{} is owned by uid {}, not by this user (uid {euid}); not trusting it",
            path.display(),
            m.uid()
        )));
    }
    Ok(f)
}

/// The name of `dir`'s filesystem if it is a network or FUSE one, where `flock` and mmap are
/// not coherent between hosts (two hosts could both "hold" the lock and append at one offset).
#[cfg(target_os = "linux")]
fn network_fs(dir: &Path) -> Option<&'static str> {
    let t = rustix::fs::statfs(dir).ok()?.f_type as i64 & 0xffff_ffff;
    Some(match t {
        0x6969 => "NFS",
        0xFF53_4D42 => "CIFS",
        0xFE53_4D42 => "SMB2",
        0x517B => "SMB",
        0x6573_5546 => "FUSE",
        0x0BD0_0BD0 => "Lustre",
        0x4750_4653 => "GPFS",
        0x0102_1997 => "9p",
        0x00C3_6400 => "Ceph",
        _ => return None,
    })
}

#[cfg(not(target_os = "linux"))]
fn network_fs(_dir: &Path) -> Option<&'static str> {
    None
}

/// Checks the directory itself, creating it if needed (this user's own, not writable by others
/// unless sticky and named by the caller) and whether its filesystem keeps `flock` and mmap
/// coherent. `Ok((writable, why_not))`: whether writing may be tried, and why not; `Err(reason)`:
/// the directory is not to be used at all (memory-only).
pub(super) fn check_dir(dir: &Path, opts: &Options) -> Result<(bool, String), String> {
    if opts.access == Access::Memory {
        return Err("disk index disabled (access=memory, e.g. JITKEY_DISK_CACHE=0)".into());
    }
    if let Err(e) = fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        return Err(format!("cannot create {}: {e}", dir.display()));
    }
    let meta = fs::metadata(dir).map_err(|e| format!("cannot stat {}: {e}", dir.display()))?;
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(format!(
            "{} is owned by uid {}, not by this user (uid {euid}); not trusting its contents",
            dir.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
        return Err(format!(
            "{} is group- or world-writable (mode {:o}) without the sticky bit; not trusting its contents",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    if meta.mode() & 0o022 != 0 && !opts.trust_sticky_dir {
        return Err(format!(
            "{} is group- or world-writable (mode {:o}, sticky): other users can plant files there; \
             not trusting its contents (name the directory explicitly to use it)",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    let mut rw = opts.access == Access::ReadWrite;
    let mut ro_reason = if rw { String::new() } else { "read-only requested".to_owned() };
    if let Some(fs_name) = network_fs(dir).filter(|_| rw) {
        rw = false;
        ro_reason = format!(
            "{} is on a network filesystem ({fs_name}); flock/mmap are not coherent there",
            dir.display()
        );
    }
    Ok((rw, ro_reason))
}
