//! A fan-out on Elasticsearch ([`crate::index::Shard::rewrite`]): after a
//! refresh (read-your-writes), a point-in-time scan whose pages are
//! rewritten by bulk requests, several in flight while the next page is
//! read, their conflicts resolved by the positions. The point in time is
//! closed on every path, and scanned again from the start if it expires
//! part-way.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::bulk::{self, BulkOp, BulkReport};
use super::conflict::{Sent, Write};
use super::docs::{from_source, hits, scan_query, to_source, EsWhole, PitScan};
use super::shard::ElasticShard;
use super::ElasticError;
use crate::index::{Cursor, Doc, IndexError, Kind, Pages, Scan, Shard, Wanted};

/// Times a fan-out's scan starts again after its point in time expired,
/// before the command fails (retryably).
const MAX_SCAN_RESTARTS: u32 = 3;

/// A fan-out's page bulks in flight at once, while its next page is read.
const FAN_OUT_IN_FLIGHT: usize = 3;

/// A fan-out page's bulk in flight ([`ElasticShard::rewrite`]), with the
/// kind and command position of each document it writes.
struct PageWrite {
    bulk: tokio::task::JoinHandle<Result<BulkReport, ElasticError>>,
    kinds: Sent,
    /// The kind of its documents, and the key, id and what a scan tests
    /// of each (recorded as written when it settles: see `super::recent`).
    kind: Kind,
    written: Vec<(String, String, String)>,
}

/// A fan-out on Elasticsearch in progress ([`Shard::rewrite_begin`]): the
/// point-in-time scan and the page bulks in flight. Dropped before it is
/// complete, it aborts its bulks and releases its point in time.
///
/// [`Shard::rewrite_begin`]: crate::index::Shard::rewrite_begin
pub(crate) struct EsPages {
    index: String,
    kind: Kind,
    query: serde_json::Value,
    page_size: usize,
    pit: Option<PitScan>,
    writing: VecDeque<PageWrite>,
    restarts: u32,
    runtime: tokio::runtime::Handle,
}

impl Drop for EsPages {
    fn drop(&mut self) {
        for w in self.writing.drain(..) {
            w.bulk.abort();
        }
        if let Some(pit) = self.pit.take() {
            self.runtime.spawn(pit.close());
        }
    }
}

impl ElasticShard {
    /// [`Shard::rewrite_begin`](crate::index::Shard::rewrite_begin).
    pub(super) fn fan_out_pages(&mut self, scan: &Scan, page_size: usize) -> Result<Pages, IndexError> {
        Ok(Pages::new(Cursor::Elastic(Box::new(self.fan_out_begin(scan, page_size)?))))
    }

    /// A fan-out's scan read at once, without a refresh or a point in
    /// time, when it holds at most a page: a search (which sees what the
    /// last refresh published), or what a search of many owners'
    /// dependents found since the last refresh began
    /// ([`super::dependents`]); and a GET (one `_mget`) of every document
    /// this writer wrote since then that the search found or that belongs
    /// to the scan's key ([`super::recent`]), judged by the scan's
    /// predicate. `None`: more than a page matched (the caller scans a
    /// point in time).
    pub(super) fn small_scan(&mut self, scan: &Scan, page_size: usize) -> Result<Option<EsWhole>, IndexError> {
        let (kind, query) = scan_query(scan);
        self.before_scan(scan);
        // Read ahead with other owners' (`super::dependents`), or searched.
        let found = match self.recent.ahead_of(scan) {
            Some(read) => read.iter().filter(|h| scan.matches(&from_source(kind, &h.source))).cloned().collect(),
            None => {
                let index = self.target(kind, scan.key());
                let b = self.b.clone();
                let body = serde_json::json!({"query": query, "size": page_size, "seq_no_primary_term": true, "track_total_hits": false});
                let v = b.runtime.block_on(async {
                    let r = b.client.search(elasticsearch::SearchParts::Index(&[&index])).allow_partial_search_results(false).body(body).send().await?;
                    super::complete_json("a fan-out's search", r).await
                })?;
                hits(&v)
            }
        };
        if found.len() >= page_size {
            return Ok(None);
        }
        let mut docs = Vec::new();
        let mut again: Vec<String> = Vec::new();
        for hit in found {
            if self.recent.contains(kind, &hit.id) {
                again.push(hit.id);
            } else {
                docs.push((from_source(kind, &hit.source), Some(hit.seq)));
            }
        }
        let found_again: std::collections::HashSet<String> = again.iter().cloned().collect();
        let mine: Vec<String> = self.recent.matching(scan).filter(|(_, id)| !found_again.contains(id)).map(|(_, id)| id.clone()).collect();
        again.extend(mine);
        let wanted: Vec<Wanted> = again.iter().map(|id| Wanted::contents(kind, id)).collect();
        self.prefetch(&wanted)?;
        for id in again {
            if let Some(doc) = self.get(kind, &id)?.filter(|d| scan.matches(d)) {
                let seen = self.seen.get(&(kind, id)).copied();
                docs.push((doc, seen));
            }
        }
        Ok(Some(EsWhole { kind, docs }))
    }

