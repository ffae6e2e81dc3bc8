//! Allocator settings for long-running processes, and the measure of a
//! process's heap.
//!
//! `denorm` allocates through mimalloc (see `main.rs`). Two of its defaults
//! made a worker's resident heap grow with the size of the merges tantivy
//! ran, long after the memory was freed: freed pages were returned to the
//! system only after a delay (1 s in mimalloc v3, which the `mimalloc`
//! crate builds, times 10 for arenas), and, with
//! transparent huge pages, in 2 MiB units, so pages freed by a merge
//! thread stayed resident while the next merge allocated new ones. With
//! both changed, a shard's peak heap while renaming a directory of
//! 1,000,000 files fell from 173 to 85 MB (from 102 to 53 MB for 100,000
//! files); bounding the merges (`index::embedded`) then took it to 58 MB.
//! docs/benchmark.md has the figures and the throughput.

use std::os::raw::c_int;

/// `mi_option_purge_delay` in mimalloc's option enum (the same index in
/// its v2 and v3 headers; the test below checks it against the library
/// through v3's default).
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// Returns freed memory to the system at once and keeps transparent huge
/// pages off this process's heap, unless the operator chose otherwise
/// through mimalloc's own `MIMALLOC_PURGE_DELAY` / `MIMALLOC_ALLOW_THP`.
/// Call first thing in `main`, before other threads exist (mimalloc's
/// option setters are not thread-safe).
pub fn tune() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: a plain setter of mimalloc's option table; called while
        // the process is single-threaded.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // What mimalloc itself does for MIMALLOC_ALLOW_THP=0 at its start,
        // which has passed by the time `main` runs. Failure (an old kernel)
        // only leaves the default in place.
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// This process's anonymous resident memory (`RssAnon`, its heap), in
/// KiB; 0 where `/proc` does not tell.
pub fn anon_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines().find(|l| l.starts_with("RssAnon:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// Runs `f`, sampling [`anon_kib`] every 10 ms meanwhile: what `f`
/// returned, the value before it and the peak (the measurements of
/// `examples/fanout_memory.rs` and of the verify's memory test).
pub fn peak_anon_during<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let before = anon_kib();
    let peak = Arc::new(AtomicU64::new(before));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(anon_kib(), Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let out = f();
    peak.fetch_max(anon_kib(), Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("the memory sampler");
    (out, before, peak.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tune_sets_an_immediate_purge_and_turns_transparent_huge_pages_off() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() || std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            eprintln!("skipped: mimalloc options set in the environment");
            return;
        }
        // The index names the option: v3's default purge delay is 1000 ms.
        // SAFETY: a getter of mimalloc's option table.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, 1000);
        tune();
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }, 0);
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        if let Some(line) = status.lines().find(|l| l.starts_with("THP_enabled:")) {
            assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
        }
    }
}
