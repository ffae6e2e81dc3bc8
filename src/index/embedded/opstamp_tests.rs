//! tantivy's opstamps as a writer opens, which [`super::EmbeddedShard`]'s
//! open guards against: a new writer's first operation carries the last
//! commit's opstamp, and a merge before the writer's first commit counts a
//! delete of that opstamp as applied to a segment whose deletes are up to
//! date at it.

use tantivy::collector::Count;
use tantivy::indexer::{NoMergePolicy, UserOperation};
use tantivy::query::TermQuery;
use tantivy::schema::{IndexRecordOption, Schema, STORED, STRING};
use tantivy::{doc, Index, IndexWriter, Term};

/// An index of two committed segments: `a` alone, and `b` beside a
/// document deleted by the last commit (so that segment's deletes are at
/// that commit's opstamp). A new writer replaces `b` (a delete of its key,
/// then the new version), the two segments are merged, and the writer
/// commits. How many `b` are live then.
fn live_copies_after_a_replace_merged_at_once(take_the_committed_opstamp: bool) -> usize {
    let mut builder = Schema::builder();
    let key = builder.add_text_field("key", STRING | STORED);
    let index = Index::create_in_ram(builder.build());
    let term = |k: &str| Term::from_field_text(key, k);
    {
        let mut w: IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
        w.set_merge_policy(Box::new(NoMergePolicy));
        w.add_document(doc!(key => "a")).unwrap();
        w.commit().unwrap();
        w.add_document(doc!(key => "b")).unwrap();
        w.add_document(doc!(key => "gone")).unwrap();
        w.commit().unwrap();
        w.delete_term(term("gone"));
        w.commit().unwrap();
        w.wait_merging_threads().unwrap();
    }
    let mut w: IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
    w.set_merge_policy(Box::new(NoMergePolicy));
    if take_the_committed_opstamp {
        w.run(Vec::<UserOperation>::new()).unwrap();
    }
    w.delete_term(term("b"));
    w.add_document(doc!(key => "b")).unwrap();
    // The segment without deletes first: the merged segment goes on from
    // its delete cursor.
    let mut metas = index.searchable_segment_metas().unwrap();
    metas.sort_by_key(|m| m.delete_opstamp().is_some());
    assert_eq!(metas.len(), 2);
    let ids: Vec<_> = metas.iter().map(|m| m.id()).collect();
    w.merge(&ids).wait().unwrap();
    w.commit().unwrap();
    let searcher = index.reader().unwrap().searcher();
    searcher.search(&TermQuery::new(term("b"), IndexRecordOption::Basic), &Count).unwrap()
}

/// tantivy 0.25 keeps the replaced `b` live beside the new one: the delete
/// is lost. Should a release of tantivy change this, this test says so,
/// and the guard in `EmbeddedShard::open` may go.
#[test]
fn a_new_writers_first_delete_is_lost_by_a_merge_before_its_first_commit() {
    assert_eq!(live_copies_after_a_replace_merged_at_once(false), 2);
}

/// With the committed opstamp taken by an empty batch first (as the shard
/// does when it opens), the delete reaches the merged segment.
#[test]
fn a_writer_that_takes_the_committed_opstamp_first_keeps_its_deletes_through_merges() {
    assert_eq!(live_copies_after_a_replace_merged_at_once(true), 1);
}
