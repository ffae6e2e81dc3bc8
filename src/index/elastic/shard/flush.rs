//! The shard's write buffer: what a command buffers, and its flush, which
//! sends the buffer as one bulk and resolves the conflicts it meets by
//! reading again and letting the log positions decide.

use std::time::Instant;

use serde_json::Value;

use super::super::backend::{ElasticBackend, WriteFirst};
use super::super::bulk::{self, BulkOp, BulkReport};
use super::super::conflict::{self, Sent, Write};
use super::super::docs::{from_source, is_tombstone, to_source, tombstone};
use super::super::meta::{self, get_source};
use super::super::names::PARTITION_FIELD;
use super::super::tombstones::now_ms;
use super::ElasticShard;
use crate::index::{IndexError, Kind, Rewrite};

/// Writing first stops after a flush in which more than one in this many of its
/// creates met an existing document (each costing a read and a resend).
const WRITE_FIRST_CONFLICTS_AT_MOST: usize = 20;

impl ElasticShard {
    /// Sends the buffered writes; resolves their conflicts by reading again.
    pub(in crate::index::elastic) fn flush(&mut self) -> Result<(), IndexError> {
        // Before any write of this writer's (a flush, a commit, a fan-out,
        // which flushes first): what was fetched ahead may be older than it,
        // and so may a scan read ahead.
        self.prefetched.clear();
        self.ready = None;
        if self.pending.is_empty() {
            // Reads that wrote nothing (a duplicate, a command already
            // applied): their sources are not kept past the flush.
            self.pre_images.clear();
            return Ok(());
        }
        let kinds: Sent = self.pending.iter().map(|(k, op, pos, w)| (format!("{}/{}", op.index(), op.id()), (*k, *pos, *w))).collect();
        // The buffer is dropped only once Elasticsearch has it: after a
        // failure the next commit sends it again (writes are conditional and
        // guarded, so a partial first attempt is harmless).
        let ops: Vec<BulkOp> = self.pending.iter().map(|(_, op, _, _)| op.clone()).collect();
        if self.pending.iter().any(|(k, op, _, _)| self.seen_foreign.contains(&(*k, op.id().to_string()))) {
            self.confirm_owner()?;
        }
        self.flushed.clear();
        let report = self.b.runtime.block_on(bulk::execute(&self.b.client, ops, self.b.limits, self.b.policy))?;
        // The creates written first that met an existing document.
        let met = report
            .conflicts
            .iter()
            .filter(|op| match op {
                BulkOp::Create { index, id, .. } => kinds.get(&format!("{index}/{id}")).is_some_and(|(k, _, _)| self.assumed.contains(&(*k, id.clone()))),
                _ => false,
            })
            .count();
        let resolved = self.resolve(report, &kinds, None);
        self.unsearchable = Some(Instant::now());
        if let Err(e @ IndexError::Rejected(_)) = &resolved {
            tracing::warn!(partition = self.partition, error = %e, "a write of the flush was refused: putting back what its other writes replaced");
            self.undo(&kinds);
        }
        resolved?;
        if self.writing_first && self.b.write_first == WriteFirst::WhenAbsent && met * WRITE_FIRST_CONFLICTS_AT_MOST > self.assumed.len() {
            tracing::debug!(partition = self.partition, creates = self.assumed.len(), existed = met, "upserts found their documents: reading them first again");
            self.writing_first = false;
        }
        self.pending.clear();
        self.pending_at.clear();
        self.overlay.clear();
        self.seen.clear();
        self.pre_images.clear();
        self.flushed.clear();
        self.seen_foreign.clear();
        self.assumed.clear();
        Ok(())
    }

