//! SQLite's own page cache (`pcache1`), wrapped so that a commit does not
//! walk the whole cache for nothing.
//!
//! At the end of every write transaction the pager drops cached pages
//! past the database's end (`xTruncate(dbSize + 1)`). `pcache1` skips that
//! when no page it ever held lies past the limit, by the highest key it has
//! seen. But a B-tree split that puts its new pages in page-number order
//! (`balance_nonroot`) swaps two pages through the locking page's number
//! (1 GiB / page size + 1, never a real page) as a temporary key; from then
//! on `pcache1` believes a page that high may be cached, and each commit's
//! truncate walks every hash bucket and cached page. Under `track` load
//! that was 3–4 % of the server's samples (benches/HISTORY.md, "SQLite's
//! page cache walked on every commit"), on the inbox writer and on the main
//! writer, whose random-key inserts split pages taken from the free list.
//!
//! The wrapper keeps its own bound — the highest key it handed out or moved
//! a page to, and whether the temporary key holds a page right now — and
//! passes a truncate on only when some page can lie past the limit. Every
//! other call goes straight to `pcache1`, so what is cached and when it is
//! evicted does not change.
//!
//! [`install`] must run before any SQLite connection exists (as
//! [`super::alloc::install`]); a process that does not call it
//! keeps `pcache1` unwrapped.

use std::{
    cell::Cell,
    ffi::{c_int, c_uint, c_void},
    mem::MaybeUninit,
    ptr,
    sync::OnceLock,
};

use rusqlite::ffi;

/// SQLite's `PENDING_BYTE`: the page holding it is never a database page.
const PENDING_BYTE: u32 = 0x4000_0000;

/// Which keys of one cache can hold a page. Plain logic, kept apart from
/// the FFI so it is tested on its own. Plain cells, not atomics: `holds`
/// runs on every page fetch, and SQLite uses a cache from one connection
/// at a time.
#[derive(Debug)]
struct Bound {
    /// No page other than the locking page's has a key above this.
    max: Cell<u32>,
    /// The locking page's key, the temporary key of a page swap.
    lock_key: u32,
    /// A page may be cached under `lock_key`.
    lock_key_used: Cell<bool>,
}

impl Bound {
    fn new(page_size: u32) -> Self {
        Bound {
            max: Cell::new(0),
            lock_key: PENDING_BYTE / page_size.max(1) + 1,
            lock_key_used: Cell::new(false),
        }
    }

    /// A page is now cached under `key` (fetched or moved there).
    fn holds(&self, key: u32) {
        if key == self.lock_key {
            self.lock_key_used.set(true);
        } else if key > self.max.get() {
            self.max.set(key);
        }
    }

    /// The page under `key` moved away from it.
    fn left(&self, key: u32) {
        if key == self.lock_key {
            self.lock_key_used.set(false);
        }
    }

    /// Whether a page with a key of `limit` or more can be cached.
    fn any_from(&self, limit: u32) -> bool {
        self.max.get() >= limit || (self.lock_key_used.get() && self.lock_key >= limit)
    }

    /// Every page with a key of `limit` or more was dropped.
    fn truncated(&self, limit: u32) {
        self.max.set(self.max.get().min(limit.saturating_sub(1)));
        if self.lock_key >= limit {
            self.lock_key_used.set(false);
        }
    }
}

/// One wrapped cache: what SQLite holds as its `sqlite3_pcache *`.
struct Cache {
    inner: *mut ffi::sqlite3_pcache,
    bound: Bound,
}

/// `pcache1`'s methods, as SQLite had them before [`install`].
struct Inner(ffi::sqlite3_pcache_methods2);

// SAFETY: the methods are plain C functions and `pArg` is SQLite's own
// global, which SQLite itself shares between threads.
unsafe impl Send for Inner {}
// SAFETY: as for `Send`; the table is never written after `install`.
unsafe impl Sync for Inner {}

static INNER: OnceLock<Inner> = OnceLock::new();

