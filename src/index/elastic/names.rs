//! The names denorm gives things in Elasticsearch: indexes, aliases, meta
//! documents, and the bookkeeping fields of its documents. No I/O.

use crate::index::Kind;

/// Field holding the log position of the last write (idempotence guard).
pub const POS_FIELD: &str = "denorm_pos";

/// Set on a tombstone: what a delete leaves, with the delete's position in
/// [`POS_FIELD`], so that an older write arriving late (a previous owner
/// still running) finds the document newer than itself instead of absent.
pub const DELETED_FIELD: &str = "denorm_deleted";

/// The partition whose shard wrote the document (or its tombstone) last.
/// Positions ([`POS_FIELD`]) are offsets within that partition: a writer
/// compares them only with its own, and takes a document another
/// partition wrote as foreign (see `shard::ElasticShard::foreign`). A
/// document moves between partitions through a cross-key rename.
pub const PARTITION_FIELD: &str = "denorm_partition";

/// When a tombstone was written (epoch milliseconds): tombstones are
/// removed once older than `tombstones::TOMBSTONE_TTL`.
pub const DELETED_AT_FIELD: &str = "denorm_deleted_at";

/// The tenant a document belongs to (absent: the default tenant's). Its
/// `id`, `path` and `user.id` are stored as the producer wrote them, and
/// its `_id` is scoped to the tenant (see `crate::command::tenant`).
pub const TENANT_FIELD: &str = "tenant";

/// The routing of the document `id` (scoped) in `index` (the index or
/// alias it is read or written through): its tenant, so that a tenant's
/// documents share a shard of each shared index and a search through its
/// filtered alias reads that shard only. The default tenant's documents
/// are routed by `_id`, as before tenants, and so are a tenant's in its
/// own indexes (`<prefix>-t-<tenant>-...`), which are its alone: a large
/// tenant's documents spread over their shards. An index's name decides,
/// so its reads and writes always agree.
pub fn routing<'a>(index: &str, id: &'a str) -> Option<&'a str> {
    let tenant = crate::command::tenant::of(id)?;
    let own = index.split_once(TENANT_MARK).is_some_and(|(_, rest)| rest.strip_prefix(tenant).is_some_and(|r| r.starts_with('-')));
    (!own).then_some(tenant)
}

/// What follows the prefix in a tenant's own index or alias:
/// `<prefix>-t-<tenant>-...`. The configuration refuses a prefix that holds
/// it, so a name holds it exactly when it names a tenant's own.
pub const TENANT_MARK: &str = "-t-";

/// Whether `name` (an index or an alias) is a tenant's own, not shared.
pub fn is_tenants_own(name: &str) -> bool {
    name.contains(TENANT_MARK)
}

pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "files",
        Kind::User => "users",
        Kind::Post => "posts",
        // Singular: never one of the compiled-in names.
        Kind::Model(k) => k.as_str(),
    }
}

/// The alias documents of `kind` are read and written through.
pub fn alias(prefix: &str, kind: Kind) -> String {
    format!("{prefix}-{}", kind_name(kind))
}

/// The compiled-in kinds, which every index has.
pub const KINDS: [Kind; 3] = [Kind::File, Kind::User, Kind::Post];

/// The kinds of an index holding `model`'s documents: the compiled-in
/// ones, then the model's, each an index of its own.
pub fn kinds(model: Option<&'static crate::domain::Domain>) -> Vec<Kind> {
    let declared = model.into_iter().flat_map(crate::index::ModelKind::all).map(Kind::Model);
    KINDS.into_iter().chain(declared).collect()
}

/// The id of the meta document naming the model generation `g` holds.
pub const MODEL: &str = "model";

/// The concrete index of `kind` in generation `g`.
pub fn concrete(prefix: &str, kind: Kind, g: u64) -> String {
    format!("{}-{:06}", alias(prefix, kind), g + 1)
}

/// The alias generation `g`'s shard writers read and write `kind` through.
pub fn write_alias(prefix: &str, kind: Kind, g: u64) -> String {
    format!("{}-g{g}", alias(prefix, kind))
}

/// The id of the meta document `name` (`log`, `p<N>`) of generation `g`.
pub fn meta_id(g: u64, name: &str) -> String {
    match g {
        0 => name.to_string(),
        g => format!("g{g}-{name}"),
    }
}

/// The meta field holding a partition's owner epoch (see
/// `ElasticBackend::open_shard`).
pub const OWNER_FIELD: &str = "owner";

/// The meta index: one concrete index for every generation.
pub fn meta_index(prefix: &str) -> String {
    format!("{prefix}-meta")
}

/// The generation of the concrete index `index` of `kind`, if it is one.
pub fn generation_of(prefix: &str, kind: Kind, index: &str) -> Option<u64> {
    let digits = index.strip_prefix(&alias(prefix, kind))?.strip_prefix('-')?;
    if digits.len() != 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_sub(1)
}

/// The meta document of a generation's last sweep of expired tombstones.
pub const SWEEP: &str = "sweep";

/// The meta document naming the tenants with indexes of their own in a
/// generation (see `super::placement`).
pub const PLACEMENT: &str = "placement";

/// A tenant's read alias of `kind`: filtered to its documents on the
/// shared index, or on its own index when the tenant has one.
pub fn tenant_alias(prefix: &str, tenant: &str, kind: Kind) -> String {
    format!("{prefix}{TENANT_MARK}{tenant}-{}", kind_name(kind))
}

/// A tenant's own concrete index of `kind` in generation `g`, as rebuilt
/// `rev` times by `denorm rebuild --tenant` (0: as the generation was
/// created).
pub fn dedicated_concrete(prefix: &str, tenant: &str, kind: Kind, g: u64, rev: u32) -> String {
    match rev {
        0 => format!("{}-{:06}", tenant_alias(prefix, tenant, kind), g + 1),
        r => format!("{}-{:06}-r{r}", tenant_alias(prefix, tenant, kind), g + 1),
    }
}

/// The alias a tenant's rebuild writes revision `rev` of its own index of
/// `kind` in generation `g` through, until its cutover.
pub fn rebuild_alias(prefix: &str, tenant: &str, kind: Kind, g: u64, rev: u32) -> String {
    format!("{}-r{rev}", dedicated_write_alias(prefix, tenant, kind, g))
}

/// The alias generation `g`'s writers read and write a tenant's own index
/// of `kind` through.
pub fn dedicated_write_alias(prefix: &str, tenant: &str, kind: Kind, g: u64) -> String {
    format!("{}-g{g}", tenant_alias(prefix, tenant, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_documents_are_routed_by_the_tenant_in_the_shared_indexes_only() {
        assert_eq!(routing("denorm-files-g0", "acme\u{1f}f1"), Some("acme"));
        assert_eq!(routing("denorm-t-acme-files-g0", "acme\u{1f}f1"), None);
        assert_eq!(routing("denorm-t-acme-files-000001", "acme\u{1f}f1"), None);
        assert_eq!(routing("denorm-t-acmex-files-g0", "acme\u{1f}f1"), Some("acme"));
        assert_eq!(routing("denorm-files-g0", "f1"), None);
    }
}
