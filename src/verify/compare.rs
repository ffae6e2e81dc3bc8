//! Comparing a live index with the replay of its log, document by
//! document: a merge of the two, each in `(kind, id)` order. No I/O.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use crate::command::partitioner;
use crate::index::{Doc, Recorded};

/// Per partition, the last offset applied (-1: none): where the replay
/// stopped, and where the live index stood when it was read.
pub type Positions = BTreeMap<i32, i64>;

/// A field whose values differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Field {
    pub field: String,
    /// The replay's value (`null`: none).
    pub expected: Value,
    /// The live index's value (`null`: none).
    pub actual: Value,
}

/// What is wrong with a document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// The replay has it, the live index does not.
    Missing,
    /// The live index has it, the replay does not.
    Unexpected,
    /// Both have it, with different fields.
    Differs,
}

/// One document that differs. Its `id` and `elsewhere` are scoped to
/// their tenant, as everything inside denorm; a report shows them as the
/// producer wrote them, with the tenant beside them (see its `Serialize`).
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub kind: &'static str,
    pub id: String,
    pub problem: Problem,
    /// The partition of the document's key.
    pub partition: i32,
    pub fields: Vec<Field>,
    /// The log offsets (in `partition`) that last wrote it, live and in the
    /// replay.
    pub live_offset: Option<u64>,
    pub replay_offset: Option<u64>,
    /// The other side holds this document under another key (`missing`:
    /// the live index does; `unexpected`: the replay does): a document
    /// that changed owners, which a guarded repair of one key cannot
    /// restore (review of verify, F9 and F10).
    pub elsewhere: Option<String>,
    /// The document in the replay and in the live index (what a repair
    /// restores and replaces).
    pub expected: Option<Doc>,
    pub actual: Option<Doc>,
}

impl Serialize for Difference {
    /// `kind`, `tenant` (a named tenant's only), `id` and `elsewhere` as
    /// the producer wrote them, then the rest.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use crate::command::tenant;
        #[derive(Serialize)]
        struct Shown<'a> {
            kind: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            tenant: Option<&'a str>,
            id: &'a str,
            problem: Problem,
            partition: i32,
            fields: &'a [Field],
            live_offset: Option<u64>,
            replay_offset: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            elsewhere: Option<&'a str>,
        }
        let (tenant, id) = tenant::split(&self.id);
        Shown {
            kind: self.kind,
            tenant,
            id,
            problem: self.problem,
            partition: self.partition,
            fields: &self.fields,
            live_offset: self.live_offset,
            replay_offset: self.replay_offset,
            elsewhere: self.elsewhere.as_deref().map(tenant::unscoped),
        }
        .serialize(s)
    }
}

/// What a comparison found.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Outcome {
    /// Documents compared (in either index).
    pub checked: u64,
    /// Live documents written after the snapshot (their offset is past the
    /// one the replay stopped at): not compared.
    pub written_since: u64,
    /// Documents the replay has and the live index lacks, in a partition
    /// whose log went on past the snapshot (a delete applied since, or a
    /// loss): not compared.
    pub unsettled: u64,
    /// The first differences found (at most the `max` asked for).
    pub differences: Vec<Difference>,
    /// All differences found.
    pub differences_total: usize,
}

/// The key that orders a document's commands (a file's top-level
/// directory, a user's or a post's user id).
pub fn key_of(doc: &Doc) -> String {
    doc.key()
}

/// A live document, with what its backend records beside its fields.
pub struct Live(pub Doc, pub Recorded);

impl From<Doc> for Live {
    fn from(d: Doc) -> Live {
        Live(d, Recorded::default())
    }
}

/// How the bookkeeping a backend records of a live document differs from
/// what the replay says of it, a document of `partition` (review of
/// verify, F17): another partition named as its writer (on Elasticsearch
/// the workers then refuse its every command as an owner conflict), or a
/// position lost (any write then wins over it).
fn bookkeeping_diffs(partition: i32, live: &Recorded, replayed: &Doc) -> Vec<Field> {
    let mut out = Vec::new();
    if let Some(owner) = live.owner.filter(|o| *o != partition) {
        out.push(Field { field: "denorm_partition".into(), expected: Value::from(partition), actual: Value::from(owner) });
    }
    if live.pos_lost {
        out.push(Field { field: "denorm_pos".into(), expected: Value::from(replayed.pos()), actual: Value::Null });
    }
    out
}

