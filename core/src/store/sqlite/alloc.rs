//! SQLite's own memory, routed through the process's global allocator
//! (mimalloc in the `fastack` binary) without SQLite's allocation
//! statistics.
//!
//! By default SQLite calls the C library's `malloc` and takes a global
//! mutex on every allocation to keep `sqlite3_memory_used` current. Under
//! load the embedded store's connection threads spent about 8 % of the
//! node's CPU there (glibc's `malloc`, `free`, `malloc_consolidate` and
//! that mutex; benches/HISTORY.md). Nothing in fastack reads SQLite's
//! memory statistics or sets a soft heap limit, which are all the
//! statistics serve.
//!
//! [`install`] must run before any SQLite connection exists: SQLite takes
//! its allocator when it initialises, and its configuration calls are not
//! thread-safe. `fastack` calls it first thing in `main`; a process that
//! does not (the tests) keeps SQLite's defaults.

use std::{
    alloc::{Layout, alloc, dealloc, realloc},
    ffi::{c_int, c_void},
    ptr,
};

use rusqlite::ffi;

/// Each block starts with its size (what `xSize` answers), as SQLite's own
/// allocator does where the C library cannot tell a block's size. Eight
/// bytes keep the block 8-byte aligned, which is all SQLite asks.
const HEADER: usize = 8;
const ALIGN: usize = 8;

fn layout(size: usize) -> Option<Layout> {
    Layout::from_size_align(size.checked_add(HEADER)?, ALIGN).ok()
}

/// The block's start from the pointer SQLite holds.
///
/// # Safety
/// `p` came from [`x_malloc`] or [`x_realloc`] and was not freed.
unsafe fn base(p: *mut c_void) -> (*mut u8, usize) {
    // SAFETY: the caller's pointer is HEADER bytes into a live block
    // whose first HEADER bytes hold its size.
    unsafe {
        let base = p.cast::<u8>().sub(HEADER);
        (base, base.cast::<u64>().read() as usize)
    }
}

unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
    let Some(layout) = usize::try_from(n).ok().and_then(layout) else {
        return ptr::null_mut();
    };
    // SAFETY: the layout is never zero-sized (it includes the header).
    unsafe {
        let base = alloc(layout);
        if base.is_null() {
            return ptr::null_mut();
        }
        base.cast::<u64>().write(n as u64);
        base.add(HEADER).cast()
    }
}

unsafe extern "C" fn x_free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: SQLite frees only what this allocator returned, once.
    unsafe {
        let (base, size) = base(p);
        if let Some(layout) = layout(size) {
            dealloc(base, layout);
        }
    }
}

unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
    if p.is_null() {
        // SAFETY: as for `x_malloc`.
        return unsafe { x_malloc(n) };
    }
    let Some(new_size) = usize::try_from(n).ok().filter(|n| layout(*n).is_some()) else {
        return ptr::null_mut();
    };
    // SAFETY: `p` is a live block of this allocator; on failure it stays
    // valid, as SQLite expects of `xRealloc`.
    unsafe {
        let (base, size) = base(p);
        let Some(old) = layout(size) else {
            return ptr::null_mut();
        };
        let moved = realloc(base, old, new_size + HEADER);
        if moved.is_null() {
            return ptr::null_mut();
        }
        moved.cast::<u64>().write(new_size as u64);
        moved.add(HEADER).cast()
    }
}

unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
    if p.is_null() {
        return 0;
    }
    // SAFETY: as for `x_free`.
    unsafe { base(p).1 as c_int }
}

unsafe extern "C" fn x_roundup(n: c_int) -> c_int {
    n.saturating_add(ALIGN as c_int - 1) & !(ALIGN as c_int - 1)
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

/// Installs the allocator and turns SQLite's memory statistics off.
/// Returns whether SQLite took both (it refuses once it is initialised,
/// and then keeps its defaults, which are equally correct).
///
/// # Safety
/// No other thread may be using SQLite while this runs, and no SQLite
/// connection may have been opened before it in this process.
pub unsafe fn install() -> bool {
    let methods = ffi::sqlite3_mem_methods {
        xMalloc: Some(x_malloc),
        xFree: Some(x_free),
        xRealloc: Some(x_realloc),
        xSize: Some(x_size),
        xRoundup: Some(x_roundup),
        xInit: Some(x_init),
        xShutdown: Some(x_shutdown),
        pAppData: ptr::null_mut(),
    };
    // SAFETY: the caller guarantees SQLite is not initialised and not in
    // use; SQLite copies `methods` before the call returns.
    unsafe {
        let stats = ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int);
        let malloc = ffi::sqlite3_config(
            ffi::SQLITE_CONFIG_MALLOC,
            &methods as *const ffi::sqlite3_mem_methods,
        );
        stats == ffi::SQLITE_OK && malloc == ffi::SQLITE_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_size_and_content_across_realloc() {
        // SAFETY: the blocks are this allocator's own, freed once.
        unsafe {
            let p = x_malloc(13);
            assert!(!p.is_null());
            assert_eq!(p as usize % ALIGN, 0);
            assert_eq!(x_size(p), 13);
            p.cast::<u8>().copy_from(b"hello, sqlite".as_ptr(), 13);
            let q = x_realloc(p, 4096);
            assert_eq!(x_size(q), 4096);
            assert_eq!(
                std::slice::from_raw_parts(q.cast::<u8>(), 13),
                b"hello, sqlite"
            );
            let r = x_realloc(q, 5);
            assert_eq!(x_size(r), 5);
            assert_eq!(std::slice::from_raw_parts(r.cast::<u8>(), 5), b"hello");
            x_free(r);
            x_free(ptr::null_mut());
            assert_eq!(x_size(ptr::null_mut()), 0);
            assert_eq!(x_roundup(13), 16);
            assert_eq!(x_roundup(16), 16);
            assert!(x_malloc(-1).is_null());
        }
    }
}
