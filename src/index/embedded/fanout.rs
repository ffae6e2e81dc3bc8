//! A fan-out's scan on the embedded index: the committed snapshot with the
//! shard's pending writes laid over it, so that a fan-out needs no commit
//! of its own before it starts (docs/architecture.md, "Fan-outs without a
//! commit of their own").
//!
//! The first page is read when the fan-out starts, against the pending
//! writes of that moment: a committed document with a pending write is
//! left out, and the pending documents that match the scan are read
//! instead. A scan that ends within that page (a profile change's few
//! posts, a small rename) is then whole. A longer one reads its next pages
//! from the same snapshot, less every document that was pending at the
//! start (its pending version was in the first page). The other keys'
//! writes between the pages do not matter: a fan-out reads its own key's
//! documents only, whose commands wait in its lane meanwhile, and what
//! crosses keys is a barrier that waits for the lanes to drain.

use std::collections::HashSet;

use tantivy::Searcher;

use crate::index::{Doc, IndexError, Kind, Scan};

use super::overlay::Overlay;
use super::schema::{Fields, Paged, Stores};

/// A fan-out's scan in progress.
pub(crate) enum Cursor {
    /// Every document the scan reads, found when it started: a fan-out of
    /// one page.
    Whole(Vec<Doc>),
    /// A scan of more than one page.
    Paged {
        /// Documents read at the start (pending writes included), handed
        /// out a page at a time before the rest.
        ahead: Vec<Doc>,
        page_size: usize,
        /// The committed snapshot of the start, past what was read then.
        rest: Paged,
        rest_done: bool,
        /// The documents pending at the start.
        pending: HashSet<(Kind, String)>,
        /// The scan's key.
        key: String,
        /// The shard's count of single-document writes when the scan
        /// began: a page checks its documents against their current
        /// versions only once another write came.
        writes: u64,
    },
}

impl Cursor {
    /// Starts the scan of `scan` over `searcher`'s snapshot and `overlay`,
    /// the shard having made `writes` single-document writes so far.
    pub(super) fn begin(searcher: Searcher, f: &Fields, stores: &mut Stores, scan: &Scan, page_size: usize, overlay: &Overlay, writes: u64) -> Result<Self, IndexError> {
        let mut rest = Paged::new(searcher, f.scan_query(scan).as_ref(), page_size)?;
        let mut first = Vec::new();
        let done = rest.next(stores, &mut |store, doc| {
            let d = f.doc_of(&store.get(doc)?)?;
            if !overlay.contains(d.kind(), d.id()) {
                first.push(d);
            }
            Ok(())
        })?;
        first.extend(overlay.matching(scan));
        Ok(match done && first.len() <= page_size {
            true => Cursor::Whole(first),
            false => {
                first.reverse();
                Cursor::Paged { ahead: first, page_size, rest, rest_done: done, pending: overlay.ids(), key: scan.key().to_string(), writes }
            }
        })
    }

    /// The scan's key, for a scan of several pages (whose rewrites go to
    /// the writer rather than the overlay).
    pub(super) fn paged_key(&self) -> Option<&str> {
        match self {
            Cursor::Whole(_) => None,
            Cursor::Paged { key, .. } => Some(key),
        }
    }

    /// The shard's count of single-document writes when a scan of several
    /// pages began.
    pub(super) fn writes_at(&self) -> Option<u64> {
        match self {
            Cursor::Whole(_) => None,
            Cursor::Paged { writes, .. } => Some(*writes),
        }
    }

    /// The next page, and whether the scan is complete with it.
    pub(super) fn next(&mut self, f: &Fields, stores: &mut Stores) -> Result<(Vec<Doc>, bool), IndexError> {
        match self {
            Cursor::Whole(docs) => Ok((std::mem::take(docs), true)),
            Cursor::Paged { ahead, page_size, rest, rest_done, pending, .. } => {
                if !ahead.is_empty() {
                    let page: Vec<Doc> = (0..*page_size).map_while(|_| ahead.pop()).collect();
                    return Ok((page, ahead.is_empty() && *rest_done));
                }
                if *rest_done {
                    return Ok((Vec::new(), true));
                }
                let mut page = Vec::new();
                *rest_done = rest.next(stores, &mut |store, doc| {
                    let d = f.doc_of(&store.get(doc)?)?;
                    if pending.is_empty() || !pending.contains(&(d.kind(), d.id().to_string())) {
                        page.push(d);
                    }
                    Ok(())
                })?;
                Ok((page, *rest_done))
            }
        }
    }
}