/// A document's fields, without its bookkeeping.
fn fields(doc: &Doc) -> BTreeMap<String, Value> {
    let v = match doc.clone().without_pos() {
        Doc::File(f) => serde_json::to_value(f),
        Doc::User(u) => serde_json::to_value(u),
        Doc::Post(p) => serde_json::to_value(p),
        Doc::Model(d) => Ok(crate::command::generic::value::document_json(d.unscoped_id(), &d.fields, &d.copies)),
    };
    match v {
        Ok(Value::Object(m)) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

fn field_diffs(expected: Option<&Doc>, actual: Option<&Doc>) -> Vec<Field> {
    let (e, a) = (expected.map(fields).unwrap_or_default(), actual.map(fields).unwrap_or_default());
    let mut names: Vec<&String> = e.keys().chain(a.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|n| {
            let (x, y) = (e.get(n).cloned().unwrap_or(Value::Null), a.get(n).cloned().unwrap_or(Value::Null));
            (x != y).then(|| Field { field: n.clone(), expected: x, actual: y })
        })
        .collect()
}

/// The order both sides are compared in: the order of
/// [`crate::index::SearchIndex::dump_sorted`] (kind, tenant, id, then key).
pub fn order(d: &Doc) -> (&'static str, Option<String>, String, String) {
    crate::index::dump_order(d)
}

/// The merge of two indexes' documents, before its differences are
/// judged ([`Compared::settle`]): whether a document one side lacks is a
/// difference depends on where the live index stood once it was read
/// whole.
#[derive(Debug, Default)]
pub struct Compared {
    /// Documents compared (not those written since).
    pub checked: u64,
    pub written_since: u64,
    /// Partitions with live documents but no checkpoint: their documents
    /// cannot be placed against the log (an index restored without its
    /// checkpoints), so the verify cannot judge them (review F4).
    pub without_checkpoint: std::collections::BTreeSet<i32>,
    /// The differences kept whole, in merge order: the first ones of each
    /// [`Class`] (see [`Keep`]), so memory is bounded however many
    /// documents differ (review of verify, F13).
    candidates: Vec<Difference>,
    /// Per class, the differences kept and the index of the first one,
    /// and those found beyond them (counted only).
    classes: BTreeMap<Class, ClassCount>,
    /// Live documents written past the log's end as read before the merge
    /// (see [`Keep::log_ends`]), counted in `written_since` until judged.
    past_end: Vec<Difference>,
    /// Per partition, how many of `past_end` are its.
    past_end_of: BTreeMap<i32, usize>,
}

/// Differences [`Compared::settle`] judges alike: of one problem, in one
/// partition, marked or not by [`Keep::marked`].
type Class = (u8, i32, bool);

#[derive(Debug, Default, Clone, Copy)]
struct ClassCount {
    first: usize,
    kept: usize,
    beyond: u64,
}

/// Which differences a comparison keeps whole: per [`Class`], the first
/// `per_class` (at least one), and no more than `total` in all but the
/// first of each class (which judges the class); the others are counted.
/// Listing the first `max` judged differences needs no more than
/// `per_class = max` and no `total`: each class is judged as a whole, so a
/// listed difference is among the first `max` of its class. A repair, which
/// mends some differences and counts the rest, needs `total` alone.
pub struct Keep<'a> {
    pub per_class: usize,
    pub total: usize,
    /// What else the judgement depends on, beside the problem and the
    /// partition (a difference a former round proved).
    pub marked: &'a dyn Fn(&Difference) -> bool,
    /// The last offset of each partition's log, read before the merge: a
    /// live document written past it is kept (the first `per_class` of
    /// each partition) to be judged by [`Compared::past_the_log`] against
    /// the log's end read after it: a position no command wrote is forged
    /// (review of verify: a forged `denorm_pos` hid a document as "written
    /// since").
    pub log_ends: Option<&'a Positions>,
}

impl Keep<'_> {
    /// Every difference.
    pub fn all() -> Keep<'static> {
        Keep { per_class: usize::MAX, total: usize::MAX, marked: &|_| false, log_ends: None }
    }
}