    /// After a flush met a refusal: puts back what its other writes
    /// replaced (the versions of [`ElasticShard::pre_images`]), so that a
    /// refused flush, like a refused commit of the embedded index, leaves
    /// nothing of its batch. The applier then applies the batch's commands
    /// one at a time to find the refused one, and the commands it parks
    /// behind it are not seen applied meanwhile. Each put-back is
    /// conditional on the version the flush wrote: a document written
    /// again since is left as it is, and so is one whose former version is
    /// not known (written without a read). Best effort: what is not put
    /// back is applied again, each a no-op by its position, when the
    /// parked commands are reprocessed.
    fn undo(&mut self, kinds: &Sent) {
        let mut ops = Vec::new();
        let mut unknown = 0usize;
        for (index, id, version) in std::mem::take(&mut self.flushed) {
            let kind = kinds.get(&format!("{index}/{id}")).map(|(k, _, _)| *k);
            match (version, kind.and_then(|k| self.pre_images.get(&(k, id.clone())))) {
                (Some(v), Some(None)) => ops.push(BulkOp::Delete { index, id, if_seq_no: Some(v) }),
                (Some(v), Some(Some(source))) => ops.push(BulkOp::Index { index, id, source: source.clone(), if_seq_no: Some(v) }),
                _ => unknown += 1,
            }
        }
        match self.b.runtime.block_on(bulk::execute(&self.b.client, ops, self.b.limits, self.b.policy)) {
            Ok(r) => {
                tracing::warn!(partition = self.partition, put_back = r.done, written_since = r.conflicts.len(), failed = r.failed.len(), unknown, "the refused flush's other writes were put back")
            }
            Err(error) => tracing::warn!(partition = self.partition, %error, "putting back the refused flush's other writes failed"),
        }
    }

    /// 409s: another write got there first. Read the document again and
    /// let the log positions decide, up to a few rounds:
    /// - a buffered write or delete (`rule` None) is sent again, against
    ///   the version just read, only when what is there now is older than
    ///   its command;
    /// - a fan-out's rewrite (`rule` Some) applies the rule to what is
    ///   there now (the rule has its own position guard), never to the
    ///   version it rewrote before, whose position is already the command's.
    ///
    /// `kinds` maps `index/id` to the document's kind and its command's
    /// position.
    pub(in crate::index::elastic) fn resolve(&mut self, mut report: BulkReport, kinds: &Sent, mut rule: Option<&mut Rewrite<'_>>) -> Result<u64, IndexError> {
        let mut written = report.done as u64;
        for _ in 0..5 {
            // A buffered flush's writes, for a put-back should one be
            // refused (a fan-out's pages are not put back).
            if rule.is_none() {
                self.flushed.append(&mut report.written);
            }
            report.refused()?;
            if report.conflicts.is_empty() {
                return Ok(written);
            }
            let mut again = Vec::new();
            // Whether one of `again` replaces another partition's version.
            let mut over_foreign = false;
            // The round's conflicts read with one `_mget` (review F9); one
            // the `_mget` could not answer, or all of them if it failed, is
            // read with a GET.
            let targets: Vec<(String, String)> = report.conflicts.iter().map(|op| (op.index().to_string(), op.id().to_string())).collect();
            let mut read = match self.b.runtime.block_on(meta::mget_sources(&self.b.client, &targets)) {
                Ok(found) => found.into_iter(),
                Err(error) => {
                    tracing::debug!(partition = self.partition, %error, "reading conflicts with one _mget failed; each is read with a GET");
                    Vec::new().into_iter()
                }
            };
            for op in report.conflicts.drain(..) {
                let (index, source) = match &op {
                    BulkOp::Index { index, source, .. } | BulkOp::Create { index, source, .. } => (index.clone(), Some(source.clone())),
                    BulkOp::Delete { index, .. } => (index.clone(), None),
                };
                let (kind, pos, write) = kinds.get(&format!("{index}/{}", op.id())).copied().unwrap_or((Kind::File, 0, Write::Own));
                let current = match read.next().flatten() {
                    Some(current) => current,
                    None => self.b.runtime.block_on(get_source(&self.b.client, &index, op.id()))?,
                };
                let id = op.id().to_string();
                match (current, source, rule.as_mut()) {
                    // Deleted since the scan read it: nothing to move.
                    (Some((cur, _)), Some(_), Some(_)) if is_tombstone(&cur) => {}
                    // Another partition's document now: taken over since
                    // the scan read it (an owner change), never rewritten
                    // by this partition's fan-out. It was: the rule ran on
                    // it and stamped it with this partition, and the owner
                    // change's delete half here then deleted it (review of
                    // Elasticsearch, F1).
                    (Some((cur, _)), Some(_), Some(_)) if self.foreign(&cur) => {}
                    (Some((cur, seq)), Some(_), Some(rule)) => {
                        if let Some(new) = rule(&from_source(kind, &cur)) {
                            again.push(BulkOp::Index { index, id, source: self.stamp(to_source(&new)), if_seq_no: Some(seq) });
                        }
                    }
                    // The document a rewrite read is gone: nothing to move.
                    (None, Some(_), Some(_)) => {}
                    (Some((cur, seq)), Some(src), None) => {
                        if conflict::wins_over(self.partition, &cur, kind, pos, write) {
                            over_foreign |= self.foreign(&cur);
                            self.pre_images.insert((kind, id.clone()), Some(cur.clone()));
                            again.push(BulkOp::Index { index, id, source: src, if_seq_no: Some(seq) });
                        } else if self.foreign(&cur) && !is_tombstone(&cur) && write != Write::Departed {
                            // Another partition's document, written since
                            // this one was read absent (or written first,
                            // unread): what `position` says of it, said
                            // here. Which of two owners comes first
                            // decides; a replay may decide otherwise.
                            owner_conflict(&self.b, kind, &id, &cur, self.partition);
                        }
                    }
                    (None, Some(src), None) => {
                        self.pre_images.insert((kind, id.clone()), None);
                        again.push(BulkOp::Create { index, id, source: src });
                    }
                    (Some((cur, seq)), None, _) => {
                        if conflict::wins_over(self.partition, &cur, kind, pos, Write::Own) {
                            over_foreign |= self.foreign(&cur);
                            if rule.is_none() {
                                self.pre_images.insert((kind, id.clone()), Some(cur.clone()));
                            }
                            again.push(BulkOp::Delete { index, id, if_seq_no: Some(seq) });
                        }
                    }
                    (None, None, _) => {}
                }
            }
            if over_foreign {
                self.confirm_owner()?;
            }
            report = self.b.runtime.block_on(bulk::execute(&self.b.client, again, self.b.limits, self.b.policy))?;
            written += report.done as u64;
        }
        Err(IndexError::Backend("write conflicts kept recurring; another writer owns these documents".into()))
    }
}

