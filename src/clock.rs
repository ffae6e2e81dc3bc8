//! The wall clock, in one place: what the pipeline stamps and compares
//! (commands' `issued_at`, dead letters, tombstones' expiry, lag in
//! seconds, health's timestamps). A clock before 1970 reads as 0.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn now_millis() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    #[test]
    fn milliseconds_and_seconds_agree() {
        let (ms, s) = (super::now_millis(), super::now_secs());
        assert!(ms > 1_600_000_000_000, "{ms}");
        assert!((ms / 1000).abs_diff(s as i64) <= 1, "{ms} {s}");
    }
}