fn class_of(d: &Difference, marked: bool) -> Class {
    (d.problem as u8, d.partition, marked)
}

impl Compared {
    /// Judges the live documents written past the log's end as read
    /// before the merge against `last` (per partition, the log's last
    /// offset, read after it): one past it was written by no command, so
    /// its position is forged, a difference in `denorm_pos`; the others
    /// were written during the merge.
    pub fn past_the_log(&mut self, last: &Positions) {
        self.past_end_of.clear();
        for mut d in std::mem::take(&mut self.past_end) {
            let pos = d.live_offset.unwrap_or(0) as i64;
            if pos <= last.get(&d.partition).copied().unwrap_or(-1) {
                continue;
            }
            self.written_since -= 1;
            self.checked += 1;
            d.fields = vec![Field { field: "denorm_pos".into(), expected: d.replay_offset.map_or(Value::Null, Value::from), actual: Value::from(pos) }];
            let class = self.classes.entry(class_of(&d, false)).or_insert(ClassCount { first: self.candidates.len(), ..ClassCount::default() });
            class.kept += 1;
            self.candidates.push(d);
        }
    }

    /// The differences kept whole (see [`Keep`]).
    pub fn kept(&self) -> usize {
        self.candidates.len()
    }

    /// Judges the differences: `unsettled` says whether a difference is
    /// not judged (one side may hold effects of commands past the stop
    /// that leave no position: deletes); it must decide by the problem,
    /// the partition and the mark of [`Keep`] alone, since the differences
    /// not kept are judged by the first of their class. At most `max`
    /// differences are listed; all are counted.
    pub fn settle(self, unsettled: &dyn Fn(&Difference) -> bool, max: usize) -> Outcome {
        let mut out = Outcome { checked: self.checked, written_since: self.written_since, ..Outcome::default() };
        for c in self.classes.values().filter(|c| c.beyond > 0) {
            match unsettled(&self.candidates[c.first]) {
                true => out.unsettled += c.beyond,
                false => out.differences_total += c.beyond as usize,
            }
        }
        for d in self.candidates {
            if unsettled(&d) {
                out.unsettled += 1;
                continue;
            }
            out.differences_total += 1;
            if out.differences.len() < max {
                out.differences.push(d);
            }
        }
        out
    }
}

/// Compares `live` with `replay`, both in [`order`] (streams: neither is
/// held). The replay stopped at `at`; a document either side last wrote
/// past `at` is not compared (`written_since`). Every difference is kept.
pub fn compare<L: Into<Live>>(live: impl IntoIterator<Item = L>, replay: impl IntoIterator<Item = Doc>, at: &Positions, partitions: i32) -> Compared {
    compare_kept(live, replay, at, partitions, &Keep::all())
}

