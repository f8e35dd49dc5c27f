//! Process-wide settings for the command-line programs (`sparkling`, `sparkling-train`); the
//! library itself changes no process state. (Interrupt handling is [`crate::fsio`]'s.)

/// Keep freed memory in the process instead of handing it back to the OS at once.
///
/// glibc serves allocations above a threshold (128 KiB at start, raised as such blocks are
/// freed, up to 32 MiB) with their own `mmap` and returns freed heap tops above another one. The
/// decode loop allocates and frees megabyte-sized buffers every step (logits of a verify or a
/// batch: rows × vocabulary × 4 bytes; activations, attention scratch), so each step paid fresh
/// page faults and `munmap`s in the kernel. With both thresholds at 256 MiB the buffers are
/// reused from the heap, which matters most for batch decoding; peak RSS is unchanged
/// (BENCHMARKS §25). Linux with glibc only (`mallopt`); elsewhere nothing. Call it once, first thing in `main`.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const THRESHOLD: libc::c_int = 256 << 20;
        // SAFETY: `mallopt` only sets allocator parameters; it is called before any other
        // thread exists. A refused value (return 0) leaves glibc's defaults: nothing to undo.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
        }
    }
}
