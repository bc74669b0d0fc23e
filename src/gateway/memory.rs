//! Memory a config load leaves behind, given back to the OS at once.
//!
//! Reading a config of a million keys allocates several times what the finished key table
//! keeps (the file's text, each key's fields, the duplicate check), and a reload frees a whole
//! config beside it. jemalloc keeps freed pages to reuse and returns them only as it decays
//! them, which an idle process never gets to: without a purge, the resident set would stay
//! at the load's peak until traffic came. One purge after a load costs a few milliseconds.

/// Returns the pages of freed memory in every jemalloc arena to the OS now.
pub fn release_freed() {
    #[cfg(not(target_env = "msvc"))]
    {
        // `arena.<MALLCTL_ARENAS_ALL>.purge` (4096 = MALLCTL_ARENAS_ALL): every arena.
        const PURGE_ALL: &[u8] = b"arena.4096.purge\0";
        // SAFETY: the name is NUL-terminated, and a purge neither reads nor writes a value:
        // jemalloc requires the old and new value pointers null and the lengths 0, as passed.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                PURGE_ALL.as_ptr().cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 {
            tracing::debug!(rc, "jemalloc purge refused");
        }
    }
}