/// `pcache1`'s methods. Set before SQLite can call any method below; a
/// table of `None`s stands in should that ever not hold, so no method
/// panics across the FFI boundary.
fn inner() -> &'static ffi::sqlite3_pcache_methods2 {
    static NONE: Inner = Inner(ffi::sqlite3_pcache_methods2 {
        iVersion: 0,
        pArg: ptr::null_mut(),
        xInit: None,
        xShutdown: None,
        xCreate: None,
        xCachesize: None,
        xPagecount: None,
        xFetch: None,
        xUnpin: None,
        xRekey: None,
        xTruncate: None,
        xDestroy: None,
        xShrink: None,
    });
    &INNER.get().unwrap_or(&NONE).0
}

/// # Safety (for every method below)
/// `p` is a cache [`x_create`] returned and [`x_destroy`] has not freed;
/// SQLite calls a cache's methods from one connection at a time.
unsafe fn cache<'a>(p: *mut ffi::sqlite3_pcache) -> &'a Cache {
    // SAFETY: see above.
    unsafe { &*p.cast::<Cache>() }
}

unsafe extern "C" fn x_init(arg: *mut c_void) -> c_int {
    // SAFETY: forwarded as SQLite would have called it.
    unsafe { inner().xInit.map_or(ffi::SQLITE_OK, |f| f(arg)) }
}

unsafe extern "C" fn x_shutdown(arg: *mut c_void) {
    if let Some(f) = inner().xShutdown {
        // SAFETY: forwarded as SQLite would have called it.
        unsafe { f(arg) }
    }
}

unsafe extern "C" fn x_create(
    page_size: c_int,
    extra: c_int,
    purgeable: c_int,
) -> *mut ffi::sqlite3_pcache {
    let Some(create) = inner().xCreate else {
        return ptr::null_mut();
    };
    // SAFETY: forwarded as SQLite would have called it.
    let p = unsafe { create(page_size, extra, purgeable) };
    if p.is_null() {
        return p;
    }
    let cache = Box::new(Cache {
        inner: p,
        bound: Bound::new(u32::try_from(page_size).unwrap_or(1)),
    });
    Box::into_raw(cache).cast()
}

unsafe extern "C" fn x_cachesize(p: *mut ffi::sqlite3_pcache, n: c_int) {
    // SAFETY: `p` is ours (see `cache`); forwarded to its inner cache.
    unsafe {
        if let Some(f) = inner().xCachesize {
            f(cache(p).inner, n)
        }
    }
}

unsafe extern "C" fn x_pagecount(p: *mut ffi::sqlite3_pcache) -> c_int {
    // SAFETY: as for `x_cachesize`.
    unsafe { inner().xPagecount.map_or(0, |f| f(cache(p).inner)) }
}

unsafe extern "C" fn x_fetch(
    p: *mut ffi::sqlite3_pcache,
    key: c_uint,
    create: c_int,
) -> *mut ffi::sqlite3_pcache_page {
    // SAFETY: as for `x_cachesize`.
    unsafe {
        let c = cache(p);
        let Some(fetch) = inner().xFetch else {
            return ptr::null_mut();
        };
        let page = fetch(c.inner, key, create);
        if !page.is_null() {
            c.bound.holds(key);
        }
        page
    }
}

unsafe extern "C" fn x_unpin(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    discard: c_int,
) {
    // SAFETY: as for `x_cachesize`. A discarded page only makes the bound
    // looser, never wrong.
    unsafe {
        if let Some(f) = inner().xUnpin {
            f(cache(p).inner, page, discard)
        }
    }
}

unsafe extern "C" fn x_rekey(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    old: c_uint,
    new: c_uint,
) {
    // SAFETY: as for `x_cachesize`.
    unsafe {
        let c = cache(p);
        if let Some(f) = inner().xRekey {
            f(c.inner, page, old, new);
        }
        c.bound.left(old);
        c.bound.holds(new);
    }
}

unsafe extern "C" fn x_truncate(p: *mut ffi::sqlite3_pcache, limit: c_uint) {
    // SAFETY: as for `x_cachesize`.
    unsafe {
        let c = cache(p);
        if !c.bound.any_from(limit) {
            return;
        }
        if let Some(f) = inner().xTruncate {
            f(c.inner, limit);
        }
        c.bound.truncated(limit);
    }
}

