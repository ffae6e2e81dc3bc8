//! The shards' merge policy: tantivy's, with merges bounded in documents.

use std::collections::HashMap;

/// tantivy's `LogMergePolicy`, with no merge producing more than
/// `max_docs` documents. A merge holds per-document state (document id
/// mappings, field norms) for what it merges, so unbounded merges made a
/// shard's memory grow with its size: renaming a directory of 1,000,000
/// files raised a shard's peak heap by 50 % over one of 100,000, all of it
/// in merges (none with merges off). Sizes count live documents, so a
/// segment that deletes have thinned merges again.
#[derive(Debug)]
pub(super) struct BoundedMergePolicy {
    log: tantivy::indexer::LogMergePolicy,
    max_docs: u32,
}

/// The shards' merge policy: merges of at most `max_docs` documents, or
/// tantivy's default (unbounded) for 0.
pub(super) fn merge_policy(max_docs: u32) -> Box<dyn tantivy::indexer::MergePolicy> {
    if max_docs == 0 {
        Box::new(tantivy::indexer::LogMergePolicy::default())
    } else {
        Box::new(BoundedMergePolicy::new(max_docs))
    }
}

impl BoundedMergePolicy {
    fn new(max_docs: u32) -> Self {
        let mut log = tantivy::indexer::LogMergePolicy::default();
        // A segment over half the bound has little left to merge with.
        log.set_max_docs_before_merge((max_docs / 2) as usize);
        BoundedMergePolicy { log, max_docs }
    }
}

impl tantivy::indexer::MergePolicy for BoundedMergePolicy {
    fn compute_merge_candidates(&self, segments: &[tantivy::index::SegmentMeta]) -> Vec<tantivy::indexer::MergeCandidate> {
        let size: HashMap<_, _> = segments.iter().map(|s| (s.id(), s.num_docs())).collect();
        let mut bounded = Vec::new();
        for candidate in self.log.compute_merge_candidates(segments) {
            let (mut chunk, mut docs) = (Vec::new(), 0u32);
            for id in candidate.0 {
                let n = size.get(&id).copied().unwrap_or(0);
                if !chunk.is_empty() && docs.saturating_add(n) > self.max_docs {
                    if chunk.len() > 1 {
                        bounded.push(tantivy::indexer::MergeCandidate(std::mem::take(&mut chunk)));
                    }
                    chunk.clear();
                    docs = 0;
                }
                chunk.push(id);
                docs = docs.saturating_add(n);
            }
            if chunk.len() > 1 {
                bounded.push(tantivy::indexer::MergeCandidate(chunk));
            }
        }
        bounded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::embedded::schema::schema;
    use std::collections::HashMap;
    use tantivy::Index;

    #[test]
    fn merges_never_produce_more_than_the_bound_and_take_at_least_two_segments() {
        use tantivy::indexer::MergePolicy;
        let index = Index::create_in_ram(schema(None).0);
        // Many small segments (one level for tantivy's policy), a few
        // large ones, and one over the bound.
        let sizes = [9_000u32; 30].iter().chain(&[40_000, 45_000, 48_000, 150_000]).copied().collect::<Vec<_>>();
        let metas: Vec<_> = sizes.iter().map(|&n| index.new_segment_meta(tantivy::index::SegmentId::generate_random(), n)).collect();
        let docs: HashMap<_, _> = metas.iter().map(|m| (m.id(), m.num_docs())).collect();
        let unbounded = tantivy::indexer::LogMergePolicy::default().compute_merge_candidates(&metas);
        assert!(unbounded.iter().any(|c| c.0.iter().map(|id| docs[id]).sum::<u32>() > 100_000), "the case must exceed the bound without it");
        let candidates = BoundedMergePolicy::new(100_000).compute_merge_candidates(&metas);
        assert!(!candidates.is_empty());
        let mut seen = std::collections::HashSet::new();
        for c in &candidates {
            assert!(c.0.len() >= 2, "{c:?}");
            assert!(c.0.iter().map(|id| docs[id]).sum::<u32>() <= 100_000, "{c:?}");
            assert!(c.0.iter().all(|id| seen.insert(*id)), "a segment in two merges");
        }
        // The small segments are all merged, in merges of 11 (99,000 documents).
        assert_eq!(candidates.iter().map(|c| c.0.len()).sum::<usize>(), 30);
        assert!(merge_policy(0).compute_merge_candidates(&metas).iter().any(|c| c.0.len() == 30));
    }
}