/// [`compare`], keeping the differences `keep` says.
pub fn compare_kept<L: Into<Live>>(live: impl IntoIterator<Item = L>, replay: impl IntoIterator<Item = Doc>, at: &Positions, partitions: i32, keep: &Keep<'_>) -> Compared {
    let mut out = Compared::default();
    let (mut l, mut r) = (live.into_iter().map(Into::into).peekable(), replay.into_iter().peekable());
    // The documents of one kind and id come together (ordered by key):
    // the keys each side holds them under, and where their candidates
    // begin.
    let mut run = Run::default();
    loop {
        let (live, replayed) = match (l.peek().map(|d: &Live| order(&d.0)), r.peek().map(order)) {
            (None, None) => break,
            (Some(a), Some(b)) if a == b => (l.next(), r.next()),
            (Some(a), Some(b)) if a < b => (l.next(), None),
            (Some(_), None) => (l.next(), None),
            _ => (None, r.next()),
        };
        let (live, recorded) = live.map_or((None, Recorded::default()), |Live(d, rec)| (Some(d), rec));
        let pair = (live, replayed);
        let doc = pair.0.as_ref().or(pair.1.as_ref()).expect("one side");
        let (kind, id) = (doc.kind(), doc.id().to_string());
        if run.of.as_ref() != Some(&(kind.as_str(), id.clone())) {
            run.close(&mut out.candidates);
            run = Run { of: Some((kind.as_str(), id.clone())), start: out.candidates.len(), ..Run::default() };
        }
        let key = key_of(doc);
        if pair.0.is_some() {
            run.live.push(key.clone());
        }
        if pair.1.is_some() {
            run.replay.push(key.clone());
        }
        let partition = partitioner::partition_of(&key, partitions);
        let stop = at.get(&partition).copied().unwrap_or(-1);
        if stop < 0 && pair.0.is_some() {
            out.without_checkpoint.insert(partition);
            continue;
        }
        let problem = match &pair {
            (Some(d), _) | (_, Some(d)) if d.pos() as i64 > stop => {
                out.written_since += 1;
                let past_end = |d: &Doc| keep.log_ends.is_some_and(|e| d.pos() as i64 > e.get(&partition).copied().unwrap_or(-1));
                if let Some(live) = pair.0.as_ref().filter(|d| past_end(d)) {
                    let held = out.past_end_of.entry(partition).or_default();
                    if *held < keep.per_class.max(1) {
                        *held += 1;
                        out.past_end.push(Difference {
                            kind: kind.as_str(),
                            id,
                            // A stray document with a forged position is no
                            // less stray.
                            problem: if pair.1.is_some() { Problem::Differs } else { Problem::Unexpected },
                            partition,
                            fields: Vec::new(),
                            live_offset: Some(live.pos()),
                            replay_offset: pair.1.as_ref().map(Doc::pos),
                            elsewhere: None,
                            expected: pair.1.clone(),
                            actual: pair.0.clone(),
                        });
                    }
                }
                continue;
            }
            (Some(live), Some(replayed)) if live.clone().without_pos() == replayed.clone().without_pos() && bookkeeping_diffs(partition, &recorded, replayed).is_empty() => {
                out.checked += 1;
                continue;
            }
            (Some(_), Some(_)) => Problem::Differs,
            (Some(_), None) => Problem::Unexpected,
            (None, Some(_)) => Problem::Missing,
            (None, None) => unreachable!(),
        };
        out.checked += 1;
        let mut d = Difference {
            kind: kind.as_str(),
            id,
            problem,
            partition,
            fields: Vec::new(),
            live_offset: pair.0.as_ref().filter(|_| !recorded.pos_lost).map(Doc::pos),
            replay_offset: pair.1.as_ref().map(Doc::pos),
            elsewhere: None,
            expected: None,
            actual: None,
        };
        let class = out.classes.entry(class_of(&d, (keep.marked)(&d))).or_insert(ClassCount { first: out.candidates.len(), ..ClassCount::default() });
        if class.kept > 0 && (class.kept >= keep.per_class || out.candidates.len() >= keep.total) {
            class.beyond += 1;
            continue;
        }
        class.kept += 1;
        d.fields = field_diffs(pair.1.as_ref(), pair.0.as_ref());
        if let (Some(_), Some(replayed)) = &pair {
            d.fields.extend(bookkeeping_diffs(partition, &recorded, replayed));
        }
        (d.expected, d.actual) = (pair.1, pair.0);
        out.candidates.push(d);
    }
    run.close(&mut out.candidates);
    out
}

