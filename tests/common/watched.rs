//! An allocator that watches the bytes held and the largest single request, for the tests that
//! bound what reading untrusted input allocates (checkpoint_fuzz, line_memory). A test binary
//! installs it with `#[global_allocator] static GLOBAL: Watched = Watched;`; without that, the
//! figures stay zero.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The system allocator, noting the largest single request and the peak of the bytes held.
pub struct Watched;

static LARGEST_ALLOC: AtomicUsize = AtomicUsize::new(0);
static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK_HELD: AtomicUsize = AtomicUsize::new(0);

impl Watched {
    fn took(size: usize) {
        LARGEST_ALLOC.fetch_max(size, Ordering::Relaxed);
        let held = HELD.fetch_add(size, Ordering::Relaxed) + size;
        PEAK_HELD.fetch_max(held, Ordering::Relaxed);
    }
    fn gave(size: usize) {
        HELD.fetch_sub(size, Ordering::Relaxed);
    }
}

// SAFETY: forwards to `System` unchanged.
unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::took(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::took(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        Self::gave(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        Self::took(new_size);
        Self::gave(layout.size());
        System.realloc(ptr, layout, new_size)
    }
}

/// What one watched call allocated.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// The most bytes held at once above what was held when the call began (other tests'
    /// threads allocate too, a little).
    pub peak_held: usize,
    /// The largest single allocation.
    pub largest: usize,
}

/// The watch is process-wide: calls are measured one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f`, measuring what it allocates.
pub fn watch<T>(f: impl FnOnce() -> T) -> (T, Usage) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    LARGEST_ALLOC.store(0, Ordering::Relaxed);
    let held_before = HELD.load(Ordering::Relaxed);
    PEAK_HELD.store(held_before, Ordering::Relaxed);
    let out = f();
    let usage = Usage {
        peak_held: PEAK_HELD
            .load(Ordering::Relaxed)
            .saturating_sub(held_before),
        largest: LARGEST_ALLOC.load(Ordering::Relaxed),
    };
    (out, usage)
}
