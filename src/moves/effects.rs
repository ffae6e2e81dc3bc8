//! The writes of a cross-key move on a shard: the source's scan and its
//! removal of what left, the destination's take-over and its withdrawal
//! of an attempt given up. The applier decides when (see
//! `worker/applier/moves.rs`); these say what is written.

use crate::apply::{move_file, FanOut};
use crate::command::moves::{MoveIn, MovedFile};
use crate::command::path;
use crate::index::{newer, Doc, IndexError, Kind, Origin, Scan, Shard};

/// The source side of a cross-key rename at log position `pos`: streams
/// the files under `from` it moves, at their new paths, to `out`. Writes
/// nothing. A scan that has to start again may hand a file over twice.
pub fn move_out<S: Shard + ?Sized>(shard: &mut S, from: &str, to: &str, pos: u64, fan_out: FanOut, out: &mut dyn FnMut(MovedFile)) -> Result<(), IndexError> {
    fan_out.rewrite(shard, &Scan::FilesWithin { path: from.to_string() }, &mut |d| {
        if let Some(Doc::File(f)) = move_file(d, from, to, pos) {
            out(MovedFile { path: f.full_path(), id: f.id, contents: f.contents });
        }
        None
    })?;
    Ok(())
}

/// After a cross-key rename's files reached the destination: deletes each
/// one from the source, unless it is no longer under `from` (the
/// destination has written it already, where the backends share documents)
/// or was written after the rename. Returns the number deleted.
pub fn remove_moved<S: Shard + ?Sized>(shard: &mut S, ids: &[String], from: &str, pos: u64) -> Result<u64, IndexError> {
    let mut n = 0;
    for id in ids {
        match shard.get(Kind::File, id)? {
            Some(Doc::File(cur)) if newer(pos, cur.pos) && path::is_within(&cur.full_path(), from) => {
                shard.delete_departed(Kind::File, id, pos)?;
                n += 1;
            }
            _ => {}
        }
    }
    Ok(n)
}

/// The destination side of a cross-key rename: a chunk's files, written at
/// the move's position `pos` (its first chunk's offset here) unless a later
/// command of this partition wrote them since.
pub fn move_in<S: Shard + ?Sized>(shard: &mut S, m: &MoveIn, pos: u64) -> Result<u64, IndexError> {
    let mut n = 0;
    let from = Origin { key: path::top_level(&m.from), partition: Some(m.source_partition) };
    for d in m.docs(pos) {
        n += shard.take_over(d, &from)?;
    }
    Ok(n)
}

/// The destination side of a move attempt its source gave up (an aborted
/// end), where the source's shard is another one and still holds the
/// files: deletes the files under the move's `to` written at the move's
/// position `pos`, which are its chunks' files (nothing else of the
/// partition is applied while a move is in flight). Returns the number
/// deleted.
pub fn withdraw_move<S: Shard + ?Sized>(shard: &mut S, m: &MoveIn, pos: u64) -> Result<u64, IndexError> {
    let mut ids = Vec::new();
    shard.rewrite(&Scan::FilesWithin { path: m.to.clone() }, 1000, &mut |d| {
        if d.pos() == pos {
            ids.push(d.id().to_string());
        }
        None
    })?;
    for id in &ids {
        shard.delete(Kind::File, id, pos)?;
    }
    Ok(ids.len() as u64)
}
