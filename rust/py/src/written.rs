//! The written prefix of an inline `MaybeUninit` array, as the slice it is: the one place the
//! inline buffers of the hot path (`ArgSlots`, the packed `Slots`, the launch `Opts`) make that cast.

use std::mem::MaybeUninit;

/// `s` as `&[T]`.
///
/// # Safety
/// Every element of `s` was written.
#[inline(always)]
pub(crate) unsafe fn written<T>(s: &[MaybeUninit<T>]) -> &[T] {
    // SAFETY: the caller's contract; MaybeUninit<T> has T's layout.
    unsafe { &*(std::ptr::from_ref(s) as *const [T]) }
}

/// `s` as `&mut [T]`.
///
/// # Safety
/// Every element of `s` was written.
#[inline(always)]
pub(crate) unsafe fn written_mut<T>(s: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: the caller's contract; MaybeUninit<T> has T's layout.
    unsafe { &mut *(std::ptr::from_mut(s) as *mut [T]) }
}