/// The documents of one kind and id in a comparison (see [`compare`]).
#[derive(Default)]
struct Run {
    of: Option<(&'static str, String)>,
    start: usize,
    /// The keys the live index and the replay hold them under.
    live: Vec<String>,
    replay: Vec<String>,
}

impl Run {
    /// Names, in the run's differences, the other key the other side holds
    /// the document under.
    fn close(&self, candidates: &mut [Difference]) {
        for d in candidates.iter_mut().skip(self.start) {
            let Some(doc) = d.expected.as_ref().or(d.actual.as_ref()) else { continue };
            let key = key_of(doc);
            let other = match d.problem {
                Problem::Missing => &self.live,
                Problem::Unexpected => &self.replay,
                Problem::Differs => continue,
            };
            d.elsewhere = other.iter().find(|k| **k != key).cloned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{Author, FileDoc, PostDoc, UserDoc};

    fn file(id: &str, path: &str, contents: &str, pos: u64) -> Doc {
        Doc::File(FileDoc::at(id, path, contents, pos))
    }

    fn all_at(n: i64) -> Positions {
        (0..4).map(|p| (p, n)).collect()
    }

    /// Review F4 and F7: a live document in a partition without a
    /// checkpoint used to count as written since (an index restored
    /// without its checkpoints verified clean); it now marks its partition
    /// as not verifiable. And `checked` counts only what was compared.
    #[test]
    fn documents_without_a_checkpoint_are_not_written_since_and_only_compared_ones_count() {
        let out = compare(vec![file("a", "/t/a.txt", "x", 3)], vec![], &all_at(-1), 4);
        assert_eq!((out.written_since, out.checked), (0, 0));
        assert_eq!(out.without_checkpoint.into_iter().collect::<Vec<_>>(), vec![partitioner::partition_of("/t", 4)]);
        let out = compare(vec![file("a", "/t/a.txt", "x", 9), file("b", "/t/b.txt", "x", 2)], vec![file("b", "/t/b.txt", "x", 2)], &all_at(5), 4);
        assert_eq!((out.written_since, out.checked), (1, 1), "the document written since is not counted as compared");
        assert!(out.without_checkpoint.is_empty());
    }

    /// Review F9, F10: a document held under one key live and another in
    /// the replay (an owner change one side did not take) is two
    /// differences that each name the other key; so is a document the live
    /// index holds under one key, equal there, and the replay under a
    /// second as well.
    #[test]
    fn a_document_held_under_another_key_by_the_other_side_is_named_with_that_key() {
        let out = compare(vec![file("f", "/z/x.txt", "c", 3)], vec![file("f", "/c/x.txt", "c", 4)], &all_at(5), 4).settle(&|_| false, 10);
        let got: Vec<(Problem, Option<&str>)> = out.differences.iter().map(|d| (d.problem, d.elsewhere.as_deref())).collect();
        assert_eq!(got, vec![(Problem::Missing, Some("/z")), (Problem::Unexpected, Some("/c"))]);
        let out = compare(vec![file("f", "/a/x.txt", "c", 3)], vec![file("f", "/a/x.txt", "c", 3), file("f", "/b/x.txt", "c", 4)], &all_at(5), 4).settle(&|_| false, 10);
        let got: Vec<(Problem, Option<&str>)> = out.differences.iter().map(|d| (d.problem, d.elsewhere.as_deref())).collect();
        assert_eq!(got, vec![(Problem::Missing, Some("/a"))]);
        let out = compare(vec![file("g", "/a/x.txt", "c", 3)], vec![], &all_at(5), 4).settle(&|_| false, 10);
        assert_eq!(out.differences[0].elsewhere, None);
    }

    /// Equal documents pass whatever their offsets; a changed field, a lost
    /// document and an extra one are each reported, with the field's two
    /// values and the offsets that wrote them.
    #[test]
    fn each_kind_of_difference_is_named_with_its_fields() {
        let replay = vec![file("a", "/t/a.txt", "same", 3), file("b", "/t/b.txt", "right", 4), file("c", "/t/c.txt", "lost", 5)];
        let live = vec![file("a", "/t/a.txt", "same", 9), file("b", "/t/b.txt", "wrong", 4), file("d", "/t/d.txt", "extra", 6)];
        let out = compare(live, replay, &all_at(10), 4).settle(&|_| false, 10);
        let total = out.differences_total;
        assert_eq!((out.checked, total, out.written_since, out.unsettled), (4, 3, 0, 0));
        let got: Vec<(&str, Problem)> = out.differences.iter().map(|d| (d.id.as_str(), d.problem)).collect();
        assert_eq!(got, vec![("b", Problem::Differs), ("c", Problem::Missing), ("d", Problem::Unexpected)]);
        let b = &out.differences[0];
        assert_eq!(b.fields, vec![Field { field: "contents".into(), expected: "right".into(), actual: "wrong".into() }]);
        assert_eq!((b.live_offset, b.replay_offset, b.partition), (Some(4), Some(4), partitioner::partition_of("/t", 4)));
        assert!(out.differences[1].fields.iter().any(|f| f.field == "contents" && f.expected == "lost" && f.actual.is_null()));
    }

    /// A live document written after the snapshot is not compared; a
    /// document missing live in a partition that moved on since is counted
    /// as unsettled, in one that did not it is missing.
    #[test]
    fn what_changed_since_the_snapshot_is_never_reported_as_wrong() {
        let p = partitioner::partition_of("/t", 4);
        let mut at = all_at(10);
        at.insert(p, 5);
        let replay = vec![file("a", "/t/a.txt", "v1", 5), file("b", "/t/b.txt", "v1", 2)];
        let live = vec![file("a", "/t/a.txt", "v2", 7)];
        let out = compare(live.clone(), replay.clone(), &at, 4).settle(&|d| d.problem == Problem::Missing && d.partition == p, 10);
        let total = out.differences_total;
        assert_eq!((out.written_since, out.unsettled, total), (1, 1, 0), "{out:?}");
        let out = compare(live, replay, &at, 4).settle(&|_| false, 10);
        let total = out.differences_total;
        assert_eq!((out.written_since, total, out.differences[0].id.as_str()), (1, 1, "b"));
    }

    /// Before a rebuild's cutover the new generation plays the replay, and
    /// its builder may have gone past its checkpoint: a document it wrote
    /// since is not compared either, and with the partition judged
    /// unsettled for what one side lacks, a delete past it (the live side
    /// keeps the document) is not reported; a changed field still is.
    #[test]
    fn a_document_the_replay_side_wrote_past_the_stop_is_not_compared() {
        let p = partitioner::partition_of("/t", 4);
        let mut at = all_at(10);
        at.insert(p, 5);
        let live = vec![file("a", "/t/a.txt", "v1", 3), file("c", "/t/c.txt", "kept", 4), file("d", "/t/d.txt", "wrong", 4)];
        let built = vec![file("a", "/t/a.txt", "v2", 8), file("d", "/t/d.txt", "right", 4)];
        let out = compare(live, built, &at, 4).settle(&|d| d.problem != Problem::Differs && d.partition == p, 10);
        let got: Vec<&str> = out.differences.iter().map(|d| d.id.as_str()).collect();
        assert_eq!((out.written_since, out.unsettled, got), (1, 1, vec!["d"]), "{out:?}");
    }

    /// Users and posts are keyed by the user: a post's author name that
    /// did not follow a rename is a difference in field `user`.
    #[test]
    fn a_stale_author_name_is_a_difference_of_the_post() {
        let user = |name: &str| Doc::User(UserDoc { id: "u1".into(), name: name.into(), email: "e".into(), dob: "d".into(), pos: 1 });
        let post = |name: &str| Doc::Post(PostDoc { id: "p1".into(), title: "t".into(), body: "b".into(), user: Author { id: "u1".into(), name: name.into() }, pos: 2 });
        let out = compare(vec![user("new"), post("old")], vec![user("new"), post("new")], &all_at(10), 4).settle(&|_| false, 10);
        let total = out.differences_total;
        assert_eq!(total, 1);
        let d = &out.differences[0];
        assert_eq!((d.kind, d.problem, d.partition), ("post", Problem::Differs, partitioner::partition_of("u1", 4)));
        assert_eq!(d.fields[0].field, "user");
        // At most `max` kept, all counted.
        let out = compare(vec![user("x"), post("x")], vec![user("new"), post("new")], &all_at(10), 4).settle(&|_| false, 1);
        let total = out.differences_total;
        assert_eq!((out.differences.len(), total), (1, 2));
    }

    /// `n` documents in order, a third of them differing, a third lacking
    /// live, a third lacking in the replay, under 8 keys.
    fn differing(n: usize) -> (impl Iterator<Item = Doc>, impl Iterator<Item = Doc>) {
        let doc = |i: usize, contents: &str| file(&format!("{i:08}"), &format!("/t{}/f.txt", i % 8), contents, 1);
        let live = (0..n).filter(|i| i % 3 != 1).map(move |i| doc(i, "live"));
        let replay = (0..n).filter(|i| i % 3 != 2).map(move |i| doc(i, if i % 3 == 0 { "replay" } else { "live" }));
        (live, replay)
    }

    /// Review F13: every difference was kept with both its documents until
    /// the end (a systematic difference over a large index is gigabytes).
    /// Now the first `max` of each class judged alike are kept, the rest
    /// counted; the verdict and the differences listed are those of a
    /// comparison that keeps all.
    #[test]
    fn differences_kept_are_bounded_and_the_verdict_is_unchanged() {
        let moved = partitioner::partition_of("/t3", 4);
        let unsettled = |d: &Difference| d.problem == Problem::Missing && d.partition == moved;
        let proven = |d: &Difference| d.id == "00000019";
        let judge = |d: &Difference| unsettled(d) && !proven(d);
        let (live, replay) = differing(30_000);
        let all = compare(live, replay, &all_at(10), 4);
        assert_eq!(all.kept(), 30_000);
        let all = all.settle(&judge, 100);
        let (live, replay) = differing(30_000);
        let marked = |d: &Difference| d.problem == Problem::Missing && proven(d);
        let bounded = compare_kept(live, replay, &all_at(10), 4, &Keep { per_class: 100, total: usize::MAX, marked: &marked, log_ends: None });
        // Three problems, four partitions, marked or not.
        assert!(bounded.kept() <= 100 * 3 * 4 * 2, "{}", bounded.kept());
        let bounded = bounded.settle(&|d| unsettled(d) && !marked(d), 100);
        assert_eq!(bounded, all);
        assert!(all.unsettled > 0 && all.differences.iter().any(|d| d.id == "00000019" && d.problem == Problem::Missing), "the test judges nothing: {:?}", (all.unsettled, all.differences_total));

        // A million documents: what is kept does not grow with them.
        let (live, replay) = differing(1_000_000);
        let big = compare_kept(live, replay, &all_at(10), 4, &Keep { per_class: 100, total: usize::MAX, marked: &|_| false, log_ends: None });
        assert!(big.kept() <= 100 * 3 * 4, "{}", big.kept());
        let big = big.settle(&|_| false, 100);
        assert_eq!((big.checked, big.differences_total, big.differences.len()), (1_000_000, 1_000_000, 100));

        // For a repair: `total` in all, beside the first of each class.
        let (live, replay) = differing(30_000);
        let repair = compare_kept(live, replay, &all_at(10), 4, &Keep { per_class: 50, total: 50, marked: &|_| false, log_ends: None });
        assert!(repair.kept() <= 50 + 3 * 4, "{}", repair.kept());
        assert_eq!(repair.settle(&|_| false, 50).differences_total, 30_000);
    }

    /// A forged `denorm_pos` past the log's end hid a live document as
    /// "written since": never compared, and a verify of a quiet index
    /// clean. A position past the log's end read after the merge is a
    /// difference now; one written during the merge (past the end read
    /// before it, within the one read after) is still written since.
    #[test]
    fn a_position_past_the_end_of_the_log_is_a_difference() {
        let (p, ends) = (partitioner::partition_of("/t", 4), all_at(20));
        let live = vec![file("a", "/t/a.txt", "x", 25), file("b", "/t/b.txt", "x", 999), file("c", "/t/c.txt", "x", 15), file("d", "/t/d.txt", "x", 998)];
        let replay = vec![file("a", "/t/a.txt", "x", 3), file("b", "/t/b.txt", "x", 4)];
        let keep = Keep { log_ends: Some(&ends), ..Keep::all() };
        let mut compared = compare_kept(live, replay, &all_at(10), 4, &keep);
        compared.past_the_log(&all_at(30));
        let out = compared.settle(&|_| false, 10);
        assert_eq!((out.written_since, out.checked, out.differences_total), (2, 2, 2), "{out:?}");
        let d = &out.differences[0];
        assert_eq!((d.id.as_str(), d.problem, d.partition), ("b", Problem::Differs, p));
        assert_eq!(d.fields, vec![Field { field: "denorm_pos".into(), expected: 4.into(), actual: 999.into() }]);
        // A stray document with a forged position is unexpected.
        assert_eq!((out.differences[1].id.as_str(), out.differences[1].problem), ("d", Problem::Unexpected));
    }

    /// Two copies of one id under two keys (an owner change without its
    /// explicit form, on the embedded index) pair up by key.
    #[test]
    fn copies_of_one_id_under_two_keys_pair_up_by_key() {
        let mut live = vec![file("f", "/b/f.txt", "two", 2), file("f", "/a/f.txt", "one", 1)];
        let mut replay = live.clone();
        live.sort_by_cached_key(order);
        replay.reverse();
        replay.sort_by_cached_key(order);
        let total = compare(live.clone(), replay, &all_at(10), 4).settle(&|_| false, 10).differences_total;
        assert_eq!(total, 0);
        let out = compare(live, vec![file("f", "/a/f.txt", "one", 1)], &all_at(10), 4).settle(&|_| false, 10);
        let total = out.differences_total;
        assert_eq!((total, out.differences[0].problem), (1, Problem::Unexpected));
    }
    /// Review F17: the writer a backend records (Elasticsearch's
    /// `denorm_partition`) naming another partition, or a position lost,
    /// is a difference though the fields are equal; the lost position is
    /// not reported as offset 0.
    #[test]
    fn a_wrong_writer_or_a_lost_position_differs() {
        let p = partitioner::partition_of("/a", 4);
        let f = |id: &str| file(id, &format!("/a/{id}.txt"), "c", 3);
        let live = vec![
            Live(f("a"), Recorded { owner: Some((p + 1) % 4), pos_lost: false }),
            Live(f("b"), Recorded { owner: None, pos_lost: true }),
            Live(f("c"), Recorded { owner: Some(p), pos_lost: false }),
            Live(f("d"), Recorded::default()),
        ];
        let out = compare(live, vec![f("a"), f("b"), f("c"), f("d")], &all_at(5), 4).settle(&|_| false, 10);
        // Each difference: the id, its fields (name, expected, actual),
        // the live offset.
        type Seen<'a> = (&'a str, Vec<(&'a str, Value, Value)>, Option<u64>);
        let got: Vec<Seen> = out.differences.iter().map(|d| (d.id.as_str(), d.fields.iter().map(|x| (x.field.as_str(), x.expected.clone(), x.actual.clone())).collect(), d.live_offset)).collect();
        let want = vec![("a", vec![("denorm_partition", Value::from(p), Value::from((p + 1) % 4))], Some(3)), ("b", vec![("denorm_pos", Value::from(3), Value::Null)], None)];
        assert_eq!(got, want);
        assert_eq!((out.checked, out.differences_total), (4, 2));
    }

    #[test]
    fn a_report_shows_a_tenants_ids_as_its_producer_wrote_them_with_the_tenant_beside() {
        let d = |id: &str, elsewhere: Option<&str>| Difference {
            kind: "file",
            id: id.into(),
            problem: Problem::Missing,
            partition: 1,
            fields: Vec::new(),
            live_offset: None,
            replay_offset: Some(4),
            elsewhere: elsewhere.map(str::to_string),
            expected: None,
            actual: None,
        };
        let acme = serde_json::to_value(d("acme\u{1f}f1", Some("acme\u{1f}/docs"))).unwrap();
        assert_eq!((&acme["tenant"], &acme["id"], &acme["elsewhere"]), (&serde_json::json!("acme"), &serde_json::json!("f1"), &serde_json::json!("/docs")), "{acme}");
        assert_eq!(acme["problem"], "missing");
        let default = serde_json::to_value(d("f1", None)).unwrap();
        assert!(default.get("tenant").is_none() && default.get("elsewhere").is_none(), "{default}");
        assert_eq!(default["id"], "f1");
    }
}