impl ElasticShard {
    /// Buffers a write of a document until the next flush. A later write
    /// of a document already buffered replaces it (its condition is the
    /// one the document was last read with, which the buffered write,
    /// unsent, did not change): each document is sent once per flush, its
    /// last version. Two writes of one document were both sent, and judged
    /// by the last one's position after a conflict, so the first, older,
    /// could be sent again over another writer's newer version (review of
    /// Elasticsearch, F2). A take-over stays one: the write replaces what
    /// it took over.
    pub(super) fn buffer(&mut self, kind: Kind, op: BulkOp, pos: u64, write: Write) {
        match self.pending_at.get(&(kind, op.id().to_string())) {
            Some(&i) => {
                let merged = match (self.pending[i].3, write) {
                    (taken @ Write::TakeOver { .. }, Write::Own | Write::Departed) => taken,
                    (_, w) => w,
                };
                self.pending[i] = (kind, op, pos, merged);
            }
            None => {
                self.pending_at.insert((kind, op.id().to_string()), self.pending.len());
                self.pending.push((kind, op, pos, write));
            }
        }
    }

    /// A delete as a tombstone, not a removal (see `names::DELETED_FIELD`),
    /// decided by `write`'s rule.
    pub(super) fn tombstone(&mut self, kind: Kind, id: &str, pos: u64, write: Write) -> Result<(), IndexError> {
        self.ready = None;
        self.recent.deleted(kind, id);
        let op = self.write_op(kind, id, tombstone(id, pos, now_ms()));
        self.buffer(kind, op, pos, write);
        self.overlay.insert((kind, id.to_string()), None);
        Ok(())
    }
}

/// Counts and logs a command of `partition` naming a document `stored`
/// another partition holds.
pub(super) fn owner_conflict(b: &ElasticBackend, kind: Kind, id: &str, stored: &Value, partition: i32) {
    b.owner_conflict(kind, id, &stored[PARTITION_FIELD], partition, "a command names a document another key's partition holds: an owner change sent without its explicit form (previous_path, previous_user_id), or a redelivery after the document moved; not applied");
}