unsafe extern "C" fn x_destroy(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: `p` is ours and SQLite destroys it once, last.
    unsafe {
        let c = Box::from_raw(p.cast::<Cache>());
        if let Some(f) = inner().xDestroy {
            f(c.inner);
        }
    }
}

unsafe extern "C" fn x_shrink(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: as for `x_cachesize`.
    unsafe {
        if let Some(f) = inner().xShrink {
            f(cache(p).inner)
        }
    }
}

/// Wraps SQLite's page cache. Returns whether SQLite took the wrapper (it
/// refuses once it is initialised, and keeps `pcache1` as it is).
///
/// # Safety
/// No other thread may be using SQLite while this runs, and no SQLite
/// connection may have been opened before it in this process.
pub unsafe fn install() -> bool {
    let mut current = MaybeUninit::<ffi::sqlite3_pcache_methods2>::zeroed();
    // SAFETY: the caller guarantees SQLite is not initialised and not in
    // use; SQLite fills `current` with its default (pcache1) and copies
    // `ours` before the second call returns.
    unsafe {
        if ffi::sqlite3_config(ffi::SQLITE_CONFIG_GETPCACHE2, current.as_mut_ptr())
            != ffi::SQLITE_OK
        {
            return false;
        }
        let current = current.assume_init();
        if INNER.set(Inner(current)).is_err() {
            return false;
        }
        let ours = ffi::sqlite3_pcache_methods2 {
            iVersion: current.iVersion,
            pArg: current.pArg,
            xInit: Some(x_init),
            xShutdown: Some(x_shutdown),
            xCreate: Some(x_create),
            xCachesize: Some(x_cachesize),
            xPagecount: Some(x_pagecount),
            xFetch: Some(x_fetch),
            xUnpin: Some(x_unpin),
            xRekey: Some(x_rekey),
            xTruncate: Some(x_truncate),
            xDestroy: Some(x_destroy),
            xShrink: current.xShrink.map(|_| x_shrink as _),
        };
        ffi::sqlite3_config(
            ffi::SQLITE_CONFIG_PCACHE2,
            &ours as *const ffi::sqlite3_pcache_methods2,
        ) == ffi::SQLITE_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 KiB pages: the locking page is 262,145.
    const LOCK: u32 = PENDING_BYTE / 4096 + 1;

    #[test]
    fn a_commit_after_a_page_swap_has_nothing_past_the_end() {
        let b = Bound::new(4096);
        for key in 1..=2_000 {
            b.holds(key);
        }
        assert!(b.any_from(2_000), "page 2000 is cached");
        assert!(!b.any_from(2_001));
        // balance_nonroot: A → temporary, B → A's number, temporary → B's.
        b.left(1_500);
        b.holds(LOCK);
        assert!(b.any_from(2_001), "the temporary key holds a page");
        b.left(1_900);
        b.holds(1_500);
        b.left(LOCK);
        b.holds(1_900);
        assert!(
            !b.any_from(2_001),
            "the swap is over: nothing lies past the end"
        );
    }

    #[test]
    fn a_truncate_lowers_the_bound_and_growth_raises_it() {
        let b = Bound::new(4096);
        for key in 1..=100 {
            b.holds(key);
        }
        b.truncated(51);
        assert!(!b.any_from(51));
        assert!(b.any_from(50));
        b.holds(51);
        assert!(b.any_from(51));
        b.truncated(0);
        assert!(!b.any_from(1));
    }

    #[test]
    fn a_page_left_under_the_temporary_key_is_always_truncated() {
        let b = Bound::new(4096);
        b.holds(10);
        b.holds(LOCK);
        assert!(b.any_from(11));
        assert!(b.any_from(LOCK));
        assert!(!b.any_from(LOCK + 1));
        b.truncated(11);
        assert!(!b.any_from(11), "the truncate dropped it");
    }

    #[test]
    fn the_lock_key_follows_the_page_size() {
        assert_eq!(Bound::new(4096).lock_key, LOCK);
        assert_eq!(Bound::new(65_536).lock_key, 16_385);
        assert_eq!(Bound::new(512).lock_key, 2_097_153);
    }
}
