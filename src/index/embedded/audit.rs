//! The owner audit of `denorm run --owner-audit-secs` (embedded index):
//! documents held under several keys, logged and counted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::EmbeddedIndex;

/// Every `every` until shutdown: the documents several partitions' shards
/// hold. One found twice in a row is not a move caught between its two
/// sides (those complete in seconds): it is logged and counted.
pub fn audit_owners(index: &EmbeddedIndex, every: Duration, shutdown: &AtomicBool) {
    let mut previous = std::collections::HashSet::new();
    let mut next = std::time::Instant::now() + every;
    while !shutdown.load(Ordering::SeqCst) {
        if std::time::Instant::now() < next {
            std::thread::sleep(Duration::from_millis(100).min(every));
            continue;
        }
        next = std::time::Instant::now() + every;
        let found = match index.held_by_several_partitions() {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "owner audit failed; tried again at the next one");
                continue;
            }
        };
        let lasting: Vec<_> = found.iter().filter(|(key, _)| previous.contains(key)).collect();
        metrics::gauge!(crate::metrics::OWNER_CONFLICTS).set(lasting.len() as f64);
        for (key, partitions) in lasting.iter().take(20) {
            // Named as the delete's warning names one (`apply`).
            let (kind, id) = super::schema::shown_doc_key(key);
            tracing::warn!(
                kind,
                id = %id,
                ?partitions,
                "a document is held under several keys: an owner change was sent without its explicit form (previous_path, previous_user_id); see docs/cross-key.md"
            );
        }
        previous = found.into_iter().map(|(key, _)| key).collect();
    }
}
