//! A fan-out on Elasticsearch ([`crate::index::Shard::rewrite`]): after a
//! refresh (read-your-writes), a point-in-time scan whose pages are
//! rewritten by bulk requests, several in flight while the next page is
//! read, their conflicts resolved by the positions. The point in time is
//! closed on every path, and scanned again from the start if it expires
//! part-way.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use elasticsearch::indices::IndicesRefreshParts;

use super::bulk::{self, BulkOp, BulkReport};
use super::conflict::Write;
use super::docs::{from_source, scan_query, to_source, PitScan};
use super::shard::ElasticShard;
use super::ElasticError;
use crate::index::{Doc, IndexError, Kind, Scan};

/// Times a fan-out's scan starts again after its point in time expired,
/// before the command fails (retryably).
const MAX_SCAN_RESTARTS: u32 = 3;

/// A fan-out's page bulks in flight at once, while its next page is read.
const FAN_OUT_IN_FLIGHT: usize = 3;

/// A fan-out page's bulk in flight ([`ElasticShard::rewrite`]), with the
/// kind and command position of each document it writes.
struct PageWrite {
    bulk: tokio::task::JoinHandle<Result<BulkReport, ElasticError>>,
    kinds: HashMap<String, (Kind, u64, Write)>,
}

impl ElasticShard {
    /// [`Shard::rewrite`](crate::index::Shard::rewrite) on Elasticsearch.
    pub(super) fn fan_out(&mut self, scan: &Scan, page_size: usize, rewrite: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        self.flush()?;
        let (kind, query) = scan_query(scan);
        let index = self.target(kind);
        let b = self.b.clone();
        // Read-your-writes: the scan must see every earlier write.
        let r = b.runtime.block_on(b.client.indices().refresh(IndicesRefreshParts::Index(&[&index])).send()).map_err(ElasticError::from)?;
        // A refresh some shards missed would let the scan miss writes.
        b.runtime.block_on(super::complete_json("refreshing before a fan-out", r))?;
        let mut written = 0u64;
        let mut restarts = 0;
        loop {
            let mut pit = b.runtime.block_on(PitScan::open(&b.client, &index, query.clone(), page_size))?;
            // Ok(Some(reason)): the point in time expired part-way.
            // In flight: each page's bulk, spawned, with what resolving its
            // conflicts needs. Aborted on every path that leaves early.
            let mut writing: VecDeque<PageWrite> = VecDeque::new();
            let result = (|| -> Result<Option<String>, IndexError> {
                // The next page is read while earlier pages' rewrites are
                // written, up to FAN_OUT_IN_FLIGHT bulks at once: the point
                // in time does not see them, and pages hold distinct
                // documents, so the requests are independent.
                loop {
                    let read_started = Instant::now();
                    let next = b.runtime.block_on(pit.next_page());
                    let read = read_started.elapsed();
                    let page = match next {
                        Ok(page) => page,
                        Err(ElasticError::ScanExpired(reason)) => {
                            // What was sent is settled before the scan
                            // starts again.
                            while let Some(w) = writing.pop_front() {
                                written += self.settle_page(w, &mut *rewrite)?;
                            }
                            return Ok(Some(reason));
                        }
                        Err(e) => return Err(e.into()),
                    };
                    if page.is_empty() {
                        break;
                    }
                    let mut ops = Vec::new();
                    let mut kinds = HashMap::new();
                    for hit in page {
                        if let Some(new) = rewrite(&from_source(kind, &hit.source)) {
                            kinds.insert(format!("{index}/{}", hit.id), (kind, new.pos(), Write::Own));
                            ops.push(BulkOp::Index { index: index.clone(), id: hit.id, source: self.stamp(to_source(&new)), if_seq_no: hit.seq });
                        }
                    }
                    let client = b.client.clone();
                    let (limits, policy) = (b.limits, b.policy);
                    writing.push_back(PageWrite { bulk: b.runtime.spawn(async move { bulk::execute(&client, ops, limits, policy).await }), kinds });
                    let settle_started = Instant::now();
                    if writing.len() >= FAN_OUT_IN_FLIGHT {
                        written += self.settle_page(writing.pop_front().expect("a page in flight"), &mut *rewrite)?;
                    }
                    tracing::debug!(index = %index, read_ms = read.as_millis() as u64, waited_for_writes_ms = settle_started.elapsed().as_millis() as u64, written, "fan-out page");
                }
                while let Some(w) = writing.pop_front() {
                    written += self.settle_page(w, &mut *rewrite)?;
                }
                Ok(None)
            })();
            for w in writing {
                w.bulk.abort();
            }
            // The point in time is closed on every path, errors included.
            b.runtime.block_on(pit.close());
            match result? {
                None => return Ok(written),
                // From the beginning: the position guards skip what this
                // scan already rewrote.
                Some(reason) if restarts < MAX_SCAN_RESTARTS => {
                    restarts += 1;
                    tracing::warn!(%reason, restarts, "a fan-out's point in time expired: scanning again from the start");
                }
                Some(reason) => return Err(ElasticError::ScanExpired(reason).into()),
            }
        }
    }

    /// Waits for a fan-out page's bulk and resolves its conflicts with the
    /// rewrite rule. Returns the documents written.
    fn settle_page(&mut self, w: PageWrite, rule: &mut dyn FnMut(&Doc) -> Option<Doc>) -> Result<u64, IndexError> {
        let report = self.b.runtime.block_on(w.bulk).map_err(|e| IndexError::Backend(format!("a fan-out's bulk request did not finish: {e}")))??;
        let written = self.resolve(report, &w.kinds, Some(rule))?;
        self.unsearchable = Some(Instant::now());
        Ok(written)
    }
}