    /// [`Shard::rewrite_page`](crate::index::Shard::rewrite_page).
    pub(super) fn fan_out_next(&mut self, pages: &mut Pages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        let p = match pages.cursor() {
            Cursor::Elastic(p) => p,
            Cursor::ElasticWhole(whole) => {
                // Written with this writer's other writes, each conditional on
                // the version it was read at.
                let (kind, docs) = (whole.kind, std::mem::take(&mut whole.docs));
                let mut written = 0;
                for (doc, version) in docs {
                    if let Some(new) = rewrite(&doc) {
                        if let Some(v) = version {
                            self.seen.insert((kind, doc.id().to_string()), v);
                        }
                        self.put(new)?;
                        written += 1;
                    }
                }
                return Ok((written, true));
            }
            other => return Err(other.mismatch()),
        };
        self.fan_out_page(p, rewrite)
    }

    /// Makes every write a fan-out's scan of `index` must see searchable:
    /// a refresh of that index, unless a refresh of the generation began
    /// after this writer's last write and after it opened the shard (the
    /// previous owner's writes). Review F3 and F10.
    pub(super) fn searchable_for_scan(&mut self, index: &str) -> Result<(), IndexError> {
        if self.unsearchable.is_none() && self.b.refreshed_since(self.generation(), self.recent.since) {
            return Ok(());
        }
        let b = self.b.clone();
        let r = b.runtime.block_on(b.client.indices().refresh(elasticsearch::indices::IndicesRefreshParts::Index(&[index])).send()).map_err(ElasticError::from)?;
        // A refresh some shards missed would let the scan miss writes.
        b.runtime.block_on(super::complete_json("refreshing before a fan-out", r))?;
        Ok(())
    }

    /// Starts a fan-out: sends the writes before it, refreshes
    /// (read-your-writes) and opens the point in time it scans.
    pub(super) fn fan_out_begin(&mut self, scan: &Scan, page_size: usize) -> Result<EsPages, IndexError> {
        self.flush()?;
        let (kind, query) = scan_query(scan);
        let index = self.target(kind, scan.key());
        let b = self.b.clone();
        // Read-your-writes: the scan must see every earlier write.
        self.searchable_for_scan(&index)?;
        let pit = b.runtime.block_on(PitScan::open(&b.client, &index, query.clone(), page_size))?;
        Ok(EsPages { index, kind, query, page_size, pit: Some(pit), writing: VecDeque::new(), restarts: 0, runtime: b.runtime.clone() })
    }

    /// Reads the fan-out's next page and sends its rewrites, while up to
    /// [`FAN_OUT_IN_FLIGHT`] earlier pages' bulks are written: the point in
    /// time does not see them, and pages hold distinct documents, so the
    /// requests are independent. At the end of the scan, waits for them
    /// all. Returns the documents written (by the bulks settled) and
    /// whether the scan is complete.
    pub(super) fn fan_out_page(&mut self, p: &mut EsPages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        let result = self.fan_out_page_or_fail(p, rewrite);
        if result.is_err() {
            // Its bulks aborted and its point in time released now, not
            // when the pages are dropped.
            for w in p.writing.drain(..) {
                w.bulk.abort();
            }
            if let Some(pit) = p.pit.take() {
                self.b.runtime.block_on(pit.close());
            }
        }
        result
    }

