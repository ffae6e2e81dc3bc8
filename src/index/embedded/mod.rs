//! Embedded index on tantivy: `<root>/shards/p<partition>/` is one tantivy
//! index per topic partition, written only by that partition's current
//! owner (tantivy's writer lock is an OS file lock, released when the owner
//! exits or dies), while searches read every shard. Each commit stores the
//! last applied log position in the commit payload, atomically with the
//! documents.

mod audit;
mod backend;
mod directory;
mod fanout;
mod layout;
mod merge;
pub mod model;
#[cfg(test)]
mod opstamp_tests;
mod overlay;
pub mod raw;
mod schema;
mod search;
mod shard;
mod sorted;
mod writer_lock;

pub use audit::audit_owners;
pub use backend::EmbeddedBackend;
pub(crate) use fanout::Cursor;
pub use layout::{write_atomically, EmbeddedIndex};
pub use search::EmbeddedSearch;
pub use shard::{EmbeddedShard, DEFAULT_FAN_OUT_COMMIT_EVERY, DEFAULT_MERGE_MAX_DOCS};

use crate::index::IndexError;

impl From<tantivy::TantivyError> for IndexError {
    fn from(e: tantivy::TantivyError) -> Self {
        match e {
            tantivy::TantivyError::LockFailure(_, msg) => IndexError::Locked(msg.unwrap_or_default()),
            tantivy::TantivyError::IoError(io) => IndexError::Io(std::io::Error::new(io.kind(), io.to_string())),
            other => IndexError::Backend(other.to_string()),
        }
    }
}

/// The shards' schema with the fields of model `d`: what a shard opened
/// with the model holds its documents in.
pub fn model_schema(d: &'static crate::domain::Domain) -> &'static model::ModelSchema {
    schema::schema(Some(d)).1.model.expect("a model's schema")
}
