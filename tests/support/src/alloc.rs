//! A counting global allocator for the binaries that measure memory (a bench, the allocator's
//! own test): each declares `#[global_allocator] static A: Counting = Counting;` and reads what
//! is live, and the most that was, here.
#![allow(unsafe_code)] // a global allocator

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Counts the bytes live, and the most live since the last [`reset_peak`].
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Bytes live now.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most bytes live since the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts the peak again from what is live now.
pub fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}