    fn fan_out_page_or_fail(&mut self, p: &mut EsPages, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<(u64, bool), IndexError> {
        let b = self.b.clone();
        let mut written = 0;
        let pit = p.pit.as_mut().ok_or_else(|| IndexError::Backend("a fan-out's scan was closed".into()))?;
        let read_started = Instant::now();
        let next = b.runtime.block_on(pit.next_page());
        let read = read_started.elapsed();
        let page = match next {
            Ok(page) => page,
            Err(ElasticError::ScanExpired(reason)) => {
                // What was sent is settled before the scan starts again,
                // from the beginning: the position guards skip what it
                // already rewrote.
                while let Some(w) = p.writing.pop_front() {
                    written += self.settle_page(w, &mut *rewrite)?;
                }
                if let Some(pit) = p.pit.take() {
                    b.runtime.block_on(pit.close());
                }
                if p.restarts >= MAX_SCAN_RESTARTS {
                    return Err(ElasticError::ScanExpired(reason).into());
                }
                p.restarts += 1;
                tracing::warn!(%reason, restarts = p.restarts, "a fan-out's point in time expired: scanning again from the start");
                // A point in time sees the last refresh: without one, the
                // pages rewritten so far would be read again as they were
                // (review F10), each sent again only to conflict.
                self.searchable_for_scan(&p.index)?;
                p.pit = Some(b.runtime.block_on(PitScan::open(&b.client, &p.index, p.query.clone(), p.page_size))?);
                return Ok((written, false));
            }
            Err(e) => return Err(e.into()),
        };
        if page.is_empty() {
            while let Some(w) = p.writing.pop_front() {
                written += self.settle_page(w, &mut *rewrite)?;
            }
            // The point in time is closed once the scan is done (on every
            // other path, when the pages are dropped).
            if let Some(pit) = p.pit.take() {
                b.runtime.block_on(pit.close());
            }
            return Ok((written, true));
        }
        let mut ops = Vec::new();
        let mut kinds = HashMap::new();
        let mut keys = Vec::new();
        for hit in page {
            if let Some(new) = rewrite(&from_source(p.kind, &hit.source)) {
                keys.push((new.key(), hit.id.clone(), super::recent::scanned(&new)));
                kinds.insert(format!("{}/{}", p.index, hit.id), (p.kind, new.pos(), Write::Own));
                ops.push(BulkOp::Index { index: p.index.clone(), id: hit.id, source: self.stamp(to_source(&new)), if_seq_no: hit.seq });
            }
        }
        let client = b.client.clone();
        let (limits, policy) = (b.limits, b.policy);
        p.writing.push_back(PageWrite { bulk: b.runtime.spawn(async move { bulk::execute(&client, ops, limits, policy).await }), kinds, kind: p.kind, written: keys });
        let settle_started = Instant::now();
        if p.writing.len() >= FAN_OUT_IN_FLIGHT {
            written += self.settle_page(p.writing.pop_front().expect("a page in flight"), &mut *rewrite)?;
        }
        tracing::debug!(index = %p.index, read_ms = read.as_millis() as u64, waited_for_writes_ms = settle_started.elapsed().as_millis() as u64, written, "fan-out page");
        Ok((written, false))
    }

    /// Waits for a fan-out page's bulk and resolves its conflicts with the
    /// rewrite rule. Returns the documents written.
    fn settle_page(&mut self, w: PageWrite, rule: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        let report = self.b.runtime.block_on(w.bulk).map_err(|e| IndexError::Backend(format!("a fan-out's bulk request did not finish: {e}")))??;
        let written = self.resolve(report, &w.kinds, Some(rule))?;
        for (key, id, scanned) in w.written {
            self.recent.wrote_of(key, w.kind, &id, scanned);
        }
        self.unsearchable = Some(Instant::now());
        Ok(written)
    }
}
