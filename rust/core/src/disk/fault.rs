//! Crash points for the crash tests: an armed point makes the process SIGKILL itself there, so a
//! test can kill a writer mid-append or a compactor between any two steps of its rename protocol.
//!
//! Invariant: none of this exists in a release build. The points are named at their call sites in
//! `append` and `compact` in every build, but without the cargo feature `fault-injection`
//! [`CrashPoints`] holds nothing and its `hit` and `due` are no-ops the compiler removes, and
//! neither [`Fault`] nor `DiskIndex::arm_fault` is exported. `make build`/`make test` turn the
//! feature on (the Python crash tests need `DiskIndex._arm_fault`); the wheel and sdist leave it
//! off. The armed point lives in the writer's state, so only the lock holder passes one.

/// A point where an armed process kills itself (see
/// [`DiskIndex::arm_fault`](super::DiskIndex::arm_fault)): the crash tests' way to stop a writer
/// at an exact step (the kill-during-append and kill-during-compaction tests in
/// `tests/test_disk_processes.py` and `tests/test_disk_torture.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Write the first half of an append batch, then die (a torn record).
    SplitWrite,
    /// Compaction created its temp file (still empty), then died.
    CompactTmpCreated,
    /// Compaction wrote half of the live entries to its temp file, then died.
    CompactMidWrite,
    /// Compaction fsynced its complete temp file, then died before the rename.
    CompactAfterFsync,
    /// Compaction renamed the new file over the live one, then died before reopening it.
    CompactAfterRename,
    /// Compaction finished, then died still holding the file lock.
    CompactBeforeUnlock,
}

#[cfg(feature = "fault-injection")]
impl Fault {
    /// The point named `name` (`split_write`, `compact_tmp_created`, `compact_mid_write`,
    /// `compact_after_fsync`, `compact_after_rename`, `compact_before_unlock`), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "split_write" => Fault::SplitWrite,
            "compact_tmp_created" => Fault::CompactTmpCreated,
            "compact_mid_write" => Fault::CompactMidWrite,
            "compact_after_fsync" => Fault::CompactAfterFsync,
            "compact_after_rename" => Fault::CompactAfterRename,
            "compact_before_unlock" => Fault::CompactBeforeUnlock,
            _ => return None,
        })
    }
}

/// The armed crash point, if any, and how many more passes it lets by.
#[derive(Default)]
pub(super) struct CrashPoints {
    #[cfg(feature = "fault-injection")]
    armed: Option<(Fault, u32)>,
}

#[cfg(feature = "fault-injection")]
impl CrashPoints {
    /// Arms `fault` to fire on its `after`-th pass (0 = the next one).
    pub(super) fn arm(&mut self, fault: Fault, after: u32) {
        self.armed = Some((fault, after));
    }

    /// Whether `at` is armed to fire on this very pass (the caller then does the half of its work
    /// the crash should leave behind before calling [`hit`](Self::hit)).
    pub(super) fn due(&self, at: Fault) -> bool {
        matches!(self.armed, Some((f, 0)) if f == at)
    }

    /// Passes crash point `at`: dies here if it is armed and due, else counts the pass down.
    pub(super) fn hit(&mut self, at: Fault) {
        if let Some((f, n)) = self.armed {
            if f == at {
                if n == 0 {
                    let _ = rustix::process::kill_process(
                        rustix::process::getpid(),
                        rustix::process::Signal::KILL,
                    );
                    // SIGKILL cannot be caught; if kill failed, abort is the next best crash.
                    std::process::abort();
                }
                self.armed = Some((f, n - 1));
            }
        }
    }
}

#[cfg(not(feature = "fault-injection"))]
impl CrashPoints {
    /// Without the `fault-injection` feature no point is ever armed.
    #[inline(always)]
    pub(super) fn due(&self, _at: Fault) -> bool {
        false
    }

    /// Without the `fault-injection` feature passing a crash point does nothing.
    #[inline(always)]
    pub(super) fn hit(&mut self, _at: Fault) {}
}

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::Fault;

    #[test]
    fn every_point_has_a_name() {
        for (name, f) in [
            ("split_write", Fault::SplitWrite),
            ("compact_tmp_created", Fault::CompactTmpCreated),
            ("compact_mid_write", Fault::CompactMidWrite),
            ("compact_after_fsync", Fault::CompactAfterFsync),
            ("compact_after_rename", Fault::CompactAfterRename),
            ("compact_before_unlock", Fault::CompactBeforeUnlock),
        ] {
            assert_eq!(Fault::from_name(name), Some(f));
        }
        assert_eq!(Fault::from_name("nope"), None);
    }
}
